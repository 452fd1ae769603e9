"""Requests written as ``gpushare.io/`` keys: pod annotations (pod-wide and
per container) and the container's own annotations and labels."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from ..model import ASSIGNED, ISOLATIONS, PLACEMENTS, PREFIX, PRIORITIES, ShareRefused
from .settings import Context, Setting, Settings
from .values import Invalid, choice, core_list, equal, is_number, memory_list, same_list

T = TypeVar("T")

KEYS = ("gpu-memory", "gpu-core", "gpu-count", "gpu-devices", "priority", "placement", "isolation")


def from_keys(ctx: Context) -> Settings:
    """Levels 1-3: per-container pod annotation > pod annotation > the
    container's annotation or label (one level: they must agree)."""
    c = ctx.c
    _check_pod_keys(ctx, c.pod_annotations)
    _check_container_keys(ctx, c.annotations, "container annotation")
    _check_container_keys(ctx, c.labels, "container label")

    def count(text: str) -> int:
        if not is_number(text) or int(text) < 1:
            raise Invalid(
                f"must be a whole number of GPUs, at least 1 (this node has {len(ctx.gpus)})"
            )
        return int(text)

    return Settings(
        memory=_find(ctx, "gpu-memory", memory_list, same_list),
        core=_find(ctx, "gpu-core", core_list, same_list),
        count=_find(ctx, "gpu-count", count, equal),
        devices=_find(ctx, "gpu-devices", ctx.gpu_list.parse, equal),
        priority=_find(ctx, "priority", choice(PRIORITIES), equal),
        placement=_find(ctx, "placement", choice(PLACEMENTS), equal),
        isolation=_find(ctx, "isolation", choice(ISOLATIONS), equal),
    )


def _find(
    ctx: Context, key: str, parse: Callable[[str], T], same: Callable[[T, T], bool]
) -> Setting[T] | None:
    c = ctx.c
    own = f"{PREFIX}container.{c.name}.{key}"
    if (text := c.pod_annotations.get(own)) is not None:
        return _value(ctx, parse, text, own, "pod annotation", "container")
    if (text := c.pod_annotations.get(PREFIX + key)) is not None:
        return _value(ctx, parse, text, PREFIX + key, "pod annotation", "pod")
    ann, lab = c.annotations.get(PREFIX + key), c.labels.get(PREFIX + key)
    a = b = None
    if ann is not None:
        a = _value(ctx, parse, ann, PREFIX + key, "container annotation", "container")
    if lab is not None:
        b = _value(ctx, parse, lab, PREFIX + key, "container label", "container")
    return ctx.pick(a, b, same)


def _value(
    ctx: Context, parse: Callable[[str], T], text: str, full_key: str, where: str, level: str
) -> Setting[T]:
    cite = f"{where} {full_key}={text}"
    try:
        value = parse(text.strip())
    except Invalid as e:
        raise ctx.fail(f"{cite}: {e}", full_key) from None
    return Setting(value, cite, full_key, level)


def _check_pod_keys(ctx: Context, annotations: Mapping[str, str]) -> None:
    for key in annotations:
        if not key.startswith(PREFIX) or key == ASSIGNED:
            continue
        rest = key[len(PREFIX) :]
        if rest.startswith("container."):
            _, _, name_key = rest.partition(".")
            name, _, sub = name_key.rpartition(".")
            if name and sub in KEYS:
                continue
            raise ctx.fail(
                f"pod annotation {key}: not a known key; per-container keys are "
                f"{PREFIX}container.<name>.<key> with <key> one of {', '.join(KEYS)}",
                key,
            )
        if rest not in KEYS:
            raise _unknown(ctx, key, "pod annotation")


def _check_container_keys(ctx: Context, values: Mapping[str, str], where: str) -> None:
    for key in values:
        if not key.startswith(PREFIX) or key == ASSIGNED:
            continue
        rest = key[len(PREFIX) :]
        # Pod annotations copied to the container by the runtime: read from the pod.
        if rest.startswith("container."):
            continue
        if rest not in KEYS:
            raise _unknown(ctx, key, where)


def _unknown(ctx: Context, key: str, where: str) -> ShareRefused:
    return ctx.fail(
        f"{where} {key}: not a known key; known keys are {', '.join(PREFIX + k for k in KEYS)}",
        key,
    )
