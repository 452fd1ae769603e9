"""The CDI spec (`nri-gpushare cdi generate`): GPU shares for containers that
containerd's NRI never sees (nerdctl, docker, podman), through
`--device gpushare.io/gpu=<index|uuid|all>`.

Kind `gpushare.io/gpu`.  One device per GPU under its index ("0") and one
under its UUID ("GPU-..."), each adding only that GPU's /dev/nvidia<minor>
node and `NVIDIA_VISIBLE_DEVICES` / `GPUSHARE_GPU_UUIDS` = its UUID; and
"all", with every GPU's node and every UUID (comma-separated, index order).
The daemon learns which GPUs a container was given from those nodes in its
config.json, so a GPU device carries exactly its own node.

Spec-level edits (applied once when any device of the spec is used): the
nodes every GPU container needs (nvidiactl, the uvm nodes and the kernel
module's /dev/gpushare when the host has them), the interposer's mounts and
environment (the same `interposer_injection` the NRI path uses), and the two
OCI hooks that ask the running daemon: createRuntime (`nri-gpushare hook
create-runtime`: place and register the share; a refusal fails the
container's creation) and poststop (`nri-gpushare hook poststop`: release).
Per device they would run once per requested device.

The spec is static: nothing per container (the quota numbers) can be in it,
since a createRuntime hook runs after the runtime has read config.json.  See
docs/cdi.md.  Its interposer mount names the library version the configured
path resolves to when the spec is generated
(/usr/lib/nri-gpushare/<version>/libgpushare.so from the node installer):
after an upgrade, generate the spec again so that new CDI containers get the
new version (the old one stays on the node, so the old spec keeps working).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import math
import os
import re
import shutil
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from nri_gpushare.config import Config, ConfigError, load_config
from nri_gpushare.host.devices import (
    PRELOAD_FILE_NAME,
    HostDevices,
    library_problem,
    load_inventory,
)
from nri_gpushare.host.statefile import replace_file
from nri_gpushare.local.client import DEFAULT_SOCKET, DEFAULT_TIMEOUT
from nri_gpushare.share.interposer import interposer_injection
from nri_gpushare.share.model import DeviceNode, Gpu, InterposerPolicy, Mount
from nri_gpushare.share.plan import DeviceLookup

KIND = "gpushare.io/gpu"
ALL = "all"
PROGRAM = "nri-gpushare"
DEFAULT_OUTPUT = "/etc/cdi/gpushare.io-gpu.json"
#: Seconds the runtime gives each hook: longer than the hook's own wait for
#: the daemon (the local client's timeout), so that a slow daemon fails the
#: container with the hook's message rather than the runtime's "timed out".
HOOK_TIMEOUT = math.ceil(DEFAULT_TIMEOUT) + 5
CREATE_RUNTIME = "create-runtime"
POSTSTOP = "poststop"
#: The file names a CDI runtime loads from /etc/cdi and /var/run/cdi.
SPEC_SUFFIXES = (".json", ".yaml")

_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
"""CDI's device names (tags.cncf.io/container-device-interface pkg/parser,
ValidateDeviceName): letters, digits, `_.:-`, beginning and ending with a
letter or digit."""


class CdiError(Exception):
    """What stops the spec from being made or written; str() is one line for a person."""


def valid_device_name(name: str) -> bool:
    return _DEVICE_NAME.fullmatch(name) is not None


# -- the spec (pure) ------------------------------------------------------------------


def _node(node: DeviceNode) -> dict[str, Any]:
    return {
        "path": node.path,
        "type": node.type,
        "major": node.major,
        "minor": node.minor,
        "fileMode": node.mode,
    }


def _mount(mount: Mount) -> dict[str, Any]:
    return {
        "hostPath": mount.source,
        "containerPath": mount.destination,
        "type": mount.type,
        "options": list(mount.options),
    }


def hook_args(hook: str, api_socket: str) -> list[str]:
    """argv of `nri-gpushare hook <hook>`; `--socket` only when not the default."""
    args = [PROGRAM, "hook", hook]
    if api_socket != DEFAULT_SOCKET:
        args += ["--socket", api_socket]
    return args


def _hook(name: str, hook: str, path: str, api_socket: str, timeout: int) -> dict[str, Any]:
    return {
        "hookName": name,
        "path": path,
        "args": hook_args(hook, api_socket),
        "timeout": timeout,
    }


def _gpu_edits(gpus: Sequence[Gpu], devices: DeviceLookup) -> dict[str, Any]:
    uuids = ",".join(g.uuid for g in gpus)
    return {
        "env": [f"NVIDIA_VISIBLE_DEVICES={uuids}", f"GPUSHARE_GPU_UUIDS={uuids}"],
        "deviceNodes": [_node(devices.gpu(g.minor)) for g in gpus],
    }


def minimum_version(spec: dict[str, Any]) -> str:
    """The lowest CDI version that has every feature `spec` uses, by the rules
    of tags.cncf.io/container-device-interface specs-go/version.go (for the
    fields this module can write): a runtime refuses a spec whose cdiVersion
    is lower, and an older runtime one whose cdiVersion it does not know."""
    devices = spec.get("devices", [])
    edits = [d.get("containerEdits", {}) for d in devices] + [spec.get("containerEdits", {})]
    _, _, kind_name = str(spec.get("kind", "")).partition("/")
    if spec.get("annotations") or any(d.get("annotations") for d in devices) or "." in kind_name:
        return "0.6.0"
    if any(d["name"][:1].isdigit() for d in devices) or any(
        n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])
    ):
        return "0.5.0"  # device names beginning with a digit; deviceNodes[].hostPath
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        return "0.4.0"  # mounts[].type
    return "0.3.0"


def build_spec(
    gpus: Sequence[Gpu],
    devices: DeviceLookup,
    interposer: InterposerPolicy | None,
    hook_path: str,
    api_socket: str = DEFAULT_SOCKET,
    hook_timeout: int = HOOK_TIMEOUT,
) -> dict[str, Any]:
    """The CDI spec for `gpus`; `devices`: the host's nodes; `interposer`: the
    node's, its `preload_file` filled in for preload ld.so.preload (None: no
    interposer mounts); `hook_path`: the absolute path of nri-gpushare;
    `api_socket`: the daemon's local API.  CdiError when no spec can be made."""
    if not gpus:
        raise CdiError("no GPUs: nothing to put in the CDI spec")
    if not os.path.isabs(hook_path):
        raise CdiError(f"hook path {hook_path!r} is not absolute (CDI requires it)")
    if hook_timeout <= 0:
        raise CdiError(f"hook timeout {hook_timeout} must be more than zero seconds")
    ordered = sorted(gpus, key=lambda g: g.index)
    for attr in ("index", "uuid", "minor"):
        values = [str(getattr(g, attr)) for g in ordered]
        if len(set(values)) != len(values):
            raise CdiError(f"GPU inventory: duplicate {attr} in {', '.join(values)}")
    for g in ordered:
        if not valid_device_name(g.uuid):
            raise CdiError(
                f"GPU {g.index}: UUID {g.uuid!r} is not a valid CDI device name "
                f"(letters, digits, _.:- only, beginning and ending with a letter or digit)"
            )

    entries = [{"name": str(g.index), "containerEdits": _gpu_edits([g], devices)} for g in ordered]
    entries += [{"name": g.uuid, "containerEdits": _gpu_edits([g], devices)} for g in ordered]
    entries.append({"name": ALL, "containerEdits": _gpu_edits(ordered, devices)})

    common: dict[str, Any] = {}
    env: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    if interposer is not None:
        mounts, env = interposer_injection(interposer, {})
    if env:
        common["env"] = [f"{k}={v}" for k, v in env.items()]
    nodes = list(devices.common())
    if control := devices.control():
        nodes.append(control)
    common["deviceNodes"] = [_node(n) for n in nodes]
    if mounts:
        common["mounts"] = [_mount(m) for m in mounts]
    common["hooks"] = [
        _hook("createRuntime", CREATE_RUNTIME, hook_path, api_socket, hook_timeout),
        _hook("poststop", POSTSTOP, hook_path, api_socket, hook_timeout),
    ]
    spec: dict[str, Any] = {"cdiVersion": "", "kind": KIND, "devices": entries}
    spec["containerEdits"] = common
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def device_names(spec: dict[str, Any]) -> list[str]:
    return [d["name"] for d in spec["devices"]]


def render(spec: dict[str, Any], fmt: str) -> str:
    if fmt == "yaml":
        text: str = yaml.safe_dump(spec, sort_keys=False, default_flow_style=False)
        return text
    return json.dumps(spec, indent=2) + "\n"


# -- the node's values ----------------------------------------------------------------


def default_hook_path(
    which: Callable[[str], str | None] | None = None, argv0: str | None = None
) -> str | None:
    """The absolute path of the nri-gpushare program: found on PATH (`which`,
    default shutil.which), else the running one (`argv0`, default sys.argv[0])
    when it is an executable file; None otherwise (run as `python -m`)."""
    found = (which or shutil.which)(PROGRAM)
    if found:
        return os.path.abspath(found)
    argv0 = sys.argv[0] if argv0 is None else argv0
    if argv0:
        path = Path(argv0).resolve()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def _executable_problem(path: str) -> str:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be looked at ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if not st.st_mode & 0o111:
        return "is not executable"
    return ""


def _makedirs(directory: str) -> None:
    """Create `directory` and any missing parents, each mode 0755 whatever the
    umask (runtimes, rootless podman too, read the specs)."""
    missing = []
    path = os.path.abspath(directory)
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if os.path.isdir(path):
                continue
            raise NotADirectoryError(errno.ENOTDIR, f"{path} is not a directory") from None
        os.chmod(path, 0o755)


def write_spec(path: str, text: str) -> None:
    """Replace `path` with `text`, mode 0644, atomically (a temporary file in
    the same directory renamed over it: a runtime reading the directory sees
    the old spec or the new one).  Raises OSError."""
    directory, name = os.path.split(os.path.abspath(path))
    _makedirs(directory)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        replace_file(dir_fd, name, text.encode(), 0o644)
    finally:
        os.close(dir_fd)


# -- the command ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{PROGRAM} cdi",
        description="The CDI spec of this node's GPUs (kind gpushare.io/gpu), for "
        "nerdctl, docker and podman: --device gpushare.io/gpu=0.  See docs/cdi.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write the CDI spec")
    gen.add_argument("--config", help="the node configuration (default: built-in defaults)")
    gen.add_argument(
        "--output",
        default=DEFAULT_OUTPUT,
        help=f"where to write it, '-' for stdout (default {DEFAULT_OUTPUT})",
    )
    gen.add_argument(
        "--format",
        choices=("json", "yaml"),
        help="default: from the output's suffix (.yaml/.yml: yaml; else json)",
    )
    gen.add_argument(
        "--hook-path",
        help=f"absolute path of {PROGRAM} for the hooks (default: the one running)",
    )
    return parser


def _warn(message: str) -> None:
    print(f"{PROGRAM}: warning: {message}", file=sys.stderr)


def _inventory(config: Config, nvml: Any) -> list[Gpu]:
    """The daemon's rule: NVML when use_nvml and it reports a GPU, else the config's."""
    if config.use_nvml:
        try:
            gpus = load_inventory(config.inventory, nvml)
        except ValueError as e:
            raise CdiError(str(e)) from None
        if not gpus:
            raise CdiError("no GPUs: NVML found none and the config has no `inventory:`")
        return gpus
    if not config.inventory:
        raise CdiError("no GPUs: use_nvml is false and the config has no `inventory:`")
    return sorted(config.inventory, key=lambda g: g.index)


def _interposer(config: Config) -> InterposerPolicy | None:
    """The node's interposer policy, its preload file filled in; None (and a
    warning) when the library is not on the node."""
    policy = config.interposer
    if problem := library_problem(policy.library):
        _warn(
            f"interposer {policy.library} {problem}: the spec has no interposer mounts, so "
            f"containers started through it never get libgpushare.so, even once it is "
            f"installed; install it and generate the spec again"
        )
        return None
    if policy.preload == "ld.so.preload":
        preload_file = os.path.join(config.state_dir, PRELOAD_FILE_NAME)
        policy = dataclasses.replace(policy, preload_file=preload_file)
        try:
            os.stat(preload_file)
        except FileNotFoundError:
            _warn(
                f"{preload_file} does not exist yet: the daemon writes it when it starts, "
                f"and until then containers with a {KIND} device cannot be created "
                f"(the spec mounts it)"
            )
        except OSError:
            pass  # not ours to look at (state_dir is root's, 0700): the daemon's concern
    return policy


def _check_nodes(config: Config, devices: DeviceLookup) -> None:
    """Warn about nodes the host lacks now, which the static spec then lacks for good."""
    if not any(n.path == "/dev/nvidia-uvm" for n in devices.common()):
        _warn(
            "/dev/nvidia-uvm is not on this node, so the spec does not give it: CUDA "
            "programs need it (`nvidia-modprobe -u -c=0` creates it); generate the spec "
            "again once it exists"
        )
    if config.kmod != "off" and devices.control() is None:
        _warn(
            "the kernel module's control device (/dev/gpushare) is not on this node, so "
            "the spec does not give it: the interposer in these containers cannot read "
            "their quotas from the module; load gpushare.ko and generate the spec again"
        )


def generate(
    args: argparse.Namespace,
    devices: DeviceLookup | None = None,
    nvml: Any = None,
) -> int:
    """`cdi generate` with parsed `args`; CdiError when it cannot."""
    try:
        config = load_config(args.config) if args.config else Config()
    except ConfigError as e:
        raise CdiError(str(e)) from None
    hook_path = args.hook_path or default_hook_path()
    if hook_path is None:
        raise CdiError(f"cannot find the {PROGRAM} program on PATH: pass --hook-path")
    if not os.path.isabs(hook_path):
        raise CdiError(f"--hook-path {hook_path!r} must be an absolute path")
    gpus = _inventory(config, nvml)
    # Errors above, warnings below: an error is the only line said.
    if problem := _executable_problem(hook_path):
        _warn(f"hook program {hook_path} {problem}: containers cannot be created until it is")
    lookup = devices if devices is not None else HostDevices()
    spec = build_spec(gpus, lookup, _interposer(config), hook_path, config.api_socket)
    _check_nodes(config, lookup)
    output: str = args.output
    fmt: str = args.format or ("yaml" if output.endswith((".yaml", ".yml")) else "json")
    text = render(spec, fmt)
    if output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    if not output.endswith(SPEC_SUFFIXES):
        _warn(f"{output}: runtimes load only *.json and *.yaml files from /etc/cdi")
    try:
        write_spec(output, text)
    except OSError as e:
        raise CdiError(f"cannot write {output}: {e.strerror or e}") from None
    plural = "" if len(gpus) == 1 else "s"
    print(f"wrote {output}: {len(gpus)} GPU{plural}, devices {', '.join(device_names(spec))}")
    return 0


def main(argv: Sequence[str], *, devices: DeviceLookup | None = None, nvml: Any = None) -> int:
    """`nri-gpushare cdi ...`; `devices` and `nvml` replace the host's (tests).
    Exit 2 with one line on stderr when the spec cannot be made or written."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as e:  # --help, or a usage error (argparse said why)
        return 0 if e.code is None else e.code if isinstance(e.code, int) else 2
    try:
        return generate(args, devices, nvml)
    except CdiError as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return 2
