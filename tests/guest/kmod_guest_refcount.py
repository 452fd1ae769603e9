"""Acceptance case 8 (docs/acceptance-cases.md): the module cannot be unloaded while a container
is registered; the refcount in /proc/modules follows the registrations
exactly.  Runs inside the guest."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from tests.guest.kmod_support import (
    DEV,
    ROOT,
    ctl,
    load,
    loaded,
    ok,
    refcount,
    unload,
    value,
)

pytestmark = pytest.mark.usefixtures("kmod")


def test_rmmod_fails_while_registered_and_succeeds_after() -> None:
    ok("gpu 0 1000")
    ok("gpu 1 1000")
    ok("add a 0:100,1:100")  # one reference per container, not per GPU
    assert refcount() == 1
    assert value("/sys/module/gpushare/refcnt") == 1
    assert unload() == errno.EAGAIN
    rmmod = subprocess.run(["rmmod", "gpushare"], capture_output=True, text=True)
    assert rmmod.returncode != 0 and loaded()
    assert ROOT.is_dir() and refcount() == 1

    ok("del a")
    assert refcount() == 0
    assert unload() == 0
    assert not loaded() and not ROOT.exists() and not DEV.exists()
    load()  # for the fixture, which unloads again


def test_refcount_follows_registrations() -> None:
    ok("gpu 0 10000")
    ids = [f"c{i}" for i in range(10)]
    for n, cid in enumerate(ids, 1):
        ok(f"add {cid} 0:10:1")
        assert refcount() == n
        assert ctl(f"add {cid} 0:10") == errno.EEXIST  # refused adds take nothing
        assert ctl(f"add x{n} 0:20000") == errno.ENOSPC
        assert ctl(f"add x{n} 5:10") == errno.ENXIO
        assert refcount() == n
    for n, cid in enumerate(reversed(ids), 1):
        ok(f"del {cid}")
        assert ctl(f"del {cid}") == errno.ENOENT
        assert refcount() == len(ids) - n
    assert unload() == 0
    load()


def test_open_device_pins_the_module() -> None:
    fd = os.open(DEV, os.O_RDONLY)
    try:
        assert refcount() == 1
        assert unload() == errno.EAGAIN
    finally:
        os.close(fd)
    assert refcount() == 0
