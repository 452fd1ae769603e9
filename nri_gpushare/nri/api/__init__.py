"""NRI and ttrpc protobuf messages (betterproto bindings generated from the
.proto files next to this module by scripts/gen-protos.sh).

    from nri_gpushare.nri.api import nri, ttrpc
    nri.ConfigureResponse(events=...)

Generated names are snake_case fields and CamelCase classes: ``CDI_devices``
becomes ``cdi_devices``, ``NRI_version`` ``nri_version``, ``LinuxCPU``
``LinuxCpu``, ``CDIDevice`` ``CdiDevice``, ``POSIXRlimit`` ``PosixRlimit``,
``IOPrioClass`` ``IoPrioClass`` and the field ``class`` ``class_``. Whether an
optional wrapper (``OptionalInt`` ...) was set shows through
``betterproto.serialized_on_wire(msg.field)``.
"""

from nri_gpushare.nri.api.generated import ttrpc
from nri_gpushare.nri.api.generated.nri.pkg.api import v1alpha1 as nri

__all__ = ["nri", "ttrpc"]
