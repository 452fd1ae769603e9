"""The node installer on a clean Debian 12 root, as an operator runs it.

A fresh bookworm root (mmdebstrap; the made tarball is cached under
.cache/install-root per day and mirror list, a fresh copy unpacked per run)
gets this source tree, then the README's command, `sh
scripts/install-node.sh`, for the qemu guest's kernel.  In that root:

- the files are where docs/install.md says, the unit passes
  `systemd-analyze verify`, a re-run keeps the operator's config, and a new
  version replaces the DKMS module and adds an interposer version while the
  old one stays;
- containerd 1.7.24 installed by hand (as an operator would), `nri-gpushare
  enable`, containerd and the daemon started as the unit says, and a CRI pod
  with a share: its container sees the injected environment, its interposer
  mount names the versioned file, and `gpushare-smi` shows the pod;
- the DKMS-built gpushare.ko loads in the guest's kernel (never in this
  machine's), /proc/gpushare/version says the installed version;
- `--uninstall` refuses while the module reports registrations (a stand-in
  /proc/gpushare) and removes nothing, then removes what install added.

Everything runs in a private mount namespace (`unshare --mount`): the
root's /proc, /sys, /dev and pip mounts die with it, whatever happens.  The
root's processes are the only ones ever killed.
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.prereqs import missing
from tests.testbed.containerd import TRIXIE_BIN
from tests.testbed.cri import CriClient, parse_cri_log
from tests.testbed.images import PAUSE_IMAGE, build_images, import_images

pytestmark = [pytest.mark.containerd, pytest.mark.guest]

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "install-root"
VERSION = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M)[1]  # type: ignore[index]
NEXT_VERSION = VERSION + ".post1"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UNIT = "/usr/local/lib/systemd/system/nri-gpushare.service"
LIBDIR = "/usr/lib/nri-gpushare"
POD = "install-train"
# What the test itself adds to the root (not the installer's business).
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


def bookworm_sources() -> list[str]:
    """One-line apt sources of this machine's bookworm mirrors (deb822 or
    sources.list), for the root: the guest kernel's headers come from there."""
    lines: list[str] = []
    deb822 = Path("/etc/apt/sources.list.d/debian.sources")
    if deb822.is_file():
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
                    if suite.startswith("bookworm"):
                        lines.append(f"deb {uri} {suite} {fields.get('Components', 'main')}")
    legacy = Path("/etc/apt/sources.list")
    if not lines and legacy.is_file():
        lines = [
            line.strip()
            for line in legacy.read_text().splitlines()
            if line.startswith("deb ") and " bookworm" in line
        ]
    return lines or [
        "deb http://deb.debian.org/debian bookworm main",
        "deb http://deb.debian.org/debian bookworm-updates main",
        "deb http://deb.debian.org/debian-security bookworm-security main",
    ]


def root_tarball() -> Path:
    """A stock bookworm root (priority important: what a Debian installer
    gives a server), made once a day per mirror list."""
    sources = bookworm_sources()
    argv = ["mmdebstrap", "--quiet", "--variant=important", "--include=ca-certificates"]
    key = hashlib.sha256("\n".join(argv + sources).encode()).hexdigest()[:12]
    day = time.strftime("%Y%m%d", time.gmtime())
    tar = CACHE / f"bookworm-{day}-{key}.tar"
    if tar.is_file():
        return tar
    CACHE.mkdir(parents=True, exist_ok=True)
    for old in CACHE.glob("bookworm-*.tar"):
        old.unlink()
    # mmdebstrap picks the output's format by its name: a .tar name.
    tmp = CACHE / f".{tar.stem}.{os.getpid()}.tar"
    done = subprocess.run([*argv, "bookworm", str(tmp), *sources], capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        pytest.fail(f"mmdebstrap failed ({done.returncode}):\n{done.stderr[-4000:]}")
    tmp.replace(tar)
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
        self.before: set[str] = set()
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

    def ok(self, cmd: list[str] | str, **kw: object) -> str:
        done = self.run(cmd, **kw)  # type: ignore[arg-type]
        if done.returncode != 0:
            pytest.fail(
                f"{cmd!r} in the root failed ({done.returncode}):\n"
                f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
            )
        return done.stdout

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


# -- prerequisites ----------------------------------------------------------------------


def check_prerequisites() -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append("root privileges")
    for tool in ("mmdebstrap", "unshare", "nsenter", "chroot", "systemd-analyze"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} (apt-get install mmdebstrap util-linux systemd)")
    for binary in ("containerd", "containerd-shim-runc-v2", "ctr"):
        if not os.access(TRIXIE_BIN / binary, os.X_OK):
            problems.append(str(TRIXIE_BIN / binary))
    if problems:
        missing("install test prerequisites missing: " + "; ".join(problems))


def guest_kernel() -> str:
    from tests.guest.harness import GuestUnavailable, check_prereqs

    try:
        return check_prereqs().version
    except GuestUnavailable as e:
        missing(str(e))


@pytest.fixture(scope="module")
def node() -> Iterator[Root]:
    """A clean root with the source tree, after the README's install command."""
    check_prerequisites()
    kernel = guest_kernel()
    base = Path(tempfile.mkdtemp(prefix="gs-inst-", dir="/tmp"))
    root = Root(base)
    try:
        with phase("root tarball (mmdebstrap, cached per day)"):
            tarball = root_tarball()
        with phase("unpack a fresh root"):
            root.make(tarball)
        with phase("copy the source tree"):
            copy_tree(root.host("/src"))
        root.kernel = kernel
        with phase(f"headers of {kernel} in the root's mirror?"):
            headers_from_host_if_gone(root, kernel)
        with phase(f"sh scripts/install-node.sh --kernel {kernel} (under umask 000)"):
            # The operator's umask must not matter: see test_nothing_installed_is_world_writable.
            root.install_log = root.ok(
                ["sh", "-c", 'umask 000 && exec "$@"', "sh",
                 "sh", "scripts/install-node.sh", "--kernel", kernel]
            )  # fmt: skip
        said = [line for line in root.install_log.splitlines() if line.startswith("install-node:")]
        log("\n".join(said))
        yield root
    finally:
        root.destroy()


def headers_from_host_if_gone(root: Root, kernel: str) -> None:
    """The installer takes linux-headers-<kernel> from the mirror.  Once the
    mirror has moved on to a newer kernel ABI, the guest's (this machine's
    installed 6.1) is no longer there: then its packages come from this
    machine's apt cache (install-prereqs.sh installed them through apt),
    installed into the root before the installer runs, which then finds
    them there."""
    name = f"linux-headers-{kernel}"
    root.ok("apt-get -q update >/dev/null")
    policy = root.ok(["apt-cache", "policy", name])
    if re.search(r"Candidate: (?!\(none\))", policy):
        log(f"{name}: from the mirror")
        return
    wanted = [name]
    depends = subprocess.run(
        ["dpkg-query", "-W", "-f=${Depends}", name], capture_output=True, text=True
    ).stdout
    wanted += [d.split()[0] for d in depends.split(",") if d.split()[0].startswith("linux-")]
    debs = []
    for package in wanted:
        version = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True
        ).stdout.replace(":", "%3a")
        found = sorted(Path("/var/cache/apt/archives").glob(f"{package}_{version}_*.deb"))
        if not version or not found:
            pytest.fail(
                f"{name} is neither on the root's mirror nor in this machine's apt cache "
                f"({package} {version or 'not installed'}): run scripts/install-prereqs.sh"
            )
        debs.append(found[0])
    (root.host("/tmp/headers")).mkdir(parents=True)
    for deb in debs:
        shutil.copy(deb, root.host(f"/tmp/headers/{deb.name}"))
    names = [f"/tmp/headers/{d.name}" for d in debs]
    root.ok(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y", "-q", "install",
             "--no-install-recommends", *names])  # fmt: skip
    log(f"{name}: not on the mirror; installed from this machine's apt cache: {names}")


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


def unit_command(root: Root, key: str) -> list[str]:
    """ExecStart= or ExecStartPre= of the installed unit, as argv."""
    text = root.host(UNIT).read_text()
    lines = re.findall(rf"^{key}=(.*)$", text, re.M)
    assert len(lines) == 1, f"{key} in {UNIT}: {lines}"
    return shlex.split(lines[0].lstrip("-@:+!"))


# -- the tests, in order ----------------------------------------------------------------


def test_install_puts_everything_in_place(node: Root) -> None:
    kernel = node.kernel
    for command in ("nri-gpushare", "gpushare-runc", "gpushare-smi"):
        link = node.host(f"/usr/local/bin/{command}")
        assert os.readlink(link) == f"/opt/nri-gpushare/venv/bin/{command}"
    assert node.ok(["nri-gpushare", "load-module", "--help"])
    config = node.host("/etc/nri-gpushare/gpushare.yaml").read_text()
    assert re.search(r"^inventory: \[\]", config, re.M), "the installed inventory is empty"
    assert re.search(r"^kmod_load: true$", config, re.M)
    check = (
        "from nri_gpushare.config import load_config as load; "
        "c = load('/etc/nri-gpushare/gpushare.yaml'); assert c.inventory == () and c.kmod_load"
    )
    node.ok(["/opt/nri-gpushare/venv/bin/python", "-c", check])
    # The interposer: a versioned file behind the configured link.
    assert os.readlink(node.host(f"{LIBDIR}/libgpushare.so")) == f"{VERSION}/libgpushare.so"
    lib = node.host(f"{LIBDIR}/{VERSION}/libgpushare.so")
    assert lib.stat().st_mode & 0o777 == 0o644 and lib.read_bytes()[:4] == b"\x7fELF"
    # DKMS: the module for the guest's kernel, rebuilt for every new kernel.
    dkms_conf = node.host(f"/usr/src/gpushare-{VERSION}/dkms.conf").read_text()
    assert 'AUTOINSTALL="yes"' in dkms_conf and f'PACKAGE_VERSION="{VERSION}"' in dkms_conf
    status = node.ok(["dkms", "status", "gpushare"])
    assert f"gpushare/{VERSION}, {kernel}, x86_64: installed" in status
    assert node.host(f"/lib/modules/{kernel}/updates/dkms/gpushare.ko").is_file()
    assert node.host("/etc/kernel/postinst.d/dkms").is_file(), "dkms's kernel hook"
    assert node.host("/etc/modules-load.d/gpushare.conf").read_text().splitlines()[-1] == "gpushare"
    assert node.host(UNIT).read_text() == (REPO / "systemd/nri-gpushare.service").read_text()
    assert "systemd is not running here: skipped" in node.install_log


def test_nothing_installed_is_world_writable(node: Root) -> None:
    """Installed under umask 000, still: a world-writable venv or interposer
    directory would let any local user change the daemon's code or what
    every GPU container loads."""
    paths = [
        "/opt/nri-gpushare",
        LIBDIR,
        "/etc/nri-gpushare",
        f"/usr/src/gpushare-{VERSION}",
        "/usr/local/share/doc/nri-gpushare",
        UNIT,
        "/etc/modules-load.d/gpushare.conf",
    ]
    found = node.ok(["find", *paths, "!", "-type", "l", "-perm", "-o+w"])
    assert found == "", f"world-writable:\n{found}"
    assert node.host("/etc/nri-gpushare/gpushare.yaml").stat().st_mode & 0o777 == 0o644


def test_installed_unit_verifies(node: Root) -> None:
    done = subprocess.run(
        ["systemd-analyze", "verify", f"--root={node.path}", "nri-gpushare.service"],
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    for key in ("ExecStart", "ExecStartPre"):
        program = unit_command(node, key)[0]
        assert os.access(node.host(program), os.X_OK), f"{key} {program} is not installed"
    doc = re.search(r"^Documentation=file:(\S+)$", node.host(UNIT).read_text(), re.M)
    assert doc and node.host(doc[1]).is_file()


def test_rerun_keeps_the_config_and_upgrades(node: Root) -> None:
    config = node.host("/etc/nri-gpushare/gpushare.yaml")
    config.write_text(config.read_text() + "# the operator's own line\n")
    ko = node.host(f"/lib/modules/{node.kernel}/updates/dkms/gpushare.ko")
    built = ko.stat().st_ino
    with phase("install again, same version"):
        again = node.ok(["sh", "scripts/install-node.sh", "--kernel", node.kernel])
    assert config.read_text().endswith("# the operator's own line\n")
    # The same sources: the module DKMS built stays, never removed to be rebuilt.
    assert "built and installed for" in again and ko.stat().st_ino == built, again
    with phase("copy a newer version of the tree"):
        copy_tree(node.host("/src-next"), NEXT_VERSION)
    with phase(f"install {NEXT_VERSION} over {VERSION}"):
        node.ok(["sh", "/src-next/scripts/install-node.sh", "--kernel", node.kernel])
    status = node.ok(["dkms", "status", "gpushare"])
    assert VERSION + "," not in status and f"gpushare/{NEXT_VERSION}, " in status, status
    assert not node.host(f"/usr/src/gpushare-{VERSION}").exists()
    assert os.readlink(node.host(f"{LIBDIR}/libgpushare.so")) == f"{NEXT_VERSION}/libgpushare.so"
    # The old version stays for containers that have it mounted.
    assert node.host(f"{LIBDIR}/{VERSION}/libgpushare.so").is_file()
    assert config.read_text().endswith("# the operator's own line\n")
    show = "import importlib.metadata as m; print(m.version('nri-gpushare'))"
    version = node.ok(["/opt/nri-gpushare/venv/bin/python", "-c", show])
    assert version.strip() == NEXT_VERSION


def test_prune_keeps_versions_a_container_has_mounted(node: Root) -> None:
    """An old interposer version goes only once no container has it mounted
    (here: a process in its own mount namespace with the file bind-mounted,
    as a container has it)."""
    old = f"{LIBDIR}/{VERSION}/libgpushare.so"
    holder = node.start(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"touch /tmp/lib && mount --bind {old} /tmp/lib && touch /tmp/held && exec sleep 600"],
        "holder.log",
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not node.host("/tmp/held").exists():
        assert time.monotonic() < deadline and holder.poll() is None, node.log_tail("holder.log")
        time.sleep(0.05)
    kept = node.ok(["sh", "scripts/install-node.sh", "--prune"])
    assert f"keeping interposer {VERSION}: a container has it mounted" in kept
    assert node.host(old).is_file()
    holder.kill()
    holder.wait()
    node.kill_processes()  # the sleep
    # A CDI spec generated before the upgrade still names it: containers
    # created from that spec would mount it.
    spec = node.host("/etc/cdi/gpushare.io-gpu.json")
    made_dir = not spec.parent.exists()
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(f'{{"mounts": [{{"hostPath": "{old}"}}]}}\n')
    kept = node.ok(["sh", "scripts/install-node.sh", "--prune"])
    assert f"keeping interposer {VERSION}: /etc/cdi/gpushare.io-gpu.json names it" in kept, kept
    assert node.host(old).is_file()
    spec.unlink()
    if made_dir:
        spec.parent.rmdir()
    pruned = node.ok(["sh", "scripts/install-node.sh", "--prune"])
    assert f"removed interposer {VERSION}" in pruned
    assert not node.host(f"{LIBDIR}/{VERSION}").exists()
    # The current version is never pruned.
    assert node.host(f"{LIBDIR}/{NEXT_VERSION}/libgpushare.so").is_file()


SIMULATED = """\
use_nvml: false
kmod_load: false     # never modprobe from this root: the kernel here is the host's
inventory:
  - {index: 0, uuid: GPU-11111111-0000-0000-0000-000000000000, name: "Simulated GPU", memory: 16Gi}
  - {index: 1, uuid: GPU-22222222-0000-0000-0000-000000000000, name: "Simulated GPU", memory: 16Gi}
"""


def test_enable_then_a_pod_gets_its_share(node: Root) -> None:
    for binary in ("containerd", "containerd-shim-runc-v2", "ctr"):
        shutil.copy2(TRIXIE_BIN / binary, node.host(f"/usr/local/bin/{binary}"))
    with phase("apt-get install runc (in the root)"):
        node.ok("DEBIAN_FRONTEND=noninteractive apt-get -y -q install --no-install-recommends runc")
    node.host("/etc/containerd").mkdir(exist_ok=True)
    default = node.ok(["containerd", "config", "default"])
    # Two changes for this machine, as the test bed makes them: no registry
    # (the sandbox image is the test bed's local one), and no CAP_SYS_RESOURCE
    # (runc cannot give the sandbox a negative oom_score_adj).
    default = re.sub(r'sandbox_image = ".*"', f'sandbox_image = "{PAUSE_IMAGE}"', default)
    default = default.replace("restrict_oom_score_adj = false", "restrict_oom_score_adj = true")
    node.host("/etc/containerd/config.toml").write_text(default)

    config = node.host("/etc/nri-gpushare/gpushare.yaml")
    text = re.sub(
        r"^(use_nvml|kmod_load|inventory):.*\n(#  - .*\n)?", "", config.read_text(), flags=re.M
    )
    config.write_text(text + SIMULATED)

    with phase("nri-gpushare enable"):
        enabled = node.run(["nri-gpushare", "enable"])
    assert enabled.returncode == 0, (
        f"nri-gpushare enable failed:\n{enabled.stdout}\n{enabled.stderr}"
    )

    socket = node.host("/run/containerd/containerd.sock")
    with phase("containerd and the daemon up, the plugin connected"):
        node.start(["containerd"], "containerd.log")
        deadline = time.monotonic() + 60
        while not socket.exists():
            assert time.monotonic() < deadline, node.log_tail("containerd.log")
            time.sleep(0.1)
        import_images(TRIXIE_BIN / "ctr", socket, build_images())
        pre = node.run(unit_command(node, "ExecStartPre"))
        assert pre.returncode == 0 and "kmod_load is false" in pre.stdout, pre
        node.start(unit_command(node, "ExecStart"), "daemon.log")
        wait_connected(node)

    with phase("a CRI pod with a share"):
        try:
            run, mounts, smi = asyncio.run(run_pod(node))
        except Exception:
            log(f"containerd:\n{node.log_tail('containerd.log')}")
            log(f"daemon:\n{node.log_tail('daemon.log')}")
            raise
    env = dict(line.split("=", 1) for line in run if "=" in line)
    assert env.get("GPUSHARE_MEMORY_LIMIT") == str(2 << 30), run
    assert env.get("NVIDIA_VISIBLE_DEVICES", "").startswith("GPU-"), run
    assert f"{LIBDIR}/{NEXT_VERSION}/libgpushare.so" in mounts, mounts
    assert smi.returncode == 0 and POD in smi.stdout, f"gpushare-smi:\n{smi.stdout}\n{smi.stderr}"
    node.kill_processes()


def wait_connected(node: Root) -> None:
    deadline = time.monotonic() + 60
    while True:
        done = node.run(["nri-gpushare", "status", "--json"])
        if done.returncode == 0 and '"connected": true' in done.stdout:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the daemon did not connect:\n{node.log_tail('daemon.log')}\n"
                        f"{node.log_tail('containerd.log')}")  # fmt: skip
        time.sleep(0.3)


async def run_pod(node: Root) -> tuple[list[str], str, subprocess.CompletedProcess[str]]:
    """A pod asking for 2Gi whose container prints its environment and stays;
    (its output, its OCI spec's mounts as text, gpushare-smi while it runs)."""
    async with CriClient(node.host("/run/containerd/containerd.sock"), "/var/log/pods") as cri:
        pod = await cri.run_pod(POD, annotations={"gpushare.io/gpu-memory": "2Gi"})
        cid = await cri.create_container(pod, "main", command=["sh", "-c", "env; exec sleep 600"])
        await cri.start(cid)
        deadline = time.monotonic() + 30
        while True:
            status = await cri.container_status(cid)
            path = node.host(status.log_path)
            lines = [line for _, line in parse_cri_log(path.read_text())] if path.exists() else []
            if any(line.startswith("PATH=") for line in lines):
                break
            assert time.monotonic() < deadline, f"no output from the container: {status}"
            await asyncio.sleep(0.1)
        info = await cri.container_info(cid)
        mounts = str(info.get("runtimeSpec", {}).get("mounts", info))
        # Still running: the share is there for gpushare-smi.
        smi = node.run(["gpushare-smi"])
        return lines, mounts, smi


def test_dkms_module_loads_in_the_guest(node: Root, tmp_path: Path) -> None:
    from tests.guest.harness import run_in_guest

    kernel = node.kernel
    ko = node.host(f"/lib/modules/{kernel}/updates/dkms/gpushare.ko")
    copy = tmp_path / "gpushare.ko"
    shutil.copy(ko, copy)
    script = (
        f"insmod {copy} && cat /proc/gpushare/version && rmmod gpushare && "
        "test ! -e /proc/gpushare && echo unloaded"
    )
    with phase("guest: insmod the DKMS-built module"):
        result = run_in_guest(script, cwd=REPO, timeout=300, echo=sys.stderr)
    assert result.status == 0, result.console[-3000:]
    assert re.search(rf"^{re.escape(NEXT_VERSION)}\r?$", result.console, re.M), result.console[
        -3000:
    ]
    assert "unloaded" in result.console


def alternative(path: Path) -> bool:
    """A link update-alternatives made (cc, c++, ...)."""
    return path.is_symlink() and os.readlink(path).startswith("/etc/alternatives/")


INSTALLED = (
    "/opt/nri-gpushare",
    "/usr/local/bin/nri-gpushare",
    "/usr/local/bin/gpushare-runc",
    "/usr/local/bin/gpushare-smi",
    UNIT,
    "/usr/local/share/doc/nri-gpushare",
    "/etc/modules-load.d/gpushare.conf",
    f"{LIBDIR}/libgpushare.so",
    f"/usr/src/gpushare-{NEXT_VERSION}",
    "/var/lib/dkms/gpushare",
)


def test_uninstall_refuses_while_registered_then_removes(node: Root) -> None:
    kernel = node.kernel
    installed = [p for p in INSTALLED if not os.path.lexists(node.host(p))]
    assert installed == [], "missing before uninstall"
    fake = node.host("/tmp/fake-kmod")
    fake.mkdir(parents=True)
    (fake / "inst_ctl").write_text(f"add {'c' * 64} 0:2147483648:100:0\n")
    before = node.files()
    refused = node.run(
        ["sh", "scripts/install-node.sh", "--uninstall", "--kmod-root", "/tmp/fake-kmod"]
    )
    log(f"uninstall under a registration said:\n{refused.stdout}{refused.stderr}")
    assert refused.returncode != 0
    assert (
        "refusing to unload gpushare" in refused.stderr and "nothing was removed" in refused.stderr
    )
    assert node.files() == before

    with phase("uninstall"):
        out = node.ok(["sh", "scripts/install-node.sh", "--uninstall"])
    log(out)
    left = [p for p in INSTALLED if os.path.lexists(node.host(p))]
    assert left == []
    assert not list(node.host(f"/lib/modules/{kernel}").rglob("gpushare.ko*"))
    assert node.host("/etc/nri-gpushare/gpushare.yaml").is_file()
    assert node.host(f"{LIBDIR}/{NEXT_VERSION}/libgpushare.so").is_file()
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
    owned = node.dpkg_files()
    leftover = sorted(
        p
        for p in node.files() - node.before - owned
        if not p.startswith(TEST_ADDED + kept + churn)
        and "__pycache__" not in p
        and not alternative(node.host(p))
    )
    assert leftover == [], f"left behind by install + uninstall: {leftover}"
    assert not [p for p in node.files() if "gpushare" in p and p.startswith("/var/lib/dkms")]
