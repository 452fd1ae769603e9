"""`nri-gpushare dra-driver` composed: the kubelet plugin (`kubelet`)
preparing claims through the daemon, and the node's ResourceSlice kept
current (`SlicePublisher`).

Preparing a claim (`DraDriver.prepare`, idempotent: the kubelet retries):
read the ResourceClaim from the API server, take this node's devices from
its allocation (`claims.claim_shares`), book them in the daemon's table
(local API ``claim-prepare``: the same ledger as pods and hand-started
containers, the same refusals), then write the claim's CDI spec
(`claim_cdi`) and answer with its device name.  Unpreparing releases the
booking (``claim-unprepare``) and removes the spec.  The driver keeps no
state of its own: the daemon's claims (kept in its state directory) are the
record, so a restart of either side in the middle of a prepare is the
kubelet's retry finding the booking there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nri_gpushare.k8s.dra import (
    ClaimError,
    ClaimRef,
    DeviceHealth,
    PreparedDevice,
    claim_cdi,
    device_name,
)
from nri_gpushare.k8s.dra.claims import claim_shares, reserved_pods
from nri_gpushare.k8s.dra.kubeapi import KubeApi, KubeApiError
from nri_gpushare.k8s.dra.slices import SliceGpu, node_slice, slice_changed
from nri_gpushare.local.client import Unavailable, ask
from nri_gpushare.local.protocol import ProtocolError, Request
from nri_gpushare.share.model import Gpu

log = logging.getLogger(__name__)

PUBLISH_POLL = 2.0
"""Seconds between checks of what the slice should say."""
COLLECT_EVERY = 300.0
"""Seconds between looks for claims whose ResourceClaim is gone (`collect`)."""


class Daemon:
    """The daemon's local API, asked off the event loop."""

    def __init__(self, socket: str, timeout: float = 10.0) -> None:
        self.socket = socket
        self.timeout = timeout

    async def ask(self, request: Request) -> Any:
        try:
            reply = await asyncio.to_thread(ask, request, self.socket, self.timeout)
        except (Unavailable, ProtocolError) as e:
            raise ClaimError(f"gpushare.io: {e}") from None
        if not reply.ok:
            raise ClaimError(reply.error)
        return reply


class DraDriver:
    """The `Preparer` the kubelet plugin serves."""

    def __init__(
        self,
        node: str,
        gpus: Sequence[Gpu],
        api: KubeApi,
        daemon: Daemon,
        cdi_dir: str,
        unhealthy: Callable[[], frozenset[int]] = frozenset,
    ) -> None:
        self.node = node
        self.gpus = {g.index: g for g in gpus}
        self.api = api
        self.daemon = daemon
        self.cdi_dir = cdi_dir
        self.unhealthy = unhealthy

    async def prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        who = f"claim {claim.namespace}/{claim.name}"
        try:
            obj = await asyncio.to_thread(self.api.get_claim, claim.namespace, claim.name)
        except (KubeApiError, ClaimError) as e:
            raise ClaimError(f"gpushare.io: cannot read {who}: {e}") from None
        uid = (obj.get("metadata") or {}).get("uid")
        if uid != claim.uid:
            raise ClaimError(
                f"gpushare.io: {who} has UID {str(uid)[:64]!r}, not {claim.uid!r} as the kubelet "
                f"asked (deleted and made again?)"
            )
        shares = claim_shares(obj, self.node, sorted(self.gpus))
        if not shares:
            raise ClaimError(f"gpushare.io: {who} has no gpushare.io device of node {self.node}")
        pods = reserved_pods(obj)
        if not pods:
            raise ClaimError(f"gpushare.io: {who} is reserved for no pod yet")
        body = {
            "uid": claim.uid,
            "namespace": claim.namespace,
            "name": claim.name,
            "pods": list(pods),
            "gpus": [
                {
                    "uuid": self.gpus[s.gpu_index].uuid,
                    "memory": s.memory_bytes,
                    "core": s.core_percent,
                }
                for s in shares
            ],
        }
        log.debug("claim %s: booking %s in the daemon", claim.uid, body["gpus"])
        await self.daemon.ask(Request("claim-prepare", "", claim.uid, claim=body))
        try:
            cdi = await asyncio.to_thread(claim_cdi.write_spec, self.cdi_dir, claim.uid)
        except ClaimError:
            # Not prepared after all: nothing stays booked for a claim the
            # kubelet was told failed (it prepares it again).
            try:
                await self.daemon.ask(Request("claim-unprepare", "", claim.uid))
            except ClaimError as e:
                log.warning("claim %s: its booking stays until unprepared: %s", claim.uid, e)
            raise
        return [PreparedDevice(s.requests, self.node, s.device, (cdi,), s.share_id) for s in shares]

    async def unprepare(self, claim: ClaimRef) -> None:
        await self.daemon.ask(Request("claim-unprepare", "", claim.uid))
        await asyncio.to_thread(claim_cdi.remove_spec, self.cdi_dir, claim.uid)

    def health(self) -> list[DeviceHealth]:
        bad = self.unhealthy()
        return [
            DeviceHealth(
                self.node,
                device_name(i),
                i not in bad,
                "NVML reports it failed" if i in bad else "",
            )
            for i in sorted(self.gpus)
        ]

    async def forget_stale_specs(self) -> None:
        """Remove the CDI specs of claims the daemon no longer holds (left by a
        daemon that lost its state); never raises."""
        try:
            reply = await self.daemon.ask(Request("claims", "", ""))
        except ClaimError as e:
            log.warning("cannot list the daemon's claims (%s): stale CDI specs are kept", e)
            return
        held = {c.get("uid") for c in reply.claims or [] if isinstance(c, dict)}
        for uid in claim_cdi.written(self.cdi_dir) - held:
            try:
                await asyncio.to_thread(claim_cdi.remove_spec, self.cdi_dir, uid)
                log.info("removed the CDI spec of claim %s, which the daemon does not hold", uid)
            except ClaimError as e:
                log.warning("%s", e)

    async def collect(self) -> None:
        """Unprepare the claims the daemon books with no container holding them
        whose ResourceClaim is gone (deleted, or made again with another UID)
        without the kubelet's unprepare: no pod can use them any more, and
        their room is the scheduler's again.  Never raises."""
        try:
            reply = await self.daemon.ask(Request("claims", "", ""))
        except ClaimError as e:
            log.warning("cannot list the daemon's claims (%s): none collected", e)
            return
        for claim in reply.claims or []:
            if not isinstance(claim, dict) or claim.get("holder"):
                continue
            ref = ClaimRef(str(claim.get("namespace")), str(claim.get("name")), str(claim["uid"]))
            try:
                uid = await asyncio.to_thread(self.api.claim_uid, ref.namespace, ref.name)
                if uid == ref.uid:
                    continue
                await self.unprepare(ref)
            except (KubeApiError, ClaimError) as e:
                log.warning("claim %s/%s: not collected now: %s", ref.namespace, ref.name, e)
                continue
            log.info(
                "claim %s/%s (%s): its ResourceClaim is gone; unprepared (no container held it)",
                ref.namespace,
                ref.name,
                ref.uid,
            )

    async def collect_loop(self, stop: asyncio.Event, every: float = COLLECT_EVERY) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), every)
            except TimeoutError:
                await self.collect()


def _failed(bad: bool) -> str:
    return "NVML reports it failed" if bad else ""


def held_elsewhere(status: Mapping[str, Any]) -> dict[int, tuple[int, int, int]]:
    """GPU index -> (memory, compute, containers) held by shares not made
    through DRA, from the daemon's status document."""
    out: dict[int, tuple[int, int, int]] = {}
    for alloc in status.get("allocations") or []:
        if not isinstance(alloc, dict) or alloc.get("claim"):
            continue
        for share in alloc.get("gpus") or []:
            index, memory, core = share.get("index"), share.get("memory"), share.get("core")
            if type(index) is int and type(memory) is int and type(core) is int:
                m, c, n = out.get(index, (0, 0, 0))
                out[index] = (m + memory, c + core, n + 1)
    return out


class SlicePublisher:
    """Keeps the node's ResourceSlice what the daemon can still place:
    republished when a GPU's health or the shares held another way change."""

    def __init__(
        self,
        node: str,
        gpus: Sequence[Gpu],
        api: KubeApi,
        status: Callable[[], Mapping[str, Any]],
        unhealthy: Callable[[], frozenset[int]],
        *,
        memory_reserve_bytes: int,
        max_inst: int,
        driver_version: str = "",
    ) -> None:
        self.node = node
        self.gpus = list(gpus)
        self.api = api
        self.status = status
        self.unhealthy = unhealthy
        self.memory_reserve_bytes = memory_reserve_bytes
        self.max_inst = max_inst
        self.driver_version = driver_version
        self.published: dict[str, Any] | None = None
        self.publications = 0
        self._problem = ""

    def wanted(self) -> dict[str, Any]:
        held = held_elsewhere(self.status())
        bad = self.unhealthy()
        return node_slice(
            self.node,
            [
                SliceGpu(
                    g.index,
                    g.uuid,
                    g.name,
                    g.memory_bytes,
                    self.driver_version,
                    g.index not in bad,
                    *held.get(g.index, (0, 0, 0)),
                )
                for g in self.gpus
            ],
            memory_reserve_bytes=self.memory_reserve_bytes,
            max_inst=self.max_inst,
            generation=1,
        )

    async def tick(self) -> None:
        """Publish when what the slice should say changed (or never was)."""
        try:
            wanted = await asyncio.to_thread(self.wanted)
            if self.published is None or slice_changed(self.published, wanted):
                self.published = await asyncio.to_thread(self.api.publish, self.node, wanted)
                self.publications += 1
                devices = [d["name"] for d in wanted["spec"]["devices"]]
                log.info(
                    "published ResourceSlice %s: devices %s",
                    wanted["metadata"]["name"],
                    ", ".join(devices) or "none",
                )
            self._say("")
        except (OSError, ValueError, KubeApiError) as e:
            self._say(f"cannot publish the node's ResourceSlice: {e}; trying again")

    async def run(self, stop: asyncio.Event, poll: float = PUBLISH_POLL) -> None:
        while not stop.is_set():
            await self.tick()
            try:
                await asyncio.wait_for(stop.wait(), poll)
            except TimeoutError:
                pass

    def _say(self, problem: str) -> None:
        if problem != self._problem:
            self._problem = problem
            if problem:
                log.warning("%s", problem)
