"""`nri-gpushare enable` / `disable`: turn containerd's NRI on in its
`config.toml` with the plugin's own socket and timeouts, and put back what
was there before.

What to change is decided from containerd's own view of the file (`containerd
--config FILE config dump`): only settings whose effective value differs from
what the plugin needs are written, so a stock containerd 2.x (NRI on by
default) is left alone and a second run changes nothing.  Each line enable
writes carries a trailing comment, kept by tomlkit, with the value it set and
the one it replaced (`# nri-gpushare enable: {"set": "false", "was": "true"}`);
disable puts back exactly those, and leaves alone a line whose value was
changed since.  The record lives in the file it describes, so it cannot go
stale apart from it: a regenerated config.toml loses both.

The editing is pure (`containerd_plan`: text in, text out); `containerd_config`
asks containerd and replaces the file (backup, temp file, fsync, rename); here
the two meet, with what is printed.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nri_gpushare.ops.containerd_config import ConfigFile, ContainerdBinary
from nri_gpushare.ops.containerd_nri import (
    ConfigEditError,
    NoTempFileError,
    NriSettings,
    effective_nri,
    go_duration,
    same_setting,
)
from nri_gpushare.ops.containerd_plan import Plan, plan_disable, plan_enable

DEFAULT_CONFIG = "/etc/containerd/config.toml"
DEFAULT_PLUGIN_CONFIG = "/etc/nri-gpushare/gpushare.yaml"
RESTART_HINT = "restart containerd to apply it: systemctl restart containerd"


def settings_from_plugin_config(path: str | None) -> tuple[NriSettings, str]:
    """The settings from the plugin's YAML; (settings, where they came from).

    The default path may be absent (the plugin's defaults apply, as for
    `nri-gpushare run` without --config); a path given explicitly must exist.
    """
    from nri_gpushare.config import Config, ConfigError, load_config

    explicit = path is not None
    path = path or DEFAULT_PLUGIN_CONFIG
    if not explicit and not os.path.exists(path):
        config, source = Config(), f"the plugin's defaults ({path} does not exist)"
    else:
        try:
            config = load_config(path)
        except ConfigError as exc:
            raise ConfigEditError(f"plugin config: {exc}") from exc
        source = path
    if not os.path.isabs(config.socket):
        raise ConfigEditError(f"{source}: nri.socket {config.socket!r} must be an absolute path")
    settings = NriSettings(config.socket, config.registration_timeout, config.request_timeout)
    return settings, source


def _diff(plan: Plan, path: Path) -> str:
    old = (plan.old or "").splitlines(keepends=True)
    new = (plan.new or "").splitlines(keepends=True)
    lines = difflib.unified_diff(old, new, f"{path}", f"{path} (new)")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _validated(
    binary: ContainerdBinary, file: ConfigFile, plan: Plan, settings: NriSettings | None
) -> tuple[Path | None, dict[str, Any]]:
    """Write the new text beside the file and have containerd parse it: the
    temp file (None: the file goes) and containerd's NRI settings after."""
    text = plan.new if plan.new is not None else ""
    temp = file.temp(text)
    check = temp  # parsed where containerd resolves the imports (a link's directory)
    try:
        if os.path.realpath(file.imports_from) != os.path.realpath(temp.parent):
            check = file.temp(text, file.imports_from)
        try:
            dump = binary.dump(check, f"the edited {file.path} (in {check})")
        finally:
            if check != temp:
                check.unlink(missing_ok=True)
        nri = effective_nri(dump, "the new file")
        if settings is not None:
            wrong = [
                f"{key} = {json.dumps(nri.get(key))}"
                for key, value in settings.wanted().items()
                if key in nri and not same_setting(key, nri[key], value)
            ]
            if wrong:
                own = os.path.abspath(check)
                imports = [str(i) for i in dump.get("imports") or [] if str(i) != own]
                raise ConfigEditError(
                    "after the edit containerd still reads "
                    + ", ".join(wrong)
                    + ": a file in `imports` sets it ("
                    + (", ".join(imports) or "none listed")
                    + "); change it there and run enable again"
                )
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if plan.new is None:
        temp.unlink()
        return None, nri
    return temp, nri


def _describe(nri: Mapping[str, Any]) -> str:
    if nri.get("disable"):
        return "NRI off"
    return (
        f"NRI on, socket {nri.get('socket_path')}, registration timeout "
        f"{nri.get('plugin_registration_timeout')}, request timeout "
        f"{nri.get('plugin_request_timeout')}"
        + (
            ", external plugins refused (disable_connections)"
            if nri.get("disable_connections")
            else ""
        )
    )


def _apply(
    binary: ContainerdBinary,
    file: ConfigFile,
    plan: Plan,
    args: argparse.Namespace,
    settings: NriSettings | None,
    verb: str,
    unchanged: str = "",
) -> int:
    path = file.path
    if file.given != file.path:
        print(f"{file.given} is a link to {path}: editing {path}")
    if not plan.changed:
        print(f"{path}: no change: " + "; ".join(plan.notes or [unchanged]))
        return 0
    try:
        temp, nri = _validated(binary, file, plan, settings)
    except NoTempFileError as exc:
        if not args.dry_run:
            raise
        sys.stdout.write(_diff(plan, path))
        print(f"dry run, not checked with containerd ({exc}); nothing was changed")
        return 0
    try:
        if args.dry_run:
            sys.stdout.write(_diff(plan, path))
            print(
                f"dry run: containerd {binary.version} parses the result ({_describe(nri)}); "
                "nothing was changed"
            )
            return 0
        backup = file.replace(temp) if temp is not None else file.remove()
    finally:
        if temp is not None:
            temp.unlink(missing_ok=True)
    print(f"{path}: {verb}:")
    for line in plan.changes:
        print(f"  {line}")
    for line in plan.notes:
        print(f"  note: {line}")
    print(f"containerd {binary.version} parses the new file: {_describe(nri)}")
    print(f"backup: {backup}" if backup else "(there was no file before: no backup)")
    print(f"Next: {RESTART_HINT}")
    return 0


def _enable(args: argparse.Namespace) -> int:
    settings, source = settings_from_plugin_config(args.plugin_config)
    binary = ContainerdBinary.find(args.containerd)
    file = ConfigFile(args.config)
    text = file.read()
    if text is not None:
        effective = effective_nri(binary.dump(file.given), str(file.given))
    else:
        base = file.temp(f"version = {binary.config_version}\n", file.imports_from)
        try:
            effective = effective_nri(binary.dump(base), "containerd's defaults")
        finally:
            base.unlink()
    print(
        f"NRI settings from {source}: socket {settings.socket_path}, "
        f"registration timeout {go_duration(settings.registration_timeout)}, "
        f"request timeout {go_duration(settings.request_timeout)}"
    )
    try:
        plan = plan_enable(text, effective, settings, binary.config_version)
    except ConfigEditError as exc:
        raise ConfigEditError(f"{file.path}: {exc}") from exc
    return _apply(
        binary,
        file,
        plan,
        args,
        settings,
        "NRI enabled for nri-gpushare",
        "NRI is already on with these settings (as containerd reads this file)",
    )


def _disable(args: argparse.Namespace) -> int:
    binary = ContainerdBinary.find(args.containerd)
    file = ConfigFile(args.config)
    text = file.read()
    if text is None:
        print(f"{file.path}: no change: the file does not exist")
        return 0
    binary.dump(file.given)  # containerd must parse it now, as after
    try:
        plan = plan_disable(text)
    except ConfigEditError as exc:
        raise ConfigEditError(f"{file.path}: {exc}") from exc
    return _apply(binary, file, plan, args, None, "NRI settings before enable restored")


Command = Callable[[argparse.Namespace], int]


def _main(func: Command) -> Command:
    """`func` with a refusal told on stderr (exit status 1) instead of raised."""

    def run(args: argparse.Namespace) -> int:
        try:
            code: int = func(args)
        except ConfigEditError as exc:
            print(f"nri-gpushare {args.command}: {exc}\nNothing was changed.", file=sys.stderr)
            return 1
        return code

    return run


def register(subparsers: Any) -> None:
    for name, func, text in (
        ("enable", _enable, "turn NRI on in containerd's config.toml with the plugin's settings"),
        ("disable", _disable, "put back the NRI settings enable changed in config.toml"),
    ):
        sub = subparsers.add_parser(name, help=text, description=text)
        sub.add_argument(
            "--config",
            default=DEFAULT_CONFIG,
            help=f"containerd's config (default {DEFAULT_CONFIG})",
        )
        sub.add_argument(
            "--containerd",
            default="containerd",
            help="the containerd binary that parses the result (default: containerd on PATH)",
        )
        sub.add_argument("--dry-run", action="store_true", help="print the diff, change nothing")
        if name == "enable":
            sub.add_argument(
                "--plugin-config",
                default=None,
                help=f"the plugin's config, for nri.socket and its timeouts "
                f"(default {DEFAULT_PLUGIN_CONFIG}, its defaults if absent)",
            )
        sub.set_defaults(func=_main(func))
