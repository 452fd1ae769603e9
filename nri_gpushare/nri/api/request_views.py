"""The requests a plugin receives, as `decode` returns them: the pod and
container as lazy views (`views`), the rest as plain values or as bytes parsed
into betterproto messages on first use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import betterproto

from nri_gpushare.nri.api import nri
from nri_gpushare.nri.api.views import ContainerView, PodSandboxView, parse

M = TypeVar("M", bound=betterproto.Message)


def _parse_optional(cls: type[M], raw: bytes | None) -> M | None:
    return None if raw is None else parse(cls, raw)


def _cache() -> Any:
    """A dataclass field for a lazily parsed message: not an argument, not compared."""
    return field(default=None, init=False, repr=False, compare=False)


@dataclass(slots=True)
class ConfigureRequestView:
    config: str
    runtime_name: str
    runtime_version: str
    registration_timeout: int  # milliseconds; 0: not sent (NRI before v0.8)
    request_timeout: int  # milliseconds; 0: not sent
    nri_version: str
    raw: bytes = field(repr=False)
    _message: nri.ConfigureRequest | None = _cache()

    def message(self) -> nri.ConfigureRequest:
        """The full ConfigureRequest, parsed from `raw` on first use."""
        if self._message is None:
            self._message = parse(nri.ConfigureRequest, self.raw)
        return self._message


class SynchronizeRequestView(NamedTuple):
    pods: list[PodSandboxView]
    containers: list[ContainerView]
    more: bool


@dataclass(slots=True)
class ContainerRequestView:
    """Create/Stop and the other container-event requests (pod 1, container 2)."""

    pod: PodSandboxView
    container: ContainerView


@dataclass(slots=True)
class PodContainerRequestView:
    """A v0.12 per-event request; `container` is None for pod events."""

    pod: PodSandboxView
    container: ContainerView | None


@dataclass(slots=True)
class UpdateContainerRequestView:
    pod: PodSandboxView
    container: ContainerView
    linux_resources: bytes | None = field(repr=False)  # None when absent
    _resources: nri.LinuxResources | None = _cache()

    def linux_resources_message(self) -> nri.LinuxResources | None:
        """The requested LinuxResources, parsed on first use; None if absent."""
        if self._resources is None:
            self._resources = _parse_optional(nri.LinuxResources, self.linux_resources)
        return self._resources


@dataclass(slots=True)
class UpdatePodSandboxRequestView:
    """UpdatePodSandbox (NRI v0.10+): the pod and its new resources."""

    pod: PodSandboxView
    overhead_linux_resources: bytes | None = field(repr=False)  # None when absent
    linux_resources: bytes | None = field(repr=False)

    def overhead_message(self) -> nri.LinuxResources | None:
        """The pod's overhead resources, parsed; None if absent."""
        return _parse_optional(nri.LinuxResources, self.overhead_linux_resources)

    def resources_message(self) -> nri.LinuxResources | None:
        """The pod's resources, parsed; None if absent."""
        return _parse_optional(nri.LinuxResources, self.linux_resources)


@dataclass(slots=True)
class ValidateAdjustmentRequestView:
    """ValidateContainerAdjustment (NRI v0.10+): the container as it was before
    any plugin adjusted it; `message()` has the combined adjustment, the
    updates, which plugin set which field, and the plugins consulted."""

    pod: PodSandboxView
    container: ContainerView
    raw: bytes = field(repr=False)
    _message: nri.ValidateContainerAdjustmentRequest | None = _cache()

    def message(self) -> nri.ValidateContainerAdjustmentRequest:
        """The full request, parsed from `raw` on first use."""
        if self._message is None:
            self._message = parse(nri.ValidateContainerAdjustmentRequest, self.raw)
        return self._message


@dataclass(slots=True)
class StateChangeView:
    event: int  # nri.Event value
    pod: PodSandboxView
    container: ContainerView | None
