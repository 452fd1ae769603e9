"""The DRA driver's claims in the local API (sans-IO): the ``claim`` object
of a ``claim-prepare`` request, checked for shape and size here; what the
values mean is the daemon's to judge.

``{"uid", "namespace", "name", "pods": [pod UID, ...], "gpus": [{"uuid",
"memory": bytes (-1: the whole GPU), "core": percent}]}``
"""

from __future__ import annotations

from typing import Any

MAX_PODS = 256
MAX_GPUS = 64
MAX_FIELD = 253
_INT_RANGE = (-1, 1 << 62)


def check_claim(value: Any) -> dict[str, Any]:
    """`value` as a claim object; ValueError saying what is wrong."""
    if not isinstance(value, dict):
        raise ValueError("claim: not an object")
    out: dict[str, Any] = {}
    for key in ("uid", "namespace", "name"):
        text = value.get(key)
        if not isinstance(text, str) or not 0 < len(text) <= MAX_FIELD or "\0" in text:
            raise ValueError(f"claim.{key}: not a string of 1 to {MAX_FIELD} characters")
        out[key] = text
    pods = value.get("pods", [])
    if (
        not isinstance(pods, list)
        or len(pods) > MAX_PODS
        or not all(isinstance(p, str) and 0 < len(p) <= MAX_FIELD for p in pods)
    ):
        raise ValueError(f"claim.pods: not a list of at most {MAX_PODS} pod UIDs")
    out["pods"] = list(pods)
    gpus = value.get("gpus")
    if not isinstance(gpus, list) or not 0 < len(gpus) <= MAX_GPUS:
        raise ValueError(f"claim.gpus: not a list of 1 to {MAX_GPUS} GPUs")
    out["gpus"] = [_gpu(g) for g in gpus]
    return out


def _gpu(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("claim.gpus: an entry is not an object")
    uuid = value.get("uuid")
    if not isinstance(uuid, str) or not 0 < len(uuid) <= MAX_FIELD:
        raise ValueError("claim.gpus: uuid is not a GPU UUID")
    numbers = {}
    for key in ("memory", "core"):
        n = value.get(key)
        if type(n) is not int or not _INT_RANGE[0] <= n <= _INT_RANGE[1]:
            raise ValueError(f"claim.gpus: {key} is not a number")
        numbers[key] = n
    return {"uuid": uuid, **numbers}
