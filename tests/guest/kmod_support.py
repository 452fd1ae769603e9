"""pytest plugin for the in-guest gpushare.ko suite (tests/guest/kmod_guest_*.py).

Runs only inside the qemu guest, as root, against the real module: the
host-side tests/guest/test_kmod.py loads it with `-p tests.guest.kmod_support`.
Every test gets a freshly loaded module and leaves it unloaded, and the
teardown fails the test if anything was left registered or pinned.
"""

from __future__ import annotations

import array
import ctypes
import errno
import json
import os
import select
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nri_gpushare.kmod import abi
from nri_gpushare.kmod.readings import parse_meminfo
from nri_gpushare.ops import kmod_admin as admin

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


def enter(cgroup: Path | None, uid: int | None) -> None:
    """Move the calling process into `cgroup` and/or switch it to `uid`."""
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text("0\n")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)


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
            enter(cgroup, uid)
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


MakeContainer = Callable[[str, str], Path]


@pytest.fixture
def container(cgroups: Callable[[str], Path]) -> Iterator[MakeContainer]:
    """Register a container (ID, and the GPU list of an `add` command) bound
    to a new cgroup named after it; those still registered are deleted
    afterwards (unless a test unloaded the module)."""
    made: list[str] = []

    def make(cid: str, spec: str) -> Path:
        ok(f"add {cid} {spec}")
        made.append(cid)
        cg = cgroups(f"gs-{cid}")
        ok(f"bind {cid} /gs-{cid}")
        return cg

    yield make
    if loaded():
        for cid in made:
            ctl(f"del {cid}")


# -- agents: processes that use /dev/gpushare on request (the memory ledger) --

MemAnswer = tuple[int, "tuple[int, int, int] | None"]  # errno, (quota, used, mine)


class Agent:
    """A process, first moved into `cgroup` and switched to `uid`, that opens
    /dev/gpushare and reserves and releases memory on request, so that a test
    can interleave several processes' ledger operations step by step, kill
    them (SIGKILL) and fork them.  Requests and answers are JSON messages on
    a SOCK_SEQPACKET pair (which also carries descriptors).  A descriptor is
    named by its number in the agent.  Every call waits for the answer."""

    TIMEOUT = 120.0

    def __init__(
        self,
        chan: socket.socket,
        pid: int,
        spare: socket.socket | None,
        parent: Agent | None = None,
    ) -> None:
        self.chan = chan
        self.pid = pid
        self.spare = spare  # the test's end of the channel a forked child gets
        self.parent = parent  # the agent that forked this one, which reaps it
        self.alive = True

    @classmethod
    def spawn(cls, cgroup: Path | None = None, uid: int | None = None) -> Agent:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        spare_ours, spare_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ours.close()
                spare_ours.close()
                enter(cgroup, uid)
                _serve(theirs, spare_theirs)
                code = 0
            except BaseException as e:  # noqa: BLE001 - report, never return into pytest
                os.write(2, f"agent {os.getpid()} failed: {e!r}\n".encode())
            finally:
                sys.stderr.flush()
                os._exit(code)
        theirs.close()
        spare_theirs.close()
        ours.settimeout(cls.TIMEOUT)
        spare_ours.settimeout(cls.TIMEOUT)
        return cls(ours, pid, spare_ours)

    def call(self, *request: object, fd: int | None = None) -> list[Any]:
        data = json.dumps(request).encode()
        if fd is None:
            self.chan.send(data)
        else:
            self.chan.sendmsg(
                [data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            )
        answer: list[Any] = json.loads(self.chan.recv(65536))
        return answer

    def open(self) -> int:
        """open(/dev/gpushare) in the agent: its descriptor, or -errno."""
        answer = self.call("open")
        return int(answer[1]) if answer[0] == 0 else -int(answer[0])

    def mem(self, fd: int, op: int, gpu: int, nbytes: int = 0) -> MemAnswer:
        err, state = self.call("mem", fd, op, gpu, nbytes)
        return err, (tuple(state) if state is not None else None)

    def reserve(self, fd: int, gpu: int, nbytes: int) -> MemAnswer:
        return self.mem(fd, abi.MEM_RESERVE, gpu, nbytes)

    def release(self, fd: int, gpu: int, nbytes: int) -> MemAnswer:
        return self.mem(fd, abi.MEM_RELEASE, gpu, nbytes)

    def info(self, fd: int, gpu: int) -> MemAnswer:
        return self.mem(fd, abi.MEM_INFO, gpu)

    def close(self, fd: int) -> int:
        return int(self.call("close", fd)[0])

    def read(self, path: str | os.PathLike[str]) -> str:
        """A file's text as the agent reads it."""
        answer = self.call("read", str(path))
        assert answer[0] == 0, os.strerror(answer[0])
        return str(answer[1])

    def send_fd(self, fd: int) -> int:
        """The agent's descriptor fd, passed (SCM_RIGHTS) to the calling process."""
        self.chan.send(json.dumps(["send", fd]).encode())
        msg, ancdata, _, _ = self.chan.recvmsg(65536, socket.CMSG_SPACE(4))
        assert json.loads(msg)[0] == 0 and ancdata, msg
        return array.array("i", ancdata[0][2])[0]

    def recv_fd(self, fd: int) -> int:
        """Pass the calling process's descriptor fd to the agent: its number there."""
        return int(self.call("recv", fd=fd)[1])

    def fork(self) -> Agent:
        """fork() in the agent: the child shares its descriptors, and serves
        on the spare channel (once per agent)."""
        assert self.spare is not None, "an agent forks once"
        pid = int(self.call("fork")[1])
        child = Agent(self.spare, pid, None, parent=self)
        self.spare = None
        return child

    def exit(self) -> None:
        """The agent exits; returns once it has (and so closed its files)."""
        self.call("exit")
        self._reap()

    def kill(self) -> None:
        """SIGKILL; returns once it is dead (and so closed its files)."""
        os.kill(self.pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        if self.parent is None:
            os.waitpid(self.pid, 0)
        elif self.parent.alive:
            assert self.parent.call("reap", self.pid)[0] == 0
        else:
            wait_exited(self.pid)  # an orphan: another process reaps it
        self.alive = False
        self.chan.close()
        if self.spare is not None:
            self.spare.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.alive:
            self.kill()


def wait_exited(pid: int) -> None:
    """Until process pid (any, not only a child) has exited: its files are
    closed then (a pidfd becomes readable at exit_notify, after exit_files)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # already reaped
    try:
        select.select([pidfd], [], [])
    finally:
        os.close(pidfd)


def _serve(chan: socket.socket, spare: socket.socket) -> None:
    """An agent's loop (see Agent); returns on "exit"."""
    while True:
        msg, ancdata, _, _ = chan.recvmsg(65536, socket.CMSG_SPACE(4))
        if not msg:
            return  # the test is gone
        request = json.loads(msg)
        op, args = request[0], request[1:]
        reply: list[object] = [0]
        try:
            if op == "open":
                reply = [0, os.open(DEV, os.O_RDWR | os.O_CLOEXEC)]
            elif op == "mem":
                state = abi.mem(*args)
                reply = [0, [state.quota, state.used, state.mine]]
            elif op == "close":
                os.close(args[0])
            elif op == "read":
                reply = [0, Path(args[0]).read_text()]
            elif op == "send":
                fds = array.array("i", [args[0]])
                chan.sendmsg([b"[0]"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                continue
            elif op == "recv":
                reply = [0, array.array("i", ancdata[0][2])[0]]
            elif op == "fork":
                pid = os.fork()
                if pid == 0:
                    chan.close()
                    chan, spare = spare, chan
                    continue
                reply = [0, pid]
            elif op == "reap":
                reply = [0, os.waitstatus_to_exitcode(os.waitpid(args[0], 0)[1])]
            elif op == "exit":
                chan.send(b"[0]")
                return
            else:
                reply = [errno.ENOSYS]
        except abi.MemError as e:
            state_list = None if e.state is None else [e.state.quota, e.state.used, e.state.mine]
            reply = [e.errno, state_list]
        except OSError as e:
            reply = [e.errno or -1, None]
        chan.send(json.dumps(reply).encode())


def meminfo(gpu: int, cid: str) -> tuple[int, dict[int, int]]:
    """/proc/gpushare/<gpu>/<cid>/meminfo: free bytes and {pid: bytes}."""
    info = parse_meminfo(read(ROOT / str(gpu) / cid / "meminfo"))
    return info.free, info.processes
