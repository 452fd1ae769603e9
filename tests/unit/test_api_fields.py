"""The field numbers the hand-written codecs use (api.fields, the ttrpc
envelopes) are the schema's, checked against the generated bindings."""

from __future__ import annotations

from typing import Any

import betterproto
import pytest

from nri_gpushare.nri.api import fields, nri, ttrpc
from nri_gpushare.nri.wire import ttrpc as wire_ttrpc

# Namespaces that stand for several messages, or for one under another name.
STANDS_FOR: dict[str, list[type[betterproto.Message]]] = {
    "MapEntry": [nri.KeyValue],  # same layout as every map<K, V> entry
    "OptionalValue": [nri.OptionalFileMode, nri.OptionalUInt32, nri.OptionalInt],
    "PodContainerRequest": [
        nri.CreateContainerRequest,
        nri.StopContainerRequest,
        nri.RunPodSandboxRequest,
        nri.StopPodSandboxRequest,
        nri.RemovePodSandboxRequest,
        nri.PostCreateContainerRequest,
        nri.StartContainerRequest,
        nri.PostStartContainerRequest,
        nri.PostUpdateContainerRequest,
        nri.RemoveContainerRequest,
        nri.ValidateContainerAdjustmentRequest,
    ],
}
NOT_FIELDS = {"LAST"}


def numbers(cls: type[betterproto.Message]) -> dict[str, int]:
    meta: Any = cls._betterproto  # type: ignore[attr-defined]
    return {name: info.number for name, info in meta.meta_by_field_name.items()}


def constants(namespace: type) -> dict[str, int]:
    return {
        name.lower(): value
        for name, value in vars(namespace).items()
        if name.isupper() and name not in NOT_FIELDS
    }


NAMESPACES = [
    value for name, value in vars(fields).items() if isinstance(value, type) and name[0].isupper()
]


@pytest.mark.parametrize("namespace", NAMESPACES, ids=lambda ns: ns.__name__)
def test_nri_field_numbers(namespace: type) -> None:
    name = namespace.__name__
    messages = STANDS_FOR[name] if name in STANDS_FOR else [getattr(nri, name)]
    for field, number in constants(namespace).items():
        found = [numbers(m)[field] for m in messages if field in numbers(m)]
        assert found and set(found) == {number}, (name, field, found)


def test_linux_container_last_field() -> None:
    assert max(numbers(nri.LinuxContainer).values()) == fields.LinuxContainer.LAST


@pytest.mark.parametrize(
    ("namespace", "message"),
    [
        (wire_ttrpc.RequestField, ttrpc.Request),
        (wire_ttrpc.KeyValueField, ttrpc.KeyValue),
        (wire_ttrpc.ResponseField, ttrpc.Response),
        (wire_ttrpc.StatusField, ttrpc.Status),
    ],
)
def test_ttrpc_field_numbers(namespace: type, message: type[betterproto.Message]) -> None:
    assert constants(namespace) == numbers(message)
