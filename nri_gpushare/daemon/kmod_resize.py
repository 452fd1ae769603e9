"""The kernel module off the event loop, with live quota changes: the host's
`OffLoopKernelModule` (one worker thread, every access under a timeout) and
`update_quota`, which `nri-gpushare resize` needs, on the same worker, so a
change is ordered with the registrations around it."""

from __future__ import annotations

from nri_gpushare.host.kmod_worker import OffLoopKernelModule
from nri_gpushare.share.kernel import GpuQuota


class ResizableKernelModule(OffLoopKernelModule):
    """`KernelModule` over a blocking client, quota changes included."""

    async def update_quota(self, container_id: str, quota: GpuQuota) -> None:
        await self._call(
            lambda: self.client.update_quota(container_id, quota),
            f"changing container {container_id}'s quota on GPU {quota.gpu_index}",
        )
