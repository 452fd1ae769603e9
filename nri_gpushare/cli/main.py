"""`nri-gpushare`: run the plugin, ask it for its status, resize a running
container's share, unload the module, write the CDI spec, and the CDI hooks
themselves (`hook`, run by the runtime in every container start: dispatched
before anything heavy is imported)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
from typing import Any

# Everything else is imported where it is used: `hook` must start fast.


def _run(args: argparse.Namespace) -> int:
    from nri_gpushare.config import Config, ConfigError, load_config
    from nri_gpushare.daemon.main import run_daemon
    from nri_gpushare.share.decisions import configure_logging

    try:
        config = load_config(args.config) if args.config else Config()
    except ConfigError as exc:
        print(f"nri-gpushare: {exc}", file=sys.stderr)
        return 2
    # One record, one line (text escapes, json is one object a line): values a
    # pod chose cannot forge lines; decisions are `decision=...` lines.
    configure_logging(config.log_level, config.log_format)
    for chatty in ("hpack", "h2", "grpclib"):  # every HTTP/2 frame of the containerd client
        logging.getLogger(chatty).setLevel(max(logging.INFO, logging.getLogger().level))
    prelaunched = os.environ.get("NRI_PLUGIN_SOCKET") == "3" and not args.socket
    try:
        return asyncio.run(run_daemon(config, socket_path=args.socket, prelaunched=prelaunched))
    except ConfigError as exc:
        print(f"nri-gpushare: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _used(share: dict[str, Any]) -> str:
    from nri_gpushare.units import format_bytes

    used = share.get("memory_used")
    return "?" if used is None else format_bytes(used)


def _compute(share: dict[str, Any]) -> str | None:
    """'compute 30% target (policy 3 fixed share), 29.6% used (60 s)'; None
    from a plugin whose status has no compute fields."""
    from nri_gpushare.share.report import POLICIES

    if "compute_rule" not in share:
        return None
    target = share.get("compute_target")
    text = "compute no share" if target is None else f"compute {target}% target"
    policy = share.get("compute_policy")
    if isinstance(policy, int) and policy in POLICIES:
        text += f" (policy {policy} {POLICIES[policy]})"
    elif str(share["compute_rule"]).startswith("standalone"):
        text += " (standalone)"
    used = share.get("compute_used_pct")
    if used is None:
        return f"{text}, used {share.get('compute_used_why') or 'unknown'}"
    return f"{text}, {used:.1f}% used ({share.get('compute_window_s') or 0:.0f} s)"


def _scheduler(gpu: dict[str, Any]) -> str:
    """'; policy 2 (weighted), slice 10 ms, drain 100 ms, prio_ratio 80%,
    0 forced ends' when the module said."""
    policy = gpu.get("policy")
    if not isinstance(policy, int):
        return ""
    from nri_gpushare.share.report import POLICIES

    name = POLICIES.get(policy, "unknown")
    text = f"; policy {policy} ({name})"
    if isinstance(gpu.get("slice_us"), int):
        text += f", slice {gpu['slice_us'] / 1000:g} ms"
    if isinstance(gpu.get("drain_us"), int):
        text += f", drain {gpu['drain_us'] / 1000:g} ms"
    if isinstance(gpu.get("prio_ratio"), int):
        text += f", prio_ratio {gpu['prio_ratio']}%"
    if isinstance(gpu.get("forced_ends"), int):
        text += f", {gpu['forced_ends']} forced end{'' if gpu['forced_ends'] == 1 else 's'}"
    return text


def _owner(alloc: dict[str, Any]) -> str:
    """The pod, or for a container started by hand how it asked and its name
    (its creator's text: escaped, so no escape sequence reaches the terminal)."""
    from nri_gpushare.units import quote

    origin = alloc.get("origin", "nri")
    if origin == "nri":
        return quote(str(alloc["pod"] or "-"))
    return f"{quote(str(origin))} {quote(str(alloc['name']))}"


def _print_guards(status: dict[str, Any]) -> None:
    interposer = status.get("interposer")
    if interposer:
        state = interposer.get("problem") or "present"
        if interposer.get("problem"):
            state = f"{state} (interposer.missing: {interposer['missing']})"
        print(
            f"interposer: {interposer['library']} -> {interposer['container_path']} "
            f"({interposer['preload']}): {state}"
        )
    limits = status.get("nvml_memory_limits")
    if limits:
        if limits["mode"] == "off":
            print("driver memory limits (NVML): off")
        else:
            on = [i for i, p in limits["gpus"].items() if not p]
            off: dict[str, list[str]] = {}
            for index, problem in limits["gpus"].items():
                if problem:
                    off.setdefault(problem, []).append(index)
            where = f"on GPU {', '.join(on)}" if on else "on no GPU"
            print(
                f"driver memory limits (NVML): {where}"
                + "".join(f"; not on GPU {', '.join(i)}: {p}" for p, i in off.items())
            )


def _print_status(status: dict[str, Any]) -> None:
    from nri_gpushare.units import format_bytes, quote

    kmod = status["kmod"]
    enforced = "loaded" if kmod["loaded"] else f"{kmod['problem']}: isolation not enforced"
    print(f"kernel module: {kmod['mode']}, {enforced}")
    _print_guards(status)
    for gpu in status["gpus"]:
        print(
            f"GPU {gpu['index']} {gpu['uuid']} {gpu['name']}: "
            f"memory {format_bytes(gpu['memory_allocated'])} allocated, "
            f"{format_bytes(gpu['memory_free'])} free of {format_bytes(gpu['memory_total'])}; "
            f"core {gpu['core_allocated']}%; {len(gpu['containers'])} container(s)"
            + _scheduler(gpu)
        )
    nri = status.get("nri", {})
    if not nri.get("connected", True):
        why = f": {nri['last_error']}" if nri.get("last_error") else ""
        print(f"NRI: not connected to the runtime{why}")
    allocations = status["allocations"]
    if not allocations:
        print("no allocations")
    else:
        print(
            f"{'CONTAINER':14} {'POD / ORIGIN NAME':30} {'GPU':>3} {'USED':>9} "
            f"{'MEMORY':>9} {'CORE':>5} {'PRIORITY':8} GUARDS"
        )
    for alloc in allocations:
        guards = ",".join(alloc.get("guards", []))
        for share in alloc["gpus"]:
            core = f"{share['core']}%" if share["core"] else "-"
            print(
                f"{alloc['container_id'][:13]:14} {_owner(alloc)[:30]:30} "
                f"{share['index']:>3} {_used(share):>9} {format_bytes(share['memory']):>9} "
                f"{core:>5} {alloc['priority']:8} {guards}"
            )
        for share in alloc["gpus"]:
            if (compute := _compute(share)) is not None:
                print(f"  {alloc['container_id'][:13]} GPU {share['index']}: {compute}")
        if alloc.get("resized"):
            print(
                f"  {alloc['container_id'][:13]}: resized live (its gpushare.io/assigned "
                f"annotation and environment say the share it was created with)"
            )
        for mechanism, why in alloc.get("unguarded", {}).items():
            what = "unguarded" if mechanism == "none" else f"no {mechanism}"
            print(f"  {alloc['container_id'][:13]}: {what}: {why}")
        unknown = {s["memory_used_why"] for s in alloc["gpus"] if s.get("memory_used") is None}
        for why in sorted(unknown - {""}):
            print(f"  {alloc['container_id'][:13]}: used {why}")
    for entry in status.get("unserved", []):
        print(
            f"UNSERVED {entry['container_id'][:13]} {quote(entry['pod'] or entry['name'])}: "
            f"asked for {entry['asked']}, runs without a share ({entry['action']})"
        )
    for claim in status.get("claims", []):
        print(_claim_line(claim))


def _claim_line(claim: dict[str, Any]) -> str:
    """A prepared DRA claim: its share and who holds it."""
    from nri_gpushare.units import format_bytes, quote

    shares = ", ".join(
        f"GPU {g['index']} {format_bytes(g['memory'])}" + (f" {g['core']}%" if g["core"] else "")
        for g in claim["gpus"]
    )
    holder = claim["holder"]
    held = f"held by container {holder[:13]}" if holder else "booked, no container holds it yet"
    name = quote(f"{claim['namespace']}/{claim['name']}")
    return f"DRA CLAIM {name} ({claim['uid']}): {shares}; {held}"


def _status(args: argparse.Namespace) -> int:
    from nri_gpushare.config import ConfigError
    from nri_gpushare.host.sockets import query_status, status_socket, unreachable

    try:
        path = status_socket(args.config, args.status_socket)
    except ConfigError as exc:
        print(f"nri-gpushare: {exc}", file=sys.stderr)
        return 2
    try:
        status = query_status(path)
    except (OSError, ValueError) as exc:  # ValueError: a cut-off or garbled reply
        print(f"nri-gpushare: {unreachable(path, exc)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        _print_status(status)
    return 0


def _uninstall(args: argparse.Namespace) -> int:
    from nri_gpushare.kmod.procfs import ProcfsKernelModule
    from nri_gpushare.ops.kmod_admin import uninstall

    code, message = uninstall(ProcfsKernelModule(args.kmod_root))
    print(message, file=sys.stderr if code else sys.stdout)
    return code


# Subcommands that live in their own modules: each has
# `register(subparsers)`, which adds its parsers with `set_defaults(func=...)`
# (`func(args) -> int`) and keeps heavy imports inside the functions.
_COMMAND_MODULES: tuple[str, ...] = (
    "nri_gpushare.ops.load_module",
    "nri_gpushare.cli.smi",
    "nri_gpushare.ops.containerd_enable",
    "nri_gpushare.ops.kmod_upgrade",
    "nri_gpushare.cli.device_plugin",
    "nri_gpushare.cli.dra_driver",
    "nri_gpushare.cli.resize",
)


def build_parser() -> argparse.ArgumentParser:
    from nri_gpushare.config import DEFAULT_STATUS_SOCKET
    from nri_gpushare.names import PROC_ROOT

    parser = argparse.ArgumentParser(prog="nri-gpushare", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the NRI plugin")
    run.add_argument("--config", help="YAML node configuration")
    run.add_argument("--socket", help="NRI socket (overrides nri.socket of the config)")
    run.set_defaults(func=_run)

    status = sub.add_parser("status", help="show GPUs and allocations of the running plugin")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument("--config", help="read status_socket from this config")
    status.add_argument("--status-socket", default=DEFAULT_STATUS_SOCKET)
    status.set_defaults(func=_status)

    uninstall = sub.add_parser(
        "uninstall", help="unload gpushare.ko (refused while containers are registered)"
    )
    uninstall.add_argument("--kmod-root", default=PROC_ROOT)
    uninstall.set_defaults(func=_uninstall)

    for module in _COMMAND_MODULES:
        importlib.import_module(module).register(sub)

    # Parsed by their own modules (main() hands them over); listed for --help.
    sub.add_parser("cdi", help="write the CDI spec (nri-gpushare cdi generate --help)")
    sub.add_parser("hook", help="the CDI spec's OCI hooks (run by the runtime, not by hand)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hook"]:
        from nri_gpushare.local.hook import main as hook_main

        return hook_main(argv[1:])
    if argv[:1] == ["cdi"]:
        from nri_gpushare.ops.cdi import main as cdi_main

        return cdi_main(argv[1:])
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
