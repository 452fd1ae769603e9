"""Field numbers of the NRI messages the hand-written codec reads or writes.

One namespace per message, named after it, numbers as in nri.proto next to
this module (a test checks every one against the generated bindings). Plain
int constants rather than IntEnums: the decoders compare field numbers a few
hundred times per request, and an IntEnum comparison costs five times an int's.
"""

from __future__ import annotations

from typing import Final


class MapEntry:
    """Any map<K, V> entry."""

    KEY: Final = 1
    VALUE: Final = 2


class KeyValue:
    KEY: Final = 1
    VALUE: Final = 2


class PodSandbox:
    ID: Final = 1
    NAME: Final = 2
    UID: Final = 3
    NAMESPACE: Final = 4
    LABELS: Final = 5
    ANNOTATIONS: Final = 6
    RUNTIME_HANDLER: Final = 7
    LINUX: Final = 8
    PID: Final = 9
    IPS: Final = 10


class Container:
    ID: Final = 1
    POD_SANDBOX_ID: Final = 2
    NAME: Final = 3
    STATE: Final = 4
    LABELS: Final = 5
    ANNOTATIONS: Final = 6
    ARGS: Final = 7
    ENV: Final = 8
    MOUNTS: Final = 9
    HOOKS: Final = 10
    LINUX: Final = 11
    PID: Final = 12
    RLIMITS: Final = 13
    CREATED_AT: Final = 14
    STARTED_AT: Final = 15
    FINISHED_AT: Final = 16
    EXIT_CODE: Final = 17
    STATUS_REASON: Final = 18
    STATUS_MESSAGE: Final = 19
    CDI_DEVICES: Final = 20
    USER: Final = 21


class LinuxContainer:
    CGROUPS_PATH: Final = 5
    LAST: Final = 12  # fields 1..LAST are all messages, maps or strings


class ConfigureRequest:
    CONFIG: Final = 1
    RUNTIME_NAME: Final = 2
    RUNTIME_VERSION: Final = 3
    REGISTRATION_TIMEOUT: Final = 4
    REQUEST_TIMEOUT: Final = 5
    NRI_VERSION: Final = 6


class ConfigureResponse:
    EVENTS: Final = 2


class SynchronizeRequest:
    PODS: Final = 1
    CONTAINERS: Final = 2
    MORE: Final = 3


class SynchronizeResponse:
    UPDATE: Final = 1
    MORE: Final = 2


class PodContainerRequest:
    """CreateContainerRequest, StopContainerRequest and every v0.12 per-event
    request (RunPodSandboxRequest ... RemoveContainerRequest)."""

    POD: Final = 1
    CONTAINER: Final = 2


class UpdatePodSandboxRequest:
    POD: Final = 1
    OVERHEAD_LINUX_RESOURCES: Final = 2
    LINUX_RESOURCES: Final = 3


class UpdateContainerRequest:
    POD: Final = 1
    CONTAINER: Final = 2
    LINUX_RESOURCES: Final = 3


class StateChangeEvent:
    EVENT: Final = 1
    POD: Final = 2
    CONTAINER: Final = 3


class ValidateContainerAdjustmentRequest:
    POD: Final = 1
    CONTAINER: Final = 2
    ADJUST: Final = 3
    UPDATE: Final = 4
    OWNERS: Final = 5
    PLUGINS: Final = 6


class ValidateContainerAdjustmentResponse:
    REJECT: Final = 1
    REASON: Final = 2


class CreateContainerResponse:
    ADJUST: Final = 1
    UPDATE: Final = 2
    EVICT: Final = 3


class UpdateContainerResponse:
    UPDATE: Final = 1
    EVICT: Final = 2


class StopContainerResponse:
    UPDATE: Final = 1


class ContainerAdjustment:
    ANNOTATIONS: Final = 2
    MOUNTS: Final = 3
    ENV: Final = 4
    LINUX: Final = 6


class LinuxContainerAdjustment:
    DEVICES: Final = 1


class LinuxDevice:
    PATH: Final = 1
    TYPE: Final = 2
    MAJOR: Final = 3
    MINOR: Final = 4
    FILE_MODE: Final = 5
    UID: Final = 6
    GID: Final = 7


class OptionalValue:
    """OptionalFileMode, OptionalUInt32 and the other wrappers."""

    VALUE: Final = 1


class Mount:
    DESTINATION: Final = 1
    TYPE: Final = 2
    SOURCE: Final = 3
    OPTIONS: Final = 4
