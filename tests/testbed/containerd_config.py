"""The config.toml the test bed writes: version 2 for containerd 1.7, version 3
for 2.x (where CRI is split into io.containerd.cri.v1.runtime and .images and
the sandbox image is a pinned image).  Same settings either way; see
tests/testbed/containerd.py for why each is needed on these machines."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

DISABLED_SNAPSHOTTERS = ("btrfs", "devmapper", "zfs")  # and aufs, which 2.x no longer has


class Bed(Protocol):
    """What the config is made of (tests.testbed.containerd.Containerd)."""

    base: Path
    cri_socket: Path
    ttrpc_socket: Path
    nri_socket: Path
    nri_plugin_dir: Path
    nri_plugin_config_dir: Path
    runc_root: Path
    nri: bool
    plugin_registration_timeout: str
    plugin_request_timeout: str
    log_level: str
    sandbox_image: str
    passthrough_annotations: tuple[str, ...]


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_text(bed: Bed, major: int) -> str:
    """The whole config.toml for a containerd of this major version."""
    sections = _common(bed, major)
    sections.update(_cri_v3(bed) if major >= 2 else _cri_v2(bed))
    lines: list[str] = []
    for name, keys in sections.items():
        if name:
            lines.append(f"\n[{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


def _common(bed: Bed, major: int) -> dict[str, dict[str, object]]:
    b = bed.base
    return {
        "": {
            "version": 3 if major >= 2 else 2,
            "root": b / "root",
            "state": b / "state",
            "disabled_plugins": [
                f"io.containerd.snapshotter.v1.{name}"
                for name in (
                    DISABLED_SNAPSHOTTERS if major >= 2 else ("aufs", *DISABLED_SNAPSHOTTERS)
                )
            ],
        },
        "grpc": {"address": bed.cri_socket},
        "ttrpc": {"address": bed.ttrpc_socket},
        "debug": {"level": bed.log_level},
        'plugins."io.containerd.internal.v1.opt"': {"path": b / "opt"},
        'plugins."io.containerd.nri.v1.nri"': {
            "disable": not bed.nri,
            "socket_path": bed.nri_socket,
            "plugin_path": bed.nri_plugin_dir,
            "plugin_config_path": bed.nri_plugin_config_dir,
            "plugin_registration_timeout": bed.plugin_registration_timeout,
            "plugin_request_timeout": bed.plugin_request_timeout,
        },
    }


def _runtime(bed: Bed, prefix: str) -> dict[str, dict[str, object]]:
    """The runc runtime and CNI dirs, under `prefix` (the CRI runtime's table)."""
    runc = f"{prefix}.containerd.runtimes.runc"
    return {
        f"{prefix}.containerd": {"default_runtime_name": "runc"},
        runc: {
            "runtime_type": "io.containerd.runc.v2",
            "pod_annotations": list(bed.passthrough_annotations),
            "container_annotations": list(bed.passthrough_annotations),
        },
        f"{runc}.options": {"SystemdCgroup": False, "Root": bed.runc_root},
    }


def _cri_v2(bed: Bed) -> dict[str, dict[str, object]]:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    sections: dict[str, dict[str, object]] = {
        cri: {
            "disable_apparmor": True,
            "restrict_oom_score_adj": True,
            "sandbox_image": bed.sandbox_image,
            "stream_server_address": "127.0.0.1",
            "stream_server_port": "0",
            # Off by default in 1.7 (the kubelet's CDI devices, e.g. a DRA
            # claim's, are then ignored): the bed's own dir, never /etc/cdi.
            "enable_cdi": True,
            "cdi_spec_dirs": [str(bed.base / "cdi")],
        },
        **_runtime(bed, cri),
        f"{cri}.cni": {"bin_dir": bed.base / "cni" / "bin", "conf_dir": bed.base / "cni" / "conf"},
    }
    sections[f"{cri}.containerd"]["snapshotter"] = "overlayfs"
    return sections


def _cri_v3(bed: Bed) -> dict[str, dict[str, object]]:
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    images = 'plugins."io.containerd.cri.v1.images"'
    return {
        'plugins."io.containerd.grpc.v1.cri"': {
            "stream_server_address": "127.0.0.1",
            "stream_server_port": "0",
        },
        images: {"snapshotter": "overlayfs"},
        f"{images}.pinned_images": {"sandbox": bed.sandbox_image},
        runtime: {
            "disable_apparmor": True,
            "restrict_oom_score_adj": True,
            # CDI is on by default in 2.x: the bed's own dir, never /etc/cdi.
            "cdi_spec_dirs": [str(bed.base / "cdi")],
        },
        **_runtime(bed, runtime),
        f"{runtime}.cni": {
            "bin_dirs": [str(bed.base / "cni" / "bin")],
            "conf_dir": bed.base / "cni" / "conf",
        },
    }
