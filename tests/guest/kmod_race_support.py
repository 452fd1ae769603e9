"""Helpers of the in-guest race and stress tests (kmod_guest_race_*.py).

How long each stress runs: its CI default, or $GPUSHARE_RACE_S (the bind and
forced-unload races) / $GPUSHARE_STRESS_S (the general stress) for long local
runs.  The races need two CPUs (test_kmod.py boots the guest with -smp 2).
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.guest.kmod_support import KO, loaded

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
