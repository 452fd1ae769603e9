"""Run a command inside a real Debian kernel booted under qemu.

The kernel is Debian bookworm's 6.1 from /boot, or with $GPUSHARE_GUEST_KERNEL
another one (find_kernel): e.g. "6.12" or "7.2", from the roots that
scripts/kernel-roots.sh makes under .cache/kernels (trixie, sid), each of
which is also where modules for that kernel are built (Kernel.root).

The guest sees the host's whole file system read-only (9p) under a tmpfs
overlay, so the project, its venv and freshly built modules are all there at
their host paths; directories passed as ``rwdirs`` are shared writable, which
is how results (junit XML, logs) come back.  The guest's console streams to
``echo`` (our stdout by default) and to a serial log file, and the command's
exit status comes back through qemu's isa-debug-exit device.  A kernel panic
(``oops=panic``), a guest that ends without reporting a status, or a timeout
raises GuestError, so only a reported status can ever pass a test.

Stdlib only: ``scripts/run-in-guest.sh`` runs this file as a script.
"""

from __future__ import annotations

import argparse
import codecs
import ctypes
import hashlib
import lzma
import os
import re
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
CACHE = REPO / ".cache" / "guest"
KERNEL_ROOTS = REPO / ".cache" / "kernels"  # scripts/kernel-roots.sh
VENV_BIN = REPO / ".venv" / "bin"
INIT = HERE / "init.sh"
BUSYBOX = Path("/bin/busybox")
QEMU = "qemu-system-x86_64"
# What the initramfs needs to reach the host's files; dependencies follow from modules.dep.
BASE_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
MARK = "gpushare-guest: "
IN_GUEST_ENV = "GPUSHARE_IN_GUEST"
KERNEL_ENV = "GPUSHARE_GUEST_KERNEL"  # which kernel: see find_kernel()
KVER_ENV = "GPUSHARE_GUEST_KVER"  # the exact version of the default 6.1 in /boot
DEFAULT_KERNEL = "6.1"
DEFAULT_TIMEOUT = 300.0
KEEP_LOGS = 20
PR_SET_PDEATHSIG = 1


class GuestError(Exception):
    """The guest did not report a status for the command."""

    def __init__(self, message: str, console: str = "") -> None:
        super().__init__(message)
        self.console = console


class GuestUnavailable(GuestError):
    """A prerequisite (qemu, the kernel with its headers, busybox-static) is missing."""


class GuestTimeout(GuestError):
    """The whole run (boot included) took longer than its timeout."""


class GuestCrashed(GuestError):
    """Kernel panic/oops, failed guest setup, or qemu ended without a status."""


@dataclass(frozen=True)
class GuestResult:
    status: int  # the command's exit status
    console: str  # everything the guest printed on its serial console
    boot_s: float  # qemu start until the command started
    total_s: float  # qemu start until qemu exited
    serial_log: Path

    @property
    def kernel_warned(self) -> bool:
        """The kernel hit a WARN (taint W) during the run; its log is in console."""
        return f"{MARK}kernel warning" in self.console


@dataclass(frozen=True)
class Kernel:
    version: str  # e.g. 6.1.0-56-amd64
    image: Path  # its vmlinuz
    modules: Path  # its /lib/modules/VERSION, as the host sees it
    build: Path  # headers to build modules against, as the build sees them
    # A root of the kernel's own release (scripts/kernel-roots.sh) that
    # modules for it are built in (chroot), its toolchain being too new for
    # the host's; build is a path inside it.  None: build on the host.
    root: Path | None = None

    @property
    def modules_dep(self) -> Path:
        return self.modules / "modules.dep"

    @property
    def config(self) -> Path:
        return self.image.with_name(f"config-{self.version}")

    def host_path(self, path: Path) -> Path:
        """A path of the build's view (e.g. build) as the host sees it."""
        return self.root / path.relative_to("/") if self.root else path


def _version_key(version: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", version)]


def _kernels_in(root: Path | None) -> list[Kernel]:
    """The kernels in root's /boot (the host's when None) that have
    modules.dep and headers, newest first."""
    boot = (root or Path("/")) / "boot"
    found = []
    for image in boot.glob("vmlinuz-*"):
        version = image.name.removeprefix("vmlinuz-")
        if root is None:
            build = Path("/lib/modules", version, "build")
        else:
            build = Path("/usr/src", f"linux-headers-{version}")  # kernel-roots.sh's Debian roots
        k = Kernel(version, image, (root or Path("/")) / "lib/modules" / version, build, root)
        if (k.host_path(k.build) / "Makefile").is_file() and k.modules_dep.is_file():
            found.append(k)
    return sorted(found, key=lambda k: _version_key(k.version), reverse=True)


def _is_version(version: str, wanted: str) -> bool:
    """version is wanted or starts with it up to a separator ("6.1" is not 6.12)."""
    return version == wanted or (version.startswith(wanted) and version[len(wanted)] in ".+-")


def find_kernel(wanted: str | None = None) -> Kernel:
    """The kernel to boot, newest first among those that match.

    wanted (default $GPUSHARE_GUEST_KERNEL, else "6.1"): a version or its
    start ("6.12", "7.2", "6.12.117+deb13-amd64"), looked for in /boot and in
    the roots of scripts/kernel-roots.sh, or the name of such a root
    ("trixie", "sid").  For the default 6.1, $GPUSHARE_GUEST_KVER may name its
    exact version in /boot.  Only a kernel with modules.dep and headers counts.
    """
    wanted = wanted or os.environ.get(KERNEL_ENV) or DEFAULT_KERNEL
    exact = os.environ.get(KVER_ENV) if wanted == DEFAULT_KERNEL else None
    for k in _kernels_in(None):
        if _is_version(k.version, exact or wanted):
            return k
    for root in sorted(KERNEL_ROOTS.glob("*/root")):
        for k in _kernels_in(root):
            if root.parent.name == wanted or _is_version(k.version, wanted):
                return k
    if wanted == DEFAULT_KERNEL:
        raise GuestUnavailable(
            f"no kernel /boot/vmlinuz-{exact or '6.1.*'} with modules and headers in"
            " /lib/modules/ (run scripts/install-prereqs.sh: linux-image-amd64,"
            " linux-headers-amd64)"
        )
    raise GuestUnavailable(
        f"no kernel {wanted} with modules and headers in /boot or {KERNEL_ROOTS}/*/root"
        " (run scripts/kernel-roots.sh RELEASE: trixie has 6.12, sid 7.x)"
    )


def check_prereqs() -> Kernel:
    """The kernel to boot; raises GuestUnavailable naming what is missing."""
    missing = []
    if not shutil.which(QEMU):
        missing.append(f"{QEMU} (Debian package qemu-system-x86)")
    if not BUSYBOX.is_file():
        missing.append(f"{BUSYBOX} (Debian package busybox-static)")
    try:
        kernel = find_kernel()
    except GuestUnavailable as e:
        missing.append(str(e))
    if missing:
        raise GuestUnavailable("guest prerequisites missing: " + "; ".join(missing))
    return kernel


# --- initramfs -----------------------------------------------------------


def module_order(modules_dep: Path, names: Iterable[str]) -> list[str]:
    """Module paths (relative to /lib/modules/KVER) for names, dependencies first.

    Names that are built into the kernel (absent from modules.dep but listed in
    modules.builtin) need no file and are left out.
    """
    deps: dict[str, list[str]] = {}
    for line in modules_dep.read_text().splitlines():
        mod, _, rest = line.partition(":")
        deps[mod] = rest.split()
    by_name = {_mod_name(m): m for m in deps}
    builtin_file = modules_dep.with_name("modules.builtin")
    builtin = (
        {_mod_name(m) for m in builtin_file.read_text().split()}
        if builtin_file.is_file()
        else set()
    )
    order: list[str] = []

    def visit(mod: str) -> None:
        if mod not in order:
            for dep in deps[mod]:
                visit(dep)
            order.append(mod)

    for name in names:
        key = name.replace("-", "_")
        if key in by_name:
            visit(by_name[key])
        elif key not in builtin:
            raise GuestUnavailable(f"kernel module {name} not found in {modules_dep}")
    return order


def _mod_name(path: str) -> str:
    return Path(path).name.split(".ko")[0].replace("-", "_")


def module_bytes(path: Path) -> bytes:
    """The module at path, uncompressed: the initramfs's busybox insmod loads
    plain .ko files only (Debian compresses modules with xz since 6.x)."""
    data = path.read_bytes()
    if path.name.endswith(".ko"):
        return data
    if path.name.endswith(".ko.xz"):
        return lzma.decompress(data, lzma.FORMAT_XZ)
    if path.name.endswith(".ko.gz"):
        return zlib.decompress(data, 16 + zlib.MAX_WBITS)
    raise GuestUnavailable(f"{path}: a module compressed in a way the harness cannot undo")


class _Cpio:
    """Writes an uncompressed newc cpio archive (what the kernel unpacks as initramfs)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.ino = 0

    def add(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        self.ino += 1
        nlink = 2 if stat.S_ISDIR(mode) else 1
        fields = (self.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, *rdev, len(name) + 1, 0)
        head = b"070701" + b"".join(b"%08X" % f for f in fields) + name.encode() + b"\0"
        self.parts += [_pad4(head), _pad4(data)]

    def dir(self, name: str) -> None:
        self.add(name, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, perm: int = 0o644) -> None:
        self.add(name, stat.S_IFREG | perm, data)

    def symlink(self, name: str, target: str) -> None:
        self.add(name, stat.S_IFLNK | 0o777, target.encode())

    def bytes(self) -> bytes:
        self.add("TRAILER!!!", 0)
        return b"".join(self.parts)


def _pad4(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def initramfs(kernel: Kernel) -> Path:
    """The cached initramfs for kernel; built when the kernel or the harness changed."""
    inputs = hashlib.sha256()
    for part in (
        kernel.version.encode(),
        INIT.read_bytes(),
        Path(__file__).read_bytes(),
        str(BUSYBOX.stat().st_mtime_ns).encode(),
    ):
        inputs.update(part + b"\0")
    path = CACHE / f"initramfs-{kernel.version}-{inputs.hexdigest()[:16]}.cpio"
    if path.is_file():
        return path

    mods = module_order(kernel.modules_dep, BASE_MODULES)
    cpio = _Cpio()
    for d in (
        "bin",
        "dev",
        "etc",
        "lib",
        "lib/modules",
        "mnt",
        "mnt/lower",
        "mnt/rw",
        "newroot",
        "proc",
        "sys",
        "tmp",
    ):
        cpio.dir(d)
    cpio.add("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1))
    cpio.file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    for applet in applets:
        if applet != "busybox":
            cpio.symlink(f"bin/{applet}", "busybox")
    for mod in mods:
        cpio.file(f"lib/modules/{_mod_name(mod)}.ko", module_bytes(kernel.modules / mod))
    cpio.file("etc/modules", "".join(_mod_name(m) + "\n" for m in mods).encode())
    cpio.file("init", INIT.read_bytes(), 0o755)

    CACHE.mkdir(parents=True, exist_ok=True)
    for old in CACHE.glob(f"initramfs-{kernel.version}-*.cpio"):
        old.unlink(missing_ok=True)
    _write_atomic(path, cpio.bytes())
    return path


def boot_image(kernel: Kernel) -> Path:
    """The kernel to hand qemu: its decompressed ELF vmlinux when the kernel can boot that.

    With CONFIG_PVH, qemu starts an ELF vmlinux directly; that skips the
    firmware's real-mode path and the kernel's own decompression, which under
    TCG takes several seconds.  Falls back to the bzImage.
    """
    config = kernel.config
    if not config.is_file() or "\nCONFIG_PVH=y\n" not in config.read_text():
        return kernel.image
    st = kernel.image.stat()
    path = CACHE / f"vmlinux-{kernel.version}-{st.st_size}-{st.st_mtime_ns}"
    if path.is_file():
        return path
    bz = kernel.image.read_bytes()
    elf = _decompress_payload(bz)
    if elf is None:
        return kernel.image
    CACHE.mkdir(parents=True, exist_ok=True)
    for old in CACHE.glob(f"vmlinux-{kernel.version}-*"):
        old.unlink(missing_ok=True)
    _write_atomic(path, elf)
    return path


def _decompress_payload(bz: bytes) -> bytes | None:
    """The ELF vmlinux inside a bzImage (xz, gzip, or zstd when the zstd tool
    is there), else None.

    The setup header locates the payload (boot protocol 2.08+: its offset
    and length after the setup sectors); the kernel's build appends the
    uncompressed length, which checks the result.
    """
    setup_sects = bz[0x1F1] or 4
    start = (setup_sects + 1) * 512 + int.from_bytes(bz[0x248:0x24C], "little")
    payload = bz[start : start + int.from_bytes(bz[0x24C:0x250], "little")]
    packed, size = payload[:-4], int.from_bytes(payload[-4:], "little")
    data = b""
    try:
        if packed.startswith(b"\xfd7zXZ\x00"):
            data = lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(packed)
        elif packed.startswith(b"\x1f\x8b\x08"):
            data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(packed)
        elif packed.startswith(b"\x28\xb5\x2f\xfd") and (zstd := shutil.which("zstd")):
            done = subprocess.run([zstd, "-dcq"], input=packed, capture_output=True)
            data = done.stdout if done.returncode == 0 else b""
    except (lzma.LZMAError, zlib.error):
        return None
    return data if data.startswith(b"\x7fELF") and len(data) == size else None


def _write_atomic(path: Path, data: bytes) -> None:
    """Parallel runs may build the same file: each writes its own and renames."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path)


# --- running a command ---------------------------------------------------


def guest_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's whole environment inside the guest."""
    base = {
        "PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "USER": "root",
        "LOGNAME": "root",
        "LANG": "C.UTF-8",
        "TERM": "dumb",  # the console is a tty: no colour escapes in the logs
        "PYTHONUNBUFFERED": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # autoloading over 9p costs 10+ s
        IN_GUEST_ENV: "1",
    }
    return base | dict(env or {})


def job_script(
    cmd: Sequence[str] | str, cwd: str, env: Mapping[str, str], modules: Sequence[str]
) -> str:
    """The shell script the guest runs (from an empty environment) in its chroot."""
    q = shlex.quote
    for k in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise ValueError(f"bad environment variable name {k!r}")
    lines = ["#!/bin/sh"]
    lines += [f"export {k}={q(v)}" for k, v in env.items()]
    lines.append(f"cd {q(cwd)} || exit 125")
    for ko in modules:
        lines.append(f"insmod {q(ko)} || {{ echo {q(MARK + 'insmod failed: ' + ko)}; exit 125; }}")
    if isinstance(cmd, str):
        lines.append(f"exec /bin/sh -c {q(cmd)}")
    else:
        lines.append(f"exec {shlex.join(cmd)}")
    return "\n".join(lines) + "\n"


def run_in_guest(
    cmd: Sequence[str] | str,
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    rwdirs: Iterable[str | os.PathLike[str]] = (),
    modules: Iterable[str | os.PathLike[str]] = (),
    echo: TextIO | None = None,
    serial_log: str | os.PathLike[str] | None = None,
    memory_mb: int = 1024,
    smp: int = 1,
    kernel_args: Sequence[str] = (),
) -> GuestResult:
    """Boot the guest, run cmd as root in cwd, return its exit status and console.

    cmd: an argv list, or a string for /bin/sh -c.  env: added to guest_env().
    rwdirs: host directories shared writable at the same path (created if
    missing); everything else is the host's file system, read-only underneath
    a throwaway tmpfs layer.  modules: .ko files insmod'ed before cmd (a
    failure gives status 125).  echo: where the console streams (sys.stdout
    when None).  smp: virtual CPUs (races need 2).  kernel_args: extra words
    for the kernel command line, e.g. "slub_debug=FZP" so that a use after
    free hits poison.  Raises GuestUnavailable, GuestTimeout or GuestCrashed
    (its message names the first oops line when the kernel crashed).
    """
    kernel = check_prereqs()
    cwd = os.path.abspath(cwd)
    if not os.path.isdir(cwd):
        raise ValueError(f"cwd {cwd} is not a directory on the host")
    rw = [os.path.abspath(d) for d in rwdirs]
    for d in rw:
        if "\n" in d:
            raise ValueError(f"rwdir {d!r}: newline in path")
        os.makedirs(d, exist_ok=True)
    kos = [os.path.abspath(m) for m in modules]
    for ko in kos:
        if not os.path.isfile(ko):
            raise ValueError(f"module {ko} does not exist")
    initrd = initramfs(kernel)
    log = Path(serial_log) if serial_log else _new_log_path()
    log.parent.mkdir(parents=True, exist_ok=True)
    out = sys.stdout if echo is None else echo

    with tempfile.TemporaryDirectory(prefix="gpushare-guest-") as job:
        Path(job, "job.sh").write_text(job_script(cmd, cwd, guest_env(env), kos))
        Path(job, "mounts").write_text("".join(f"rw{i} {d}\n" for i, d in enumerate(rw)))
        argv = qemu_argv(kernel, initrd, job, rw, memory_mb, smp=smp, kernel_args=kernel_args)
        with open(log, "w", encoding="utf-8") as log_file:
            rc, console, boot_s, total_s = _run_qemu(argv, timeout, out, log_file)

    where = f"(serial log: {log})"
    if rc is None:
        raise GuestTimeout(f"guest did not finish within {timeout:g} s {where}", console)
    reported = re.findall(rf"^{MARK}exit status (\d+)$", console, re.M)
    if rc & 1 and reported and int(reported[-1]) == rc >> 1:
        return GuestResult(rc >> 1, console, boot_s or total_s, total_s, log)
    panic = re.search(r"^.*Kernel panic.*$", console, re.M)
    setup = re.search(rf"^{MARK}setup failed: .*$", console, re.M)
    if panic:
        why = f"guest kernel panicked: {panic.group(0).strip()}"
        if oops := first_oops(console):
            why += f" (first oops: {oops})"
    elif setup:
        why = f"guest {setup.group(0).removeprefix(MARK)}"
    else:
        why = f"qemu exited with {rc} and the guest reported no status"
    raise GuestCrashed(f"{why} {where}", console)


OOPS_RE = re.compile(
    r"^.*?((?:BUG: |general protection fault|Oops: |kernel BUG at |"
    r"Unable to handle kernel |WARNING: ).*)$",
    re.M,
)


def first_oops(console: str) -> str | None:
    """The first line of the first oops, BUG or WARN splat in console, if any."""
    m = OOPS_RE.search(console)
    return m.group(1).strip() if m else None


def qemu_argv(
    kernel: Kernel,
    initrd: Path,
    job: str,
    rwdirs: Sequence[str],
    memory_mb: int,
    *,
    smp: int = 1,
    kernel_args: Sequence[str] = (),
) -> list[str]:
    if any(c.isspace() for c in job):
        raise ValueError(f"job directory {job!r} has white space (set TMPDIR)")
    if smp < 1:
        raise ValueError(f"smp {smp}: at least one CPU")
    for arg in kernel_args:
        if not arg or any(c.isspace() for c in arg) or arg.startswith("gsjob="):
            raise ValueError(f"bad kernel argument {arg!r}")
    # loglevel=5 rather than quiet: WARN splats (KERN_WARNING) show up live.
    # cryptomgr.notests skips the crypto self-tests, a second of boot under TCG.
    append = " ".join(
        [
            "console=ttyS0 oops=panic panic=-1 loglevel=5 cryptomgr.notests",
            *kernel_args,
            f"gsjob={job}",
        ]
    )
    argv = [
        QEMU,
        "-machine",
        "q35",
        "-accel",
        "tcg",
        "-cpu",
        "max",
        "-smp",
        str(smp),
        "-m",
        str(memory_mb),
        "-nodefaults",
        "-no-user-config",
        "-no-reboot",
        "-display",
        "none",
        "-serial",
        "stdio",
        "-net",
        "none",
        "-device",
        "isa-debug-exit,iobase=0xf4,iosize=0x04",
        "-kernel",
        str(boot_image(kernel)),
        "-initrd",
        str(initrd),
        "-append",
        append,
        "-virtfs",
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
    ]
    for i, d in enumerate(rwdirs):
        opts = f"local,path={d.replace(',', ',,')},mount_tag=rw{i},security_model=none"
        argv += ["-virtfs", opts + ",multidevs=remap"]
    return argv


def _run_qemu(
    argv: list[str], timeout: float, echo: TextIO, log: TextIO
) -> tuple[int | None, str, float | None, float]:
    """Run qemu, teeing its output; (exit code or None on timeout, console, boot s, total s)."""
    start = time.monotonic()
    deadline = start + timeout
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    chunks: list[str] = []
    pending = ""  # a trailing "\r" that may start a "\r\n"
    tail = ""  # the boot marker may straddle reads
    boot_s: float | None = None
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if not select.select([fd], [], [], left)[0]:
                continue
            data = os.read(fd, 65536)
            text = pending + decoder.decode(data, final=not data)
            pending = "\r" if text.endswith("\r") and data else ""
            text = text.removesuffix(pending).replace("\r\n", "\n")
            chunks.append(text)
            for sink in (echo, log):
                sink.write(text)
                sink.flush()
            tail = (tail + text)[-100:]
            if boot_s is None and f"{MARK}running" in tail:
                boot_s = time.monotonic() - start
            if not data:
                break
    except BaseException:
        timed_out = True  # e.g. KeyboardInterrupt: do not leave qemu behind
        raise
    finally:
        if timed_out:
            os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
        proc.stdout.close()
    return (None if timed_out else rc), "".join(chunks), boot_s, time.monotonic() - start


def _die_with_parent() -> None:
    """In the child: SIGKILL when the runner dies, so a killed test run leaves no qemu."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _new_log_path() -> Path:
    logs = CACHE / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    old = sorted(logs.glob("serial-*.log"), key=lambda p: p.stat().st_mtime)
    for p in old[: max(0, len(old) - KEEP_LOGS)]:
        p.unlink(missing_ok=True)
    fd, name = tempfile.mkstemp(
        prefix=time.strftime("serial-%Y%m%d-%H%M%S-"), suffix=".log", dir=logs
    )
    os.close(fd)
    return Path(name)


# --- command line (scripts/run-in-guest.sh) --------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="run-in-guest.sh",
        description="Run CMD as root in a Debian kernel under qemu (host / read-only, "
        "tmpfs overlay): bookworm's 6.1, or $GPUSHARE_GUEST_KERNEL's (e.g. 6.12, 7.2: "
        "scripts/kernel-roots.sh). Exit status: CMD's, 124 on timeout, 125 if the guest "
        "failed (panic, boot failure, missing prerequisite).",
    )
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S")
    p.add_argument(
        "--rwdir",
        action="append",
        default=[],
        metavar="DIR",
        help="share DIR writable at the same path (repeatable)",
    )
    p.add_argument(
        "--load-module",
        action="append",
        default=[],
        metavar="KO",
        help="insmod KO before CMD (repeatable)",
    )
    p.add_argument(
        "--cwd",
        default=os.getcwd(),
        metavar="DIR",
        help="directory to run CMD in (default: the current one)",
    )
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--serial-log", metavar="FILE", help="where to keep the console log")
    p.add_argument("--smp", type=int, default=1, metavar="N", help="virtual CPUs (default 1)")
    p.add_argument(
        "--kernel-arg",
        action="append",
        default=[],
        metavar="WORD",
        help="add WORD to the kernel command line, e.g. slub_debug=FZP (repeatable)",
    )
    p.add_argument("cmd", nargs="+", metavar="CMD", help="argv; a single word is run by sh -c")
    args = p.parse_args(argv)
    env = dict(e.split("=", 1) for e in args.env)
    cmd: Sequence[str] | str = args.cmd[0] if len(args.cmd) == 1 else args.cmd
    try:
        r = run_in_guest(
            cmd,
            cwd=args.cwd,
            env=env,
            timeout=args.timeout,
            rwdirs=args.rwdir,
            modules=args.load_module,
            serial_log=args.serial_log,
            smp=args.smp,
            kernel_args=args.kernel_arg,
        )
    except GuestTimeout as e:
        print(f"run-in-guest: {e}", file=sys.stderr)
        return 124
    except (GuestError, ValueError) as e:
        print(f"run-in-guest: {e}", file=sys.stderr)
        return 125
    except KeyboardInterrupt:
        print("run-in-guest: interrupted", file=sys.stderr)
        return 130
    print(
        f"run-in-guest: status {r.status}, command started after {r.boot_s:.1f} s, "
        f"total {r.total_s:.1f} s (serial log: {r.serial_log})",
        file=sys.stderr,
    )
    return r.status


if __name__ == "__main__":
    sys.exit(main())
