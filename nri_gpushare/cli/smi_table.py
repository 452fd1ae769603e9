"""gpushare-smi's table: `view()`'s document drawn in the manner of
nvidia-smi, at most `WIDTH` columns, an unknown value as ``n/a[k]`` with
footnote k saying why.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WIDTH = 120
"""No line of the table is longer."""
PID_NOTE = "PIDs: as the kernel module sees them (host PID namespace), not the container's."
NVML_NOTE = (
    "*: from NVML (the driver's figures per process, each put with its container by its "
    "cgroup): the kernel module does not count this container"
)


@dataclass(frozen=True)
class Column:
    title: tuple[str, str]  # two header lines
    width: int
    right: bool = False


GPU_COLUMNS = (
    Column(("GPU", ""), 3, True),
    Column(("NAME", ""), 20),
    Column(("MEMORY", "TOTAL"), 9, True),
    Column(("MEMORY", "ALLOCATED"), 9, True),
    Column(("MEMORY", "USED"), 9, True),
    Column(("CORE", "ALLOCATED"), 9, True),
    Column(("CORE", "USED"), 8, True),
    Column(("POLICY", ""), 14),
    Column(("CONTAINERS", ""), 10, True),
)
CONTAINER_COLUMNS = (
    Column(("GPU", ""), 3, True),
    Column(("POD / NAME", ""), 31),
    Column(("CONTAINER", ""), 12),
    Column(("MEMORY", "QUOTA"), 8, True),
    Column(("MEMORY", "USED"), 8, True),
    Column(("CORE", "TARGET"), 6, True),
    Column(("CORE", "USED"), 7, True),
    Column(("PRIO", ""), 6),
    Column(("PIDS", ""), 10),
)


def shorten(text: str, width: int) -> str:
    """`text` in `width` characters: its start and end around '…' when too
    long (a pod's namespace and the end of its name tell most)."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def clean_text(text: str) -> str:
    """A name someone else chose, printable (no escape sequences reach the terminal)."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[str]:
    rule = "+" + "+".join("-" * (c.width + 2) for c in columns) + "+"
    double = rule.replace("-", "=")

    def line(cells: Sequence[str]) -> str:
        out = []
        for c, cell in zip(columns, cells, strict=True):
            cell = shorten(cell, c.width)
            out.append(cell.rjust(c.width) if c.right else cell.ljust(c.width))
        return "| " + " | ".join(out) + " |"

    lines = [rule, line([c.title[0] for c in columns])]
    if any(c.title[1] for c in columns):
        lines.append(line([c.title[1] for c in columns]))
    lines.append(double)
    lines += [line(r) for r in rows]
    lines.append(rule)
    return lines


def _size(value: int) -> str:
    """Bytes as a short size: 16Gi, 1.5Gi, 300Mi, 0."""
    for unit, scale in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value >= scale:
            number = value / scale
            text = f"{number:.0f}" if number >= 100 or number == int(number) else f"{number:.1f}"
            return text.removesuffix(".0") + unit
    return str(value)


class _Notes:
    """Footnotes: each distinct reason once, numbered in order of first use."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def mark(self, why: str | None) -> str:
        why = why or "unknown"
        if why not in self.reasons:
            self.reasons.append(why)
        return f"n/a[{self.reasons.index(why) + 1}]"

    def lines(self) -> list[str]:
        out = []
        for i, why in enumerate(self.reasons, 1):
            out += textwrap.wrap(
                f"[{i}] {clean_text(why)}", WIDTH, subsequent_indent=" " * (len(str(i)) + 3)
            )
        return out


def _pids(pids: Sequence[int], width: int) -> str:
    if not pids:
        return "-"
    text = ",".join(str(p) for p in pids)
    shown = list(pids)
    while len(text) > width and len(shown) > 1:
        shown.pop()
        text = ",".join(str(p) for p in shown) + f" +{len(pids) - len(shown)}"
    return text


def _owner(c: Mapping[str, Any], width: int) -> str:
    """'namespace/pod (container)' or 'name (runc:namespace)' in `width`
    characters: the part in parentheses keeps up to a third of them."""
    if c["origin"] == "nri":
        main, extra = (c["pod"], c["name"]) if c["pod"] else (c["name"], "")
    else:
        main, extra = c["name"], c["origin"]
    main, extra = clean_text(main), clean_text(extra)
    if not extra:
        return shorten(main, width)
    if len(main) + len(extra) + 3 > width:
        extra = shorten(extra, max(width // 3, width - 3 - len(main)))
    return f"{shorten(main, width - len(extra) - 3)} ({extra})"


def render(doc: Mapping[str, Any], local_time: str | None = None) -> str:
    """The table for a `view()` document."""
    plugin = doc["plugin"]
    kmod = plugin["kmod"]
    if kmod["loaded"]:
        module = f"kernel module: {kmod['mode']}, loaded"
    elif kmod["mode"] == "off":
        module = "kernel module: off (not used: isolation not enforced by it)"
    else:
        module = f"kernel module: {kmod['mode']}, {kmod['problem'] or 'not loaded'}"
        module += ": isolation not enforced"
    nri = "NRI: connected" if plugin["nri_connected"] else "NRI: NOT connected"
    stamp = local_time or time.strftime("%a %b %d %H:%M:%S %Y")
    lines = [
        clean_text(f"gpushare-smi   nri-gpushare {plugin['version']}   {stamp}")[:WIDTH],
        *textwrap.wrap(clean_text(f"{module}   {nri}"), WIDTH, subsequent_indent="  "),
    ]
    notes = _Notes()
    rows = []
    shares = sorted(
        ((s, c) for c in doc["containers"] for s in c["gpus"]),
        key=lambda sc: (sc[0]["index"], sc[1]["pod"] or sc[1]["name"], sc[1]["container_id"]),
    )
    nvml = {
        (s["index"], what)
        for s, _ in shares
        for what in ("memory", "core")
        if s.get(f"{what}_used_source") == "nvml"
    }
    for g in doc["gpus"]:
        empty = g["containers"] == 0
        star = {what: "*" if (g["index"], what) in nvml else "" for what in ("memory", "core")}
        mem_used = (
            "-"
            if empty
            else _known(g["memory_used"], _size, g["memory_used_why"], notes, star["memory"])
        )
        core_used = (
            "-" if empty else _known(g["core_used"], _pct, g["core_used_why"], notes, star["core"])
        )
        policy = (
            f"{g['policy']} {g['policy_name'] or 'unknown'}"
            if g["policy"] is not None
            else notes.mark(g["policy_why"])
        )
        rows.append(
            [
                str(g["index"]),
                clean_text(g["name"]),
                _size(g["memory_total"]),
                _size(g["memory_allocated"]),
                mem_used,
                f"{g['core_allocated']}%",
                core_used,
                policy,
                str(g["containers"]),
            ]
        )
    lines += _table(GPU_COLUMNS, rows)
    rows = []
    for s, c in shares:
        rows.append(
            [
                str(s["index"]),
                _owner(c, CONTAINER_COLUMNS[1].width),
                c["container_id"][:12],
                _size(s["memory_quota"]),
                _known(s["memory_used"], _size, s["memory_used_why"], notes, _star(s, "memory")),
                "-" if s["core_target"] is None else f"{s['core_target']}%",
                _known(s["core_used"], _pct, s["core_used_why"], notes, _star(s, "core")),
                c["priority"],
                notes.mark(s["pids_why"]) if s["pids"] is None else _pids(s["pids"], 10),
            ]
        )
    if rows:
        lines += _table(CONTAINER_COLUMNS, rows)
        lines.append(PID_NOTE)
        if nvml:
            lines += textwrap.wrap(NVML_NOTE, WIDTH, subsequent_indent="   ")
    else:
        lines.append("No containers hold a share.")
    for u in doc["unserved"]:
        lines += textwrap.wrap(
            clean_text(
                f"UNSERVED {u['container_id'][:12]} {u.get('pod') or u.get('name')}: asked for "
                f"{u.get('asked')}, runs without a share ({u.get('action')})"
            ),
            WIDTH,
            subsequent_indent="  ",
        )
    for claim in doc.get("claims", []):
        lines += textwrap.wrap(clean_text(_claim_line(claim)), WIDTH, subsequent_indent="  ")
    lines += notes.lines()
    return "\n".join(lines)


def _claim_line(claim: dict[str, Any]) -> str:
    """A prepared DRA claim (the daemon's status: every field checked there)."""
    shares = ", ".join(
        f"GPU {g.get('index')} {_size(g.get('memory'))}"
        + (f" {g['core']}%" if g.get("core") else "")
        for g in claim.get("gpus", [])
    )
    holder = str(claim.get("holder") or "")
    held = f"held by {holder[:12]}" if holder else "no container yet"
    return f"DRA claim {claim.get('namespace')}/{claim.get('name')}: {shares}; {held}"


def _pct(value: float) -> str:
    return f"{value:g}%"


def _star(share: Mapping[str, Any], what: str) -> str:
    """ "*" for a figure NVML gave (NVML_NOTE), "" for the kernel module's."""
    return "*" if share.get(f"{what}_used_source") == "nvml" else ""


def _known(
    value: Any, show: Callable[[Any], str], why: str | None, notes: _Notes, mark: str = ""
) -> str:
    return notes.mark(why) if value is None else show(value) + mark
