"""The daemon's side of the local API: requests from the CDI hook and
gpushare-runc meet the share domain here, as NRI messages do in `daemon`.

A container asked for this way is one that NRI never sees (ctr, nerdctl,
docker).  Its request is read from the same places as a pod's: its
``gpushare.io/*`` annotations (the bundle's config.json, as the hook or the
wrapper sent them), its containerd **labels** (read here, from containerd,
never from the caller: `nerdctl run --label` puts them nowhere else) and its
environment (cGPU/eGPU variables), under the node's `sources.standalone`.
The share goes into the same table as the pods' shares, so the two can never
be given the same memory.

A container in the Kubernetes (CRI) namespace ``k8s.io`` carrying CRI's
annotations is NRI's: it is answered with no share here, so that a CRI
runtime configured with gpushare-runc or a CDI device is never counted twice.

A CDI device gives a GPU, so the hook is never answered "no share": a
container that asks for none through its CDI device is refused (a
Kubernetes one unless NRI placed a share for it), or it would use the GPU
with nothing booked.

``runc-create`` and ``hook`` are the compiled front's (``front/``): the
bundle and the state are read here instead (`local_bundle`), then asked as
``create``, ``start`` and ``release`` are.

``claim-prepare``, ``claim-unprepare`` and ``claims`` are the DRA driver's
(`local_claims`; root only, as resize).

``resize`` is the node operator's `nri-gpushare resize` (the socket answers
root only, see `local_server`): the share service's `resizer` does it.

Answers come within `ANSWER_WITHIN` seconds, before the callers give up
(`nri_gpushare.local.client.DEFAULT_TIMEOUT`); a create that would answer
later is refused and leaves nothing reserved.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from nri_gpushare.daemon import local_bundle, local_claims
from nri_gpushare.host.containerd.client import ContainerdError, ContainerNotFound
from nri_gpushare.local.protocol import Reply, Request
from nri_gpushare.share.model import (
    Allocation,
    ContainerInfo,
    Gpu,
    InjectionPlan,
    Origin,
    ShareRefused,
)
from nri_gpushare.share.plan import share_json
from nri_gpushare.share.resize_ask import ResizeAsk
from nri_gpushare.share.service import ShareService
from nri_gpushare.units import quote

log = logging.getLogger(__name__)

CRI_CONTAINER_TYPE = "io.kubernetes.cri.container-type"
CRI_NAMESPACE = "k8s.io"
ANSWER_WITHIN = 8.0
"""Seconds a create may take (the hook and the wrapper wait 10)."""
NAME_KEYS = ("nerdctl/name", "io.containerd.container.name")
"""Labels or annotations that name a hand-started container (nerdctl's)."""


class LabelSource(Protocol):
    async def labels(self, namespace: str, container_id: str) -> dict[str, str]:
        """The container's containerd labels; raises when it cannot say."""


class LabelsUnavailable(Exception):
    """The labels cannot be read; str() says why, for a person."""


def plan_json(plan: InjectionPlan) -> dict[str, object]:
    """The PLAN of the local protocol."""
    return {
        "devices": [
            {"path": d.path, "type": d.type, "major": d.major, "minor": d.minor, "mode": d.mode}
            for d in plan.devices
        ],
        "env": dict(plan.env),
        "mounts": [
            {
                "destination": m.destination,
                "type": m.type,
                "source": m.source,
                "options": list(m.options),
            }
            for m in plan.mounts
        ],
        "annotations": dict(plan.annotations),
        "remove_annotations": list(plan.remove_annotations),
    }


class LocalApiHandler:
    """Local API requests -> share service."""

    def __init__(
        self,
        service: ShareService,
        labels: LabelSource | None,
        containerd_socket: str = "",
    ) -> None:
        self.service = service
        self.labels = labels
        self.containerd_socket = containerd_socket
        self.by_minor: Mapping[int, Gpu] = {g.minor: g for g in service.gpus}

    async def __call__(self, request: Request) -> Reply:
        if request.op == "runc-create":
            return await local_bundle.runc_create(request, self)
        if request.op == "hook":
            return await local_bundle.hook(request, self)
        if request.op == "resize":
            return await self._resize(request)
        if request.op in ("claim-prepare", "claim-unprepare", "claims"):
            return local_claims.claim_op(self.service, request)
        if request.op == "release":
            released = await self.service.local_shares.release_local(
                request.namespace, request.id, f"released ({request.via or 'hook'} asked)"
            )
            return Reply(True, released=released)
        if request.op == "start":
            try:
                await self.service.local_shares.start_local(
                    request.namespace, request.id, request.pid
                )
            except ShareRefused as e:
                return self._refused(request, str(e), e.reason)
            return Reply(True)
        try:
            async with asyncio.timeout(ANSWER_WITHIN):
                return await self._create(request)
        except TimeoutError:
            # Cancelled inside the service, which undoes what it had reserved.
            await self.service.local_shares.release_local(
                request.namespace, request.id, "placed too late"
            )
            where = f"{request.namespace}/{request.id}" if request.namespace else request.id
            return self._refused(
                request,
                f"gpushare: cannot create container {where}: not placed within "
                f"{ANSWER_WITHIN:g} s (containerd or the kernel module is slow to answer); "
                f"nothing was reserved, retry",
                "unavailable",
                "timeout",
            )

    async def _resize(self, r: Request) -> Reply:
        """The operator's resize (the socket answers root only); logged by the service."""
        ask = ResizeAsk(r.memory, r.core, r.priority)
        try:
            async with asyncio.timeout(ANSWER_WITHIN):
                alloc, changed = await self.service.resizer.resize(r.id, ask)
        except ShareRefused as e:
            return Reply.refused(str(e), e.reason)
        except TimeoutError:
            return Reply.refused(
                f"gpushare: resizing {quote(r.id)} took more than {ANSWER_WITHIN:g} s (the "
                f"kernel module is slow to answer); what was changed was changed back, or, "
                f"where the module did not answer, is settled on what it holds within "
                f"seconds; see 'nri-gpushare status'",
                "unavailable",
            )
        return Reply(True, resized=resized_json(alloc, changed))

    def _refused(
        self,
        r: Request,
        message: str,
        reason: str,
        logged_as: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Reply:
        """The refusal, logged as a decision (`logged_as`: its reason there,
        when the protocol's says less; `labels`: the container's, when read)."""
        self.service.decisions.refused(
            r.id,
            logged_as or reason,
            message,
            name=container_name(labels or {}, r.annotations) or r.id,
            origin=f"{r.via or 'runc'}:{r.namespace}",
        )
        return Reply.refused(message, reason)

    async def undelivered(self, request: Request, reply: Reply) -> None:
        """The caller went away before it had the answer: a share it did not
        learn of must not stay booked."""
        booked = local_bundle.created(request, reply)
        if booked is None and request.op == "create" and reply.ok and reply.plan is not None:
            booked = request.namespace, request.id
        if booked is not None:
            await self.service.local_shares.release_local(
                *booked, "its creator went away before the answer"
            )

    async def _create(self, r: Request) -> Reply:
        where = f"{r.namespace}/{r.id}" if r.namespace else r.id
        if r.namespace == CRI_NAMESPACE and CRI_CONTAINER_TYPE in r.annotations:
            held = self.service.allocations.get(r.id)
            if r.via == "cdi" and r.gpu_minors and (held is None or held.local):
                return self._refused(
                    r, _cdi_without_share(where, "NRI placed no share for it"), "invalid"
                )
            log.info("container %s: a CRI container, served through NRI; nothing to do", where)
            return Reply(True)
        try:
            labels = await self._labels(r)
        except LabelsUnavailable as e:
            return self._refused(
                r, f"gpushare: cannot create container {where}: {e}", "unavailable"
            )
        gpus = None
        if r.gpu_minors is not None:
            unknown = [m for m in r.gpu_minors if m not in self.by_minor]
            if unknown:
                return self._refused(
                    r,
                    f"gpushare: cannot create container {where}: it was given /dev/nvidia"
                    f"{unknown[0]}, which is not a GPU of this node's inventory; regenerate "
                    f"the CDI spec (nri-gpushare cdi generate)",
                    "invalid",
                    labels=labels,
                )
            gpus = tuple(dict.fromkeys(self.by_minor[m].index for m in r.gpu_minors))
        name = container_name(labels, r.annotations)
        info = ContainerInfo(
            id=r.id,
            name=name or r.id,
            annotations=r.annotations,
            labels=labels,
            env=r.env,
            cgroups_path=r.cgroups_path,
            pid=r.pid,
        )
        try:
            plan = await self.service.lifecycle.create_container(
                info, origin=_origin(r.via), namespace=r.namespace, gpus=gpus
            )
        except ShareRefused as e:  # logged by the service
            return Reply.refused(str(e), e.reason)
        if plan is None or not plan.devices:
            if r.via == "cdi" and r.gpu_minors:
                await self.service.local_shares.release_local(r.namespace, r.id, "no share asked")
                return self._refused(
                    r, _cdi_without_share(where, "it asks for none"), "invalid", labels=labels
                )
            return Reply(True) if plan is None else Reply(True, plan=plan_json(plan))
        if r.pid:  # the hook runs once the cgroup exists: bind now
            try:
                await self.service.local_shares.start_local(r.namespace, r.id, r.pid)
            except ShareRefused as e:
                await self.service.local_shares.release_local(
                    r.namespace, r.id, "its cgroup cannot be bound"
                )
                return self._refused(r, str(e), e.reason, labels=labels)
        return Reply(True, plan=plan_json(plan))

    async def _labels(self, r: Request) -> dict[str, str]:
        if not r.namespace or self.labels is None:
            return {}
        try:
            return await self.labels.labels(r.namespace, r.id)
        except ContainerNotFound:
            raise LabelsUnavailable(
                f"containerd at {self.containerd_socket} has no container {r.id} in namespace "
                f"{r.namespace}, so its labels cannot be read; point the node config's "
                f"containerd.socket at the containerd that runs it"
            ) from None
        except ContainerdError as e:
            raise LabelsUnavailable(f"cannot read its labels from containerd: {e}") from None


def resized_json(alloc: Allocation, changed: bool) -> dict[str, object]:
    """The reply to a resize: the share as it now is."""
    return {
        "container_id": alloc.container_id,
        "name": alloc.name,
        "pod": alloc.pod,
        "origin": alloc.where,
        "priority": alloc.priority,
        "changed": changed,
        "gpus": [share_json(s) for s in alloc.shares],
    }


def _origin(via: str) -> Origin:
    """The share's origin: the CDI hook's, else gpushare-runc's (the protocol
    has checked `via`)."""
    return "cdi" if via == "cdi" else "runc"


def container_name(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str:
    """The name a hand-started container was given (nerdctl's labels), or ""."""
    return next((v for k in NAME_KEYS if (v := labels.get(k) or annotations.get(k))), "")


def _cdi_without_share(where: str, why: str) -> str:
    return (
        f"gpushare: cannot create container {where}: it was given a gpushare.io/gpu CDI "
        f"device, but {why}, and a GPU must not be used with nothing booked; ask for a share "
        f"(e.g. the label or annotation gpushare.io/gpu-memory=2Gi, or "
        f"ALIYUN_COM_GPU_MEM_CONTAINER), or start the container without the device"
    )
