"""Requests from a pod's ``resources.limits``, as the kubelet hands them over.

The device plugin's Allocate puts the device IDs the kubelet picked on the
container as ``gpushare.io/kubelet.<resource>`` annotations
(`nri_gpushare.k8s`); the number of IDs is the amount the pod's spec asked
for and the scheduler counted.  The amounts are totals over the container's
GPUs: ``gpu-memory: 8`` with ``gpu-count: 2`` is 4 GiB on each of two GPUs.

Only the device plugin writes these (through the kubelet, into the CRI
container config), so anything else that carries them is refused
(`check_forged`): a pod annotation of that prefix (containerd's
pod_annotations passthrough would copy it onto the container, where it would
read as the kubelet's), and any annotation or label of that prefix on a
container that is not in a pod.  The IDs are still parsed as untrusted text.
"""

from __future__ import annotations

from collections.abc import Mapping

from nri_gpushare.names import CORE, COUNT, KUBELET_ANNOTATIONS, KUBELET_PREFIX, MEMORY, RESOURCES
from nri_gpushare.share.ids import BadIds, format_ids, parse_ids
from nri_gpushare.share.model import ContainerInfo, ShareRefused
from nri_gpushare.share.request.settings import NOTHING, Context, Setting, Settings
from nri_gpushare.share.request.values import CORE_RULE
from nri_gpushare.units import GiB, format_bytes, quote

LIMITS = "resources.limits"

_ASK_INSTEAD = (
    f"ask with {LIMITS} {RESOURCES[MEMORY]} / {CORE} / {COUNT} instead (docs/kubernetes.md)"
)


def check_forged(c: ContainerInfo) -> None:
    """Refuse (reason "forbidden") what poses as the device plugin's annotations."""
    for key in c.pod_annotations:
        if key.startswith(KUBELET_PREFIX):
            raise _forbidden(
                c,
                f"pod annotation {quote(key)}: {KUBELET_PREFIX}* annotations are written "
                f"only by nri-gpushare's device plugin through the kubelet; remove it and "
                + _ASK_INSTEAD,
                key,
            )
    if c.pod_name:
        return
    for where, mapping in (("container annotation", c.annotations), ("container label", c.labels)):
        for key in mapping:
            if key.startswith(KUBELET_PREFIX):
                raise _forbidden(
                    c,
                    f"{where} {quote(key)}: only Kubernetes pods get {KUBELET_PREFIX}* "
                    f"annotations, from nri-gpushare's device plugin; remove it and ask with "
                    f"gpushare.io/gpu-memory (and gpu-core, gpu-count) instead",
                    key,
                )


def _forbidden(c: ContainerInfo, message: str, key: str) -> ShareRefused:
    return ShareRefused(f"gpushare: {c.describe()}: {message}", "forbidden", key)


def kubelet_ids(ctx: Context) -> dict[str, frozenset[int]]:
    """Resource short name -> the IDs the kubelet gave the container (only
    the resources it has); ShareRefused for text the device plugin would not
    write."""
    out: dict[str, frozenset[int]] = {}
    for key, text in ctx.c.annotations.items():
        if not key.startswith(KUBELET_PREFIX):
            continue
        short = key[len(KUBELET_PREFIX) :]
        if KUBELET_ANNOTATIONS.get(short) != key:
            known = ", ".join(KUBELET_ANNOTATIONS.values())
            raise ctx.fail(
                f"container annotation {quote(key)}: not one nri-gpushare's device plugin "
                f"writes ({known}); are the device plugin and this plugin the same version?",
                key,
            )
        try:
            out[short] = parse_ids(text)
        except BadIds as e:
            raise ctx.fail(
                f"container annotation {key}={quote(text)}: {e}; it is written by "
                f"nri-gpushare's device plugin (Allocate), not by a person: are the device "
                f"plugin and this plugin the same version?",
                key,
            ) from None
    return out


def canonical(ids: Mapping[str, frozenset[int]]) -> dict[str, str]:
    """short name -> ranges text, as recorded and shown in status."""
    return {short: format_ids(ids[short]) for short in sorted(ids)}


def from_kubelet(ctx: Context) -> Settings:
    """What ``resources.limits`` asks for (per GPU), or nothing."""
    return settings_for(ctx, kubelet_ids(ctx))


def settings_for(ctx: Context, ids: Mapping[str, frozenset[int]]) -> Settings:
    if not ids:
        return NOTHING
    amounts = {short: len(v) for short, v in ids.items()}
    memory_key, core_key, count_key = RESOURCES[MEMORY], RESOURCES[CORE], RESOURCES[COUNT]
    if MEMORY not in amounts:
        given = " and ".join(f"{RESOURCES[s]}={n}" for s, n in sorted(amounts.items()))
        raise ctx.fail(
            f"{LIMITS} {given} needs {memory_key} in {LIMITS} too "
            f"(GiB of GPU memory, the total over the container's GPUs, e.g. {memory_key}: 4)",
            memory_key,
        )
    n, k = amounts[MEMORY], amounts.get(COUNT, 1)
    if n % k:
        raise ctx.fail(
            f"{LIMITS} {memory_key}={n}: {MEMORY} is the total over {COUNT} GPUs: "
            f"{n} over {k} GPUs is not whole GiB; use a multiple of {k}",
            memory_key,
        )
    per_gpu = n // k * GiB
    memory_cite = f"{LIMITS} {memory_key}={n}"
    if k > 1:
        memory_cite += f" ({format_bytes(per_gpu)} on each of {k} GPUs)"
    if COUNT in amounts:
        count = Setting(k, f"{LIMITS} {count_key}={k}", count_key, "container")
    else:
        count = Setting(1, f"{memory_cite} without {count_key} (one GPU)", memory_key, "container")
    core = None
    if (c := amounts.get(CORE)) is not None:
        if c % (5 * k) or c > 100 * k:
            each = f"{c // k}%" if c % k == 0 else "not a whole percent"
            raise ctx.fail(
                f"{LIMITS} {core_key}={c}: {CORE} is the total over {COUNT} GPUs: {c} over "
                f"{k} GPU{'s' if k > 1 else ''} is {each} per GPU, which {CORE_RULE}; "
                f"use a multiple of {5 * k} from {5 * k} to {100 * k}",
                core_key,
            )
        core_cite = f"{LIMITS} {core_key}={c}"
        if k > 1:
            core_cite += f" ({c // k}% on each of {k} GPUs)"
        core = Setting((c // k,), core_cite, core_key, "container")
    return Settings(
        memory=Setting((per_gpu,), memory_cite, memory_key, "container"),
        core=core,
        count=count,
    )


def recorded_ids(c: ContainerInfo) -> dict[str, str]:
    """The device IDs a live container carries, canonical, for a share
    recovered without a record of them (a bad value is left out: this never
    refuses)."""
    out = {}
    for short, key in KUBELET_ANNOTATIONS.items():
        if (text := c.annotations.get(key)) is not None:
            try:
                out[short] = format_ids(parse_ids(text))
            except BadIds:
                continue
    return out
