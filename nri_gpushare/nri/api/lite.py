"""A fast, strict protobuf codec for the NRI messages on the plugin's hot path.

betterproto spends milliseconds on one CreateContainerRequest, while the
runtime calls plugins under a node-wide lock. This codec never decodes a
whole request: a request decoder only splits its top level, and the pod and
container are lazy *views* over the request's own bytes, each field decoded
(and checked: malformed bytes raise `DecodeError`) when a handler first reads
it; ``view.contains(b"...")`` searches a view's bytes without decoding them,
and ``view.message()`` checks and parses the full betterproto object. It also
encodes the few responses a plugin sends, byte for byte as betterproto
serializes the equivalent message.

The parts: `views` (the pod and container views, the checked betterproto
parse), `request_views` (the requests around them), `decode` (requests into
views), `encode` (responses), `fields` (the field numbers, as in nri.proto),
all on the one protobuf walker `wire.pb`. This module is their public face:
import from here.
"""

from __future__ import annotations

from nri_gpushare.nri.api.decode import (
    decode_configure_request,
    decode_container,
    decode_create_container_request,
    decode_pod_container_request,
    decode_pod_request,
    decode_pod_sandbox,
    decode_state_change,
    decode_stop_container_request,
    decode_synchronize_request,
    decode_update_container_request,
    decode_update_pod_sandbox_request,
    decode_validate_adjustment_request,
)
from nri_gpushare.nri.api.encode import (
    EMPTY,
    Adjustment,
    Device,
    MountSpec,
    encode_configure_response,
    encode_container_adjustment,
    encode_create_container_response,
    encode_stop_container_response,
    encode_synchronize_response,
    encode_update_container_response,
    encode_validate_adjustment_response,
)
from nri_gpushare.nri.api.request_views import (
    ConfigureRequestView,
    ContainerRequestView,
    PodContainerRequestView,
    StateChangeView,
    SynchronizeRequestView,
    UpdateContainerRequestView,
    UpdatePodSandboxRequestView,
    ValidateAdjustmentRequestView,
)
from nri_gpushare.nri.api.views import ContainerView, PodSandboxView
from nri_gpushare.nri.wire.errors import DecodeError

__all__ = [
    "EMPTY",
    "Adjustment",
    "ConfigureRequestView",
    "ContainerRequestView",
    "ContainerView",
    "DecodeError",
    "Device",
    "MountSpec",
    "PodContainerRequestView",
    "PodSandboxView",
    "StateChangeView",
    "SynchronizeRequestView",
    "UpdateContainerRequestView",
    "UpdatePodSandboxRequestView",
    "ValidateAdjustmentRequestView",
    "decode_configure_request",
    "decode_container",
    "decode_create_container_request",
    "decode_pod_container_request",
    "decode_pod_request",
    "decode_pod_sandbox",
    "decode_state_change",
    "decode_stop_container_request",
    "decode_synchronize_request",
    "decode_update_container_request",
    "decode_update_pod_sandbox_request",
    "decode_validate_adjustment_request",
    "encode_configure_response",
    "encode_container_adjustment",
    "encode_create_container_response",
    "encode_stop_container_response",
    "encode_synchronize_response",
    "encode_update_container_response",
    "encode_validate_adjustment_response",
]
