"""What one source says about a request, typed per attribute, and how sources
combine: a higher source wins, but two sources that both set an attribute must
agree (`merge`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Generic, TypeVar

from nri_gpushare.share.model import (
    ContainerInfo,
    Gpu,
    Isolation,
    NodePolicy,
    Placement,
    Priority,
    ShareRefused,
)
from nri_gpushare.share.request.values import GpuList, equal, same_list

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class Setting(Generic[T_co]):
    """One attribute's value and where it came from."""

    value: T_co
    cite: str  # "pod annotation gpushare.io/gpu-memory=2Gi"
    key: str  # what a person edits
    level: str  # "container" (set on the container itself), "pod" or "env"
    default_count: int | None = None  # GPUs the value implies (cGPU: every GPU)


@dataclass(frozen=True)
class Settings:
    """Everything one source (or a merge of sources) sets; None: not set."""

    memory: Setting[tuple[int, ...]] | None = None
    core: Setting[tuple[int, ...]] | None = None
    count: Setting[int] | None = None
    devices: Setting[tuple[int, ...]] | None = None
    priority: Setting[Priority] | None = None
    placement: Setting[Placement] | None = None
    isolation: Setting[Isolation] | None = None

    def present(self) -> dict[str, Setting[object]]:
        """attribute -> setting, for the attributes that are set."""
        every: dict[str, Setting[object] | None] = {
            "memory": self.memory,
            "core": self.core,
            "count": self.count,
            "devices": self.devices,
            "priority": self.priority,
            "placement": self.placement,
            "isolation": self.isolation,
        }
        return {attr: s for attr, s in every.items() if s is not None}


NOTHING = Settings()
"""A source that sets nothing (shared: Settings is immutable)."""


class Context:
    """The container being parsed and the node it is parsed for."""

    def __init__(self, c: ContainerInfo, gpus: Sequence[Gpu], policy: NodePolicy) -> None:
        self.c = c
        self.gpus = list(gpus)
        self.policy = policy

    @cached_property
    def gpu_list(self) -> GpuList:
        """The node's GPUs as a list parser (built when a request names GPUs)."""
        return GpuList(self.gpus)

    def parse_gpus(self, text: str) -> tuple[int, ...]:
        """A GPU list (indexes or UUIDs) of this node."""
        return self.gpu_list.parse(text)

    def fail(self, message: str, key: str | None, reason: str = "invalid") -> ShareRefused:
        return ShareRefused(f"gpushare: {self.c.describe()}: {message}", reason, key)

    def conflict(self, a: Setting[object], b: Setting[object]) -> ShareRefused:
        return self.fail(
            f"{a.cite} disagrees with {b.cite}; remove one of them or make them agree",
            a.key,
            "conflict",
        )

    def pick(
        self, a: Setting[T] | None, b: Setting[T] | None, same: Callable[[T, T], bool]
    ) -> Setting[T] | None:
        """`a` over `b`; both set and different is a conflict."""
        if a is None:
            return b
        if b is not None and not same(a.value, b.value):
            raise self.conflict(a, b)
        return a


def merge(ctx: Context, high: Settings, low: Settings) -> Settings:
    """`high` over `low`, attribute by attribute; disagreement is a conflict."""
    if low is NOTHING:
        return high
    if high is NOTHING:
        return low
    return Settings(
        memory=ctx.pick(high.memory, low.memory, same_list),
        core=ctx.pick(high.core, low.core, same_list),
        count=ctx.pick(high.count, low.count, equal),
        devices=ctx.pick(high.devices, low.devices, equal),
        priority=ctx.pick(high.priority, low.priority, equal),
        placement=ctx.pick(high.placement, low.placement, equal),
        isolation=ctx.pick(high.isolation, low.isolation, equal),
    )
