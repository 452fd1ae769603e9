"""`gpushare-smi` (also `nri-gpushare smi`): the running daemon's GPUs and
shares as a table, in the manner of nvidia-smi and cGPU's cgpu-smi.

It asks the daemon's status socket, as `nri-gpushare status` does, and shows
per GPU its memory total / allocated / used, compute allocated / used and
scheduling policy; per container (one row per GPU it holds a share of) its
pod or name, ID, memory quota / used, compute target / used, priority and
the processes holding GPU memory.  "Used" comes from the kernel module
(its ledger and its GPU-time accounting); where the module cannot say
(standalone mode), from NVML's per-process figures, marked ``*``; where
neither can, the cell says ``n/a[k]`` and footnote k says why: never a
made-up 0.  PIDs are the host's (initial) PID namespace, as the kernel
module and NVML number processes, not the container's.

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
import time
from typing import Any, Literal

from nri_gpushare.cli.smi_table import clean_text, render
from nri_gpushare.cli.smi_view import SCHEMA, unknown_shares, view
from nri_gpushare.config import DEFAULT_STATUS_SOCKET

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


def _frame(path: str, form: Literal["table", "json", "json-line"]) -> tuple[str, bool]:
    """One frame, `form` "table", "json" or "json-line", and whether the
    daemon answered; when it did not, the message saying so."""
    from nri_gpushare.host.sockets import query_status, unreachable

    try:
        status = query_status(path)
    except (OSError, ValueError) as exc:  # ValueError: a cut-off or garbled reply
        return f"gpushare-smi: {unreachable(path, exc)}", False
    from nri_gpushare.host.nvml_usage import nvml_use

    try:
        doc = view(status, nvml=nvml_use(unknown_shares(status)))
        if form == "table":
            return render(doc), True
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        return (
            f"gpushare-smi: cannot read the daemon's status at {path} ({type(exc).__name__}: "
            f"{clean_text(str(exc))}): is the daemon (nri-gpushare --version) of another version "
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
