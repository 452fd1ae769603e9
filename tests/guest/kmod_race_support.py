"""Helpers of the in-guest race and stress tests (kmod_guest_race_*.py).

How long each stress runs: its CI default, or $GPUSHARE_RACE_S (the bind and
forced-unload races) / $GPUSHARE_STRESS_S (the general stress) for long local
runs.  The races need two CPUs (test_kmod.py boots the guest with -smp 2).

Workers (with label, add_bound, del_counted, add_counted, gputimes and
granted_now) and Tally (with open_dev): the test's and the workers' sides
of the races of a fixed number of operations (the ledger, scheduler and
drain races), whose workers call /dev/gpushare at random while the test
changes everything under them.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from nri_gpushare.kmod import abi
from tests.guest.kmod_support import DEV, KO, ROOT, ctl, enter, loaded, ok

FINIT_MODULE = {"x86_64": 313, "aarch64": 273}
O_TRUNC_FORCE = os.O_NONBLOCK | os.O_TRUNC  # rmmod -f: delete_module(2) with O_TRUNC


def seconds(env: str, default: float) -> float:
    """$env as a number of seconds, else default."""
    return float(os.environ.get(env) or default)


def mark(message: str) -> None:
    """A line in the kernel log (and on the guest's console, with the kernel's
    timestamp): when a race started, to measure how long an oops took."""
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<4>gpushare-test: {message}\n")


def need_two_cpus() -> None:
    cpus = os.cpu_count() or 1
    assert cpus >= 2, f"races need two CPUs, the guest has {cpus} (qemu -smp 2)"


def finit_module(ko: str | os.PathLike[str], params: str = "") -> int:
    """finit_module(2) like insmod ko params; 0 or the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(ko, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.syscall(FINIT_MODULE[os.uname().machine], fd, params.encode(), 0) != 0:
            return ctypes.get_errno()
    finally:
        os.close(fd)
    return 0


def delete_module(name: str, flags: int = os.O_NONBLOCK) -> int:
    """delete_module(2) like rmmod (flags O_TRUNC_FORCE: rmmod -f); 0 or the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.delete_module(name.encode(), flags) != 0:
        return ctypes.get_errno()
    return 0


def reload_forced() -> bool:
    """rmmod -f gpushare, then insmod it again; True when the unload happened."""
    gone = delete_module("gpushare", O_TRUNC_FORCE) == 0
    for _ in range(200):  # an unload still finishing answers EEXIST/EBUSY for a moment
        err = finit_module(KO)
        if err == 0 or (err == errno.EEXIST and loaded()):
            return gone
        time.sleep(0.005)
    raise AssertionError(f"insmod {KO} kept failing: {os.strerror(err)}")


def fork(fn: Callable[[], int]) -> int:
    """Run fn() in a child process whose exit status is fn's result (1 on an exception)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = fn()
        except BaseException as e:  # noqa: BLE001 - report, never return into pytest
            os.write(2, f"child {os.getpid()} failed: {e!r}\n".encode())
        finally:
            sys.stderr.flush()
            os._exit(code)
    return pid


def wait_all(pids: Iterable[int]) -> list[int]:
    return [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]


def poll(pid: int) -> int | None:
    """The child's exit code once it has exited (it is reaped then), else None."""
    done, status = os.waitpid(pid, os.WNOHANG)
    return os.waitstatus_to_exitcode(status) if done else None


def names(counts: collections.Counter[int]) -> dict[str, int]:
    """errno counts by name, for messages: {"OK": 12, "ESRCH": 40}."""
    return {(errno.errorcode.get(e, str(e)) if e else "OK"): n for e, n in counts.items()}


def walk(root: Path) -> int:
    """Read every file under root, ignoring what vanishes meanwhile; files read."""
    n = 0
    for top, _dirs, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(top, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.read(fd, 65536)
                n += 1
            except OSError:
                pass
            finally:
                os.close(fd)
    return n


def label(err: int) -> str:
    """An answer's name in the tallies: "OK" or the errno's, as in "del ENOENT"."""
    return errno.errorcode.get(err, "OK") if err else "OK"


def add_bound(cid: str, spec: str) -> None:
    """Add container cid (spec: its GPUs) and bind it to the cgroup /gs-cid."""
    ok(f"add {cid} {spec}")
    ok(f"bind {cid} /gs-{cid}")


def del_counted(cid: str, ops: collections.Counter[str]) -> int:
    """del cid while its workers run (ENOENT: deleted already), counted in ops."""
    err = ctl(f"del {cid}")
    assert err in (0, errno.ENOENT)
    ops[f"del {label(err)}"] += 1
    return err


def add_counted(cid: str, spec: str, ops: collections.Counter[str]) -> int:
    """add cid (bound to /gs-cid when added; EEXIST: there already, ENOSPC: no
    room) while the workers run, counted in ops."""
    err = ctl(f"add {cid} {spec}")
    assert err in (0, errno.EEXIST, errno.ENOSPC)
    if err == 0:
        ok(f"bind {cid} /gs-{cid}")
    ops[f"add {label(err)}"] += 1
    return err


def gputimes(gpu: int, ids: Iterable[str]) -> list[int]:
    """The gputime of each container of ids on gpu that is there now (one
    deleted meanwhile answers ENOENT or EIO)."""
    times = []
    for cid in ids:
        try:
            times.append(int((ROOT / f"{gpu}/{cid}/gputime").read_text()))
        except OSError as e:
            assert e.errno in (errno.ENOENT, errno.EIO), e
    return times


def granted_now(cg: Path, gpu: int, *, extend: bool = False) -> int:
    """In a process of cg: a blocking ACQUIRE (given 5 s), an EXTEND when
    extend, then a RELEASE; 0 or the first errno."""

    def run() -> int:
        enter(cg, None)
        signal.signal(signal.SIGALRM, lambda *_: None)
        fd = os.open(DEV, os.O_RDWR | os.O_CLOEXEC)
        signal.setitimer(signal.ITIMER_REAL, 5.0)
        try:
            abi.sched(fd, abi.SCHED_ACQUIRE, gpu)
            signal.setitimer(signal.ITIMER_REAL, 0)
            if extend:
                abi.sched(fd, abi.SCHED_EXTEND, gpu)
            abi.sched(fd, abi.SCHED_RELEASE, gpu, 1)
        except OSError as e:
            return e.errno or 1
        return 0

    return wait_all([fork(run)])[0]


class Tally:
    """A worker's side of Workers: its counts of answers by name, for the
    test, and of the wrong ones, each told on stderr."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.counts: collections.Counter[str] = collections.Counter()
        self.bad = 0

    def wrong(self, message: str) -> None:
        self.bad += 1
        os.write(2, f"{self.who}: {message}\n".encode())

    def send(self, stats_fd: int) -> int:
        """The counts to the test (one JSON line on stats_fd); the worker's
        exit status: how many answers were wrong (at most 99)."""
        os.write(stats_fd, (json.dumps(self.counts) + "\n").encode())
        return min(self.bad, 99)


def open_dev(tally: Tally, nap: float = 0.0) -> int | None:
    """/dev/gpushare opened by a worker; None, counted as "open ENOENT",
    while its container is deleted (after a nap of nap seconds)."""
    try:
        return os.open(DEV, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        tally.counts["open ENOENT"] += 1  # its container is deleted just now
        if nap:
            time.sleep(nap)
        return None


Worker = Callable[[int, int, int], int]
"""worker(seed, stop_fd, stats_fd): calls until stop_fd reads EOF, then its
tallies (a JSON object) as one line to stats_fd; returns its exit status."""


class Workers:
    """Worker processes, each in its container's cgroup (as root or another
    uid), running worker until the test stops them all; the test stops,
    continues and kills them meanwhile (a killed one is replaced by a new
    one in the same container, as the same uid, with the next seed)."""

    def __init__(self, worker: Worker, cgs: dict[str, Path], seed: int) -> None:
        self.worker = worker
        self.cgs = cgs
        self.stop_r, self.stop_w = os.pipe()
        self.stats_r, self.stats_w = os.pipe()
        self.live: dict[int, tuple[str, int | None]] = {}
        self.stopped: set[int] = set()
        self.seeds = iter(range(seed * 1000, seed * 1000 + 1000))

    def spawn(self, cid: str, uid: int | None) -> int:
        """A worker in cid's cgroup as uid (None: root), with the next seed."""
        seed = next(self.seeds)

        def run() -> int:
            os.close(self.stop_w)  # the test's alone, so that its close means stop
            os.close(self.stats_r)
            enter(self.cgs[cid], uid)
            return self.worker(seed, self.stop_r, self.stats_w)

        pid = fork(run)
        self.live[pid] = (cid, uid)
        return pid

    def check(self) -> None:
        """No worker has exited (one that failed early)."""
        for pid in list(self.live):
            code = poll(pid)
            assert code is None, f"worker {pid} exited with {code} (see its stderr)"

    def kill(self, rng: random.Random) -> None:
        """SIGKILL a worker, chosen by rng, and start another in its place."""
        pid = rng.choice(sorted(self.live))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        self.stopped.discard(pid)
        cid, uid = self.live.pop(pid)
        self.spawn(cid, uid)

    def stop_or_continue(self, rng: random.Random) -> str:
        """SIGSTOP a worker, chosen by rng, or SIGCONT it if stopped; which."""
        pid = rng.choice(sorted(self.live))
        if pid in self.stopped:
            os.kill(pid, signal.SIGCONT)
            self.stopped.discard(pid)
            return "SIGCONT"
        os.kill(pid, signal.SIGSTOP)
        self.stopped.add(pid)
        return "SIGSTOP"

    def finish(self) -> tuple[list[int], collections.Counter[str]]:
        """Continue the stopped, stop all and wait for them: their exit
        statuses and their tallies, summed."""
        for pid in self.stopped:
            os.kill(pid, signal.SIGCONT)
        os.close(self.stop_w)
        codes = wait_all(self.live)
        os.close(self.stop_r)
        os.close(self.stats_w)
        seen: collections.Counter[str] = collections.Counter()
        with os.fdopen(self.stats_r) as f:
            for line in f:
                seen.update(json.loads(line))
        return codes, seen
