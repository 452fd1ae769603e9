"""JSON values read from untrusted OCI files, checked (pure, standard library
only): a section that is missing or null is empty, one of the wrong type is
an `OciError` that says which and where."""

from __future__ import annotations

import json
from typing import Any


class OciError(ValueError):
    """OCI state or a config.json that cannot be used; str() says what and where."""


class PlanError(ValueError):
    """An injection plan from the daemon that cannot be applied; str() says why."""


def json_kind(value: object) -> str:
    """A JSON value's kind, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_object(data: bytes, what: str, limit: int) -> dict[str, Any]:
    """`data` (at most `limit` bytes) as a JSON object; OciError naming `what` otherwise."""
    if len(data) > limit:
        raise OciError(f"{what}: more than {limit} bytes")
    try:
        obj = json.loads(data, parse_constant=_reject_constant)
    except RecursionError:
        raise OciError(f"{what}: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, huge integers
        raise OciError(f"{what}: not JSON: {e}") from None  # e's text is the message
    if not isinstance(obj, dict):
        raise OciError(f"{what}: not a JSON object but {json_kind(obj)}")
    return obj


def section(obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """obj[key] when it is of `kind`; None when missing or null; OciError otherwise."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = {dict: "an object", list: "an array", str: "a string", int: "an integer"}
        raise OciError(f"{where}{key}: {json_kind(value)}, expected {expected[kind]}")
    return value


def string_map(obj: dict[str, Any], key: str, where: str) -> dict[str, str]:
    """obj[key] as an object of strings ({} when missing or null); OciError otherwise."""
    value = section(obj, key, dict, where) or {}
    for k, v in value.items():
        if not isinstance(v, str):
            raise OciError(f"{where}{key}: {k[:80]!r} is {json_kind(v)}, expected a string")
    return dict(value)


def copied_object(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """A copy of parent[key] (created when missing), stored back in `parent`."""
    value = section(parent, key, dict, where)
    copy = dict(value) if value is not None else {}
    parent[key] = copy
    return copy


def copied_array(parent: dict[str, Any], key: str, where: str) -> list[Any]:
    """A copy of parent[key] (created when missing), stored back in `parent`."""
    value = section(parent, key, list, where)
    copy = list(value) if value is not None else []
    parent[key] = copy
    return copy
