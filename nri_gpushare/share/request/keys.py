"""Requests written as ``gpushare.io/`` keys: pod annotations (pod-wide and
per container) and the container's own annotations and labels.

An unknown ``gpushare.io/`` key in an annotation is refused: a person typed it
(e.g. a misspelt request).  One in the container's labels is only logged:
containerd merges the image's labels in, and an image may carry labels of its
own under our prefix (``gpushare.io/maintainer``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import NamedTuple, TypeVar

from nri_gpushare.names import ASSIGNED, KEY_PREFIX, KUBELET_PREFIX
from nri_gpushare.share.model import ISOLATIONS, PLACEMENTS, PRIORITIES, ShareRefused
from nri_gpushare.share.request.settings import Context, Setting, Settings
from nri_gpushare.share.request.values import (
    Invalid,
    choice,
    core_list,
    equal,
    is_number,
    memory_list,
    same_list,
)
from nri_gpushare.units import quote

log = logging.getLogger(__name__)

T = TypeVar("T")

KEYS = ("gpu-memory", "gpu-core", "gpu-count", "gpu-devices", "priority", "placement", "isolation")
_FULL = {key: KEY_PREFIX + key for key in KEYS}
KUBELET = KUBELET_PREFIX[len(KEY_PREFIX) :]  # "kubelet."


def from_keys(ctx: Context) -> Settings:
    """Levels 1-3: per-container pod annotation > pod annotation > the
    container's annotation or label (one level: they must agree)."""
    c = ctx.c
    _check_pod_keys(ctx, c.pod_annotations)
    own = _check_container_keys(ctx, c.annotations, "container annotation")
    own |= _check_container_keys(ctx, c.labels, "container label", unknown_ok=True)
    pod = _Sources(f"{KEY_PREFIX}container.{c.name}.", own)

    def count(text: str) -> int:
        if not is_number(text) or int(text) < 1:
            raise Invalid(
                f"must be a whole number of GPUs, at least 1 (this node has {len(ctx.gpus)})"
            )
        return int(text)

    return Settings(
        memory=_find(ctx, pod, "gpu-memory", memory_list, same_list),
        core=_find(ctx, pod, "gpu-core", core_list, same_list),
        count=_find(ctx, pod, "gpu-count", count, equal),
        devices=_find(ctx, pod, "gpu-devices", ctx.parse_gpus, equal),
        priority=_find(ctx, pod, "priority", _PRIORITY, equal),
        placement=_find(ctx, pod, "placement", _PLACEMENT, equal),
        isolation=_find(ctx, pod, "isolation", _ISOLATION, equal),
    )


_PRIORITY, _PLACEMENT, _ISOLATION = choice(PRIORITIES), choice(PLACEMENTS), choice(ISOLATIONS)


class _Sources(NamedTuple):
    own_prefix: str  # "gpushare.io/container.<name>." in the pod's annotations
    container: bool  # whether the container's annotations or labels have keys


def _find(
    ctx: Context, src: _Sources, key: str, parse: Callable[[str], T], same: Callable[[T, T], bool]
) -> Setting[T] | None:
    c = ctx.c
    own = src.own_prefix + key
    if (text := c.pod_annotations.get(own)) is not None:
        return _value(ctx, parse, text, own, "pod annotation", "container")
    full = _FULL[key]
    if (text := c.pod_annotations.get(full)) is not None:
        return _value(ctx, parse, text, full, "pod annotation", "pod")
    if not src.container:
        return None
    ann, lab = c.annotations.get(full), c.labels.get(full)
    a = b = None
    if ann is not None:
        a = _value(ctx, parse, ann, full, "container annotation", "container")
    if lab is not None:
        b = _value(ctx, parse, lab, full, "container label", "container")
    return ctx.pick(a, b, same)


def _value(
    ctx: Context, parse: Callable[[str], T], text: str, full_key: str, where: str, level: str
) -> Setting[T]:
    cite = f"{where} {full_key}={quote(text)}"
    try:
        value = parse(text.strip())
    except Invalid as e:
        raise ctx.fail(f"{cite}: {e}", full_key) from None
    return Setting(value, cite, full_key, level)


def _check_pod_keys(ctx: Context, annotations: Mapping[str, str]) -> None:
    for key in annotations:
        if not key.startswith(KEY_PREFIX) or key == ASSIGNED:
            continue
        rest = key[len(KEY_PREFIX) :]
        if rest.startswith("container."):
            _, _, name_key = rest.partition(".")
            name, _, sub = name_key.rpartition(".")
            if name and sub in KEYS:
                continue
            raise ctx.fail(
                f"pod annotation {quote(key)}: not a known key; per-container keys are "
                f"{KEY_PREFIX}container.<name>.<key> with <key> one of {', '.join(KEYS)}",
                key,
            )
        if rest not in KEYS:
            raise _unknown(ctx, key, "pod annotation")


def _check_container_keys(
    ctx: Context, values: Mapping[str, str], where: str, unknown_ok: bool = False
) -> bool:
    """Refuses unknown keys (only logs them when `unknown_ok`: labels, which
    come with the image); True when `values` has a request key."""
    found = False
    for key in values:
        if not key.startswith(KEY_PREFIX) or key == ASSIGNED:
            continue
        rest = key[len(KEY_PREFIX) :]
        # Pod annotations copied to the container by the runtime: read from the pod;
        # the device plugin's (resources.limits): read by `kubelet`.
        if rest.startswith(("container.", KUBELET)):
            continue
        if rest in KEYS:
            found = True
        elif unknown_ok:
            log.warning(
                "%s: %s %s is not a gpushare.io request key; ignored (known keys: %s)",
                ctx.c.describe(),
                where,
                quote(key),
                ", ".join(KEYS),
            )
        else:
            raise _unknown(ctx, key, where)
    return found


def _unknown(ctx: Context, key: str, where: str) -> ShareRefused:
    known = ", ".join(KEY_PREFIX + k for k in KEYS)
    return ctx.fail(f"{where} {quote(key)}: not a known key; known keys are {known}", key)
