"""The product's shared vocabulary: one name per meaning, imported by every
layer (it imports nothing of ours).

Keys of ours in annotations, labels and environment names start with
`KEY_PREFIX` (``gpushare.io/``).  The node advertises three extended
resources (`RESOURCES`); the kubelet device plugin hands a container the IDs
it allocated in annotations under `KUBELET_PREFIX`, one per resource
(`KUBELET_ANNOTATIONS`), which only the kubelet may write (see
`nri_gpushare.k8s`).
"""

from __future__ import annotations

from typing import Final

DOMAIN: Final = "gpushare.io"
KEY_PREFIX: Final = f"{DOMAIN}/"
"""Every annotation, label or key of ours starts with this."""
ASSIGNED: Final = KEY_PREFIX + "assigned"
"""The annotation that records what a container was given."""

MEMORY: Final = "gpu-memory"
CORE: Final = "gpu-core"
COUNT: Final = "gpu-count"
RESOURCES: Final = {name: f"{DOMAIN}/{name}" for name in (MEMORY, CORE, COUNT)}
"""short name -> the extended resource's name."""

KUBELET_PREFIX: Final = f"{DOMAIN}/kubelet."
KUBELET_ANNOTATIONS: Final = {name: KUBELET_PREFIX + name for name in RESOURCES}
"""short name -> the container annotation the device plugin's Allocate sets."""

DRA_CLAIM_ENV: Final = "GPUSHARE_DRA_CLAIM"
"""The variable a prepared DRA claim's CDI device sets in a container: the
claim's UID (see `nri_gpushare.k8s.dra`)."""

PROC_ROOT: Final = "/proc/gpushare"
"""Where gpushare.ko's procfs tree lives."""
DEFAULT_DEVICE_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins"
