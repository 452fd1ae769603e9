"""OCI runtime state and bundles, for the CDI hook and gpushare-runc.

Pure functions, except the three named for their I/O (`read_config`,
`write_config`, `read_pid_file`).  Standard library only: this runs in every
container start.

Everything read here is untrusted: a bundle's config.json is what the image
and the user asked for, and a runtime's state names that bundle.  A section
that is missing is empty; one of the wrong type is an `OciError` that says
which and why (never a traceback).  A plan comes from the daemon; one that is
malformed is a `PlanError`.

- `parse_state`: the OCI state a runtime gives a hook on stdin.
- `read_config` / `bundle_info`: a bundle's config.json, and what the daemon
  needs from it (environment, annotations, cgroups path, the NVIDIA GPUs the
  runtime was told to create: CDI's injection).
- `namespace_of`: the containerd namespace, from the bundle path or runc's
  ``--root``.
- `apply_plan` / `write_config`: put the daemon's injection plan into
  config.json (devices with their cgroup rules, env, mounts, annotations),
  and write it back atomically without following a symlink.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Any

from nri_gpushare.local.oci_json import OciError as OciError  # this module's errors
from nri_gpushare.local.oci_json import PlanError as PlanError
from nri_gpushare.local.oci_json import (
    copied_array,
    copied_object,
    json_kind,
    json_object,
    section,
    string_map,
)
from nri_gpushare.local.oci_plan import plan_devices, plan_env, plan_list, plan_map, plan_mounts

MAX_STATE = 4 << 20
"""Bytes of OCI state a hook reads from stdin."""
MAX_CONFIG = 32 << 20
"""Bytes of config.json read (runc has no limit; real ones are kilobytes)."""
NVIDIA_MAJOR = 195
"""The character major of /dev/nvidia<N> (and of nvidiactl 255, modeset 254)."""
CONTAINERD_TASKS = "io.containerd.runtime.v2.task"
"""The directory containerd's v2 shims keep bundles under: <root>/<this>/<ns>/<id>."""

_GPU_PATH = re.compile(r"/dev/nvidia([0-9]{1,7})")
_NAMESPACE = re.compile(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*")
"""containerd's namespace rule (identifiers.Validate), at most 76 characters."""
_MAX_NAMESPACE = 76


@dataclass(frozen=True)
class State:
    """The OCI runtime state (runtime-spec "State")."""

    oci_version: str
    id: str
    status: str
    pid: int
    bundle: str
    annotations: dict[str, str]


@dataclass(frozen=True)
class BundleInfo:
    """What the daemon is told about a bundle.

    gpu_minors: minors of the NVIDIA GPU nodes in linux.devices (what CDI
    injected), in config order, each once; empty when there are none.
    """

    env: dict[str, str]
    annotations: dict[str, str]
    cgroups_path: str
    gpu_minors: tuple[int, ...]


# -- OCI state (hook stdin) -------------------------------------------------


def parse_state(data: bytes) -> State:
    """The OCI state in `data` (JSON, as runc writes a hook's stdin)."""
    obj = json_object(data, "OCI state", MAX_STATE)
    where = "OCI state: "
    cid = section(obj, "id", str, where)
    if not cid:
        raise OciError(f"{where}id: missing")
    bundle = section(obj, "bundle", str, where) or ""
    if not bundle.startswith("/") or "\0" in bundle:
        raise OciError(f"{where}bundle: {bundle[:200]!r} is not an absolute path")
    pid = section(obj, "pid", int, where) or 0
    if not 0 <= pid < 1 << 31:
        raise OciError(f"{where}pid: {pid} is not a process ID")
    return State(
        oci_version=section(obj, "ociVersion", str, where) or "",
        id=cid,
        status=section(obj, "status", str, where) or "",
        pid=pid,
        bundle=bundle,
        annotations=string_map(obj, "annotations", where),
    )


# -- config.json --------------------------------------------------------------


def config_path(bundle: str) -> str:
    return os.path.join(bundle, "config.json")


def load_config(data: bytes, what: str = "config.json") -> dict[str, Any]:
    """config.json's bytes as a dict (OciError when it is not a JSON object)."""
    return json_object(data, what, MAX_CONFIG)


def read_config(
    bundle: str, *, follow: bool = True, limit: int = MAX_CONFIG, dir_fd: int | None = None
) -> dict[str, Any]:
    """Read <bundle>/config.json (I/O).  A symlink is followed, as runc follows
    it, unless `follow` is false (the daemon's reads: a symlink is an error);
    anything but a regular file is refused (a FIFO would block), and so is
    one of more than `limit` bytes.  `dir_fd`: the bundle directory, open."""
    path = config_path(bundle)
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    try:
        name = path if dir_fd is None else "config.json"
        fd = os.open(name, flags if follow else flags | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as e:
        raise OciError(f"{path}: cannot open: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OciError(f"{path}: not a regular file")
        if st.st_size > limit:
            raise OciError(f"{path}: more than {limit} bytes")
        chunks, size = [], 0
        while chunk := os.read(fd, min(limit + 1, 1 << 20)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OciError(f"{path}: more than {limit} bytes")
    except OSError as e:
        raise OciError(f"{path}: cannot read: {e.strerror or e}") from e
    finally:
        os.close(fd)
    return load_config(b"".join(chunks), path)


def parse_env(entries: list[Any], where: str = "process.env") -> dict[str, str]:
    """process.env's "K=V" entries as a dict; the last of two equal keys wins
    (as in runc).  An entry without "=" is not a variable and is skipped."""
    env: dict[str, str] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, str):
            raise OciError(f'{where}[{i}]: {json_kind(entry)}, expected a "NAME=value" string')
        key, eq, value = entry.partition("=")
        if eq:
            env[key] = value
    return env


def gpu_minors(devices: list[Any], where: str = "linux.devices") -> tuple[int, ...]:
    """Minors of the NVIDIA GPU nodes among `devices` (linux.devices): character
    devices of major 195 at /dev/nvidia<N>; nvidiactl, modeset, uvm and caps are
    not GPUs."""
    minors: list[int] = []
    for i, dev in enumerate(devices):
        if not isinstance(dev, dict):
            raise OciError(f"{where}[{i}]: {json_kind(dev)}, expected an object")
        path, major = dev.get("path"), dev.get("major")
        if dev.get("type") != "c" or type(major) is not int or major != NVIDIA_MAJOR:
            continue
        if not isinstance(path, str) or not _GPU_PATH.fullmatch(path):
            continue
        minor = dev.get("minor")
        if type(minor) is not int or not 0 <= minor < 1 << 20:
            raise OciError(f"{where}[{i}] ({path}): minor {minor!r:.40} is not a device minor")
        if minor not in minors:
            minors.append(minor)
    return tuple(minors)


def bundle_info(config: dict[str, Any]) -> BundleInfo:
    """What the daemon needs from a config.json dict."""
    process = section(config, "process", dict, "") or {}
    linux = section(config, "linux", dict, "") or {}
    return BundleInfo(
        env=parse_env(section(process, "env", list, "process.") or []),
        annotations=string_map(config, "annotations", ""),
        cgroups_path=section(linux, "cgroupsPath", str, "linux.") or "",
        gpu_minors=gpu_minors(section(linux, "devices", list, "linux.") or []),
    )


# -- namespaces ---------------------------------------------------------------


def _is_namespace(name: str) -> bool:
    return len(name) <= _MAX_NAMESPACE and _NAMESPACE.fullmatch(name) is not None


def namespace_of(bundle: str, container_id: str, root: str = "") -> str:
    """The containerd namespace of a container: from its bundle path
    (``.../io.containerd.runtime.v2.task/<ns>/<id>``, when <id> is the
    container's: containerd's shims, for ctr, nerdctl and docker alike); ""
    when it does not say (runc run by hand, CRI-O, podman).  runc's ``--root``
    is not asked: its last component is a namespace only under containerd's
    shims, and elsewhere (``/run/runc``, ``/run/user/1000/runc``) it would
    name one that does not exist.  `root` is kept for callers; unused."""
    parts = [p for p in bundle.split("/") if p and p != "."]
    if (
        len(parts) >= 3
        and parts[-3] == CONTAINERD_TASKS
        and parts[-1] == container_id
        and _is_namespace(parts[-2])
    ):
        return parts[-2]
    return ""


def namespace_from_root(root: str) -> str:
    """The namespace a containerd shim's runc ``--root`` ends with
    (``<runc root>/<ns>``: ``/run/containerd/runc/default``,
    ``/var/run/docker/runtime-runc/moby``); "" when it is not a name.  Only
    for ``delete``, which has no bundle: a wrong guess releases nothing (the
    daemon matches namespace and ID)."""
    parts = [p for p in root.split("/") if p and p != "."]
    return parts[-1] if parts and _is_namespace(parts[-1]) else ""


# -- plans ----------------------------------------------------------------------


def _clean(path: str) -> str:
    """A container path compared as runc would mount it (no //, . or trailing /)."""
    return "/" + "/".join(p for p in path.split("/") if p and p != ".")


def apply_plan(config: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """`config` (a config.json dict) with `plan` (the local API's PLAN) put in:
    device nodes in linux.devices (an entry at the same path is replaced) each
    with a cgroup rule allowing it (rwm) at the end of linux.resources.devices,
    process.env set, mounts added (one at the same destination is replaced: the
    new one goes last, so nothing earlier hides it), annotations set and
    ``remove_annotations`` deleted.  `config` itself is not changed.

    OciError when config.json has a section of the wrong type; PlanError when
    the plan is malformed."""
    if not isinstance(plan, dict):
        raise PlanError(f"plan: {json_kind(plan)}, expected an object")
    devices, mounts = plan_devices(plan), plan_mounts(plan)
    env, annotations = plan_env(plan), plan_map(plan, "annotations")
    remove = plan_list(plan, "remove_annotations")
    if not all(isinstance(k, str) for k in remove):
        raise PlanError("plan remove_annotations: expected an array of strings")
    out = dict(config)

    if devices:
        linux = copied_object(out, "linux", "")
        nodes = copied_array(linux, "devices", "linux.")
        rules = copied_array(
            copied_object(linux, "resources", "linux."), "devices", "linux.resources."
        )
        for dev in devices:
            nodes[:] = [
                n for n in nodes if not (isinstance(n, dict) and n.get("path") == dev["path"])
            ]
            nodes.append(dev)
            rule = {
                "allow": True,
                "type": dev["type"],
                "major": dev["major"],
                "minor": dev["minor"],
                "access": "rwm",
            }
            rules[:] = [r for r in rules if r != rule]
            rules.append(rule)

    if env:
        process = copied_object(out, "process", "")
        entries = copied_array(process, "env", "process.")
        parse_env(entries)  # the same checks as bundle_info
        kept = [e for e in entries if e.partition("=")[0] not in env or "=" not in e]
        process["env"] = kept + [f"{k}={v}" for k, v in env.items()]

    if mounts:
        listed = copied_array(out, "mounts", "")
        for i, m in enumerate(listed):
            if not isinstance(m, dict) or not isinstance(m.get("destination"), str):
                raise OciError(f"mounts[{i}]: not an object with a destination")
        for m in mounts:
            dest = _clean(m["destination"])
            listed[:] = [x for x in listed if _clean(x["destination"]) != dest]
            listed.append(m)

    if annotations or remove:
        current = string_map(out, "annotations", "")
        current.update(annotations)
        for key in remove:
            current.pop(key, None)
        out["annotations"] = current
    return out


# -- writing --------------------------------------------------------------------


def dump_config(config: dict[str, Any]) -> bytes:
    """config.json's bytes (ASCII JSON: what runc reads back is exactly this)."""
    try:
        return json.dumps(config, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise OciError(f"config.json: cannot be written back: {e}") from None


def write_config(bundle: str, config: dict[str, Any], dir_fd: int | None = None) -> None:
    """Replace <bundle>/config.json with `config` (I/O): a new file in the bundle
    directory, then rename over the old name, so a reader sees the old file or
    the new one, and a symlink at that name is replaced, never written through.
    The new file gets the old one's permission bits (and owner, where allowed).
    `dir_fd`: the bundle directory, open (the one read, even if its path now
    names another).  Not fsync'd: a bundle does not outlive a reboot."""
    at = bundle if dir_fd is None else ""
    path = os.path.join(at, "config.json")
    data = dump_config(config)
    try:
        st = os.stat(path, dir_fd=dir_fd)
        mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o644
    except FileNotFoundError:
        st, mode = None, 0o644
    tmp = os.path.join(at, f".config.json.gpushare-{os.getpid()}-{os.urandom(4).hex()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if st is not None and (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(fd, st.st_uid, st.st_gid)
                except PermissionError:
                    pass
        finally:
            os.close(fd)
        os.rename(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def read_pid_file(path: str) -> int:
    """The process ID runc wrote to its --pid-file (I/O); OciError when it is
    not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise OciError(f"{path}: cannot open: {e.strerror or e}") from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OciError(f"{path}: not a regular file")
        text = os.read(fd, 64)
    except OSError as e:
        raise OciError(f"{path}: cannot read: {e.strerror or e}") from e
    finally:
        os.close(fd)
    try:
        pid = int(text.strip())
    except ValueError:
        raise OciError(f"{path}: {text[:40]!r} is not a process ID") from None
    if not 0 < pid < 1 << 31:
        raise OciError(f"{path}: {pid} is not a process ID")
    return pid
