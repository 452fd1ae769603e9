"""`nri-gpushare dra-driver`: the Kubernetes DRA driver (`nri_gpushare.k8s.dra`).

Reads the same node config as `nri-gpushare run` (the GPUs, `memory_reserve`,
`max_inst`, `status_socket`, `api_socket`) and runs until SIGTERM or SIGINT.
The API server's credentials are the pod's service account in a pod, else
the node's copy that the DaemonSet keeps (`--credentials-dir`, see
`nri_gpushare.k8s.events`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any


def register(subparsers: Any) -> None:
    from nri_gpushare.k8s.dra.driver import COLLECT_EVERY
    from nri_gpushare.k8s.dra.kubelet import PLUGIN_DIR, REGISTRY_DIR
    from nri_gpushare.k8s.dra.serve import CDI_DIR
    from nri_gpushare.k8s.events import HOST_DIR

    parser = subparsers.add_parser(
        "dra-driver",
        help="the Kubernetes DRA driver: publish each GPU's memory and compute, prepare claims",
    )
    parser.add_argument("--config", help="YAML node configuration (default: built-in defaults)")
    parser.add_argument(
        "--node-name", default="", help="this node's name (default: $NODE_NAME, else the hostname)"
    )
    parser.add_argument("--plugin-dir", default=PLUGIN_DIR, help=f"default {PLUGIN_DIR}")
    parser.add_argument("--registry-dir", default=REGISTRY_DIR, help=f"default {REGISTRY_DIR}")
    parser.add_argument("--cdi-dir", default=CDI_DIR, help=f"default {CDI_DIR}")
    parser.add_argument(
        "--credentials-dir",
        default=HOST_DIR,
        help=f"the API server's address and token outside a pod (default {HOST_DIR})",
    )
    parser.add_argument(
        "--collect-every",
        type=float,
        default=COLLECT_EVERY,
        metavar="SECONDS",
        help="how often prepared claims whose ResourceClaim is gone are unprepared "
        f"(default {COLLECT_EVERY:g})",
    )
    parser.set_defaults(func=dra_driver)


def _say(message: str) -> None:
    print(f"nri-gpushare dra-driver: {message}", file=sys.stderr)


def dra_driver(args: argparse.Namespace) -> int:
    from nri_gpushare.cli.node_setup import node_setup
    from nri_gpushare.k8s.dra.serve import Places, serve
    from nri_gpushare.k8s.events import EventError, Settings

    setup = node_setup(args.config, _say)
    if setup is None:
        return 2
    config, gpus = setup
    env = dict(os.environ)
    if args.node_name:
        env["NODE_NAME"] = args.node_name
    try:
        settings = Settings.from_environment(env, args.credentials_dir)
    except (EventError, OSError) as exc:
        _say(f"no API server credentials: {exc}")
        return 2
    if not args.collect_every > 0:
        _say(f"--collect-every {args.collect_every:g}: give a number of seconds above 0")
        return 2
    places = Places(args.plugin_dir, args.registry_dir, args.cdi_dir, args.collect_every)
    try:
        return asyncio.run(serve(config, gpus, settings.node, settings, places))
    except KeyboardInterrupt:
        return 130
