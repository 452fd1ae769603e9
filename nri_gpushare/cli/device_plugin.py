"""`nri-gpushare device-plugin`: the kubelet device plugin (`plugin`).

Reads the same node config as `nri-gpushare run` (the GPUs, `memory_reserve`,
`max_inst`, `status_socket`, `kubernetes.device_plugin_dir`) and runs until
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
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
    from nri_gpushare.config import Config, ConfigError, load_config
    from nri_gpushare.host.devices import load_inventory
    from nri_gpushare.k8s.plugin import serve
    from nri_gpushare.share.decisions import configure_logging

    try:
        config = load_config(args.config) if args.config else Config()
    except ConfigError as exc:
        _say(str(exc))
        return 2
    configure_logging(config.log_level, config.log_format)
    for chatty in ("hpack", "h2", "grpclib"):  # every HTTP/2 frame otherwise
        logging.getLogger(chatty).setLevel(max(logging.INFO, logging.getLogger().level))
    # The GPUs as the daemon finds them, so that both count the same devices.
    gpus = load_inventory(config.inventory) if config.use_nvml else list(config.inventory)
    if not gpus:
        _say("no GPUs: NVML found none and the config has no `inventory:`")
        return 2
    try:
        return asyncio.run(serve(config, gpus))
    except KeyboardInterrupt:
        return 130
