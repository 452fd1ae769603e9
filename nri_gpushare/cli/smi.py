"""`gpushare-smi` (also `nri-gpushare smi`): the running daemon's GPUs and
shares as a table, in the manner of nvidia-smi and cGPU's cgpu-smi.

It asks the daemon's status socket, as `nri-gpushare status` does, and shows
per GPU its memory total / allocated / used, compute allocated / used and
scheduling policy; per container (one row per GPU it holds a share of) its
pod or name, ID, memory quota / used, compute target / used, priority and
the processes holding GPU memory.  "Used" comes from the kernel module
(its ledger and its GPU-time accounting); where it is unknown the cell says
``n/a[k]`` and footnote k says why: never a made-up 0.  PIDs are the kernel
module's: the host's (initial) PID namespace, not the container's.

``--json`` prints `view()`'s document (schema ``gpushare-smi/1``, described
in docs/monitoring.md).  ``--watch [SECONDS]`` redraws every SECONDS (2 by
default) until Ctrl-C; while the daemon cannot be reached it says so and
keeps trying.  When stdout is not a terminal, --watch prints one frame per
interval, separated by a blank line (with --json: one document per line).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nri_gpushare.config import DEFAULT_STATUS_SOCKET
from nri_gpushare.share.report import POLICIES

SCHEMA = "gpushare-smi/1"
WIDTH = 120
"""No line of the table is longer."""
POLICY_NAMES = POLICIES  # the module's scheduling policies by number
PID_NOTE = "PIDs: as the kernel module sees them (host PID namespace), not the container's."


# -- the document ---------------------------------------------------------------------


def _sum_known(values: Sequence[Any]) -> Any:
    """The sum when every value is known (not None); None otherwise."""
    if any(v is None for v in values):
        return None
    return round(sum(values), 1) if any(isinstance(v, float) for v in values) else sum(values)


def _first_why(shares: Sequence[Mapping[str, Any]], value: str, why: str) -> str | None:
    return next((str(s.get(why) or "unknown") for s in shares if s.get(value) is None), None)


def _policy_why(status: Mapping[str, Any]) -> str:
    kmod = status.get("kmod", {})
    if kmod.get("mode") == "off":
        return "unknown: kmod: off"
    if not kmod.get("loaded"):
        return f"unknown: the kernel module {kmod.get('problem') or 'is not loaded'}"
    return "unknown: read once a container on this GPU is registered with the kernel module"


def view(status: Mapping[str, Any], now: float | None = None) -> dict[str, Any]:
    """The --json document for a status document (`now`: time.time())."""
    now = time.time() if now is None else now
    allocations = status.get("allocations", [])
    by_gpu: dict[int, list[Mapping[str, Any]]] = {}
    for alloc in allocations:
        for share in alloc["gpus"]:
            by_gpu.setdefault(share["index"], []).append(share)
    gpus = []
    for gpu in status.get("gpus", []):
        shares = by_gpu.get(gpu["index"], [])
        policy = gpu.get("policy")
        gpus.append(
            {
                "index": gpu["index"],
                "uuid": gpu["uuid"],
                "name": gpu["name"],
                "memory_total": gpu["memory_total"],
                "memory_allocated": gpu["memory_allocated"],
                "memory_used": _sum_known([s.get("memory_used") for s in shares]),
                "memory_used_why": _first_why(shares, "memory_used", "memory_used_why"),
                "core_allocated": gpu["core_allocated"],
                "core_used": _sum_known([s.get("compute_used_pct") for s in shares]),
                "core_used_why": _first_why(shares, "compute_used_pct", "compute_used_why"),
                "policy": policy if isinstance(policy, int) else None,
                "policy_name": POLICY_NAMES.get(policy) if isinstance(policy, int) else None,
                "policy_why": None if isinstance(policy, int) else _policy_why(status),
                "containers": len(gpu.get("containers", [])),
            }
        )
    containers = []
    for alloc in allocations:
        shares = []
        for s in alloc["gpus"]:
            pids = s.get("pids")
            shares.append(
                {
                    "index": s["index"],
                    "uuid": s["uuid"],
                    "memory_quota": s["memory"],
                    "memory_used": s.get("memory_used"),
                    "memory_used_why": (
                        None if s.get("memory_used") is not None else s.get("memory_used_why")
                    ),
                    "core_target": s.get("compute_target"),
                    "core_used": s.get("compute_used_pct"),
                    "core_used_why": (
                        None if s.get("compute_used_pct") is not None else s.get("compute_used_why")
                    ),
                    "pids": pids,
                    "pids_why": (
                        None
                        if pids is not None
                        else (s.get("memory_used_why") or "unknown: this daemon does not say")
                    ),
                }
            )
        containers.append(
            {
                "container_id": alloc["container_id"],
                "pod": alloc.get("pod") or "",
                "name": alloc.get("name") or "",
                "origin": alloc.get("origin") or "nri",
                "priority": alloc.get("priority", "normal"),
                "isolation": alloc.get("isolation", ""),
                "gpus": shares,
            }
        )
    kmod = status.get("kmod", {})
    return {
        "schema": SCHEMA,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "plugin": {
            "version": status.get("version") or "unknown",
            "kmod": {
                "mode": kmod.get("mode"),
                "loaded": bool(kmod.get("loaded")),
                "problem": kmod.get("problem") or "",
            },
            "nri_connected": bool(status.get("nri", {}).get("connected")),
        },
        "gpus": gpus,
        "containers": containers,
        "unserved": list(status.get("unserved", [])),
    }


# -- the table ---------------------------------------------------------------------------


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


def _clean(text: str) -> str:
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
                f"[{i}] {_clean(why)}", WIDTH, subsequent_indent=" " * (len(str(i)) + 3)
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
    main, extra = _clean(main), _clean(extra)
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
        _clean(f"gpushare-smi   nri-gpushare {plugin['version']}   {stamp}")[:WIDTH],
        *textwrap.wrap(_clean(f"{module}   {nri}"), WIDTH, subsequent_indent="  "),
    ]
    notes = _Notes()
    rows = []
    for g in doc["gpus"]:
        empty = g["containers"] == 0
        mem_used = "-" if empty else _known(g["memory_used"], _size, g["memory_used_why"], notes)
        core_used = "-" if empty else _known(g["core_used"], _pct, g["core_used_why"], notes)
        policy = (
            f"{g['policy']} {g['policy_name'] or 'unknown'}"
            if g["policy"] is not None
            else notes.mark(g["policy_why"])
        )
        rows.append(
            [
                str(g["index"]),
                _clean(g["name"]),
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
    shares = sorted(
        ((s, c) for c in doc["containers"] for s in c["gpus"]),
        key=lambda sc: (sc[0]["index"], sc[1]["pod"] or sc[1]["name"], sc[1]["container_id"]),
    )
    for s, c in shares:
        rows.append(
            [
                str(s["index"]),
                _owner(c, CONTAINER_COLUMNS[1].width),
                c["container_id"][:12],
                _size(s["memory_quota"]),
                _known(s["memory_used"], _size, s["memory_used_why"], notes),
                "-" if s["core_target"] is None else f"{s['core_target']}%",
                _known(s["core_used"], _pct, s["core_used_why"], notes),
                c["priority"],
                notes.mark(s["pids_why"]) if s["pids"] is None else _pids(s["pids"], 10),
            ]
        )
    if rows:
        lines += _table(CONTAINER_COLUMNS, rows)
        lines.append(PID_NOTE)
    else:
        lines.append("No containers hold a share.")
    for u in doc["unserved"]:
        lines += textwrap.wrap(
            _clean(
                f"UNSERVED {u['container_id'][:12]} {u.get('pod') or u.get('name')}: asked for "
                f"{u.get('asked')}, runs without a share ({u.get('action')})"
            ),
            WIDTH,
            subsequent_indent="  ",
        )
    lines += notes.lines()
    return "\n".join(lines)


def _pct(value: float) -> str:
    return f"{value:g}%"


def _known(value: Any, show: Callable[[Any], str], why: str | None, notes: _Notes) -> str:
    return notes.mark(why) if value is None else show(value)


# -- the command ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help=f"print JSON (schema {SCHEMA})")
    parser.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=_interval,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C; not a terminal: one frame "
        "per interval, separated by a blank line (--json: one document per line)",
    )
    parser.add_argument("--config", help="read status_socket from this config")
    parser.add_argument("--status-socket", default=DEFAULT_STATUS_SOCKET)


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text} s: give 0.1 to 3600 seconds")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "smi", help="GPUs and shares as a table (as gpushare-smi)", description=__doc__
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nri_gpushare.config import ConfigError
    from nri_gpushare.host.sockets import status_socket

    try:
        path = status_socket(args.config, args.status_socket)
    except ConfigError as exc:
        print(f"gpushare-smi: {exc}", file=sys.stderr)
        return 2
    if args.watch is None:
        frame, ok = _frame(path, "json" if args.json else "table")
        print(frame, file=sys.stdout if ok else sys.stderr)
        return 0 if ok else 1
    return _watch(path, args.json, args.watch)


def _frame(path: str, form: str) -> tuple[str, bool]:
    """One frame, `form` "table", "json" or "json-line", and whether the
    daemon answered; when it did not, the message saying so."""
    from nri_gpushare.host.sockets import query_status, unreachable

    try:
        status = query_status(path)
    except (OSError, ValueError) as exc:  # ValueError: a cut-off or garbled reply
        return f"gpushare-smi: {unreachable(path, exc)}", False
    try:
        doc = view(status)
        if form == "table":
            return render(doc), True
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        return (
            f"gpushare-smi: cannot read the daemon's status at {path} ({type(exc).__name__}: "
            f"{_clean(str(exc))}): is the daemon (nri-gpushare --version) of another version "
            f"than gpushare-smi? restart it after an upgrade",
            False,
        )
    return json.dumps(doc, indent=2 if form == "json" else None), True


def _watch(path: str, as_json: bool, every: float) -> int:
    tty = sys.stdout.isatty() and not as_json
    out = sys.stdout
    try:
        if tty:
            out.write("\x1b[?25l\x1b[H\x1b[2J")  # hide the cursor, clear once
        while True:
            frame, ok = _frame(path, "json-line" if as_json else "table")
            if as_json and not ok:
                frame = json.dumps({"schema": SCHEMA, "time": _utc(), "error": frame})
            elif not ok:
                frame += f"\nretrying every {every:g} s"
            if tty:
                footer = f"every {every:g} s; Ctrl-C to quit"
                body = "\n".join(line + "\x1b[K" for line in [*frame.split("\n"), "", footer])
                out.write("\x1b[H" + body + "\n\x1b[J")  # overwrite in place: no flicker
            else:
                out.write(frame + ("\n" if as_json else "\n\n"))
            out.flush()
            time.sleep(every)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `gpushare-smi --watch | head`
        sys.stderr.close()
        return 0
    finally:
        if tty:
            out.write("\x1b[?25h\n")
            out.flush()


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpushare-smi", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
