"""Pure helpers of the real kernel-module client and of `uninstall`.

The client itself is tested against the real module in the qemu guest
(tests/guest/kmod_guest_client.py); these need no kernel.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from nri_gpushare.kmod.cgroup import cgroup2_mounts, cgroup_v2_path, expand_systemd_slice
from nri_gpushare.kmod.procfs import ProcfsKernelModule, describe, meminfo
from nri_gpushare.kmod.readings import MemInfo, parse_meminfo
from nri_gpushare.ops import kmod_admin as admin
from nri_gpushare.share.kernel import (
    GpuDeclaration,
    GpuQuota,
    KmodError,
    ModuleNotLoaded,
    NotRegistered,
    Registration,
)
from tests.fakes import FakeKernelModule

CID = "c" * 64


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("/k8s.io/abc", "/k8s.io/abc"),
        ("k8s.io/abc", "/k8s.io/abc"),
        ("/sys/fs/cgroup/k8s.io/abc", "/k8s.io/abc"),
        ("/sys/fs/cgroup/unified/k8s.io/abc", "/k8s.io/abc"),
        ("/sys/fs/cgroup", "/"),
        (
            "kubepods-besteffort-pod12.slice:cri-containerd:abc",
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12.slice"
            "/cri-containerd-abc.scope",
        ),
        ("system.slice:docker:abc", "/system.slice/docker-abc.scope"),
        (":cri-containerd:abc", "/system.slice/cri-containerd-abc.scope"),
        ("-.slice:x:abc", "/x-abc.scope"),
    ],
)
def test_cgroup_v2_path(given: str, want: str) -> None:
    mounts = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
    assert cgroup_v2_path(given, mounts) == want


@pytest.mark.parametrize("bad", ["", "a:b", "a:b:c:d", "pod.slice-x:p:n", "a--b.slice:p:n"])
def test_cgroup_v2_path_refuses(bad: str) -> None:
    with pytest.raises(ValueError):
        cgroup_v2_path(bad)


def test_expand_systemd_slice() -> None:
    assert expand_systemd_slice("a-b-c.slice") == "/a.slice/a-b.slice/a-b-c.slice"
    assert expand_systemd_slice("-.slice") == ""
    with pytest.raises(ValueError):
        expand_systemd_slice("a/b.slice")


def test_cgroup2_mounts(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / /sys rw - sysfs sysfs rw\n"
        "30 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
        "31 22 0:27 / /mnt/my\\040cg rw shared:5 - cgroup2 none rw\n"
        "32 22 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    )
    assert cgroup2_mounts(info) == ["/sys/fs/cgroup", "/mnt/my cg"]
    assert cgroup2_mounts(tmp_path / "missing") == []


def test_describe_uses_the_request_notation() -> None:
    reg = Registration(CID, (GpuQuota(0, 3276 << 20, 10), GpuQuota(1, 1 << 30, 0, True)))
    assert describe(reg) == "GPU 0: 3276Mi, 10% compute, GPU 1: 1024Mi, 0% compute, high priority"


def registered_fake() -> FakeKernelModule:
    fake = FakeKernelModule()
    fake.declare_gpus([GpuDeclaration(0, 16 << 30)])
    fake.register(Registration(CID, (GpuQuota(0, 4 << 30, 30, True),)))
    return fake


def test_uninstall_refuses_listing_containers(tmp_path: Path) -> None:
    (tmp_path / "gpushare").mkdir()
    unloaded: list[str] = []
    code, message = admin.uninstall(registered_fake(), unload=unloaded.append, sysfs=tmp_path)
    assert code == admin.EXIT_REFUSED and not unloaded
    assert "1 container is still registered" in message
    assert CID in message and "GPU 0: 4096Mi, 30% compute, high priority" in message


def test_uninstall_unloads_when_empty(tmp_path: Path) -> None:
    (tmp_path / "gpushare").mkdir()
    unloaded: list[str] = []
    code, message = admin.uninstall(FakeKernelModule(), unload=unloaded.append, sysfs=tmp_path)
    assert (code, message, unloaded) == (admin.EXIT_OK, "unloaded gpushare", ["gpushare"])


def test_uninstall_not_loaded(tmp_path: Path) -> None:
    code, message = admin.uninstall(
        FakeKernelModule(loaded=False), unload=pytest.fail, sysfs=tmp_path
    )
    assert code == admin.EXIT_OK and "not loaded" in message


@pytest.mark.parametrize(
    ("err", "code", "words"),
    [
        (errno.EAGAIN, admin.EXIT_REFUSED, "reference count 3"),
        (errno.EPERM, admin.EXIT_FAILED, "needs root"),
        (errno.ENOENT, admin.EXIT_OK, "not loaded"),
        (errno.EIO, admin.EXIT_FAILED, "could not unload"),
    ],
)
def test_uninstall_kernel_refusals(tmp_path: Path, err: int, code: int, words: str) -> None:
    (tmp_path / "gpushare").mkdir()
    (tmp_path / "gpushare" / "refcnt").write_text("3\n")

    def unload(name: str) -> None:
        raise OSError(err, "no")

    got, message = admin.uninstall(FakeKernelModule(), unload=unload, sysfs=tmp_path)
    assert got == code and words in message


def test_parse_meminfo() -> None:
    assert parse_meminfo("Free: 100\n", 100) == MemInfo(100, {}, 100)
    info = parse_meminfo("Free: 0\nPID: 42 Mem: 600\nPID: 7 Mem: 400\n", 1000)
    assert info.free == 0 and info.processes == {42: 600, 7: 400}
    assert info.used == 1000 and info.memsize == 1000
    assert parse_meminfo("Free: 18446744073709551615\n").free == 2**64 - 1


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "\n",
        "Free: 100",  # no newline
        "Free: 100\n\n",
        "Free: -1\n",
        "Free: +1\n",
        "Free: 01\n",
        "Free:  1\n",
        "free: 1\n",
        "Free: 1 \n",
        "PID: 1 Mem: 1\n",
        "Free: 1\nPID: 0 Mem: 1\n",
        "Free: 1\nPID: 1 Mem: 0\n",
        "Free: 1\nPID: 1 Mem: 5\nPID: 1 Mem: 5\n",
        "Free: 1\nPID: 1 Mem: 5 \n",
        "Free: 1\nPID: 1  Mem: 5\n",
        "Free: 1\nPID: x Mem: 5\n",
        "Free: 1\nFree: 1\n",
        "Free: 1\r\n",
    ],
)
def test_parse_meminfo_is_strict(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_meminfo(bad)


def fake_tree(tmp_path: Path, memsize: str, meminfo: str) -> ProcfsKernelModule:
    (tmp_path / "inst_ctl").write_text("")
    d = tmp_path / "0" / CID
    d.mkdir(parents=True)
    (d / "memsize").write_text(memsize)
    (d / "meminfo").write_text(meminfo)
    (tmp_path / "0" / "orphaned_memsize").write_text("12\n")
    return ProcfsKernelModule(tmp_path)


def test_meminfo_reader(tmp_path: Path) -> None:
    kmod = fake_tree(tmp_path, "1000\n", "Free: 400\nPID: 9 Mem: 600\n")
    info = kmod.meminfo(0, CID)
    assert info == MemInfo(400, {9: 600}, 1000) and info.used == 600
    assert meminfo(0, CID, root=tmp_path) == info
    assert kmod.orphaned_memory(0) == 12
    with pytest.raises(NotRegistered):
        kmod.meminfo(1, CID)
    with pytest.raises(KmodError) as e:
        kmod.meminfo(0, "../x")
    assert e.value.errno == errno.EINVAL


def test_meminfo_reader_refuses_garbage(tmp_path: Path) -> None:
    kmod = fake_tree(tmp_path, "1000\n", "Free: 400\nPID: 9\n")
    with pytest.raises(KmodError) as e:
        kmod.meminfo(0, CID)
    assert e.value.errno == errno.EPROTO


def test_meminfo_reader_not_loaded(tmp_path: Path) -> None:
    with pytest.raises(ModuleNotLoaded):
        ProcfsKernelModule(tmp_path / "missing").meminfo(0, CID)
