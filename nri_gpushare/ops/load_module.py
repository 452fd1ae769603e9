"""`nri-gpushare load-module`: the systemd unit's ExecStartPre.

Runs `modprobe gpushare` when the node config says `kmod_load: true`, and
does nothing (exit 0, saying so) otherwise.  A failed modprobe fails the
command only under `kmod: required`, since the daemon would refuse to start
without the module then; under `kmod: optional` it is logged and the daemon
starts without enforcement.

While `nri-gpushare kmod-upgrade` has a saved state that no module has taken
yet (`<state_dir>/kmod-upgrade.state`: an upgrade running, or one that was
interrupted), it loads nothing: a plain load would come up empty, the daemon
would register its containers anew, and the upgrade's import (GPU time,
settings) would then be refused.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

MODULE = "gpushare"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "load-module",
        help="modprobe gpushare when the config's kmod_load is true (the unit's ExecStartPre)",
    )
    parser.add_argument("--config", help="YAML node configuration (default: built-in defaults)")
    parser.add_argument(
        "--modprobe", default="modprobe", help="the modprobe program (default: from PATH)"
    )
    parser.set_defaults(func=load_module)


def _say(message: str, error: bool = False) -> None:
    print(f"nri-gpushare load-module: {message}", file=sys.stderr if error else sys.stdout)


def load_module(args: argparse.Namespace) -> int:
    from nri_gpushare.config import Config, ConfigError, load_config

    try:
        config = load_config(args.config) if args.config else Config()
    except ConfigError as exc:
        _say(str(exc), error=True)
        return 2
    if config.kmod == "off":
        _say(f"kmod: off in the config: {MODULE} is not loaded")
        return 0
    if not config.kmod_load:
        _say(f"kmod_load is false in the config: not loading {MODULE}")
        return 0
    from nri_gpushare.ops.kmod_upgrade_state import STATE_FILE

    pending = os.path.join(config.state_dir, STATE_FILE)
    if os.path.lexists(pending):
        _say(
            f"not loading {MODULE}: {pending} holds a module upgrade's state that no module "
            f"has taken yet (an upgrade is running, or was interrupted: run "
            f"`nri-gpushare kmod-upgrade` to finish it)",
            error=True,
        )
        return 0
    command = [args.modprobe, MODULE]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        problem = "" if done.returncode == 0 else _modprobe_output(done)
    except OSError as exc:
        problem = f"cannot run {args.modprobe}: {exc.strerror or exc}"
    if not problem:
        _say(f"loaded {MODULE}")
        return 0
    advice = (
        f"is the module installed for this kernel? (`dkms status {MODULE}`; "
        f"`sh scripts/install-node.sh` builds it)"
    )
    if config.kmod == "required":
        _say(
            f"`{' '.join(command)}` failed: {problem}; kmod: required, so the daemon "
            f"cannot start: {advice}",
            error=True,
        )
        return 1
    _say(
        f"`{' '.join(command)}` failed: {problem}; kmod: optional, so the daemon starts "
        f"without the module (isolation not enforced): {advice}",
        error=True,
    )
    return 0


def _modprobe_output(done: subprocess.CompletedProcess[str]) -> str:
    text = " ".join((done.stderr or done.stdout or "").split())
    return f"exit status {done.returncode}" + (f": {text}" if text else "")
