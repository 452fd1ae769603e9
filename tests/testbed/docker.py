"""Debian's Docker (dockerd + CLI) on a test-bed containerd: trixie's 26.1 on
containerd 1.7, sid's 28.5 on 2.x (the one extracted beside the containerd).

dockerd runs against the given `Containerd` (--containerd), so Docker's
containers are containerd containers in the namespace "moby", run by the
io.containerd.runc.v2 shim with runc's root at <exec-root>/runtime-runc/moby
(the shim appends the namespace) and the bundle at
<containerd state>/io.containerd.runtime.v2.task/moby/<id>.  A runtime added
by path (`runtimes=`) is the same shim with that path as its runc binary.

Everything lives under one base dir: data root, exec root, pid file, API
socket, daemon.json, the log.  No bridge, no iptables, no userland proxy:
containers run with `--network none`.  Both binaries come from
.cache/trixie or .cache/sid (scripts/install-prereqs.sh), never from $PATH, and
the CLI gets a private DOCKER_CONFIG.  Only what this object started is ever killed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.testbed.containerd import SHIM_SOCKET_DIR, Containerd, selected_bin_dir
from tests.testbed.images import build_images

MOBY_NAMESPACE = "moby"
STORAGE_DRIVERS = ("overlay2", "vfs")  # tried in this order unless one is named


class DockerdError(RuntimeError):
    pass


def release_root(bin_dir: Path) -> Path:
    """The extracted Debian root a containerd bin dir (its usr/bin) is in:
    Docker is taken from the same release."""
    return bin_dir.parents[1]


def missing_prerequisites(root: Path | None = None) -> list[str]:
    """What Docker needs beyond the containerd test bed, human-readable."""
    root = root or release_root(selected_bin_dir())
    return [
        f"{root / b} (run scripts/install-prereqs.sh)"
        for b in ("usr/sbin/dockerd", "usr/bin/docker", "usr/bin/docker-init")
        if not os.access(root / b, os.X_OK)
    ]


def docker_archive(oci_tar: Path, dest: Path) -> Path:
    """Copy an OCI layout tar (tests/testbed/images.py) to dest, adding the
    manifest.json of a docker-archive: dockerd 26 with its graph drivers loads
    only that.  RepoTags come from the io.containerd.image.name annotations."""
    with tarfile.open(oci_tar) as src, tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as out:

        def blob(digest: str) -> str:
            return "blobs/sha256/" + digest.split(":", 1)[1]

        def read(name: str) -> object:
            f = src.extractfile(name)
            assert f is not None, name
            return json.loads(f.read())

        entries = []
        index = read("index.json")
        assert isinstance(index, dict)
        for desc in index["manifests"]:
            manifest = read(blob(desc["digest"]))
            assert isinstance(manifest, dict)
            name = desc.get("annotations", {}).get("io.containerd.image.name")
            entries.append(
                {
                    "Config": blob(manifest["config"]["digest"]),
                    "RepoTags": [name] if name else [],
                    "Layers": [blob(layer["digest"]) for layer in manifest["layers"]],
                }
            )
        for member in src.getmembers():
            out.addfile(member, src.extractfile(member) if member.isfile() else None)
        data = json.dumps(entries).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size, info.mode = len(data), 0o644
        out.addfile(info, io.BytesIO(data))
    return dest


class Dockerd:
    """One private dockerd on `containerd`.  start()/stop() or a context manager.

    runtimes: name -> path of a runc-compatible binary (`--add-runtime`).
    cdi_spec_dirs: enables CDI with these spec dirs (daemon.json).
    storage_driver: None tries overlay2, then vfs (overlay2 fails where the
    base dir itself is on overlayfs, as in a nested container); the one that
    started is in .storage_driver.
    images: load the test images (BUSYBOX_IMAGE, PAUSE_IMAGE) after start.
    """

    def __init__(
        self,
        containerd: Containerd,
        base: Path | str | None = None,
        *,
        runtimes: Mapping[str, str | Path] | None = None,
        cdi_spec_dirs: Sequence[Path | str] = (),
        storage_driver: str | None = None,
        images: bool = True,
        log_level: str = "info",
        root: Path | None = None,
    ) -> None:
        self.containerd = containerd
        self._own_base = base is None
        self.base = Path(base or tempfile.mkdtemp(prefix="gpushare-tb-docker-", dir="/tmp"))
        self.runtimes = {name: str(path) for name, path in (runtimes or {}).items()}
        self.cdi_spec_dirs = [Path(d) for d in cdi_spec_dirs]
        self.storage_driver = storage_driver
        self.images = images
        self.log_level = log_level
        root = root or release_root(containerd.bin_dir)
        self.dockerd_bin = root / "usr" / "sbin" / "dockerd"
        self.docker_bin = root / "usr" / "bin" / "docker"
        self.data_root = self.base / "data"
        self.exec_root = self.base / "exec"
        self.socket = self.base / "docker.sock"
        self.pidfile = self.base / "docker.pid"
        self.config_path = self.base / "daemon.json"
        self.cli_config = self.base / "cli"
        self.log_path = self.base / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        if len(str(self.socket)) > 100:
            raise DockerdError(f"base dir {self.base} too long for a unix socket")

    # -- paths --------------------------------------------------------------

    @property
    def host(self) -> str:
        """DOCKER_HOST for this daemon."""
        return f"unix://{self.socket}"

    @property
    def runc_root(self) -> Path:
        """runc's --root for Docker's containers, every runtime's (runc and
        those added by path): the shim appends the namespace."""
        return self.exec_root / "runtime-runc" / MOBY_NAMESPACE

    def bundle(self, container_id: str) -> Path:
        """The OCI bundle of a running container (in containerd's state dir)."""
        task_dir = self.containerd.base / "state" / "io.containerd.runtime.v2.task"
        return task_dir / MOBY_NAMESPACE / container_id

    def config(self) -> dict[str, object]:
        config: dict[str, object] = {}
        if self.cdi_spec_dirs:
            config["features"] = {"cdi": True}
            config["cdi-spec-dirs"] = [str(d) for d in self.cdi_spec_dirs]
        return config

    def argv(self, storage_driver: str) -> list[str]:
        args = [
            str(self.dockerd_bin),
            # Always our own file: never /etc/docker/daemon.json.
            f"--config-file={self.config_path}",
            f"--containerd={self.containerd.grpc_address}",
            f"--data-root={self.data_root}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={self.pidfile}",
            f"--host={self.host}",
            f"--storage-driver={storage_driver}",
            f"--log-level={self.log_level}",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            "--bridge=none",
            "--userland-proxy=false",
        ]
        args += [f"--add-runtime={name}={path}" for name, path in self.runtimes.items()]
        return args

    # -- lifecycle ------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Dockerd:
        """Start dockerd and load the images; on failure, stop what started
        (the base dir stays, with the log) and raise DockerdError."""
        if self.running:
            return self
        if not self.containerd.running:
            raise DockerdError("its containerd is not running")
        for d in (self.data_root, self.exec_root, self.cli_config, *self.cdi_spec_dirs):
            d.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(self.config(), indent=1) + "\n")
        # dockerd runs modprobe only for networking that is off here (bridge,
        # iptables, ipvs); should it ever try, the stub refuses.
        (self.base / "bin").mkdir(exist_ok=True)
        stub = self.base / "bin" / "modprobe"
        stub.write_text('#!/bin/sh\necho "modprobe $*: refused by the test bed" >&2\nexit 1\n')
        stub.chmod(0o755)
        try:
            self._start_any_driver(timeout)
            if self.images:
                self.load_image(build_images())
        except BaseException:
            self.stop(remove=False)
            raise
        return self

    def _start_any_driver(self, timeout: float) -> None:
        drivers = [self.storage_driver] if self.storage_driver else list(STORAGE_DRIVERS)
        for i, driver in enumerate(drivers):
            logged = len(self.log_text())
            try:
                self._start(driver, timeout)
                self.storage_driver = driver
                return
            except DockerdError:
                refused = f"driver not supported: {driver}" in self.log_text()[logged:]
                if i == len(drivers) - 1 or not refused:
                    raise
                self._stop_dockerd()
                self._unmount()

    def _start(self, driver: str, timeout: float) -> None:
        # The stub modprobe, then docker-init and (sid) runc; else the system's runc.
        path = [self.base / "bin", self.dockerd_bin.parents[2] / "usr" / "bin"]
        path_var = ":".join(map(str, path)) + ":" + os.environ.get("PATH", "/usr/sbin:/usr/bin")
        with self.log_path.open("ab") as log:
            log.write(f"--- gpushare test bed: starting dockerd with {driver}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv(driver),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=dict(os.environ, PATH=path_var),
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise DockerdError(
                    f"dockerd exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            probe = self.docker(
                "version", "--format", "{{.Server.Version}}", check=False, timeout=5
            )
            if probe.returncode == 0:
                return
            if time.monotonic() > deadline:
                self._stop_dockerd()
                raise DockerdError(f"dockerd not ready in {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def load_image(self, oci_tar: Path) -> list[str]:
        """Load the images of an OCI layout tar from images.py; their names."""
        archive = docker_archive(oci_tar, self.base / f"{oci_tar.stem}.docker.tar")
        try:
            done = self.docker("load", "--input", str(archive), timeout=120)
        finally:
            archive.unlink()
        prefix = "Loaded image: "
        return [line[len(prefix) :] for line in done.stdout.splitlines() if line.startswith(prefix)]

    def stop(self, remove: bool = True) -> None:
        """Remove every container, stop dockerd, kill what is left of Docker's
        containers and shims, unmount everything under base; the base dir is
        deleted too if this object created it and remove is set."""
        if self.running:
            ids = self.docker("ps", "--all", "--quiet", check=False, timeout=30).stdout.split()
            if ids:
                self.docker("rm", "--force", "--volumes", *ids, check=False, timeout=60)
        self._stop_dockerd()
        self._kill_leftovers()
        self._unmount()
        if remove and self._own_base:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Dockerd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _stop_dockerd(self) -> None:
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            self.proc.send_signal(sig)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        self.pidfile.unlink(missing_ok=True)

    def _kill_leftovers(self) -> None:
        """What outlived dockerd: containerd's records and tasks in "moby" (by
        id, as ctr sees them), then any shim of ours still alive."""
        ctr = [str(self.containerd.ctr), "-a", str(self.containerd.grpc_address)]
        ctr += ["-n", MOBY_NAMESPACE]
        if self.containerd.running:
            listed = subprocess.run(
                [*ctr, "containers", "ls", "-q"], capture_output=True, text=True
            )
            for cid in listed.stdout.split():
                subprocess.run([*ctr, "tasks", "delete", "--force", cid], capture_output=True)
                subprocess.run([*ctr, "containers", "delete", cid], capture_output=True)
        if self.runc_root.is_dir():
            for state in self.runc_root.iterdir():
                subprocess.run(
                    [
                        self.containerd.runc,
                        "--root",
                        str(self.runc_root),
                        "delete",
                        "--force",
                        state.name,
                    ],
                    capture_output=True,
                )
        address = str(self.containerd.grpc_address)
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            opts = dict(zip(argv[1::2], argv[2::2], strict=False))
            if not (
                argv[0].endswith("containerd-shim-runc-v2")
                and opts.get("-address") == address
                and opts.get("-namespace") == MOBY_NAMESPACE
            ):
                continue
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                pass
            # containerd (1.7 and 2.x) names the socket sha256(address/namespace/id).
            key = f"{address}/{MOBY_NAMESPACE}/{opts.get('-id', '')}"
            Path(SHIM_SOCKET_DIR, hashlib.sha256(key.encode()).hexdigest()).unlink(missing_ok=True)

    def _unmount(self) -> None:
        """dockerd mounts its data root on itself, overlays (overlay2), netns
        files; after a clean shutdown nothing is left, after a kill this does it."""
        base = str(self.base) + "/"
        with open("/proc/self/mountinfo") as f:
            points = {line.split()[4] for line in f}
        for point in sorted((p for p in points if p.startswith(base)), key=len, reverse=True):
            if subprocess.run(["umount", point], capture_output=True).returncode != 0:
                subprocess.run(["umount", "--lazy", point], capture_output=True)

    # -- the CLI --------------------------------------------------------------

    def docker(
        self, *args: str, check: bool = True, timeout: float = 60.0, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the docker CLI on this daemon; check raises DockerdError
        with its output and the daemon's log tail."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
        env |= {"DOCKER_HOST": self.host, "DOCKER_CONFIG": str(self.cli_config)}
        done = subprocess.run(
            [str(self.docker_bin), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if check and done.returncode != 0:
            raise DockerdError(
                f"docker {' '.join(args)} exited with {done.returncode}:\n"
                f"stdout: {done.stdout.strip()}\nstderr: {done.stderr.strip()}\n"
                f"dockerd log:\n{self.log_tail(20)}"
            )
        return done

    # -- logs -----------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])
