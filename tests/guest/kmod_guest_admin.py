"""`nri-gpushare uninstall` (nri_gpushare.ops.kmod_admin.uninstall) against the real
module inside the guest: it refuses, listing the registered containers, while
any exist, and unloads the module once none does."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from nri_gpushare.kmod.procfs import ProcfsKernelModule
from nri_gpushare.ops import kmod_admin as admin
from tests.guest.kmod_support import DEV, NOBODY, ROOT, errno_of, load, loaded, ok, refcount

pytestmark = pytest.mark.usefixtures("kmod")

CIDS = ["a" * 64, "b" * 64]


def test_uninstall_refuses_while_registered_then_unloads() -> None:
    client = ProcfsKernelModule()
    ok("gpu 0 17179869184")
    ok(f"add {CIDS[0]} 0:4294967296:30")
    ok(f"add {CIDS[1]} 0:1073741824:0:1")

    code, message = admin.uninstall(client)
    assert code == admin.EXIT_REFUSED
    assert message.startswith("refusing to unload gpushare: 2 containers are still registered:")
    assert f"{CIDS[0]}  (GPU 0: 4096Mi, 30% compute)" in message
    assert f"{CIDS[1]}  (GPU 0: 1024Mi, 0% compute, high priority)" in message
    assert loaded() and refcount() == 2

    ok(f"del {CIDS[0]}")
    code, message = admin.uninstall(client)
    assert code == admin.EXIT_REFUSED and "1 container is still registered" in message
    assert CIDS[1] in message and CIDS[0] not in message

    ok(f"del {CIDS[1]}")
    assert admin.uninstall(client) == (admin.EXIT_OK, "unloaded gpushare")
    assert not loaded() and not ROOT.exists()
    code, message = admin.uninstall(client)
    assert (code, message) == (admin.EXIT_OK, "gpushare is not loaded; nothing to uninstall")
    load()  # for the fixture


def test_uninstall_names_the_holders_of_the_device() -> None:
    """Root holds /dev/gpushare open: uninstall refuses and names the process."""
    fd = os.open(DEV, os.O_RDONLY)
    try:
        code, message = admin.uninstall(ProcfsKernelModule())
    finally:
        os.close(fd)
    assert code == admin.EXIT_REFUSED
    assert "reference count 1" in message
    assert f"/dev/gpushare is held open by PID {os.getpid()} (" in message, message
    assert loaded()
    assert admin.uninstall(ProcfsKernelModule()) == (admin.EXIT_OK, "unloaded gpushare")
    load()  # for the fixture


def test_unprivileged_users_cannot_hold_the_module() -> None:
    """A user outside every registered container cannot open /dev/gpushare,
    so cannot keep the module loaded: uninstall goes through."""
    ok("gpu 0 17179869184")
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
        err = errno_of(lambda: os.open(DEV, os.O_RDONLY))  # kept open if it worked
        os.write(wfd, str(err).encode())
        time.sleep(30)
        os._exit(0)
    os.close(wfd)
    try:
        assert int(os.read(rfd, 16)) == errno.ENOENT
        assert refcount() == 0
        assert admin.uninstall(ProcfsKernelModule()) == (admin.EXIT_OK, "unloaded gpushare")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(rfd)
    load()  # for the fixture


def test_uninstall_command_line() -> None:
    """The real `nri-gpushare uninstall`: non-zero with the list, then unloads."""
    command = [sys.executable, "-m", "nri_gpushare.cli.main", "uninstall"]
    ok("gpu 0 17179869184")
    ok(f"add {CIDS[0]} 0:4294967296:30")
    refused = subprocess.run(command, capture_output=True, text=True)
    assert refused.returncode == admin.EXIT_REFUSED, refused
    assert CIDS[0] in refused.stderr and "refusing to unload" in refused.stderr
    assert loaded() and refcount() == 1

    ok(f"del {CIDS[0]}")
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done
    assert "unloaded gpushare" in done.stdout
    assert not loaded()
    load()  # for the fixture
