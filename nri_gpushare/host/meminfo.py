"""Memory in use per container and GPU, from gpushare.ko's meminfo: the share
domain's `MemoryUsage`, read off the event loop."""

from __future__ import annotations

from collections.abc import Sequence

from nri_gpushare.host.worker import BlockingWorker
from nri_gpushare.share.usage import MemoryUse


class ModuleMemInfo:
    """`MemoryUsage` from gpushare.ko's meminfo (/proc/gpushare/<gpu>/<id>/meminfo),
    read on a worker thread.  `client` is the module's procfs client: its
    `meminfo(gpu, container_id)` gives `free` and `processes` (pid -> bytes),
    and `used` (memsize - free) when it read memsize; else used is the quota
    minus free."""

    def __init__(self, client: object, worker: BlockingWorker) -> None:
        self.client = client
        self.worker = worker

    async def usage(
        self, wanted: Sequence[tuple[int, str, int]]
    ) -> dict[tuple[int, str], MemoryUse]:
        read = getattr(self.client, "meminfo", None)
        if read is None:
            why = "unknown: this plugin's kernel-module client cannot read meminfo"
            return {(gpu, cid): MemoryUse(None, {}, why) for gpu, cid, _ in wanted}

        def batch() -> dict[tuple[int, str], MemoryUse]:
            out = {}
            for gpu, cid, quota in wanted:
                try:
                    info = read(gpu, cid)
                    processes = {int(p): int(b) for p, b in dict(info.processes).items()}
                    used = getattr(info, "used", None)  # memsize - free, of one moment
                    if not isinstance(used, int) or not getattr(info, "memsize", 0):
                        used = quota - int(info.free)
                    out[gpu, cid] = MemoryUse(max(0, used), processes, "")
                except Exception as e:  # noqa: BLE001 - one unreadable entry is shown as such
                    out[gpu, cid] = MemoryUse(None, {}, f"unknown: meminfo unreadable ({e})")
            return out

        try:
            return await self.worker.call(batch, "reading meminfo")
        except TimeoutError as e:
            return {(gpu, cid): MemoryUse(None, {}, f"unknown: {e}") for gpu, cid, _ in wanted}

    def close(self) -> None:
        self.worker.close()
