"""What `nri-gpushare resize` asks, checked like a new request: the new
memory, compute and priority of a running container's share, and the
refusals that need no placement (bad values, a share the kubelet accounted,
one whose limits cannot change live).

The values are text (from the command line or the local API) and parsed
with the request's own parsers (`request.values`): memory as ``gpu-memory``
(a size per GPU, a short list repeats its last value), compute as
``gpu-core`` (5..100 in steps of 5 per GPU), priority normal|high.  An empty
text leaves that part as it is.  The share keeps its GPUs and their order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nri_gpushare.names import KUBELET_PREFIX, RESOURCES
from nri_gpushare.share.kernel import KmodError, MemoryHeld, OverCommitted, UpgradeInProgress
from nri_gpushare.share.model import PRIORITIES, Allocation, NodePolicy, ShareRefused
from nri_gpushare.share.request.values import Invalid, choice, core_list, expand, memory_list
from nri_gpushare.units import format_bytes, quote


@dataclass(frozen=True)
class ResizeAsk:
    """The new values as given; "" leaves a part unchanged."""

    memory: str = ""
    core: str = ""
    priority: str = ""

    def empty(self) -> bool:
        return not (self.memory or self.core or self.priority)


def who(alloc: Allocation) -> str:
    """The container, for messages."""
    pod = f" (pod {quote(alloc.pod)})" if alloc.pod else ""
    where = f" ({alloc.where})" if alloc.local else ""
    return f"container '{quote(alloc.name or alloc.container_id)}'{pod}{where}"


def resized(alloc: Allocation, ask: ResizeAsk, policy: NodePolicy) -> Allocation:
    """`alloc` with the values `ask` gives; raises ShareRefused ("invalid")
    for a value the same key of a new request would be refused for."""
    fail = f"gpushare: cannot resize {who(alloc)}"
    if ask.empty():
        raise ShareRefused(f"{fail}: nothing to change: give a memory, core or priority", "invalid")
    n = len(alloc.shares)
    memory = tuple(s.memory_bytes for s in alloc.shares)
    core = tuple(s.core_percent for s in alloc.shares)
    priority = alloc.priority
    what = ""
    try:
        if ask.memory:
            what = f"memory '{quote(ask.memory)}'"
            memory = _per_gpu(memory_list(ask.memory), n)
            if 0 in memory:
                raise Invalid(
                    "a share cannot be resized to 0 bytes (to give it up, stop the container)"
                )
        if ask.core:
            what = f"core '{quote(ask.core)}'"
            if alloc.isolation != "full":
                raise Invalid(
                    f"the share has isolation {alloc.isolation}, which has no compute limit"
                )
            core = _per_gpu(core_list(ask.core), n)
        if ask.priority:
            what = f"priority '{quote(ask.priority)}'"
            priority = choice(PRIORITIES)(ask.priority.strip())
            if priority == "high" and policy.max_high_priority_per_gpu == 0:
                raise Invalid("this node allows no high-priority containers")
    except Invalid as e:
        raise ShareRefused(f"{fail}: {what}: {e}", "invalid") from None
    shares = tuple(
        dataclasses.replace(s, memory_bytes=m, core_percent=c)
        for s, m, c in zip(alloc.shares, memory, core, strict=True)
    )
    return dataclasses.replace(alloc, shares=shares, priority=priority)


def _per_gpu(values: tuple[int, ...], n: int) -> tuple[int, ...]:
    if len(values) > n:
        gpus = "GPU" if n == 1 else "GPUs"
        raise Invalid(f"gives {len(values)} values, and the share has {n} {gpus}")
    return expand(values, n)


def check_kubelet(old: Allocation, new: Allocation) -> None:
    """A share from the pod's resources.limits or from a DRA claim keeps what
    the kubelet and the scheduler accounted: its memory and compute (its
    priority they do not count).  Raises ShareRefused ("forbidden")."""
    if old.shares == new.shares:
        return
    if old.claim:
        raise ShareRefused(
            f"gpushare: cannot resize {who(old)}: its share is DRA claim {old.claim}'s, which "
            f"the scheduler allocated from this node's ResourceSlice; a share changed here "
            f"would no longer be what it counts.  Give the pod a claim of the new size; its "
            f"priority can be changed here",
            "forbidden",
        )
    if not old.kubelet:
        return
    limits = ", ".join(sorted(RESOURCES[short] for short in old.kubelet))
    raise ShareRefused(
        f"gpushare: cannot resize {who(old)}: its share comes from the pod's resources.limits "
        f"({limits}), which the scheduler and the kubelet accounted on this node (the device "
        f"IDs of {KUBELET_PREFIX}*); a share changed here would no longer be what they count. "
        f"Resize such a pod by recreating it with new resources.limits (in-place pod resize "
        f"does not cover extended resources); its priority can be changed here",
        "forbidden",
    )


def check_live(old: Allocation, registered: bool, module_problem: str) -> None:
    """Only the kernel module changes a running container's limits: without
    its registration the container holds the limits of the environment it
    started with (GPUSHARE_MEMORY_LIMIT, GPUSHARE_CORE_LIMIT, GPUSHARE_PRIORITY,
    read once by the interposer), so a resize would change the books and not
    the container.  Raises ShareRefused ("kmod")."""
    if registered:
        return
    if old.isolation == "none":
        why = (
            "it has isolation none: nothing holds it to its share but the environment it "
            "was given at start"
        )
    else:
        module = f"the gpushare kernel module {module_problem}" if module_problem else ""
        why = (
            "it is not registered with the gpushare kernel module"
            + (f" ({module})" if module else " (it was created while the module did not serve)")
            + ": it runs standalone, held to its share by the CUDA interposer from the "
            "environment it was given at start"
        )
    raise ShareRefused(
        f"gpushare: cannot resize {who(old)} live: {why} (GPUSHARE_MEMORY_LIMIT, "
        f"GPUSHARE_CORE_LIMIT, GPUSHARE_PRIORITY), which cannot change while it runs; "
        f"nothing was changed. Recreate the container with the new share, or run it with "
        f"gpushare.ko loaded to resize it live",
        "kmod",
    )


def refusal(old: Allocation, new: Allocation, e: KmodError) -> ShareRefused:
    """The module's refusal of a resize it left unchanged, in the caller's words."""
    fail = f"gpushare: cannot resize {who(old)}"
    if isinstance(e, MemoryHeld):
        return ShareRefused(
            f"{fail}: its processes hold {format_bytes(e.held_bytes)} on GPU "
            f"{e.gpu_index}; it cannot shrink below that (asked "
            f"{format_bytes(_memory_on(new, e.gpu_index))}); nothing was changed",
            "capacity",
        )
    if isinstance(e, OverCommitted):
        return ShareRefused(
            f"{fail}: the gpushare kernel module has no room for it ({e}); nothing was changed",
            "capacity",
        )
    if isinstance(e, UpgradeInProgress):
        return ShareRefused(f"{fail}: {e}; nothing was changed", "kmod")
    return ShareRefused(
        f"{fail}: the gpushare kernel module refused it: {e} (errno {e.errno}); nothing "
        f"was changed",
        "kmod",
    )


def unsure(old: Allocation, new: Allocation, why: str, undo: str) -> ShareRefused:
    """A resize the module may hold in part: its change could not be undone."""
    return ShareRefused(
        f"gpushare: resizing {who(old)} to {new.describe_shares()} failed ({why}) and the "
        f"kernel module's quotas could not be changed back ({undo}): the change may have "
        f"been applied on some of its GPUs. Until the daemon has read the module's quotas "
        f"again (every few seconds, once it answers), it books the larger of both and "
        f"refuses another resize of it; then 'nri-gpushare status' shows what holds",
        "kmod",
    )


def larger(old: Allocation, new: Allocation) -> Allocation:
    """Per GPU the larger memory and compute of the two, high when either is."""
    shares = tuple(
        dataclasses.replace(
            a,
            memory_bytes=max(a.memory_bytes, b.memory_bytes),
            core_percent=max(a.core_percent, b.core_percent),
        )
        for a, b in zip(old.shares, new.shares, strict=True)
    )
    priority = "high" if old.high_priority or new.high_priority else old.priority
    return dataclasses.replace(old, shares=shares, priority=priority)


def _memory_on(alloc: Allocation, gpu: int) -> int:
    return next((s.memory_bytes for s in alloc.shares if s.index == gpu), 0)
