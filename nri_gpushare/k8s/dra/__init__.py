"""Kubernetes Dynamic Resource Allocation (DRA): `nri-gpushare dra-driver`.

The driver publishes each GPU of the node as one device of a ResourceSlice,
with its memory, compute and container slots as consumable capacity (several
claims share one device up to its capacity, KEP-5075), and serves the
kubelet's DRA plugin API: preparing a claim books exactly the capacity the
scheduler allocated, on exactly the GPU it chose, in the daemon's table
(through the local API, the same table as pods and hand-started containers),
and answers with a CDI device written for that claim.  The NRI plugin
recognises a container given that device and holds it to the claim's share.

- `slices`: the ResourceSlice the node publishes (pure);
- `claims`: what a ResourceClaim's allocation asks of this node (pure);
- `kubeapi`: the API server (ResourceSlices, ResourceClaims);
- `kubelet`: the kubelet's side: registration, DRAPlugin, health stream;
- `claim_cdi`: the per-claim CDI spec files;
- `driver`: the parts composed (`serve`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from nri_gpushare.names import DRA_CLAIM_ENV

DRIVER: Final = "gpushare.io"
"""The DRA driver's name: ResourceSlice.spec.driver, the DeviceClass's selector,
the kubelet plugin's name."""
CAPACITY_MEMORY: Final = "memory"
"""Bytes of GPU memory (a quantity, e.g. 2Gi); requests in whole MiB."""
CAPACITY_COMPUTE: Final = "compute"
"""Percent of the GPU's compute, 5..100 in steps of 5 (the allocator's rule)."""
CAPACITY_SLOTS: Final = "slots"
"""Containers (claims) on the GPU: max_inst per GPU, each claim takes one."""
CLAIM_ENV: Final = DRA_CLAIM_ENV
"""The variable the per-claim CDI device sets: the claim's UID.  The NRI
plugin reads it to find the prepared claim (and checks that the container's
pod is one the claim is reserved for)."""
CDI_KIND: Final = "gpushare.io/claim"
"""The CDI kind of the per-claim devices: ``gpushare.io/claim=<claim UID>``."""


def device_name(index: int) -> str:
    """The ResourceSlice device of GPU `index`: ``gpu-0``, ``gpu-1``, ..."""
    return f"gpu-{index}"


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources answers it."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str = ""


@dataclass(frozen=True)
class DeviceHealth:
    """One published device's health for the kubelet's health stream."""

    pool: str
    device: str
    healthy: bool
    message: str = ""


class Preparer(Protocol):
    """What the kubelet's DRAPlugin service asks of the driver.  Both calls
    are idempotent: the kubelet retries them, also after either side restarted."""

    async def prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        """The claim's devices; raises `ClaimError` with a message the
        kubelet shows (`kubectl describe pod`)."""
        ...

    async def unprepare(self, claim: ClaimRef) -> None:
        """Release what `prepare` booked (nothing held: nothing to do);
        raises `ClaimError`."""
        ...

    def health(self) -> list[DeviceHealth]:
        """Every published device's health now."""
        ...


class ClaimError(Exception):
    """A claim that cannot be prepared or unprepared; str() is for a person."""
