"""`nri-gpushare resize CONTAINER [--memory SIZE] [--core PCT] [--priority P]`:
change a running container's share live, through the running plugin's
local API (root only; see docs/resize.md).

Exit status: 0 resized (or already so), 1 refused or the plugin cannot be
reached, 2 a bad command line or config.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    from nri_gpushare.config import DEFAULT_API_SOCKET

    parser = subparsers.add_parser(
        "resize",
        help="change a running container's GPU share live (memory, compute, priority)",
        description="Change a running container's GPU share live. Values as the "
        "gpushare.io/ keys take them; a part not given stays as it is. The share keeps "
        "its GPUs; a refusal changes nothing.",
    )
    parser.add_argument(
        "container", help="container ID, a unique prefix of it, or its name (see status)"
    )
    parser.add_argument("--memory", default="", help="gpu-memory per GPU: 2Gi, 3276Mi, a list")
    parser.add_argument("--core", default="", help="gpu-core per GPU: 5..100 in steps of 5")
    parser.add_argument("--priority", default="", help="high or normal")
    parser.add_argument("--config", help="read api_socket from this config")
    parser.add_argument("--api-socket", default=DEFAULT_API_SOCKET)
    parser.set_defaults(func=resize)


def _say(message: str) -> None:
    print(f"nri-gpushare resize: {message}", file=sys.stderr)


def resize(args: argparse.Namespace) -> int:
    from nri_gpushare.config import ConfigError, load_config
    from nri_gpushare.local.client import Unavailable, ask
    from nri_gpushare.local.protocol import ProtocolError, Request

    if not (args.memory or args.core or args.priority):
        _say("nothing to change: give --memory, --core or --priority")
        return 2
    try:
        path = load_config(args.config).api_socket if args.config else args.api_socket
        request = Request(
            "resize", "", args.container, memory=args.memory, core=args.core, priority=args.priority
        )
        reply = ask(request, path)
    except ConfigError as e:
        _say(str(e))
        return 2
    except ProtocolError as e:
        _say(f"cannot ask: {e}")
        return 2
    except Unavailable as e:
        _say(str(e))
        return 1
    if not reply.ok:
        print(reply.error, file=sys.stderr)
        return 1
    print(describe(reply.resized or {}))
    return 0


def describe(resized: dict[str, Any]) -> str:
    """'resized container main (pod ns/p): GPU 0 2048Mi 30%, priority normal'.
    Names are their creators' text: escaped, so none reaches the terminal raw."""
    from nri_gpushare.units import format_bytes, quote

    who = f"container {quote(str(resized.get('name') or resized.get('container_id')))}"
    if resized.get("pod"):
        who += f" (pod {quote(str(resized['pod']))})"
    gpus = ", ".join(
        f"GPU {g.get('index')} {format_bytes(int(g.get('memory', 0)))}"
        + (f" {g['core']}%" if g.get("core") else "")
        for g in resized.get("gpus", [])
    )
    verb = "resized" if resized.get("changed") else "unchanged (already so)"
    return f"{verb} {who}: {gpus}, priority {quote(str(resized.get('priority')))}"
