"""Cgroup paths as gpushare.ko resolves them: a runtime's cgroup name (NRI's
linux.cgroups_path, cgroupfs or systemd driver) relative to the cgroup2 root,
and where cgroup2 is mounted."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path


def expand_systemd_slice(slice_name: str) -> str:
    """`a-b-c.slice` -> `/a.slice/a-b.slice/a-b-c.slice` (systemd's nesting rule)."""
    if not slice_name.endswith(".slice") or "/" in slice_name:
        raise ValueError(f"{slice_name!r} is not a systemd slice name")
    name = slice_name.removesuffix(".slice")
    if name == "-":
        return ""
    parts = name.split("-")
    if "" in parts:
        raise ValueError(f"{slice_name!r} is not a valid systemd slice name")
    return "".join("/" + "-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def cgroup2_mounts(mountinfo: str | os.PathLike[str] = "/proc/self/mountinfo") -> list[str]:
    """Mount points of cgroup2 file systems, longest first."""
    points = []
    try:
        lines = Path(mountinfo).read_text(errors="surrogateescape").splitlines()
    except OSError:
        return []
    for line in lines:
        fields, _, rest = line.partition(" - ")
        words = fields.split(" ")
        if rest.split(" ", 1)[0] == "cgroup2" and len(words) > 4:
            point = words[4]
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), point))
    return sorted(points, key=len, reverse=True)


def cgroup_v2_path(cgroups_path: str, mounts: Sequence[str] = ()) -> str:
    """The path gpushare.ko resolves, relative to the cgroup2 root, for a
    container's cgroup as the runtime names it (NRI linux.cgroups_path):

    - cgroupfs driver, `/k8s.io/<id>` (or without the leading /): as is;
    - systemd driver, `<slice>:<prefix>:<name>`: the expanded slice path
      plus `<prefix>-<name>.scope`;
    - an absolute path under a cgroup2 mount in `mounts`: the part below it.
    """
    path = cgroups_path.strip()
    if not path:
        raise ValueError("empty cgroup path")
    if any(c.isspace() or not c.isprintable() for c in path):
        # It becomes one word of an inst_ctl command.
        raise ValueError(f"{cgroups_path[:80]!r}: a cgroup path with a blank or control character")
    if ":" in path and not path.startswith("/"):
        parts = path.split(":")
        if len(parts) != 3:
            raise ValueError(f"{cgroups_path!r}: expected <slice>:<prefix>:<name>")
        slice_name, prefix, name = parts
        unit = (
            name
            if name.endswith(".slice")
            else (f"{prefix}-{name}.scope" if prefix else f"{name}.scope")
        )
        return f"{expand_systemd_slice(slice_name or 'system.slice')}/{unit}"
    for point in mounts:
        if path == point:
            return "/"
        if point != "/" and path.startswith(point + "/"):
            return path[len(point) :]
    return "/" + path.lstrip("/")
