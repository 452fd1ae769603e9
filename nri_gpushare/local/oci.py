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


class OciError(ValueError):
    """OCI state or a config.json that cannot be used; str() says what and where."""


class PlanError(ValueError):
    """An injection plan from the daemon that cannot be applied; str() says why."""


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


def _kind(value: object) -> str:
    """A JSON value's kind, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse_json(data: bytes, what: str, limit: int) -> dict[str, Any]:
    if len(data) > limit:
        raise OciError(f"{what}: more than {limit} bytes")
    try:
        obj = json.loads(data, parse_constant=_reject_constant)
    except RecursionError:
        raise OciError(f"{what}: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, huge integers
        raise OciError(f"{what}: not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise OciError(f"{what}: not a JSON object but {_kind(obj)}")
    return obj


def _section(obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """obj[key] when it is of `kind`; None when missing or null; OciError otherwise."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = {dict: "an object", list: "an array", str: "a string", int: "an integer"}
        raise OciError(f"{where}{key}: {_kind(value)}, expected {expected[kind]}")
    return value


def _string_map(obj: dict[str, Any], key: str, where: str) -> dict[str, str]:
    value = _section(obj, key, dict, where) or {}
    for k, v in value.items():
        if not isinstance(v, str):
            raise OciError(f"{where}{key}: {k[:80]!r} is {_kind(v)}, expected a string")
    return dict(value)


# -- OCI state (hook stdin) -------------------------------------------------


def parse_state(data: bytes) -> State:
    """The OCI state in `data` (JSON, as runc writes a hook's stdin)."""
    obj = _parse_json(data, "OCI state", MAX_STATE)
    where = "OCI state: "
    cid = _section(obj, "id", str, where)
    if not cid:
        raise OciError(f"{where}id: missing")
    bundle = _section(obj, "bundle", str, where) or ""
    if not bundle.startswith("/") or "\0" in bundle:
        raise OciError(f"{where}bundle: {bundle[:200]!r} is not an absolute path")
    pid = _section(obj, "pid", int, where) or 0
    if not 0 <= pid < 1 << 31:
        raise OciError(f"{where}pid: {pid} is not a process ID")
    return State(
        oci_version=_section(obj, "ociVersion", str, where) or "",
        id=cid,
        status=_section(obj, "status", str, where) or "",
        pid=pid,
        bundle=bundle,
        annotations=_string_map(obj, "annotations", where),
    )


# -- config.json --------------------------------------------------------------


def config_path(bundle: str) -> str:
    return os.path.join(bundle, "config.json")


def load_config(data: bytes, what: str = "config.json") -> dict[str, Any]:
    """config.json's bytes as a dict (OciError when it is not a JSON object)."""
    return _parse_json(data, what, MAX_CONFIG)


def read_config(bundle: str) -> dict[str, Any]:
    """Read <bundle>/config.json (I/O).  A symlink is followed, as runc follows
    it; anything but a regular file is refused (a FIFO would block)."""
    path = config_path(bundle)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise OciError(f"{path}: cannot open: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OciError(f"{path}: not a regular file")
        if st.st_size > MAX_CONFIG:
            raise OciError(f"{path}: more than {MAX_CONFIG} bytes")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_CONFIG:
                raise OciError(f"{path}: more than {MAX_CONFIG} bytes")
    except OSError as e:
        raise OciError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    return load_config(b"".join(chunks), path)


def parse_env(entries: list[Any], where: str = "process.env") -> dict[str, str]:
    """process.env's "K=V" entries as a dict; the last of two equal keys wins
    (as in runc).  An entry without "=" is not a variable and is skipped."""
    env: dict[str, str] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, str):
            raise OciError(f'{where}[{i}]: {_kind(entry)}, expected a "NAME=value" string')
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
            raise OciError(f"{where}[{i}]: {_kind(dev)}, expected an object")
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
    process = _section(config, "process", dict, "") or {}
    linux = _section(config, "linux", dict, "") or {}
    return BundleInfo(
        env=parse_env(_section(process, "env", list, "process.") or []),
        annotations=_string_map(config, "annotations", ""),
        cgroups_path=_section(linux, "cgroupsPath", str, "linux.") or "",
        gpu_minors=gpu_minors(_section(linux, "devices", list, "linux.") or []),
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


def _plan_list(plan: dict[str, Any], key: str) -> list[Any]:
    value = plan.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise PlanError(f"plan {key}: {_kind(value)}, expected an array")
    return value


def _plan_map(plan: dict[str, Any], key: str) -> dict[str, str]:
    value = plan.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise PlanError(f"plan {key}: expected an object of strings")
    return value


def _plan_path(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise PlanError(f"{where}: {value!r:.200} is not an absolute path")
    return value


def _plan_int(value: object, where: str, limit: int) -> int:
    if type(value) is not int or not 0 <= value < limit:
        raise PlanError(f"{where}: {value!r:.40} is not an integer in 0..{limit - 1}")
    return value


def _plan_devices(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for i, dev in enumerate(_plan_list(plan, "devices")):
        where = f"plan devices[{i}]"
        if not isinstance(dev, dict):
            raise PlanError(f"{where}: {_kind(dev)}, expected an object")
        kind = dev.get("type", "c")
        if kind not in ("c", "b"):
            raise PlanError(f"{where}: type {kind!r:.20} is not c or b")
        out.append(
            {
                "path": _plan_path(dev.get("path"), f"{where}.path"),
                "type": kind,
                "major": _plan_int(dev.get("major"), f"{where}.major", 1 << 32),
                "minor": _plan_int(dev.get("minor"), f"{where}.minor", 1 << 32),
                "fileMode": _plan_int(dev.get("mode", 0o666), f"{where}.mode", 0o10000),
                "uid": 0,
                "gid": 0,
            }
        )
    return out


def _plan_mounts(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(_plan_list(plan, "mounts")):
        where = f"plan mounts[{i}]"
        if not isinstance(m, dict):
            raise PlanError(f"{where}: {_kind(m)}, expected an object")
        options = m.get("options") or []
        kind, source = m.get("type", "bind"), m.get("source", "")
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise PlanError(f"{where}.options: expected an array of strings")
        if not isinstance(kind, str) or not isinstance(source, str):
            raise PlanError(f"{where}: type and source must be strings")
        out.append(
            {
                "destination": _plan_path(m.get("destination"), f"{where}.destination"),
                "type": kind,
                "source": source,
                "options": list(options),
            }
        )
    return out


def _plan_env(plan: dict[str, Any]) -> dict[str, str]:
    env = _plan_map(plan, "env")
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise PlanError(f"plan env: {key[:80]!r} is not a variable name and value")
    return env


def _clean(path: str) -> str:
    """A container path compared as runc would mount it (no //, . or trailing /)."""
    return "/" + "/".join(p for p in path.split("/") if p and p != ".")


def _object(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """A copy of parent[key] (created when missing), stored back in `parent`."""
    value = _section(parent, key, dict, where)
    copy = dict(value) if value is not None else {}
    parent[key] = copy
    return copy


def _array(parent: dict[str, Any], key: str, where: str) -> list[Any]:
    """A copy of parent[key] (created when missing), stored back in `parent`."""
    value = _section(parent, key, list, where)
    copy = list(value) if value is not None else []
    parent[key] = copy
    return copy


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
        raise PlanError(f"plan: {_kind(plan)}, expected an object")
    devices, mounts = _plan_devices(plan), _plan_mounts(plan)
    env, annotations = _plan_env(plan), _plan_map(plan, "annotations")
    remove = _plan_list(plan, "remove_annotations")
    if not all(isinstance(k, str) for k in remove):
        raise PlanError("plan remove_annotations: expected an array of strings")
    out = dict(config)

    if devices:
        linux = _object(out, "linux", "")
        nodes = _array(linux, "devices", "linux.")
        rules = _array(_object(linux, "resources", "linux."), "devices", "linux.resources.")
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
        process = _object(out, "process", "")
        entries = _array(process, "env", "process.")
        parse_env(entries)  # the same checks as bundle_info
        kept = [e for e in entries if e.partition("=")[0] not in env or "=" not in e]
        process["env"] = kept + [f"{k}={v}" for k, v in env.items()]

    if mounts:
        listed = _array(out, "mounts", "")
        for i, m in enumerate(listed):
            if not isinstance(m, dict) or not isinstance(m.get("destination"), str):
                raise OciError(f"mounts[{i}]: not an object with a destination")
        for m in mounts:
            dest = _clean(m["destination"])
            listed[:] = [x for x in listed if _clean(x["destination"]) != dest]
            listed.append(m)

    if annotations or remove:
        current = _string_map(out, "annotations", "")
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


def write_config(bundle: str, config: dict[str, Any]) -> None:
    """Replace <bundle>/config.json with `config` (I/O): a new file in the bundle
    directory, then rename over the old name, so a reader sees the old file or
    the new one, and a symlink at that name is replaced, never written through.
    The new file gets the old one's permission bits (and owner, where allowed).
    Not fsync'd: a bundle does not outlive a reboot."""
    path = config_path(bundle)
    data = dump_config(config)
    try:
        st = os.stat(path)
        mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o644
    except FileNotFoundError:
        st, mode = None, 0o644
    tmp = os.path.join(bundle, f".config.json.gpushare-{os.getpid()}-{os.urandom(4).hex()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
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
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_pid_file(path: str) -> int:
    """The process ID runc wrote to its --pid-file (I/O); OciError when it is
    not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise OciError(f"{path}: cannot open: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OciError(f"{path}: not a regular file")
        text = os.read(fd, 64)
    except OSError as e:
        raise OciError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    try:
        pid = int(text.strip())
    except ValueError:
        raise OciError(f"{path}: {text[:40]!r} is not a process ID") from None
    if not 0 < pid < 1 << 31:
        raise OciError(f"{path}: {pid} is not a process ID")
    return pid
