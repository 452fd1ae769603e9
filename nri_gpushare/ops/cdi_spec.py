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

import json
import math
import os
import re
from collections.abc import Sequence
from typing import Any, Literal

import yaml

from nri_gpushare.local.client import DEFAULT_SOCKET, DEFAULT_TIMEOUT
from nri_gpushare.share.interposer import interposer_injection
from nri_gpushare.share.model import DeviceNode, Gpu, InterposerPolicy, Mount
from nri_gpushare.share.plan import DeviceLookup

KIND = "gpushare.io/gpu"
ALL = "all"
PROGRAM = "nri-gpushare"
#: Seconds the runtime gives each hook: longer than the hook's own wait for
#: the daemon (the local client's timeout), so that a slow daemon fails the
#: container with the hook's message rather than the runtime's "timed out".
HOOK_TIMEOUT = math.ceil(DEFAULT_TIMEOUT) + 5
CREATE_RUNTIME = "create-runtime"
POSTSTOP = "poststop"

_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
"""CDI's device names (tags.cncf.io/container-device-interface pkg/parser,
ValidateDeviceName): letters, digits, `_.:-`, beginning and ending with a
letter or digit."""


class CdiError(Exception):
    """What stops the spec from being made or written; str() is one line for a person."""


def valid_device_name(name: str) -> bool:
    """Whether CDI takes `name` as a device name."""
    return _DEVICE_NAME.fullmatch(name) is not None


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
    """The names of the spec's devices, in its order."""
    return [d["name"] for d in spec["devices"]]


def render(spec: dict[str, Any], fmt: Literal["json", "yaml"]) -> str:
    """The spec as a file's text, JSON or YAML."""
    if fmt == "yaml":
        text: str = yaml.safe_dump(spec, sort_keys=False, default_flow_style=False)
        return text
    return json.dumps(spec, indent=2) + "\n"
