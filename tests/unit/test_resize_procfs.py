"""The real client's live quota change (kmod/live_quota.py) on a tree laid
out as /proc/gpushare is, with the module's errno answers injected at
write(): only changed files are written, memsize first, and a refusal of a
later file writes the earlier ones back."""

from __future__ import annotations

import errno
import os

import pytest

from nri_gpushare.kmod.procfs import ProcfsKernelModule
from nri_gpushare.share.kernel import GpuQuota, MemoryHeld, NotRegistered, OverCommitted


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "inst_ctl").write_text("")
    d = tmp_path / "0" / "c1"
    d.mkdir(parents=True)
    for name, value in (("memsize", 1 << 30), ("weight", 30), ("highprio", 0), ("memused", 0)):
        (d / name).write_text(f"{value}\n")
    return tmp_path


def values(tree):
    d = tree / "0" / "c1"
    return tuple(int((d / n).read_text()) for n in ("memsize", "weight", "highprio"))


def refuse(monkeypatch, name: str, err: int) -> list[str]:
    """write() to `name` fails with `err`; returns the files written, in order."""
    real_write, paths, written = os.write, {}, []
    real_open = os.open

    def fake_open(path, flags, *args):
        fd = real_open(path, flags, *args)
        paths[fd] = os.fspath(path)
        return fd

    def fake_write(fd, data):
        path = paths.get(fd, "")
        if path.endswith("/" + name):
            raise OSError(err, os.strerror(err))
        if path:
            written.append(f"{os.path.basename(path)}={data.decode().strip()}")
            os.ftruncate(fd, 0)
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "write", fake_write)
    return written


def test_only_the_files_that_change_are_written_memsize_first(tree, monkeypatch):
    written = refuse(monkeypatch, "none", 0)
    ProcfsKernelModule(tree).update_quota("c1", GpuQuota(0, 2 << 30, 30, True))
    assert written == [f"memsize={2 << 30}", "highprio=1"]
    assert values(tree) == (2 << 30, 30, 1)


def test_a_shrink_below_what_is_held_names_the_amount(tree, monkeypatch):
    (tree / "0" / "c1" / "memused").write_text(f"{3 << 29}\n")
    refuse(monkeypatch, "memsize", errno.EBUSY)
    with pytest.raises(MemoryHeld) as info:
        ProcfsKernelModule(tree).update_quota("c1", GpuQuota(0, 1 << 29, 30, False))
    assert (info.value.gpu_index, info.value.held_bytes) == (0, 3 << 29)
    assert "its processes hold 1536Mi on GPU 0" in str(info.value)
    assert values(tree) == (1 << 30, 30, 0)


def test_a_later_refusal_writes_the_earlier_files_back(tree, monkeypatch):
    written = refuse(monkeypatch, "weight", errno.ENOSPC)
    with pytest.raises(OverCommitted, match="GPU 0 has no room for weight 90"):
        ProcfsKernelModule(tree).update_quota("c1", GpuQuota(0, 2 << 30, 90, False))
    assert written == [f"memsize={2 << 30}", f"memsize={1 << 30}"]
    assert values(tree) == (1 << 30, 30, 0)


def test_an_unknown_container_or_an_absent_module(tree):
    with pytest.raises(NotRegistered):
        ProcfsKernelModule(tree).update_quota("c2", GpuQuota(0, 1 << 30, 0, False))
    (tree / "inst_ctl").unlink()
    with pytest.raises(Exception, match="not loaded"):
        ProcfsKernelModule(tree).update_quota("c2", GpuQuota(0, 1 << 30, 0, False))


async def test_the_daemon_changes_quotas_on_the_module_worker_like_its_other_requests():
    from nri_gpushare.config import Config
    from nri_gpushare.daemon.main import kmod_worker
    from nri_gpushare.host.kmod_worker import OffLoopKernelModule
    from nri_gpushare.share.kernel import GpuDeclaration, Registration
    from tests.fakes import FakeKernelModule

    assert isinstance(kmod_worker(Config()), OffLoopKernelModule)
    fake = FakeKernelModule()
    kmod = OffLoopKernelModule(fake)
    try:
        await kmod.declare_gpus([GpuDeclaration(0, 8 << 30)])
        await kmod.register(Registration("c1", (GpuQuota(0, 1 << 30, 10),)))
        await kmod.update_quota("c1", GpuQuota(0, 2 << 30, 20, True))
        assert fake.regs["c1"].quotas == (GpuQuota(0, 2 << 30, 20, True),)
        fake.held["c1", 0] = 3 << 29
        with pytest.raises(MemoryHeld):
            await kmod.update_quota("c1", GpuQuota(0, 1 << 30, 20, True))
    finally:
        kmod.close()
