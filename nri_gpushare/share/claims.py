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
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from nri_gpushare.names import DRA_CLAIM_ENV
from nri_gpushare.share.model import (
    Allocation,
    ContainerInfo,
    Gpu,
    GpuShare,
    NodePolicy,
    ShareRefused,
)
from nri_gpushare.share.placement import Ledger
from nri_gpushare.share.request import ShareRequest
from nri_gpushare.units import MiB, format_bytes, quote

log = logging.getLogger(__name__)

BOOKING_PREFIX = "claim:"
"""The ledger's name for a claim's booking (never a container ID: has a colon)."""
WHOLE = -1
"""A share's memory when the scheduler allocated the whole GPU (no consumable
capacity): everything the GPU can give."""
MAX_CLAIMS = 4096
MAX_PODS = 256
MAX_SHARES = 64
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class ClaimStore(Protocol):
    def load(self) -> str | None: ...

    def replace(self, text: str) -> None: ...


class MemoryClaimStore:
    """Claims kept in memory only (tests, a daemon without a state directory)."""

    def __init__(self, text: str | None = None) -> None:
        self.text = text

    def load(self) -> str | None:
        return self.text

    def replace(self, text: str) -> None:
        self.text = text


@dataclass(frozen=True)
class ShareAsk:
    """One GPU of a claim as the driver read it from the allocation."""

    uuid: str
    memory_bytes: int  # WHOLE: the whole GPU
    core_percent: int


@dataclass(frozen=True)
class ClaimAsk:
    """A claim to prepare: what the scheduler allocated on this node."""

    uid: str
    namespace: str
    name: str
    pods: tuple[str, ...]
    shares: tuple[ShareAsk, ...]


@dataclass
class Claim:
    uid: str
    namespace: str
    name: str
    pods: frozenset[str]
    shares: tuple[GpuShare, ...]
    holder: str = ""  # the container holding its share; "": booked as the claim
    booking: Allocation = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.booking = Allocation(
            BOOKING_PREFIX + self.uid, self.name, f"{self.namespace}/{self.name}", self.shares
        )

    def describe(self) -> str:
        return f"claim {quote(self.namespace)}/{quote(self.name)} ({self.uid})"

    def json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "pods": sorted(self.pods),
            "gpus": [
                {"index": s.index, "uuid": s.uuid, "memory": s.memory_bytes, "core": s.core_percent}
                for s in self.shares
            ],
            "holder": self.holder,
        }


def check_ask(ask: ClaimAsk) -> None:
    """ShareRefused ("invalid") unless every field is one a claim can have."""
    problems = []
    if not _UID.fullmatch(ask.uid):
        problems.append(f"uid {quote(ask.uid)} is not a Kubernetes UID")
    if not _NAME.fullmatch(ask.namespace) or not _NAME.fullmatch(ask.name):
        problems.append(f"{quote(ask.namespace)}/{quote(ask.name)} is not a namespace/name")
    if len(ask.pods) > MAX_PODS or not all(_UID.fullmatch(p) for p in ask.pods):
        problems.append(f"the reserved pods must be at most {MAX_PODS} pod UIDs")
    if not 0 < len(ask.shares) <= MAX_SHARES:
        problems.append(f"it must give 1 to {MAX_SHARES} GPUs")
    if problems:
        raise ShareRefused(f"gpushare: cannot prepare the claim: {'; '.join(problems)}")


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
                    f"{_describe(held.shares)}, not {_describe(shares)}: unprepare it first",
                    "conflict",
                )
            if set(ask.pods) - held.pods:
                held.pods = held.pods | set(ask.pods)  # reserved for more pods since
                self._save_or_log()
            return held
        if len(self.book) >= MAX_CLAIMS:
            raise ShareRefused(f"gpushare: this node holds {MAX_CLAIMS} claims", "capacity")
        claim = Claim(ask.uid, ask.namespace, ask.name, frozenset(ask.pods), shares)
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
        log.info("%s: prepared: %s", claim.describe(), _describe(shares))
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
            reason = "conflict" if claim is not None and claim.holder else "forbidden"
            raise ShareRefused(
                f"gpushare: cannot create {who}: it carries {DRA_CLAIM_ENV}={quote(uid)}, "
                f"but {why}",
                reason,
                DRA_CLAIM_ENV,
            )
        if not claim.holder:
            self.ledger.remove(claim.booking)
        claim.holder = c.id
        return claim

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
        ask = ClaimAsk(
            _text(entry, "uid"),
            _text(entry, "namespace"),
            _text(entry, "name"),
            tuple(_texts(entry["pods"])),
            tuple(
                ShareAsk(_text(g, "uuid"), _int(g, "memory"), _int(g, "core"))
                for g in entry["gpus"]
            ),
        )
        check_ask(ask)
        shares = self._shares(ask)
        return Claim(ask.uid, ask.namespace, ask.name, frozenset(ask.pods), shares)

    def _save(self) -> None:
        entries = [
            {k: v for k, v in claim.json().items() if k != "holder"} for claim in self.book.values()
        ]
        self.store.replace(json.dumps({"version": 1, "claims": entries}, sort_keys=True) + "\n")

    def _save_or_log(self) -> None:
        try:
            self._save()
        except OSError as e:
            log.error("the claims record cannot be written (%s): a restart may lose claims", e)

    def status(self) -> list[dict[str, Any]]:
        return [c.json() for c in sorted(self.book.values(), key=lambda c: c.uid)]


def claim_request(claim: Claim, policy: NodePolicy) -> ShareRequest:
    """What a container holding `claim` is given: the claim's share on the
    claim's GPUs, isolation full, normal priority."""
    keys = dict.fromkeys(("memory", "core", "devices", "count"), DRA_CLAIM_ENV)
    return ShareRequest(
        memory_bytes=tuple(s.memory_bytes for s in claim.shares),
        core_percent=tuple(s.core_percent for s in claim.shares),
        devices=tuple(s.index for s in claim.shares),
        priority="normal",
        placement=policy.default_placement,
        isolation="full",
        keys=keys,
    )


def _describe(shares: Iterable[GpuShare]) -> str:
    return ", ".join(
        f"GPU {s.index} {format_bytes(s.memory_bytes)}"
        + (f" {s.core_percent}%" if s.core_percent else "")
        for s in shares
    )


def _text(entry: Mapping[str, Any], key: str) -> str:
    value = entry[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} is not a string")
    return value


def _texts(values: Any) -> list[str]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise TypeError("not a list of strings")
    return values


def _int(entry: Mapping[str, Any], key: str) -> int:
    value = entry[key]
    if type(value) is not int:
        raise TypeError(f"{key} is not a number")
    return value
