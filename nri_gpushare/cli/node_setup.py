"""What the node's kubelet plugins (`device-plugin`, `dra-driver`) do first:
read the node config the daemon runs with, set up logging, and find the
GPUs as the daemon finds them (so that both count the same devices)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nri_gpushare.config import Config
    from nri_gpushare.share.model import Gpu


def node_setup(path: str | None, say: Callable[[str], None]) -> tuple[Config, list[Gpu]] | None:
    """(config, GPUs), or None once `say` has said why not."""
    from nri_gpushare.config import Config, ConfigError, load_config
    from nri_gpushare.host.devices import load_inventory
    from nri_gpushare.share.decisions import configure_logging

    try:
        config = load_config(path) if path else Config()
    except ConfigError as exc:
        say(str(exc))
        return None
    configure_logging(config.log_level, config.log_format)
    for chatty in ("hpack", "h2", "grpclib"):  # every HTTP/2 frame otherwise
        logging.getLogger(chatty).setLevel(max(logging.INFO, logging.getLogger().level))
    gpus = load_inventory(config.inventory) if config.use_nvml else list(config.inventory)
    if not gpus:
        say("no GPUs: NVML found none and the config has no `inventory:`")
        return None
    return config, gpus
