"""``v1beta1.DevicePlugin``, the kubelet's gRPC service, for one resource.
``Allocate`` answers from memory (never waits for the daemon or the kubelet)
with the annotation the NRI plugin reads; the plugin's state counts what it
hands out."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from nri_gpushare.k8s import HEALTHY, UNHEALTHY
from nri_gpushare.k8s.capacity import Device, Grant
from nri_gpushare.k8s.generated import v1beta1 as pb
from nri_gpushare.k8s.state import PluginState
from nri_gpushare.names import KUBELET_ANNOTATIONS, RESOURCES
from nri_gpushare.share.ids import BadIds, device_id, format_ids, id_number

log = logging.getLogger(__name__)

OPTIONS = pb.DevicePluginOptions(get_preferred_allocation_available=True)


def _response(devices: Sequence[Device]) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(
        devices=[pb.Device(id=d.id, health=HEALTHY if d.healthy else UNHEALTHY) for d in devices]
    )


def _refuse(message: str) -> GRPCError:
    return GRPCError(Status.INVALID_ARGUMENT, message)


class DevicePluginService(pb.DevicePluginBase):  # type: ignore[misc]  # untyped bindings
    """``v1beta1.DevicePlugin`` for one resource (`short`)."""

    def __init__(self, short: str, state: PluginState) -> None:
        self.short = short
        self.resource = RESOURCES[short]
        self._state = state
        self._stopped = False
        self.streams = 0

    def stop(self) -> None:
        """End every ListAndWatch stream (cleanly, with status OK)."""
        self._stopped = True
        self._state.wake()

    async def get_device_plugin_options(self, empty: pb.Empty) -> pb.DevicePluginOptions:
        return OPTIONS

    async def list_and_watch(self, empty: pb.Empty) -> AsyncIterator[pb.ListAndWatchResponse]:
        self.streams += 1
        try:
            sent: tuple[Device, ...] | None = None
            while not self._stopped:
                version, devices = self._state.version, self._state.devices[self.short]
                if devices != sent:
                    yield _response(devices)
                    sent = devices
                    continue  # the lists may have changed while it was sent
                await self._state.changed(version)
        finally:
            self.streams -= 1

    async def get_preferred_allocation(
        self, request: pb.PreferredAllocationRequest
    ) -> pb.PreferredAllocationResponse:
        """must_include first, then the lowest-numbered available IDs."""
        responses = []
        for container in request.container_requests:
            available = self._numbers(container.available_device_i_ds)
            must = self._numbers(container.must_include_device_i_ds)
            # must_include: an init container's IDs the pod's next container reuses.
            self._state.kubelet_frees(self.short, available - must)
            size = container.allocation_size
            if not 0 <= size <= len(available | must):
                raise _refuse(
                    f"{self.resource}: allocation size {size} is not between 0 and the "
                    f"{len(available | must)} available devices"
                )
            chosen = sorted(must) + sorted(available - must)[: max(0, size - len(must))]
            responses.append(
                pb.ContainerPreferredAllocationResponse(device_i_ds=[device_id(n) for n in chosen])
            )
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        """Each container's IDs as the annotation the NRI plugin reads; every
        container's IDs are checked before any counts as handed out."""
        listed = self._state.listed(self.short)
        grants = []
        for container in request.container_requests:
            ids = self._numbers(container.devices_ids)
            if not ids:
                raise _refuse(f"{self.resource}: a container request without device IDs")
            if len(ids) != len(container.devices_ids):
                raise _refuse(f"{self.resource}: a container request repeats device IDs")
            unknown = ids - listed
            if unknown:
                raise _refuse(
                    f"{self.resource}: device IDs {format_ids(unknown)[:64]} are not "
                    f"advertised by this plugin (it lists {len(listed)} devices, "
                    f"IDs {format_ids(listed) or 'none'})"
                )
            grants.append(Grant(self.short, ids))
        self._state.grant(grants)
        annotation = KUBELET_ANNOTATIONS[self.short]
        texts = [format_ids(grant.ids) for grant in grants]
        log.info("Allocate %s: %s", self.resource, "; ".join(texts))
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(annotations={annotation: text}) for text in texts
            ]
        )

    def _numbers(self, devices: Sequence[str]) -> frozenset[int]:
        try:
            return frozenset(id_number(d) for d in devices)
        except BadIds as e:
            raise _refuse(f"{self.resource}: {e}") from None
