"""A scheduler simulation built only from what nodes advertise.

kube-scheduler's rule for extended resources (the NodeResourcesFit filter):
a pod fits a node when, for every extended resource it requests, the request
is at most the node's allocatable minus the requests of the pods already
bound there.  Extended resources cannot be overcommitted, so requests equal
limits.  Among the nodes that fit, this simulation takes the first (the real
scheduler scores them; which one wins does not matter here, only that a node
that does not fit is never chosen).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class SimNode:
    name: str
    allocatable: dict[str, int]  # resource -> healthy devices, as the kubelet reports them
    bound: dict[str, dict[str, int]] = field(default_factory=dict)  # pod -> its limits

    def remaining(self, resource: str) -> int:
        used = sum(limits.get(resource, 0) for limits in self.bound.values())
        return self.allocatable.get(resource, 0) - used

    def fits(self, limits: Mapping[str, int]) -> bool:
        return all(n <= self.remaining(r) for r, n in limits.items() if n)


class Scheduler:
    def __init__(self, nodes: list[SimNode]) -> None:
        self.nodes = {n.name: n for n in nodes}

    def schedule(self, pod: str, limits: Mapping[str, int]) -> SimNode | None:
        """Bind `pod` to the first node it fits; None: unschedulable."""
        for node in self.nodes.values():
            if node.fits(limits):
                node.bound[pod] = dict(limits)
                return node
        return None

    def delete(self, pod: str) -> None:
        for node in self.nodes.values():
            node.bound.pop(pod, None)
