"""What the installer's tests share: a clean Debian root of one release
(test_install.py: bookworm, test_install_trixie.py: trixie), and the steps
both run in it (a pod through `nri-gpushare enable`, the DKMS-built module
in a qemu guest, the uninstall).

A root is made by mmdebstrap (the tarball cached under .cache/install-root
per release, day and mirror list, a fresh copy unpacked per run) and lives
in a private mount namespace (`unshare --mount`): its /proc, /sys, /dev and
pip mounts die with it, whatever happens.  The root's processes are the only
ones ever killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from tests.prereqs import missing
from tests.testbed.cri import CriClient, parse_cri_log
from tests.testbed.images import PAUSE_IMAGE, build_images, import_images

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "install-root"
VERSION = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M)[1]  # type: ignore[index]
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UNIT = "/usr/local/lib/systemd/system/nri-gpushare.service"
LIBDIR = "/usr/lib/nri-gpushare"
POD = "install-train"
# What the tests themselves add to a root (not the installer's business).
TEST_ADDED = (
    "/src",
    "/src-next",
    "/usr/local/bin/containerd",
    "/usr/local/bin/containerd-shim-runc-v2",
    "/usr/local/bin/ctr",
    "/etc/containerd",
    "/etc/cni",
    "/var/lib/containerd",
    "/opt/containerd",
    "/etc/gpushare-test",
    "/etc/pip.conf",
    "/etc/resolv.conf",
    "/opt/wheels",
    "/opt/pypi",
    "/opt/pypi-more",
    "/tmp",
    "/root",
    "/run",
    "/var/run",
    "/var/log",
)


def die_with_parent() -> None:
    """In a child before exec: SIGKILL when the test's process dies, so that
    a killed run leaves no namespace holder or daemon behind."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def log(message: str) -> None:
    print(f"[install test] {message}", flush=True)


@contextmanager
def phase(name: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        log(f"{name}: {time.monotonic() - started:.1f} s")


# -- the clean root ---------------------------------------------------------------------


def apt_sources(release: str) -> list[str]:
    """One-line apt sources of this machine's mirrors for release (its
    -updates and -security suites too), from deb822 files or sources.list:
    the root's packages, the guest kernel's headers among them, come from
    the same mirror as this machine's."""
    lines: list[str] = []
    for deb822 in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for stanza in deb822.read_text().split("\n\n"):
            fields = dict(
                (k.strip(), v.strip())
                for k, _, v in (line.partition(":") for line in stanza.splitlines() if ":" in line)
                if not k.startswith("#")
            )
            if "deb" not in fields.get("Types", "").split():
                continue
            for uri in fields.get("URIs", "").split():
                for suite in fields.get("Suites", "").split():
                    if suite == release or suite.startswith(release + "-"):
                        lines.append(f"deb {uri} {suite} {fields.get('Components', 'main')}")
    legacy = Path("/etc/apt/sources.list")
    if not lines and legacy.is_file():
        lines = [
            line.strip()
            for line in legacy.read_text().splitlines()
            if re.match(rf"deb\s+(\[[^]]*\]\s+)?\S+\s+{release}(-\S+)?\s", line)
        ]
    return lines or [
        f"deb http://deb.debian.org/debian {release} main",
        f"deb http://deb.debian.org/debian {release}-updates main",
        f"deb http://deb.debian.org/debian-security {release}-security main",
    ]


def root_tarball(release: str) -> Path:
    """A stock root of release (priority important: what a Debian installer
    gives a server), made once a day per mirror list."""
    sources = apt_sources(release)
    argv = ["mmdebstrap", "--quiet", "--variant=important", "--include=ca-certificates"]
    key = hashlib.sha256("\n".join(argv + sources).encode()).hexdigest()[:12]
    day = time.strftime("%Y%m%d", time.gmtime())
    tar = CACHE / f"{release}-{day}-{key}.tar"
    if tar.is_file():
        return tar
    CACHE.mkdir(parents=True, exist_ok=True)
    for old in CACHE.glob(f"{release}-*.tar"):
        old.unlink()
    # mmdebstrap picks the output's format by its name: a .tar name.
    tmp = CACHE / f".{tar.stem}.{os.getpid()}.tar"
    started = time.monotonic()
    done = subprocess.run([*argv, release, str(tmp), *sources], capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        pytest.fail(f"mmdebstrap {release} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    tmp.replace(tar)
    log(f"mmdebstrap {release}: {time.monotonic() - started:.1f} s, {tar.stat().st_size >> 20} MiB")
    return tar


def pip_settings() -> tuple[dict[str, str], list[str], str | None]:
    """This machine's pip configuration for the root: PIP_* variables, the
    local package directories to mount read-only, and the CA file pip must
    use (a proxy's CA may be in this machine's bundle only)."""
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    dirs = [str(p) for p in Path("/opt").glob("wheels") if p.is_dir()]
    dirs += [str(p) for p in sorted(Path("/opt").glob("pypi*")) if p.is_dir()]
    for value in (env.get("PIP_FIND_LINKS", ""), env.get("PIP_INDEX_URL", "")):
        for word in value.split():
            path = word.removeprefix("file://")
            if path.startswith("/") and os.path.isdir(path) and path not in dirs:
                dirs.append(path)
    cert = env.get("PIP_CERT")
    conf = Path("/etc/pip.conf")
    if not cert and conf.is_file():
        if m := re.search(r"^\s*cert\s*=\s*(\S+)", conf.read_text(), re.M):
            cert = m[1]
    if cert is None and Path("/etc/ssl/certs/ca-certificates.crt").is_file():
        cert = "/etc/ssl/certs/ca-certificates.crt"
    return env, dirs, cert


class Root:
    """A clean root in a private mount namespace held by one `sleep`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.path = base / "root"
        self.holder: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.before: set[str] = set()  # its files before the installer ran
        self.kernel = ""  # the guest's, which DKMS builds for
        self.install_log = ""

    # -- set-up and tear-down --

    def make(self, tarball: Path) -> None:
        self.path.mkdir()
        subprocess.run(["tar", "-C", str(self.path), "-xf", str(tarball)], check=True)
        self.before = self.files()
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sleep", "infinity"],
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        mine = os.readlink("/proc/self/ns/mnt")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{self.holder.pid}/ns/mnt") == mine:
            if time.monotonic() > deadline:
                pytest.fail("unshare --mount did not make a mount namespace")
            time.sleep(0.02)
        pip_env, pip_dirs, cert = pip_settings()
        r = shlex.quote(str(self.path))
        script = [
            "set -e",
            # The root a mount point: runc makes / of a container's parent
            # rprivate and pivots from it, which a plain directory refuses.
            f"mount --bind {r} {r}",
            f"mount -t proc proc {r}/proc",
            f"mount --rbind /sys {r}/sys",
            f"mount --rbind /dev {r}/dev",
        ]
        for d in pip_dirs:
            q = shlex.quote(d)
            script += [
                f"mkdir -p {r}{q}",
                f"mount --bind {q} {r}{q}",
                f"mount -o remount,bind,ro {r}{q}",
            ]
        self.host_ns("\n".join(script))
        shutil.copy("/etc/resolv.conf", self.path / "etc/resolv.conf")
        extra = self.path / "etc/gpushare-test"
        extra.mkdir()
        if Path("/etc/pip.conf").is_file():
            shutil.copy("/etc/pip.conf", self.path / "etc/pip.conf")
        self.env = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8", **pip_env}
        if cert and os.path.isfile(cert):
            shutil.copy(cert, extra / "pip-ca.crt")
            self.env["PIP_CERT"] = "/etc/gpushare-test/pip-ca.crt"

    def kill_processes(self) -> None:
        """SIGKILL every process whose root is this root (all started here)."""
        real = os.path.realpath(self.path)
        for _ in range(50):
            pids = []
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        if os.readlink(entry / "root") == real:
                            pids.append(int(entry.name))
                    except OSError:
                        pass
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def destroy(self) -> None:
        self.kill_processes()
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()
        # The namespace is gone with its last process: no mount of it can
        # remain; check before deleting anything.
        real = os.path.realpath(self.base)
        with open("/proc/self/mountinfo") as f:
            left = [line.split()[4] for line in f if line.split()[4].startswith(real + "/")]
        if left:
            raise RuntimeError(f"mounts left under {real}, not removing it: {left}")
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.base)], check=False)

    # -- running things --

    def host_ns(self, script: str) -> None:
        """A shell script as root in the namespace, outside the chroot."""
        assert self.holder is not None
        argv = ["nsenter", "-t", str(self.holder.pid), "-m", "sh", "-c", script]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"{script!r} failed: {done.stderr}")

    def argv(self, cmd: list[str], env: dict[str, str] | None = None) -> list[str]:
        assert self.holder is not None
        variables = [f"{k}={v}" for k, v in {**self.env, **(env or {})}.items()]
        return [
            "nsenter", "-t", str(self.holder.pid), "-m",
            "chroot", str(self.path), "env", "-i", *variables, *cmd,
        ]  # fmt: skip

    def run(
        self, cmd: list[str] | str, *, env: dict[str, str] | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        """cmd in the chroot (a string: sh -c), cwd /src; output captured."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else cmd
        return subprocess.run(
            self.argv(["sh", "-c", 'cd /src 2>/dev/null; exec "$@"', "sh", *argv], env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def ok(self, cmd: list[str] | str, **kw: Any) -> str:
        done = self.run(cmd, **kw)
        if done.returncode != 0:
            pytest.fail(
                f"{cmd!r} in the root failed ({done.returncode}):\n"
                f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
            )
        return done.stdout

    def apt_install(self, *packages: str) -> str:
        return self.ok(
            ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y", "-q", "install",
             "--no-install-recommends", *packages]
        )  # fmt: skip

    def start(self, cmd: list[str], log_name: str) -> subprocess.Popen[bytes]:
        out = open(self.base / log_name, "ab")  # noqa: SIM115 (lives as long as the process)
        return subprocess.Popen(
            self.argv(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )

    def log_tail(self, log_name: str) -> str:
        path = self.base / log_name
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    # -- looking at it --

    def host(self, path: str) -> Path:
        return self.path / path.lstrip("/")

    def files(self) -> set[str]:
        """Every path in the root, as seen from inside ('/etc/...')."""
        found = set()
        skip = {"proc", "sys", "dev"}
        for dirpath, dirnames, filenames in os.walk(self.path):
            rel = "/" + os.path.relpath(dirpath, self.path).removeprefix(".").lstrip("/")
            if rel == "/":
                dirnames[:] = [d for d in dirnames if d not in skip]
            for name in dirnames + filenames:
                found.add(os.path.join(rel, name))
        return found

    def dpkg_files(self) -> set[str]:
        """Every path a Debian package installed, under both names where
        /bin, /sbin, /lib are links into /usr (merged /usr)."""
        owned: set[str] = set()
        for listing in self.host("/var/lib/dpkg/info").glob("*.list"):
            owned.update(line for line in listing.read_text().splitlines() if line)
        merged = [d for d in ("/bin", "/sbin", "/lib", "/lib64") if self.host(d).is_symlink()]
        for path in list(owned):
            for d in merged:
                if path.startswith(d + "/"):
                    owned.add("/usr" + path)
        return owned


@contextmanager
def clean_root(release: str, kernel: str) -> Iterator[Root]:
    """A fresh root of release whose kernel (root.kernel, for DKMS) is the
    guest's `kernel` ("6.1", "6.12": a version or its start), which
    run_in_guest boots meanwhile: a root builds for its own release's kernel
    only, whatever $GPUSHARE_GUEST_KERNEL said."""
    from tests.guest.harness import GuestUnavailable, check_prereqs
    from tests.guest.harness.vm import KERNEL_ENV

    with pytest.MonkeyPatch.context() as env:
        env.setenv(KERNEL_ENV, kernel)
        try:
            version = check_prereqs().version
        except GuestUnavailable as e:
            missing(str(e))
        root = Root(Path(tempfile.mkdtemp(prefix=f"gs-{release}-", dir="/tmp")))
        try:
            with phase(f"root tarball (mmdebstrap {release}, cached per day)"):
                tarball = root_tarball(release)
            with phase("unpack a fresh root"):
                root.make(tarball)
            root.kernel = version
            yield root
        finally:
            root.destroy()


def check_prerequisites(binaries: Iterable[Path] = ()) -> None:
    """This machine's tools the tests use, and binaries they copy in."""
    problems = []
    if os.geteuid() != 0:
        problems.append("root privileges")
    for tool in ("mmdebstrap", "unshare", "nsenter", "chroot"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} (apt-get install mmdebstrap util-linux)")
    problems += [str(b) for b in binaries if not os.access(b, os.X_OK)]
    if problems:
        missing("install test prerequisites missing: " + "; ".join(problems))


def copy_tree(dest: Path, version: str | None = None) -> None:
    """This checkout's files (tracked, and untracked but not ignored) at dest;
    with `version`, pyproject.toml says that version."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    dest.mkdir(parents=True)
    names = [n for n in listed.decode().split("\0") if n and (REPO / n).exists()]
    subprocess.run(
        ["tar", "-C", str(REPO), "--null", "-T", "-", "-cf", "-"],
        input="\0".join(names).encode(),
        stdout=open(dest / ".tar", "wb"),  # noqa: SIM115
        check=True,
    )
    subprocess.run(["tar", "-C", str(dest), "-xf", str(dest / ".tar")], check=True)
    (dest / ".tar").unlink()
    if version:
        pyproject = dest / "pyproject.toml"
        pyproject.write_text(
            re.sub(r'^version = ".*"$', f'version = "{version}"', pyproject.read_text(), flags=re.M)
        )


def install(root: Root) -> None:
    """The README's command for the root's kernel, under umask 000 (the
    operator's umask must not matter: nothing installed is world-writable)."""
    with phase(f"sh scripts/install-node.sh --kernel {root.kernel} (under umask 000)"):
        root.install_log = root.ok(
            ["sh", "-c", 'umask 000 && exec "$@"', "sh",
             "sh", "scripts/install-node.sh", "--kernel", root.kernel]
        )  # fmt: skip
    said = [line for line in root.install_log.splitlines() if line.startswith("install-node:")]
    log("\n".join(said))


def unit_command(root: Root, key: str, unit: str = UNIT) -> list[str]:
    """ExecStart= or ExecStartPre= of an installed unit, as argv."""
    text = root.host(unit).read_text()
    lines = re.findall(rf"^{key}=(.*)$", text, re.M)
    assert len(lines) == 1, f"{key} in {unit}: {lines}"
    return shlex.split(lines[0].lstrip("-@:+!"))


def verify_unit(root: Root) -> None:
    """The installed unit passes the root's own `systemd-analyze verify` (a
    release's systemd judges its units: bookworm's 252 reports trixie's own
    units' newer keys) and names programs and a document that are there."""
    done = root.run(["systemd-analyze", "verify", "nri-gpushare.service"])
    said = done.stdout + done.stderr
    assert (done.returncode, said) == (0, ""), said
    for key in ("ExecStart", "ExecStartPre"):
        program = unit_command(root, key)[0]
        assert os.access(root.host(program), os.X_OK), f"{key} {program} is not installed"
    doc = re.search(r"^Documentation=file:(\S+)$", root.host(UNIT).read_text(), re.M)
    assert doc and root.host(doc[1]).is_file()


# -- a pod through the plugin -----------------------------------------------------------

SIMULATED = """\
use_nvml: false
kmod_load: false     # never modprobe from this root: the kernel here is the host's
inventory:
  - {index: 0, uuid: GPU-11111111-0000-0000-0000-000000000000, name: "Simulated GPU", memory: 16Gi}
  - {index: 1, uuid: GPU-22222222-0000-0000-0000-000000000000, name: "Simulated GPU", memory: 16Gi}
"""


def containerd_for_this_machine(root: Root) -> None:
    """The two changes this machine needs in the root's containerd config
    (version 2), as the test bed makes them: no registry (the sandbox image
    is the test bed's local one), and no CAP_SYS_RESOURCE (runc cannot give
    the sandbox a negative oom_score_adj).  The rest stays as it was."""
    path = root.host("/etc/containerd/config.toml")
    doc = tomlkit.parse(path.read_text())
    cri: Any = doc.setdefault("plugins", tomlkit.table()).setdefault(
        "io.containerd.grpc.v1.cri", tomlkit.table()
    )
    cri["sandbox_image"] = PAUSE_IMAGE
    cri["restrict_oom_score_adj"] = True
    path.write_text(tomlkit.dumps(doc))


def enable_then_run_a_pod(root: Root, containerd: list[str], ctr: Path, lib_version: str) -> None:
    """The simulated GPUs in the installed config, `nri-gpushare enable`,
    containerd (argv `containerd`) and the daemon started as the unit says,
    then a CRI pod with a share: its container sees the injected
    environment, its interposer mount names lib_version's file, and
    `gpushare-smi` shows the pod.  ctr: a ctr binary this machine runs."""
    config = root.host("/etc/nri-gpushare/gpushare.yaml")
    text = re.sub(
        r"^(use_nvml|kmod_load|inventory):.*\n(#  - .*\n)?", "", config.read_text(), flags=re.M
    )
    config.write_text(text + SIMULATED)

    with phase("nri-gpushare enable"):
        enabled = root.run(["nri-gpushare", "enable"])
    assert enabled.returncode == 0, (
        f"nri-gpushare enable failed:\n{enabled.stdout}\n{enabled.stderr}"
    )

    socket = root.host("/run/containerd/containerd.sock")
    with phase("containerd and the daemon up, the plugin connected"):
        root.start(containerd, "containerd.log")
        deadline = time.monotonic() + 60
        while not socket.exists():
            assert time.monotonic() < deadline, root.log_tail("containerd.log")
            time.sleep(0.1)
        import_images(ctr, socket, build_images())
        pre = root.run(unit_command(root, "ExecStartPre"))
        assert pre.returncode == 0 and "kmod_load is false" in pre.stdout, pre
        root.start(unit_command(root, "ExecStart"), "daemon.log")
        wait_connected(root)

    with phase("a CRI pod with a share"):
        try:
            run, mounts, smi = asyncio.run(run_pod(root))
        except Exception:
            log(f"containerd:\n{root.log_tail('containerd.log')}")
            log(f"daemon:\n{root.log_tail('daemon.log')}")
            raise
    env = dict(line.split("=", 1) for line in run if "=" in line)
    assert env.get("GPUSHARE_MEMORY_LIMIT") == str(2 << 30), run
    assert env.get("NVIDIA_VISIBLE_DEVICES", "").startswith("GPU-"), run
    assert f"{LIBDIR}/{lib_version}/libgpushare.so" in mounts, mounts
    assert smi.returncode == 0 and POD in smi.stdout, f"gpushare-smi:\n{smi.stdout}\n{smi.stderr}"
    root.kill_processes()


def wait_connected(root: Root) -> None:
    deadline = time.monotonic() + 60
    while True:
        done = root.run(["nri-gpushare", "status", "--json"])
        if done.returncode == 0 and '"connected": true' in done.stdout:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the daemon did not connect:\n{root.log_tail('daemon.log')}\n"
                        f"{root.log_tail('containerd.log')}")  # fmt: skip
        time.sleep(0.3)


async def run_pod(root: Root) -> tuple[list[str], str, subprocess.CompletedProcess[str]]:
    """A pod asking for 2Gi whose container prints its environment and stays;
    (its output, its OCI spec's mounts as text, gpushare-smi while it runs)."""
    async with CriClient(root.host("/run/containerd/containerd.sock"), "/var/log/pods") as cri:
        pod = await cri.run_pod(POD, annotations={"gpushare.io/gpu-memory": "2Gi"})
        cid = await cri.create_container(pod, "main", command=["sh", "-c", "env; exec sleep 600"])
        await cri.start(cid)
        deadline = time.monotonic() + 30
        while True:
            status = await cri.container_status(cid)
            path = root.host(status.log_path)
            lines = [line for _, line in parse_cri_log(path.read_text())] if path.exists() else []
            if any(line.startswith("PATH=") for line in lines):
                break
            assert time.monotonic() < deadline, f"no output from the container: {status}"
            await asyncio.sleep(0.1)
        info = await cri.container_info(cid)
        mounts = str(info.get("runtimeSpec", {}).get("mounts", info))
        # Still running: the share is there for gpushare-smi.
        smi = root.run(["gpushare-smi"])
        return lines, mounts, smi


# -- the module in the guest, the uninstall ---------------------------------------------


def dkms_module(root: Root) -> Path:
    """The gpushare.ko DKMS installed for the root's kernel (compressed as
    that kernel's modules are, or not)."""
    found = sorted(root.host(f"/lib/modules/{root.kernel}/updates/dkms").glob("gpushare.ko*"))
    assert len(found) == 1, f"DKMS's gpushare.ko for {root.kernel}: {found}"
    return found[0]


def module_loads_in_guest(root: Root, version: str, tmp_path: Path) -> None:
    """The DKMS-built module loads in the guest booting root.kernel (never in
    this machine's kernel), /proc/gpushare/version says version, and it
    unloads."""
    from tests.guest.harness import run_in_guest
    from tests.guest.harness.vm import module_bytes

    ko = dkms_module(root)
    copy = tmp_path / "gpushare.ko"
    copy.write_bytes(module_bytes(ko))  # busybox insmod: plain .ko only
    script = (
        f"echo kernel $(uname -r) && insmod {copy} && cat /proc/gpushare/version && "
        "rmmod gpushare && test ! -e /proc/gpushare && echo unloaded"
    )
    with phase(f"guest: insmod the DKMS-built module ({ko.name})"):
        result = run_in_guest(script, cwd=REPO, timeout=300, echo=sys.stderr)
    tail = result.console[-3000:]
    assert result.status == 0, tail
    assert f"kernel {root.kernel}" in result.console, tail
    assert re.search(rf"^{re.escape(version)}\r?$", result.console, re.M), tail
    assert "unloaded" in result.console


def alternative(path: Path) -> bool:
    """A link update-alternatives made (cc, c++, ...)."""
    return path.is_symlink() and os.readlink(path).startswith("/etc/alternatives/")


def installed_paths(version: str) -> tuple[str, ...]:
    """What install adds and uninstall removes (version: the installed one)."""
    return (
        "/opt/nri-gpushare",
        "/usr/local/bin/nri-gpushare",
        "/usr/local/bin/gpushare-runc",
        "/usr/local/bin/gpushare-smi",
        UNIT,
        "/usr/local/share/doc/nri-gpushare",
        "/etc/modules-load.d/gpushare.conf",
        f"{LIBDIR}/libgpushare.so",
        f"/usr/src/gpushare-{version}",
        "/var/lib/dkms/gpushare",
    )


def uninstall_refuses_then_removes(root: Root, version: str) -> None:
    """`--uninstall` refuses while the module reports a registration (a
    stand-in /proc/gpushare) and removes nothing; then it removes all that
    install added, and keeps the config and the interposer versions."""
    kernel = root.kernel
    installed = installed_paths(version)
    assert [p for p in installed if not os.path.lexists(root.host(p))] == [], "missing"
    fake = root.host("/tmp/fake-kmod")
    fake.mkdir(parents=True)
    (fake / "inst_ctl").write_text(f"add {'c' * 64} 0:2147483648:100:0\n")
    before = root.files()
    refused = root.run(
        ["sh", "scripts/install-node.sh", "--uninstall", "--kmod-root", "/tmp/fake-kmod"]
    )
    log(f"uninstall under a registration said:\n{refused.stdout}{refused.stderr}")
    assert refused.returncode != 0
    assert (
        "refusing to unload gpushare" in refused.stderr and "nothing was removed" in refused.stderr
    )
    assert root.files() == before

    with phase("uninstall"):
        out = root.ok(["sh", "scripts/install-node.sh", "--uninstall"])
    log(out)
    assert [p for p in installed if os.path.lexists(root.host(p))] == []
    assert not list(root.host(f"/lib/modules/{kernel}").rglob("gpushare.ko*"))
    assert root.host("/etc/nri-gpushare/gpushare.yaml").is_file()
    assert root.host(f"{LIBDIR}/{version}/libgpushare.so").is_file()
    # Nothing else of the installer's is left: every path added since the
    # root was made belongs to a Debian package, to the test, to what
    # uninstall keeps on purpose, or to package machinery.
    kept = ("/etc/nri-gpushare", LIBDIR, "/var/lib/nri-gpushare")
    churn = (
        "/var/lib/dpkg",
        "/var/lib/apt",
        "/var/cache",
        "/var/lib/dkms",
        "/var/lib/systemd",
        "/etc/alternatives",
        "/etc/ld.so.cache",
        f"/usr/lib/modules/{kernel}",  # depmod's files, the headers' links
        "/etc/python3",  # python3's own postinst
        "/var/lib/python",
        "/usr/local/lib/python3",
    )
    owned = root.dpkg_files()
    leftover = sorted(
        p
        for p in root.files() - root.before - owned
        if not p.startswith(TEST_ADDED + kept + churn)
        and "__pycache__" not in p
        and not alternative(root.host(p))
    )
    assert leftover == [], f"left behind by install + uninstall: {leftover}"
    assert not [p for p in root.files() if "gpushare" in p and p.startswith("/var/lib/dkms")]
