"""Prepared DRA claims: capacity Kubernetes' scheduler allocated on a GPU of
this node, booked in the same ledger as every other share (see
`nri_gpushare.k8s.dra`).

A claim is booked when the kubelet prepares it (``claim-prepare`` from the
DRA driver, through the local API), before any container of its pod
exists, so nothing placed meanwhile can take its room.  The container that
carries the claim's variable (`names.DRA_CLAIM_ENV`, set by the claim's CDI
device) takes the booking over at its CreateContainer: its allocation is
the claim's share, on the claim's GPUs, and the claim's booking leaves the
ledger while the container holds it (`take`), so the room is counted once.
When that container is released the booking comes back (`give_back`); when
the claim is unprepared it goes.

One container holds a claim's share at a time: the kernel module and the
interposer hold each container to its own quota, so two containers of one
claim would each get the whole of it.  A container may take a claim only
when its pod is one the claim is reserved for.

The claims are kept in their own file in the daemon's state directory
(`ClaimStore`), rewritten whole at each change, so a daemon restart keeps
them booked.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nri_gpushare.names import DRA_CLAIM_ENV
from nri_gpushare.share.claim_model import (
    MAX_CLAIMS,
    WHOLE,
    Claim,
    ClaimAsk,
    ClaimStore,
    ShareAsk,
    check_ask,
    claim_request,
    decode_entry,
    describe_shares,
    encode,
)
from nri_gpushare.share.model import Allocation, ContainerInfo, Gpu, GpuShare, ShareRefused
from nri_gpushare.share.placement import Ledger
from nri_gpushare.share.records import MemoryStore as MemoryClaimStore
from nri_gpushare.units import MiB, quote

__all__ = [
    "WHOLE",
    "Claim",
    "ClaimAsk",
    "ClaimStore",
    "Claims",
    "MemoryClaimStore",
    "ShareAsk",
    "claim_request",
]

log = logging.getLogger(__name__)


class Claims:
    """The node's prepared claims and their bookings in `ledger` (which the
    table may replace: `ledger` is read through `current_ledger`)."""

    def __init__(
        self,
        gpus: Sequence[Gpu],
        current_ledger: Callable[[], Ledger],
        allocations: Callable[[], Mapping[str, Allocation]],
        store: ClaimStore | None = None,
    ) -> None:
        """`current_ledger`/`allocations`: callables returning the table's
        ledger and allocations now."""
        self.by_uuid = {g.uuid: g for g in gpus}
        self._ledger = current_ledger
        self._allocations = allocations
        self.store: ClaimStore = store or MemoryClaimStore()
        self.book: dict[str, Claim] = {}

    @property
    def ledger(self) -> Ledger:
        return self._ledger()

    # -- the driver's side -------------------------------------------------

    def prepare(self, ask: ClaimAsk) -> Claim:
        """Book `ask` (idempotent: the same claim again gets the same answer);
        ShareRefused with a reason the kubelet shows.  A refusal books nothing."""
        check_ask(ask)
        shares = self._shares(ask)
        held = self.book.get(ask.uid)
        if held is not None:
            if held.shares != shares or (held.namespace, held.name) != (ask.namespace, ask.name):
                raise ShareRefused(
                    f"gpushare: {held.describe()} is prepared already with "
                    f"{describe_shares(held.shares)}, not {describe_shares(shares)}: "
                    f"unprepare it first",
                    "conflict",
                )
            if frozenset(ask.pods) != held.pods:
                held.pods = frozenset(ask.pods)  # the claim's reservedFor now
                self._save_or_log()
            return held
        if len(self.book) >= MAX_CLAIMS:
            raise ShareRefused(f"gpushare: this node holds {MAX_CLAIMS} claims", "capacity")
        claim = Claim(ask.uid, ask.namespace, ask.name, frozenset(ask.pods), shares)
        if holder := self._holder(claim):
            return self._keep(claim, holder)
        for s in shares:
            if short := self.ledger.shortfalls(s.index, s.memory_bytes, s.core_percent, False):
                raise ShareRefused(
                    f"gpushare: cannot prepare {claim.describe()}: GPU {s.index} "
                    f"{'; '.join(x.text for x in short)} (shares taken since the scheduler "
                    f"allocated it: the pod is tried again once room is free)",
                    "capacity",
                )
        self.ledger.add(claim.booking)
        self.book[claim.uid] = claim
        try:
            self._save()
        except OSError as e:
            del self.book[claim.uid]
            self.ledger.remove(claim.booking)
            raise ShareRefused(
                f"gpushare: cannot prepare {claim.describe()}: it cannot be recorded ({e}); "
                f"the node's state directory needs attention",
                "state",
            ) from None
        log.info("%s: prepared: %s", claim.describe(), describe_shares(shares))
        return claim

    def _holder(self, claim: Claim) -> str:
        """The container that still holds `claim`'s share (unprepared while it
        ran, prepared again before its release), "" when none."""
        return next((c for c, a in self._allocations().items() if a.claim == claim.uid), "")

    def _keep(self, claim: Claim, holder: str) -> Claim:
        """`claim` prepared again while container `holder` still holds its
        share: that container is its holder (nothing more is booked), or a
        refusal when the share it holds is another."""
        held = self._allocations()[holder].shares
        if held != claim.shares:
            raise ShareRefused(
                f"gpushare: cannot prepare {claim.describe()}: container {holder} still "
                f"holds its earlier share ({describe_shares(held)}), not "
                f"{describe_shares(claim.shares)}; it is prepared once that container is gone",
                "conflict",
            )
        claim.holder = holder
        self.book[claim.uid] = claim
        self._save_or_log()
        log.info("%s: prepared again; container %s holds its share", claim.describe(), holder)
        return claim

    def unprepare(self, uid: str) -> bool:
        """Forget claim `uid` (idempotent); True when one was prepared.  A
        container holding its share keeps it until it is released."""
        claim = self.book.pop(uid, None)
        if claim is None:
            return False
        if not claim.holder:
            self.ledger.remove(claim.booking)
        self._save_or_log()
        held = f" (container {claim.holder} keeps its share until it stops)" if claim.holder else ""
        log.info("%s: unprepared%s", claim.describe(), held)
        return True

    def _shares(self, ask: ClaimAsk) -> tuple[GpuShare, ...]:
        out = []
        for s in ask.shares:
            gpu = self.by_uuid.get(s.uuid)
            if gpu is None:
                raise ShareRefused(
                    f"gpushare: cannot prepare the claim: GPU {quote(s.uuid)} is not one of "
                    f"this node's (the ResourceSlice is older than the node's inventory?)"
                )
            memory, core = s.memory_bytes, s.core_percent
            if memory == WHOLE:
                memory, core = self.ledger.capacity(gpu.index), 100
            if memory < MiB or memory % MiB or not 0 <= core <= 100 or core % 5:
                raise ShareRefused(
                    f"gpushare: cannot prepare the claim: GPU {gpu.index}: memory "
                    f"{memory} bytes and compute {core}% are not a share the node gives "
                    f"(whole MiB, at least 1Mi; compute 5..100 in steps of 5)"
                )
            out.append(GpuShare(gpu.index, gpu.uuid, memory, core))
        if len({s.index for s in out}) != len(out):
            raise ShareRefused("gpushare: cannot prepare the claim: it names a GPU twice")
        return tuple(out)

    # -- the containers' side ----------------------------------------------

    def take(self, c: ContainerInfo, uid: str, local: bool) -> Claim:
        """Hand claim `uid`'s booking to container `c`; ShareRefused when `c`
        may not have it.  The caller gives it back if the container is refused."""
        who = c.describe()
        claim = self.book.get(uid)
        if local or not c.pod_uid:
            why = "DRA claims serve Kubernetes pods only"
        elif claim is None:
            why = f"no claim of UID {quote(uid)} is prepared on this node"
        elif c.pod_uid not in claim.pods:
            why = f"its pod is not one {claim.describe()} is reserved for"
        elif claim.holder and claim.holder != c.id:
            why = (
                f"{claim.describe()} is held by container {claim.holder}: a claim's share "
                f"serves one container at a time"
            )
        else:
            why = ""
        if why or claim is None:
            raise ShareRefused(
                f"gpushare: cannot create {who}: it carries {DRA_CLAIM_ENV}={quote(uid)}, "
                f"but {why}",
                "claim",
                DRA_CLAIM_ENV,
            )
        if not claim.holder:
            self.ledger.remove(claim.booking)
        claim.holder = c.id
        return claim

    def claimed_by(self, c: ContainerInfo) -> str:
        """The UID of the prepared claim live container `c` carries and may
        hold (its pod is one the claim is reserved for), "" when none: how
        recovery knows a share the module alone remembered is a claim's."""
        uid = c.env.get(DRA_CLAIM_ENV, "")
        claim = self.book.get(uid)
        return uid if claim is not None and c.pod_uid and c.pod_uid in claim.pods else ""

    def give_back(self, uid: str, container_id: str) -> None:
        """Container `container_id` no longer holds claim `uid`'s share: book
        it as the claim's again (while the claim is prepared)."""
        claim = self.book.get(uid)
        if claim is not None and claim.holder == container_id:
            claim.holder = ""
            self.ledger.add(claim.booking)

    def rebuild(self) -> None:
        """Book every claim again in a new ledger: as its holder's share when a
        container of the table holds it, else as the claim."""
        holders = {a.claim: cid for cid, a in self._allocations().items() if a.claim}
        for uid, claim in self.book.items():
            claim.holder = holders.get(uid, "")
            if not claim.holder:
                self.ledger.add(claim.booking)

    # -- records -----------------------------------------------------------

    def load(self) -> None:
        """The claims recorded before a restart, booked again (a bad record is
        logged and left out; never raises)."""
        text = self.store.load()
        if not text:
            return
        try:
            entries = json.loads(text)["claims"]
            if not isinstance(entries, list):
                raise TypeError("claims is not a list")
        except Exception as e:
            log.error("the claims record is unreadable (%s): no claim recovered", e)
            return
        for entry in entries[:MAX_CLAIMS]:
            try:
                claim = self._decode(entry)
            except Exception as e:
                log.error("a claim record is left out (%s): %.200r", e, entry)
                continue
            self.book[claim.uid] = claim
        self.rebuild()
        if self.book:
            log.info("%d prepared claim(s) recovered", len(self.book))

    def _decode(self, entry: Any) -> Claim:
        ask = decode_entry(entry)
        return Claim(ask.uid, ask.namespace, ask.name, frozenset(ask.pods), self._shares(ask))

    def _save(self) -> None:
        self.store.replace(encode(self.book.values()))

    def _save_or_log(self) -> None:
        try:
            self._save()
        except OSError as e:
            log.error("the claims record cannot be written (%s): a restart may lose claims", e)

    def status(self) -> list[dict[str, Any]]:
        return [c.json() for c in sorted(self.book.values(), key=lambda c: c.uid)]
