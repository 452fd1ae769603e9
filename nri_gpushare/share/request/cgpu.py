"""Requests written as Alibaba cGPU environment variables.

Considered only when ``ALIYUN_COM_GPU_MEM_CONTAINER`` is set or
``CGPU_DISABLE`` is true, as cGPU does; see the package docstring for each
variable.
"""

from __future__ import annotations

from nri_gpushare.share.model import Priority
from nri_gpushare.share.request.settings import NOTHING, Context, Setting, Settings
from nri_gpushare.share.request.values import Invalid, int_list
from nri_gpushare.units import GiB, quote

TRUE = ("1", "true", "yes")
FALSE = ("0", "false", "no", "")


def from_cgpu(ctx: Context) -> Settings:
    env = ctx.c.env
    disable = env.get("CGPU_DISABLE")
    if disable is not None:
        flag = disable.strip().lower()
        if flag in TRUE:
            cite = f"CGPU_DISABLE={quote(disable)}"
            return Settings(memory=Setting((0,), cite, "CGPU_DISABLE", "env"))
        if flag not in FALSE:
            raise ctx.fail(f"CGPU_DISABLE={quote(disable)}: must be true or false", "CGPU_DISABLE")
    text = env.get("ALIYUN_COM_GPU_MEM_CONTAINER")
    if text is None or not text.strip():
        return NOTHING
    key = "ALIYUN_COM_GPU_MEM_CONTAINER"
    cite = f"{key}={quote(text)}"
    try:
        gib = int_list(text, 0, None)
        if len(gib) > 1 and 0 in gib:
            raise Invalid("0 opts out and cannot be one value of a list")
    except Invalid as e:
        raise ctx.fail(
            f"{cite}: {e}; use whole GiB per GPU, e.g. 3 or 3,1 (0: no sharing)", key
        ) from None
    memory_values = tuple(v * GiB for v in gib)
    memory = Setting(memory_values, f"environment {cite}", key, "env", default_count=len(ctx.gpus))
    if memory_values == (0,):
        return Settings(memory=memory)
    return Settings(
        memory=memory,
        devices=_devices(ctx),
        core=_weight(ctx),
        priority=_priority(ctx),
    )


def memory_dev(ctx: Context) -> int | None:
    """ALIYUN_COM_GPU_MEM_DEV in bytes (informative only), None when unset."""
    var = "ALIYUN_COM_GPU_MEM_DEV"
    text = ctx.c.env.get(var)
    if text is None or not text.strip():
        return None
    try:
        (gib,) = int_list(text, 1, None, single=True)
    except Invalid:
        raise ctx.fail(
            f"{var}={quote(text)}: must be the GPU's memory in whole GiB (at least 1)", var
        ) from None
    return gib * GiB


def _devices(ctx: Context) -> Setting[tuple[int, ...]] | None:
    for var in ("ALIYUN_COM_GPU_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        devs = ctx.c.env.get(var)
        if devs is None or devs.strip().lower() in ("", "all", "none", "void"):
            continue
        cite = f"{var}={quote(devs)}"
        try:
            value = ctx.gpu_list.parse(devs.strip())
        except Invalid as e:
            raise ctx.fail(f"{cite}: {e}", var) from None
        return Setting(value, f"environment {cite}", var, "env")
    return None


def _weight(ctx: Context) -> Setting[tuple[int, ...]] | None:
    var = "ALIYUN_COM_GPU_SCHD_WEIGHT"
    w = ctx.c.env.get(var)
    if w is None or not w.strip():
        return None
    max_inst = ctx.policy.max_inst
    try:
        (weight,) = int_list(w, 1, max_inst, single=True)
    except Invalid:
        raise ctx.fail(
            f"{var}={quote(w)}: must be a whole number between 1 and {max_inst} "
            "(max_inst of this node)",
            var,
        ) from None
    if weight <= 1:
        return None
    core = max(5, 20 * weight // max_inst * 5)
    return Setting((core,), f"environment {var}={quote(w)} ({core}%)", var, "env")


def _priority(ctx: Context) -> Setting[Priority] | None:
    var = "ALIYUN_COM_GPU_HIGH_PRIO"
    p = ctx.c.env.get(var)
    if p is None:
        return None
    flag = p.strip().lower()
    if flag not in TRUE + FALSE:
        raise ctx.fail(f"{var}={quote(p)}: must be 1 (high) or 0 (normal)", var)
    priority: Priority = "high" if flag in TRUE else "normal"
    return Setting(priority, f"environment {var}={quote(p)}", var, "env")
