"""pytest plugin for the in-guest gpushare.ko suite (tests/guest/kmod_guest_*.py).

Runs only inside the qemu guest, as root, against the real module: the
host-side tests/guest/test_kmod.py loads it with `-p tests.guest.kmod_support`.
Every test gets a freshly loaded module and leaves it unloaded, and the
teardown fails the test if anything was left registered or pinned.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nri_gpushare.kmod import admin

REPO = Path(__file__).resolve().parents[2]
KO = Path(os.environ.get("GPUSHARE_KO", REPO / "kmod" / "gpushare.ko"))
ROOT = Path("/proc/gpushare")
CTL = ROOT / "inst_ctl"
DEV = Path("/dev/gpushare")
CGROUP2 = Path("/sys/fs/cgroup")
NOBODY = 65534


def errno_of(fn: Callable[[], object]) -> int:
    """0 when fn() succeeds, else the errno of the OSError it raised."""
    try:
        fn()
    except OSError as e:
        return e.errno or -1
    return 0


def write(path: str | os.PathLike[str], text: str | bytes) -> int:
    """Write text in one write(2); 0 or the errno."""
    data = text.encode() if isinstance(text, str) else text

    def go() -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    return errno_of(go)


def ctl(command: str) -> int:
    """One inst_ctl command; 0 or the errno."""
    return write(CTL, command + "\n")


def ok(command: str) -> None:
    err = ctl(command)
    assert err == 0, f"{command!r}: {os.strerror(err)}"


def read(path: str | os.PathLike[str]) -> str:
    return Path(path).read_text()


def value(path: str | os.PathLike[str]) -> int:
    return int(read(path))


def refcount() -> int:
    """The module's reference count as /proc/modules shows it."""
    for line in read("/proc/modules").splitlines():
        fields = line.split()
        if fields[0] == "gpushare":
            return int(fields[2])
    raise AssertionError("gpushare is not in /proc/modules")


def loaded() -> bool:
    return any(line.split()[0] == "gpushare" for line in read("/proc/modules").splitlines())


def registered() -> list[str]:
    return [line.split()[1] for line in read(CTL).splitlines() if line.startswith("add ")]


def load() -> None:
    """finit_module(2) like insmod, without starting a process (slow under TCG)."""
    number = {"x86_64": 313, "aarch64": 273}[os.uname().machine]
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(KO, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.syscall(number, fd, b"", 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"finit_module {KO}: {os.strerror(err)}")
    finally:
        os.close(fd)


def unload() -> int:
    """delete_module(2) like rmmod; 0 or the errno."""
    return errno_of(lambda: admin.delete_module("gpushare"))


def snapshot() -> dict[str, bytes]:
    """Every readable file under /proc/gpushare, for 'nothing changed' checks."""
    out = {}
    dirs = [str(ROOT)]
    while dirs:
        for entry in os.scandir(dirs.pop()):
            if entry.is_dir():
                dirs.append(entry.path)
                continue
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                out[entry.path] = os.read(fd, 65536)
            finally:
                os.close(fd)
    return out


def in_child(
    fn: Callable[[], object], *, uid: int | None = None, cgroup: Path | None = None
) -> object:
    """fn() in a forked child, first moved into `cgroup` and/or switched to
    `uid`; returns what fn returned (JSON-serialisable)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(rfd)
            if cgroup is not None:
                (cgroup / "cgroup.procs").write_text("0\n")
            if uid is not None:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            os.write(wfd, json.dumps(fn()).encode())
            code = 0
        except BaseException as e:  # noqa: BLE001 - report, never return into pytest
            os.write(2, f"child failed: {e!r}\n".encode())
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        data = r.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child failed (see stderr)"
    return json.loads(data)


@pytest.fixture
def kmod() -> Iterator[None]:
    """A freshly loaded gpushare.ko; unloaded afterwards, which must succeed."""
    if os.environ.get("GPUSHARE_IN_GUEST") != "1":
        pytest.fail("kmod_guest_* tests run only inside the qemu guest (see test_kmod.py)")
    assert not loaded(), "gpushare.ko is already loaded"
    load()
    try:
        yield
    finally:
        leftovers = registered() if loaded() else []
        for cid in leftovers:
            ctl(f"del {cid}")
        err = unload() if loaded() else 0
        assert not loaded(), f"rmmod gpushare failed: {os.strerror(err)}"
    assert not leftovers, f"test left containers registered: {leftovers}"


@pytest.fixture
def cgroups() -> Iterator[Callable[[str], Path]]:
    """mkdir cgroups under the cgroup2 root; removed (deepest first) afterwards."""
    made: list[Path] = []

    def make(rel: str) -> Path:
        path = CGROUP2 / rel.strip("/")
        path.mkdir()
        made.append(path)
        return path

    yield make
    for path in reversed(made):
        try:
            path.rmdir()
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
