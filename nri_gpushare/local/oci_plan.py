"""The daemon's injection plan (the local API's PLAN), checked entry by entry
before it goes into a config.json (pure, standard library only): one that is
malformed is a `PlanError`."""

from __future__ import annotations

from typing import Any

from nri_gpushare.local.oci_json import PlanError, json_kind


def plan_list(plan: dict[str, Any], key: str) -> list[Any]:
    """plan[key] as an array ([] when missing or null)."""
    value = plan.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise PlanError(f"plan {key}: {json_kind(value)}, expected an array")
    return value


def plan_map(plan: dict[str, Any], key: str) -> dict[str, str]:
    """plan[key] as an object of strings ({} when missing or null)."""
    value = plan.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise PlanError(f"plan {key}: expected an object of strings")
    return value


def _plan_path(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise PlanError(f"{where}: {value!r:.200} is not an absolute path")
    return value


def _plan_int(value: object, where: str, limit: int) -> int:
    if type(value) is not int or not 0 <= value < limit:
        raise PlanError(f"{where}: {value!r:.40} is not an integer in 0..{limit - 1}")
    return value


def plan_devices(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's device nodes as linux.devices entries."""
    out = []
    for i, dev in enumerate(plan_list(plan, "devices")):
        where = f"plan devices[{i}]"
        if not isinstance(dev, dict):
            raise PlanError(f"{where}: {json_kind(dev)}, expected an object")
        kind = dev.get("type", "c")
        if kind not in ("c", "b"):
            raise PlanError(f"{where}: type {kind!r:.20} is not c or b")
        out.append(
            {
                "path": _plan_path(dev.get("path"), f"{where}.path"),
                "type": kind,
                "major": _plan_int(dev.get("major"), f"{where}.major", 1 << 32),
                "minor": _plan_int(dev.get("minor"), f"{where}.minor", 1 << 32),
                "fileMode": _plan_int(dev.get("mode", 0o666), f"{where}.mode", 0o10000),
                "uid": 0,
                "gid": 0,
            }
        )
    return out


def plan_mounts(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's mounts as config.json mounts entries."""
    out = []
    for i, m in enumerate(plan_list(plan, "mounts")):
        where = f"plan mounts[{i}]"
        if not isinstance(m, dict):
            raise PlanError(f"{where}: {json_kind(m)}, expected an object")
        options = m.get("options") or []
        kind, source = m.get("type", "bind"), m.get("source", "")
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise PlanError(f"{where}.options: expected an array of strings")
        if not isinstance(kind, str) or not isinstance(source, str):
            raise PlanError(f"{where}: type and source must be strings")
        out.append(
            {
                "destination": _plan_path(m.get("destination"), f"{where}.destination"),
                "type": kind,
                "source": source,
                "options": list(options),
            }
        )
    return out


def plan_env(plan: dict[str, Any]) -> dict[str, str]:
    """The plan's environment, each name one a process can have."""
    env = plan_map(plan, "env")
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise PlanError(f"plan env: {key[:80]!r} is not a variable name and value")
    return env
