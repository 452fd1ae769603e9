"""containerd's NRI section (`[plugins."io.containerd.nri.v1.nri"]`): its
keys, the values the plugin needs there, and how containerd compares them
(Go durations by length).  Pure: `enable`'s planner and its commands share it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NRI_PLUGIN = "io.containerd.nri.v1.nri"
NRI_HEADER = f'[plugins."{NRI_PLUGIN}"]'
DURATION_KEYS = ("plugin_registration_timeout", "plugin_request_timeout")


class ConfigEditError(Exception):
    """Refused or failed; the message says why and what to do.  Nothing changed."""


class NoTempFileError(ConfigEditError):
    """No temporary file can be written beside the config (its directory)."""


# -- Go durations (containerd writes and reads time.Duration as "5s") ------

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def go_duration(seconds: float) -> str:
    """A Go duration string containerd reads: 2 -> "2s", 0.5 -> "500ms"."""
    nanos = round(seconds * 1e9)
    if nanos % 1_000_000_000 == 0:
        return f"{nanos // 1_000_000_000}s"
    if nanos % 1_000_000 == 0:
        return f"{nanos // 1_000_000}ms"
    return f"{nanos}ns"


def parse_go_duration(text: str) -> float | None:
    """Seconds from "1m30s", "1.5s", "500ms", "0s"; None if it is not one."""
    if text in ("0", "+0", "-0"):
        return 0.0
    body = text.lstrip("+")
    parts = _DURATION_PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def same_setting(key: str, a: object, b: object) -> bool:
    """Equal as containerd sees them (durations by length, not by spelling)."""
    if key in DURATION_KEYS and isinstance(a, str) and isinstance(b, str):
        da, db = parse_go_duration(a), parse_go_duration(b)
        if da is not None and db is not None:
            return abs(da - db) < 1e-9
    return type(a) is type(b) and a == b


# -- what the plugin needs -------------------------------------------------


@dataclass(frozen=True)
class NriSettings:
    """The NRI settings the plugin's own config implies (nri.socket and the timeouts)."""

    socket_path: str = "/var/run/nri/nri.sock"
    registration_timeout: float = 5.0
    request_timeout: float = 2.0

    def wanted(self) -> dict[str, bool | str]:
        """containerd's NRI keys and the values the plugin needs, in writing order."""
        return {
            "disable": False,
            "disable_connections": False,  # external plugins (us) may connect
            "socket_path": self.socket_path,
            "plugin_registration_timeout": go_duration(self.registration_timeout),
            "plugin_request_timeout": go_duration(self.request_timeout),
        }


def effective_nri(dump: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The NRI section of `containerd config dump`'s `dump` (`where`: whose)."""
    disabled = dump.get("disabled_plugins") or []
    if NRI_PLUGIN in disabled:
        raise ConfigEditError(
            f"{where}: disabled_plugins lists {NRI_PLUGIN!r}: remove it from there "
            "(that turns the NRI plugin off whatever its own table says) and run enable again"
        )
    section = (dump.get("plugins") or {}).get(NRI_PLUGIN)
    if not isinstance(section, dict):
        raise ConfigEditError(
            f"{where}: containerd shows no {NRI_PLUGIN} plugin settings: NRI came with "
            "containerd 1.7; install containerd 1.7 or later (or pass --containerd with it)"
        )
    return section
