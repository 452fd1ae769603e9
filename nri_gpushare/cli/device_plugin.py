"""`nri-gpushare device-plugin`: the kubelet device plugin (`plugin`).

Reads the same node config as `nri-gpushare run` (the GPUs, `memory_reserve`,
`max_inst`, `status_socket`, `kubernetes.device_plugin_dir`) and runs until
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "device-plugin",
        help="the kubelet device plugin: advertise gpushare.io/gpu-memory, gpu-core, gpu-count",
    )
    parser.add_argument("--config", help="YAML node configuration (default: built-in defaults)")
    parser.set_defaults(func=device_plugin)


def _say(message: str) -> None:
    print(f"nri-gpushare device-plugin: {message}", file=sys.stderr)


def device_plugin(args: argparse.Namespace) -> int:
    from nri_gpushare.cli.node_setup import node_setup
    from nri_gpushare.k8s.plugin import serve

    setup = node_setup(args.config, _say)
    if setup is None:
        return 2
    try:
        return asyncio.run(serve(*setup))
    except KeyboardInterrupt:
        return 130
