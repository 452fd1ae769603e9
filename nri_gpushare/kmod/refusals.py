"""gpushare.ko's errno answers as the client interface's exceptions, with
messages that say what was asked, what is free and what to do."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Collection

from nri_gpushare.kmod import abi
from nri_gpushare.kmod.readings import GpuState
from nri_gpushare.share.kernel import (
    AlreadyRegistered,
    GpusNotDeclared,
    KmodError,
    ModuleNotLoaded,
    NotRegistered,
    OverCommitted,
    Registration,
    UpgradeInProgress,
)
from nri_gpushare.units import format_bytes

_CLASSES: dict[int, type[KmodError]] = {
    errno.EEXIST: AlreadyRegistered,
    errno.ENOENT: NotRegistered,
    errno.ENOSPC: OverCommitted,
    errno.ENODEV: ModuleNotLoaded,
    errno.ENXIO: GpusNotDeclared,
}
_GENERIC: dict[int, str] = {
    errno.EPERM: "permission denied: writing /proc/gpushare needs root (CAP_SYS_ADMIN)",
    errno.EACCES: "permission denied: /proc/gpushare's registry needs root"
    " (writes also CAP_SYS_ADMIN)",
    errno.ENODEV: "gpushare.ko is being unloaded",
    errno.EINVAL: "the module refused it as invalid",
}


def refusal(
    e: OSError, what: str, hints: dict[int, str], upgrading: Callable[[], bool]
) -> KmodError:
    """The exception for the module's answer `e` to `what`: the class its
    errno stands for, the hint for that errno (else a generic reason).
    EBUSY while `upgrading()` is UpgradeInProgress."""
    err = e.errno or errno.EIO
    if err == errno.EBUSY and upgrading():
        return UpgradeInProgress(
            f"{what}: gpushare.ko is being upgraded (nri-gpushare kmod-upgrade);"
            " try again once that is done",
            err,
        )
    detail = hints.get(err) or _GENERIC.get(err) or os.strerror(err)
    return _CLASSES.get(err, KmodError)(f"{what}: {detail}", err)


def explain_invalid(reg: Registration) -> str:
    """Why the module answers EINVAL to registering `reg`."""
    gpus = [q.gpu_index for q in reg.quotas]
    if not abi.valid_id(reg.container_id):
        return (
            f"the container ID must be 1..{abi.ID_MAX} characters of [A-Za-z0-9_.-]"
            f" and not one of {', '.join(abi.GPU_FILES)}"
        )
    if not reg.quotas:
        return "it names no GPU"
    if len(set(gpus)) != len(gpus):
        return "it names a GPU twice"
    for q in reg.quotas:
        if not 0 <= q.gpu_index < abi.MAX_GPUS:
            return f"GPU index {q.gpu_index} is outside 0..{abi.MAX_GPUS - 1}"
        if not 0 <= q.core_percent <= abi.WEIGHT_MAX:
            return f"compute {q.core_percent}% on GPU {q.gpu_index} is outside 0..100"
        if q.memory_bytes < 0:
            return f"memory on GPU {q.gpu_index} is negative"
    if any(q.memory_bytes == 0 for q in reg.quotas):
        return "it asks for 0 bytes (the default) and the module's default_memsize is 0"
    return "the module refused it as invalid"


def explain_undeclared(reg: Registration, declared: Collection[int]) -> str:
    """Which of `reg`'s GPUs are not among the `declared` ones (ENXIO)."""
    missing = sorted({q.gpu_index for q in reg.quotas} - set(declared))
    known = ", ".join(map(str, sorted(declared))) or "none"
    return f"GPU {', '.join(map(str, missing))} not declared (declared: {known})"


def explain_overcommit(reg: Registration, gpu_state: Callable[[int], GpuState]) -> str:
    """Which of `reg`'s GPUs are too full for it (ENOSPC); a GPU whose state
    cannot be read is left out."""
    full = []
    for q in reg.quotas:
        try:
            s = gpu_state(q.gpu_index)
        except KmodError:
            continue
        if (
            q.memory_bytes > s.free_memory
            or q.core_percent > s.free_weight
            or s.containers >= s.max_inst
        ):
            full.append(
                f"GPU {q.gpu_index} has {format_bytes(s.free_memory)} and"
                f" {s.free_weight}% compute free, {s.containers}/{s.max_inst} containers"
            )
    why = "; ".join(full) or "a GPU is full"
    return f"it would over-commit: {why}"
