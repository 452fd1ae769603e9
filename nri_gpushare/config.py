"""Node configuration: the YAML file `nri-gpushare run --config FILE` reads.

Every key is checked at start-up; an unknown key or a bad value stops the
plugin with the file, the key and the reason, so a typo never silently turns
into a default.  See `config/gpushare.yaml` for a commented example.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar, get_args

import yaml

from nri_gpushare.kmod.abi import MAX_GPUS
from nri_gpushare.names import DEFAULT_DEVICE_PLUGIN_DIR, PROC_ROOT
from nri_gpushare.share.model import (
    ETC_LD_SO_PRELOAD,
    KMOD_MODES,
    LIBRARY_MISSING_ACTIONS,
    PLACEMENTS,
    POD_SOURCES,
    PRELOAD_MODES,
    STANDALONE_SOURCES,
    UNSERVED_ACTIONS,
    Gpu,
    InterposerPolicy,
    KmodMode,
    Placement,
    SourcePolicy,
    UnservedAction,
)
from nri_gpushare.units import parse_size

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
DEFAULT_STATUS_SOCKET = "/run/nri-gpushare/status.sock"
DEFAULT_STATE_DIR = "/var/lib/nri-gpushare"
DEFAULT_API_SOCKET = "/run/nri-gpushare/api.sock"
DEFAULT_CONTAINERD_SOCKET = "/run/containerd/containerd.sock"

_UUID = re.compile(r"^GPU-[0-9A-Za-z-]+$")

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]
NvmlLimitsMode = Literal["auto", "off"]
"""Driver-native memory limits through NVML: used where the driver has them, or never."""
LOG_LEVELS: tuple[LogLevel, ...] = get_args(LogLevel)
LOG_FORMATS: tuple[LogFormat, ...] = get_args(LogFormat)
NVML_MEMORY_LIMITS: tuple[NvmlLimitsMode, ...] = get_args(NvmlLimitsMode)
_Choice = TypeVar("_Choice", bound=str)


class ConfigError(Exception):
    """A bad configuration; the message names the file, the key and the reason."""


@dataclass(frozen=True)
class Config:
    socket: str = DEFAULT_SOCKET
    plugin_name: str = "gpushare"
    plugin_index: str = "10"
    request_timeout: float = 2.0  # containerd's plugin_request_timeout
    registration_timeout: float = 5.0  # containerd's plugin_registration_timeout
    status_socket: str = DEFAULT_STATUS_SOCKET
    log_level: LogLevel = "info"
    kmod: KmodMode = "optional"
    kmod_root: str = PROC_ROOT
    placement: Placement = "binpack"
    memory_reserve_bytes: int = 0
    max_inst: int = 16
    max_high_priority_per_gpu: int = 1
    use_nvml: bool = True
    inventory: tuple[Gpu, ...] = field(default_factory=tuple)
    state_dir: str = DEFAULT_STATE_DIR
    unserved: UnservedAction = "deny"
    pod_sources: SourcePolicy = POD_SOURCES
    standalone_sources: SourcePolicy = STANDALONE_SOURCES
    #: The CUDA interposer (`interposer:`); preload_file is filled in by the daemon.
    interposer: InterposerPolicy = field(default_factory=InterposerPolicy)
    nvml_memory_limits: NvmlLimitsMode = "auto"
    #: The local API (root only) the CDI hook and gpushare-runc ask.
    api_socket: str = DEFAULT_API_SOCKET
    #: containerd's gRPC socket: labels of hand-started containers, events and
    #: reconciliation; "" turns the local API's containerd side off.
    containerd_socket: str = DEFAULT_CONTAINERD_SOCKET
    #: One log line per decision (placed / refused / released): text or json.
    log_format: LogFormat = "text"
    #: Prometheus metrics: "host:port" to listen on; "" (default) serves none.
    metrics_listen: str = ""
    #: `nri-gpushare load-module` (the unit's ExecStartPre) loads gpushare.ko
    #: only when this is true.
    kmod_load: bool = False
    #: `nri-gpushare device-plugin`: the kubelet's device-plugin directory.
    device_plugin_dir: str = DEFAULT_DEVICE_PLUGIN_DIR
    #: Post a Warning event to the Kubernetes API on a pod the kubelet
    #: admitted but the node cannot place (fragmentation on multi-GPU nodes).
    kubernetes_events: bool = False


def parse_quantity(value: object) -> int:
    """Bytes from `2Gi`, `3276Mi`, `512M` or a bare integer (GiB), as in share requests."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{_show(value)} is not a size such as 16Gi, 3276Mi or 512M")
    return parse_size(str(value))


def _show(value: object) -> str:
    """A value for a message, shortened: a config may hold anything YAML
    can say (repr() of an int past 4,300 digits raises, of a deep list recurses)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"a {type(value).__name__} too large to show"
    return text if len(text) <= 80 else text[:77] + "..."


class _Reader:
    """Walks one mapping, remembering which keys were used and where we are."""

    def __init__(self, source: str, path: str, data: object) -> None:
        self.source, self.path = source, path
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(path or "<top>", f"expected a mapping, got {type(data).__name__}")
        self.data: dict[str, Any] = data
        self.used: set[str] = set()

    def fail(self, key: str, reason: str) -> NoReturn:
        raise ConfigError(f"{self.source}: {key}: {reason}")

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, default: Any, kind: type | tuple[type, ...]) -> Any:
        self.used.add(name)
        if name not in self.data:
            return default
        value = self.data[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            self.fail(self.key(name), f"expected {kinds[0].__name__}, got {_show(value)}")
        if not isinstance(value, kinds):
            self.fail(self.key(name), f"expected {kinds[0].__name__}, got {_show(value)}")
        return value

    def choice(self, name: str, default: _Choice, allowed: tuple[_Choice, ...]) -> _Choice:
        value: str | bool = self.get(name, default, (str, bool))
        if value is False and "off" in allowed:
            value = "off"  # YAML 1.1 reads a bare `off` as false
        for option in allowed:
            if value == option:
                return option
        self.fail(self.key(name), f"{_show(value)} is not one of {', '.join(allowed)}")

    def int_range(self, name: str, default: int, low: int, high: int) -> int:
        value: int = self.get(name, default, int)
        if not low <= value <= high:
            self.fail(self.key(name), f"{value} is outside {low}..{high}")
        return value

    def quantity(self, name: str, default: int) -> int:
        self.used.add(name)
        if name not in self.data:
            return default
        try:
            return parse_quantity(self.data[name])
        except ValueError as exc:
            self.fail(self.key(name), str(exc))

    def finish(self) -> None:
        # YAML keys may be numbers, booleans or null too: sorted as text.
        unknown = sorted(set(self.data) - self.used, key=str)
        if unknown:
            allowed = ", ".join(sorted(self.used))
            self.fail(self.key(unknown[0]), f"unknown key (allowed here: {allowed})")


def _parse_inventory(source: str, items: object) -> tuple[Gpu, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise ConfigError(f"{source}: inventory: expected a list of GPUs")
    gpus: list[Gpu] = []
    for position, item in enumerate(items):
        reader = _Reader(source, f"inventory[{position}]", item)
        index = reader.int_range("index", position, 0, MAX_GPUS - 1)
        uuid = reader.get("uuid", "", str)
        if not _UUID.match(uuid):
            reader.fail(reader.key("uuid"), f"{_show(uuid)} is not a GPU UUID such as GPU-8f6c...")
        name = reader.get("name", "NVIDIA GPU", str)
        if "memory" not in reader.data:
            reader.fail(reader.key("memory"), "missing (the GPU's total memory, e.g. 80Gi)")
        memory = reader.quantity("memory", 0)
        if memory <= 0:
            reader.fail(reader.key("memory"), "must be more than zero")
        minor = reader.int_range("minor", index, 0, 254)
        reader.finish()
        gpus.append(Gpu(index, uuid, name, memory, minor))
    for attr in ("index", "uuid", "minor"):
        seen = [getattr(g, attr) for g in gpus]
        duplicates = sorted({str(v) for v in seen if seen.count(v) > 1})
        if duplicates:
            raise ConfigError(f"{source}: inventory: duplicate {attr} {', '.join(duplicates)}")
    return tuple(sorted(gpus, key=lambda g: g.index))


_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _parse_sources(source: str, data: object) -> tuple[SourcePolicy, SourcePolicy]:
    top = _Reader(source, "sources", data)
    pods = _Reader(source, "sources.pods", top.get("pods", {}, dict))
    namespaces = pods.get("namespaces", [], list)
    for name in namespaces:
        if not isinstance(name, str) or not _NAMESPACE.fullmatch(name):
            pods.fail(
                "sources.pods.namespaces", f"{_show(name)} is not a Kubernetes namespace name"
            )
    pod_sources = SourcePolicy(
        annotations=pods.get("annotations", POD_SOURCES.annotations, bool),
        labels=pods.get("labels", POD_SOURCES.labels, bool),
        env=pods.get("env", POD_SOURCES.env, bool),
        namespaces=tuple(namespaces),
        kubelet=pods.get("kubelet", POD_SOURCES.kubelet, bool),
    )
    pods.finish()
    hand = _Reader(source, "sources.standalone", top.get("standalone", {}, dict))
    standalone = SourcePolicy(
        annotations=hand.get("annotations", STANDALONE_SOURCES.annotations, bool),
        labels=hand.get("labels", STANDALONE_SOURCES.labels, bool),
        env=hand.get("env", STANDALONE_SOURCES.env, bool),
        kubelet=False,
    )
    hand.finish()
    top.finish()
    return pod_sources, standalone


_PATH_UNSAFE = re.compile(r"[\s:\x00]")


def _path(reader: _Reader, name: str, default: str, what: str) -> str:
    """An absolute, normalised path without whitespace or ':' (which separate
    entries in ld.so.preload and LD_PRELOAD)."""
    value: str = reader.get(name, default, str)
    key = reader.key(name)
    if not value.startswith("/"):
        reader.fail(key, f"{_show(value)} must be an absolute path ({what})")
    if _PATH_UNSAFE.search(value):
        reader.fail(key, f"{_show(value)} must not contain whitespace or ':' ({what})")
    parts = value.split("/")[1:]
    if value.endswith("/") or any(p in ("", ".", "..") for p in parts):
        reader.fail(key, f"{_show(value)} must be a plain path to a file, without //, . or ..")
    return value


def _parse_interposer(source: str, data: object) -> InterposerPolicy:
    reader = _Reader(source, "interposer", data)
    defaults = InterposerPolicy()
    library = _path(reader, "library", defaults.library, "the node's libgpushare.so")
    container_path = _path(
        reader, "container_path", defaults.container_path, "where containers see it"
    )
    if container_path == ETC_LD_SO_PRELOAD or container_path.startswith(
        ("/proc/", "/sys/", "/dev/")
    ):
        reader.fail(
            reader.key("container_path"), f"{_show(container_path)} cannot hold the library"
        )
    policy = InterposerPolicy(
        library=library,
        container_path=container_path,
        preload=reader.choice("preload", defaults.preload, PRELOAD_MODES),
        missing=reader.choice("missing", defaults.missing, LIBRARY_MISSING_ACTIONS),
        allow_managed=reader.get("allow_managed", defaults.allow_managed, bool),
    )
    reader.finish()
    return policy


def _listen_address(reader: _Reader, name: str, default: str) -> str:
    """The address as host:port ([v6]:port for IPv6), or "" for off."""
    value: str = reader.get(name, default, str)
    if not value:
        return ""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    ok = bool(sep) and bool(host) and port.isascii() and port.isdigit()
    ok = ok and 1 <= int(port) <= 65535
    if not ok or any(c.isspace() or c in "[]/" for c in host):
        reader.fail(
            reader.key(name),
            f"{_show(value)} is not host:port such as 127.0.0.1:9400 or [::1]:9400",
        )
    return value


def parse_config(data: object, source: str = "<config>") -> Config:
    top = _Reader(source, "", data)
    nri = _Reader(source, "nri", top.get("nri", {}, dict))
    defaults = Config()
    socket = nri.get("socket", defaults.socket, str)
    plugin_name = nri.get("plugin_name", defaults.plugin_name, str)
    raw_index = nri.get("plugin_index", defaults.plugin_index, (str, int))
    plugin_index = f"{raw_index:02d}" if isinstance(raw_index, int) else raw_index
    if not re.fullmatch(r"\d\d", plugin_index):
        nri.fail(nri.key("plugin_index"), f"{_show(raw_index)} must be exactly two digits (00..99)")
    timeouts = {}
    for name, default in (
        ("request_timeout", defaults.request_timeout),
        ("registration_timeout", defaults.registration_timeout),
    ):
        value = nri.get(name, default, (int, float))
        if not 0.1 <= value <= 600:
            nri.fail(nri.key(name), f"{value} is outside 0.1..600 seconds")
        timeouts[name] = float(value)
    nri.finish()
    pod_sources, standalone_sources = _parse_sources(source, top.get("sources", {}, dict))
    state_dir = top.get("state_dir", defaults.state_dir, str)
    if not state_dir.startswith("/"):
        top.fail("state_dir", f"{_show(state_dir)} must be an absolute path")
    api_socket = top.get("api_socket", defaults.api_socket, str)
    if not api_socket.startswith("/"):
        top.fail("api_socket", f"{_show(api_socket)} must be an absolute path")
    cd = _Reader(source, "containerd", top.get("containerd", {}, dict))
    containerd_socket = cd.get("socket", defaults.containerd_socket, str)
    if containerd_socket and not containerd_socket.startswith("/"):
        cd.fail(cd.key("socket"), f"{_show(containerd_socket)} must be an absolute path or empty")
    cd.finish()
    metrics = _Reader(source, "metrics", top.get("metrics", {}, dict))
    metrics_listen = _listen_address(metrics, "listen", defaults.metrics_listen)
    metrics.finish()
    k8s = _Reader(source, "kubernetes", top.get("kubernetes", {}, dict))
    device_plugin_dir = k8s.get("device_plugin_dir", defaults.device_plugin_dir, str)
    if not device_plugin_dir.startswith("/"):
        k8s.fail(
            k8s.key("device_plugin_dir"), f"{_show(device_plugin_dir)} must be an absolute path"
        )
    kubernetes_events = k8s.get("events", defaults.kubernetes_events, bool)
    k8s.finish()

    config = Config(
        socket=socket,
        plugin_name=plugin_name,
        plugin_index=plugin_index,
        request_timeout=timeouts["request_timeout"],
        registration_timeout=timeouts["registration_timeout"],
        status_socket=top.get("status_socket", defaults.status_socket, str),
        log_level=top.choice("log_level", defaults.log_level, LOG_LEVELS),
        kmod=top.choice("kmod", defaults.kmod, KMOD_MODES),
        kmod_root=top.get("kmod_root", defaults.kmod_root, str),
        placement=top.choice("placement", defaults.placement, PLACEMENTS),
        memory_reserve_bytes=top.quantity("memory_reserve", defaults.memory_reserve_bytes),
        max_inst=top.int_range("max_inst", defaults.max_inst, 1, 25),
        max_high_priority_per_gpu=top.int_range(
            "max_high_priority_per_gpu", defaults.max_high_priority_per_gpu, 0, 25
        ),
        use_nvml=top.get("use_nvml", defaults.use_nvml, bool),
        inventory=_parse_inventory(source, top.get("inventory", None, (list, type(None)))),
        state_dir=state_dir,
        unserved=top.choice("unserved", defaults.unserved, UNSERVED_ACTIONS),
        pod_sources=pod_sources,
        standalone_sources=standalone_sources,
        interposer=_parse_interposer(source, top.get("interposer", {}, dict)),
        nvml_memory_limits=top.choice(
            "nvml_memory_limits", defaults.nvml_memory_limits, NVML_MEMORY_LIMITS
        ),
        api_socket=api_socket,
        containerd_socket=containerd_socket,
        log_format=top.choice("log_format", defaults.log_format, LOG_FORMATS),
        metrics_listen=metrics_listen,
        kmod_load=top.get("kmod_load", defaults.kmod_load, bool),
        device_plugin_dir=device_plugin_dir,
        kubernetes_events=kubernetes_events,
    )
    top.finish()
    return config


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except ValueError as exc:  # e.g. an integer past Python's 4300-digit conversion limit
        raise ConfigError(f"{path}: not valid YAML: a number is far too long") from exc
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from None
    return parse_config(data, str(path))
