"""Kubernetes: the kubelet device plugin and what it hands the NRI plugin.

The node advertises three extended resources (`nri_gpushare.names.RESOURCES`), so that
kube-scheduler, not a scheduler of ours, picks the node a share goes to:

- ``gpushare.io/gpu-memory``: GiB, ``floor((memory - memory_reserve) / 1 GiB)``
  per shareable GPU, summed over the node;
- ``gpushare.io/gpu-core``: percent, 100 per GPU;
- ``gpushare.io/gpu-count``: GPUs.

A container asks with ``resources.limits``.  The values are what the scheduler
counts, so they are totals over the container's GPUs: ``gpu-memory: 8`` with
``gpu-count: 2`` is 4 GiB on each of two GPUs (8 must divide by 2), and
``gpu-core: 60`` with ``gpu-count: 2`` is 30 % of each.  Without
``gpu-count`` the container gets one GPU.

The device plugin (`plugin`) advertises one device per unit, with IDs that are
decimal numbers ``"0"``, ``"1"``, ... per resource.  The kubelet picks the IDs
a container gets and calls ``Allocate``; the answer puts them on the
container as the annotation ``gpushare.io/kubelet.<resource>``
(`nri_gpushare.names.KUBELET_ANNOTATIONS`), written as ranges (``"0-7,12"``,
`nri_gpushare.share.ids`).  The kubelet copies a device plugin's
annotations into the CRI container config, so the NRI plugin sees them as the
container's own annotations and turns them into the container's request (the
number of IDs is the amount); the pod's creator cannot write them there (pod
annotations stay on the pod, and a pod annotation under
``gpushare.io/kubelet.`` is refused as a forgery).  The daemon keeps the IDs
in its records and shows them per allocation in ``status --json``
(``kubelet``), which is how the device plugin learns which IDs live containers
hold.

Capacity: for each resource the device plugin reports as healthy the IDs that
live containers and recent ``Allocate`` calls hold, plus as many others as the
allocator can still place (`capacity`), the rest unhealthy; the kubelet's
allocatable is then exactly what can be placed.
"""

from __future__ import annotations

from typing import Final

API_VERSION: Final = "v1beta1"
KUBELET_SOCKET: Final = "kubelet.sock"
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"


def endpoint(short: str) -> str:
    """The socket file name (in the device-plugin dir) serving one resource."""
    return f"gpushare-{short}.sock"
