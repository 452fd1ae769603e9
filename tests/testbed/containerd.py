"""A real, private containerd with CRI and NRI enabled, for integration tests.

Which containerd is the run's choice (GPUSHARE_CONTAINERD, read once for the
whole pytest run): "1.7" (the default) is Debian trixie's 1.7.24 with
bookworm's runc 1.1.5; "2" is Debian sid's 2.1.9 with sid's runc 1.3.6 (and
Docker 28.5 for tests/testbed/docker.py), all extracted by
scripts/install-prereqs.sh.  A test that needs one of them names its bin_dir.

Everything lives under one short base dir (unix socket paths are limited to
108 bytes): root, state, sockets, runc root, CNI dirs, NRI plugin dirs, the
log.  Only the shim sockets escape (containerd hard-codes
/run/containerd/s/).  The process is started with setsid and only what it
started is ever killed: its own PID and the shims that carry its address.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.testbed.containerd_config import config_text, toml_value
from tests.testbed.cri import CriClient, wait_images
from tests.testbed.images import (
    BUSYBOX_BINARY,
    PAUSE_IMAGE,
    build_images,
    image_names,
    import_images,
    is_static_elf,
)

REPO = Path(__file__).resolve().parents[2]
TRIXIE_BIN = REPO / ".cache" / "trixie" / "root" / "usr" / "bin"
#: containerd 2.x (Debian sid), extracted only; its runc is usr/bin/runc here.
SID_BIN = REPO / ".cache" / "sid" / "root" / "usr" / "bin"
NRI_LOG_MARKER = "io.containerd.nri.v1.nri"
SHIM_SOCKET_DIR = "/run/containerd/s"
SELECT_VAR = "GPUSHARE_CONTAINERD"
LANES = {"1.7": TRIXIE_BIN, "2": SID_BIN}
"""GPUSHARE_CONTAINERD's values and the bin dir each selects."""


class ContainerdError(RuntimeError):
    pass


def selected_bin_dir() -> Path:
    """The bin dir GPUSHARE_CONTAINERD selects for this run (1.7 if unset)."""
    choice = os.environ.get(SELECT_VAR, "") or "1.7"
    if choice not in LANES:
        raise ContainerdError(f"{SELECT_VAR}={choice!r}: expected one of {', '.join(LANES)}")
    return LANES[choice]


@functools.cache
def containerd_version(bin_dir: Path) -> tuple[int, int, int]:
    """(major, minor, patch) of `bin_dir/containerd --version`."""
    out = subprocess.run(
        [str(bin_dir / "containerd"), "--version"], capture_output=True, text=True, timeout=30
    ).stdout
    match = re.search(r" v?(\d+)\.(\d+)\.(\d+)", out)
    if match is None:
        raise ContainerdError(f"cannot tell {bin_dir / 'containerd'}'s version from {out!r}")
    major, minor, patch = map(int, match.groups())
    return major, minor, patch


def runc_binary(bin_dir: Path) -> str:
    """The runc a containerd from bin_dir runs (its shim finds it on PATH,
    which the bed starts with bin_dir): sid's own, else the system's."""
    own = bin_dir / "runc"
    return str(own) if own.exists() else shutil.which("runc") or "runc"


def missing_prerequisites(bin_dir: Path | None = None) -> list[str]:
    """Human-readable list of what the test bed lacks on this machine."""
    bin_dir = bin_dir or selected_bin_dir()
    missing = [
        f"{bin_dir / b} (run scripts/install-prereqs.sh)"
        for b in ("containerd", "containerd-shim-runc-v2", "ctr")
        if not os.access(bin_dir / b, os.X_OK)
    ]
    runc = runc_binary(bin_dir)
    ran = subprocess.run([runc, "--version"], capture_output=True) if shutil.which(runc) else None
    if ran is None or ran.returncode != 0:
        missing.append(f"a working {runc} (run scripts/install-prereqs.sh)")
    if not BUSYBOX_BINARY.exists() or not is_static_elf(BUSYBOX_BINARY):
        missing.append(f"static {BUSYBOX_BINARY} (apt-get install busybox-static)")
    if os.geteuid() != 0:
        missing.append("root privileges")
    return missing


class Containerd:
    """One private containerd.  Use start()/stop() or as a context manager."""

    def __init__(
        self,
        base: Path | str | None = None,
        *,
        bin_dir: Path | None = None,
        nri: bool = True,
        plugin_registration_timeout: str = "5s",
        plugin_request_timeout: str = "2s",
        log_level: str = "info",
        sandbox_image: str = PAUSE_IMAGE,
        images: bool = True,
        passthrough_annotations: tuple[str, ...] = (),
        config_file: Path | None = None,
    ) -> None:
        self._own_base = base is None
        self.base = Path(base or tempfile.mkdtemp(prefix="gpushare-tb-", dir="/tmp"))
        self.bin_dir = bin_dir or selected_bin_dir()
        self.nri = nri
        self.plugin_registration_timeout = plugin_registration_timeout
        self.plugin_request_timeout = plugin_request_timeout
        self.log_level = log_level
        self.sandbox_image = sandbox_image
        self.images = images
        # CRI copies pod and container annotations matching these into the OCI
        # spec (the runtime's pod_annotations / container_annotations), where NRI
        # shows them as the container's annotations.
        self.passthrough_annotations = passthrough_annotations
        self.cri_socket = self.base / "containerd.sock"
        self.ttrpc_socket = self.base / "containerd.sock.ttrpc"
        self.nri_socket = self.base / "nri.sock"
        self.nri_plugin_dir = self.base / "nri" / "plugins"
        self.nri_plugin_config_dir = self.base / "nri" / "conf"
        self.pod_log_dir = self.base / "pod-logs"
        self.runc_root = self.base / "runc"
        # config_file: start with this file as it is (see private_config())
        # instead of writing config_text() into the base dir.
        self.config_file = config_file
        self.config_path = Path(config_file) if config_file else self.base / "config.toml"
        self.log_path = self.base / "containerd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        if len(str(self.nri_socket)) > 100 or len(str(self.ttrpc_socket)) > 100:
            raise ContainerdError(f"base dir {self.base} too long for unix sockets")

    # -- paths and config -------------------------------------------------

    @property
    def ctr(self) -> Path:
        return self.bin_dir / "ctr"

    @property
    def version(self) -> tuple[int, int, int]:
        """This containerd's (major, minor, patch)."""
        return containerd_version(self.bin_dir)

    @property
    def major(self) -> int:
        return self.version[0]

    @property
    def runc(self) -> str:
        """The runc binary this containerd's shims run."""
        return runc_binary(self.bin_dir)

    @property
    def grpc_address(self) -> Path:
        """containerd's gRPC socket; CRI is served on it too."""
        return self.cri_socket

    def config_text(self) -> str:
        """config.toml: version 2 for 1.7, version 3 for 2.x."""
        return config_text(self, self.major)

    def private_config(self, text: str, *, nri_socket: bool = False) -> str:
        """A given config.toml (version 2 or 3) with this bed's private paths.

        Only where containerd keeps things is changed: root, state, the gRPC
        and ttrpc sockets, the opt dir, CNI dirs, runc's root, NRI's plugin
        dirs and, with nri_socket, NRI's socket; comments, layout and every
        other setting stay as they are (tomlkit).
        """
        import tomlkit
        from tomlkit.items import Table

        doc = tomlkit.parse(text)
        b = self.base
        doc["root"], doc["state"] = str(b / "root"), str(b / "state")
        for section, address in (("grpc", self.cri_socket), ("ttrpc", self.ttrpc_socket)):
            doc.setdefault(section, tomlkit.table())["address"] = str(address)
        paths = {
            "bin_dir": str(b / "cni" / "bin"),
            "bin_dirs": [str(b / "cni" / "bin")],
            "conf_dir": str(b / "cni" / "conf"),
            "Root": str(self.runc_root),
            "plugin_path": str(self.nri_plugin_dir),
            "plugin_config_path": str(self.nri_plugin_config_dir),
        }
        if nri_socket:
            paths["socket_path"] = str(self.nri_socket)
        nri = "io.containerd.nri.v1.nri"
        owner = {  # the table each key is changed in
            **dict.fromkeys(("bin_dir", "bin_dirs", "conf_dir"), "cni"),
            **dict.fromkeys(("plugin_path", "plugin_config_path", "socket_path"), nri),
            "Root": "options",
        }

        def walk(table: Table | tomlkit.TOMLDocument, name: str) -> None:
            for key in list(table):
                value = table[key]
                if isinstance(value, Table):
                    walk(value, key)
                elif key == "bin_dir" and "bin_dirs" in table:
                    continue  # 2.x: the deprecated one is '' and must stay so
                elif key in paths and name == owner[key]:
                    table[key] = paths[key]
                elif key == "path" and name == "io.containerd.internal.v1.opt":
                    table[key] = str(b / "opt")

        walk(doc, "")
        text = doc.as_string()
        if nri_socket and nri not in doc.get("plugins", {}):  # containerd's defaults otherwise
            text += f'\n[plugins."{nri}"]\n' + "".join(
                f"  {key} = {toml_value(paths[key])}\n"
                for key in ("socket_path", "plugin_path", "plugin_config_path")
            )
        return text

    # -- lifecycle --------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Containerd:
        if self.running:
            return self
        for d in (
            self.nri_plugin_dir,
            self.nri_plugin_config_dir,
            self.pod_log_dir,
            self.base / "cni" / "bin",
            self.base / "cni" / "conf",
        ):
            d.mkdir(parents=True, exist_ok=True)
        if self.config_file is None:
            self.config_path.write_text(self.config_text())
        env = dict(os.environ, PATH=f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(self.bin_dir / "containerd"), "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        self._wait_ready(timeout)
        marker = self.base / "root" / ".gpushare-images"
        if self.images and not marker.exists():
            self.import_images(build_images())
            marker.touch()
        return self

    def import_images(self, tar: Path) -> None:
        """Import an OCI layout tar (tests/testbed/images.py) into CRI's
        namespace; returns once CRI lists its images."""
        import_images(self.ctr, self.cri_socket, tar)
        wait_images(self.cri_socket, image_names(tar))

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise ContainerdError(
                    f"containerd exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            probe = subprocess.run(
                [str(self.ctr), "-a", str(self.cri_socket), "--timeout", "1s", "version"],
                capture_output=True,
            )
            if probe.returncode == 0:
                return
            if time.monotonic() > deadline:
                self.kill()
                raise ContainerdError(f"containerd not ready in {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc else None

    def _signal_wait(self, sig: int, timeout: float) -> bool:
        """Send sig to our containerd (only its PID); True once it has exited."""
        if self.proc is None:
            return True
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
        return True

    def restart(self, timeout: float = 30.0) -> Containerd:
        """Stop containerd gracefully and start it again on the same dirs.

        Shims and containers keep running, as across a real daemon restart.
        """
        if not self._signal_wait(signal.SIGTERM, 10.0):
            self._signal_wait(signal.SIGKILL, 10.0)
        self.proc = None
        return self.start(timeout)

    def stop(self, remove: bool = True) -> None:
        """Kill every container and shim, stop containerd, unmount leftovers.

        The base dir is deleted too if this object created it and remove is set.
        """
        self._kill_containers()
        if not self._signal_wait(signal.SIGTERM, 10.0):
            self._signal_wait(signal.SIGKILL, 10.0)
        self._kill_shims()
        self._cleanup_dirs(remove)

    def kill(self) -> None:
        """SIGKILL containerd only (shims and containers survive, dirs stay)."""
        self._signal_wait(signal.SIGKILL, 10.0)

    def __enter__(self) -> Containerd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- cleanup of what this containerd started --------------------------

    def _kill_containers(self) -> None:
        """Force-delete every runc container under our private runc root."""
        if not self.runc_root.is_dir():
            return
        for ns_root in self.runc_root.iterdir():
            for cid in (p.name for p in ns_root.iterdir() if p.is_dir()):
                subprocess.run(
                    [self.runc, "--root", str(ns_root), "delete", "--force", cid],
                    capture_output=True,
                )

    def _shims(self) -> dict[int, list[str]]:
        """Shims started by this containerd (their argv names our address), by PID."""
        shims = {}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if argv[0].endswith("containerd-shim-runc-v2") and str(self.cri_socket) in argv:
                shims[int(proc.name)] = argv
        return shims

    def _kill_shims(self) -> None:
        """SIGKILL our shims and remove their sockets from /run/containerd/s."""
        for pid, argv in self._shims().items():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            opts = dict(zip(argv[1::2], argv[2::2], strict=False))
            if "-namespace" in opts and "-id" in opts:
                # containerd (1.7 and 2.x) names the socket sha256(address/namespace/id).
                key = f"{self.cri_socket}/{opts['-namespace']}/{opts['-id']}"
                Path(SHIM_SOCKET_DIR, hashlib.sha256(key.encode()).hexdigest()).unlink(
                    missing_ok=True
                )

    def _cleanup_dirs(self, remove: bool) -> None:
        """Unmount what containerd left mounted under base, then delete it."""
        base = str(self.base) + "/"
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
        for point in sorted({p for p in points if p.startswith(base)}, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)
        if remove and self._own_base:
            shutil.rmtree(self.base, ignore_errors=True)

    def cri_client(self) -> CriClient:
        """A CRI client on this containerd, logging pods under pod_log_dir."""
        return CriClient(self.cri_socket, self.pod_log_dir)

    # -- logs -------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])
