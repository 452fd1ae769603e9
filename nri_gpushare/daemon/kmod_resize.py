"""Kept only for tests that still import it: the daemon's kernel-module
client is `nri_gpushare.host.kmod_worker.OffLoopKernelModule`, quota changes
included.  Delete once nothing imports it."""

from nri_gpushare.host.kmod_worker import OffLoopKernelModule as ResizableKernelModule

__all__ = ["ResizableKernelModule"]
