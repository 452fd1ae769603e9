"""nri_gpushare.kmod.procfs.ProcfsKernelModule against the real gpushare.ko,
inside the guest: what it sends, what it reads back, and how each refusal
reaches the caller."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
from nri_gpushare.kmod.procfs import ProcfsKernelModule
from nri_gpushare.kmod.readings import GpuState
from nri_gpushare.share.kernel import (
    AlreadyRegistered,
    GpuDeclaration,
    GpuQuota,
    KernelModuleClient,
    KmodError,
    ModuleNotLoaded,
    NotRegistered,
    OverCommitted,
    Registration,
)
from tests.guest.kmod_support import CGROUP2, NOBODY, ROOT, in_child, load, read, unload

pytestmark = pytest.mark.usefixtures("kmod")

GiB = 1 << 30
MiB = 1 << 20
CID = "f" * 64
MakeCgroup = Callable[[str], Path]


def client() -> ProcfsKernelModule:
    c = ProcfsKernelModule()
    c.declare_gpus([GpuDeclaration(i, 32 * GiB) for i in range(4)])
    return c


def reg(cid: str, *quotas: tuple[int, int, int], high: bool = False) -> Registration:
    return Registration(cid, tuple(GpuQuota(g, m, c, high) for g, m, c in quotas))


def test_is_a_kernel_module_client() -> None:
    c: KernelModuleClient = ProcfsKernelModule()
    assert c.loaded()
    assert not ProcfsKernelModule("/proc/no-such-module").loaded()


def test_declare_register_read_back_unregister() -> None:
    c = client()
    c.declare_gpus([GpuDeclaration(0, 32 * GiB)])  # idempotent
    assert c.gpus() == [GpuDeclaration(i, 32 * GiB) for i in range(4)]
    r1 = reg(CID, (0, 3276 * MiB, 10), (1, 3276 * MiB, 10), (2, 3276 * MiB, 10))
    r2 = reg("second", (3, 8 * GiB, 50), high=True)
    c.register(r1)
    c.register(r2)
    assert c.registrations() == [r1, r2]
    assert c.gpu_state(0) == GpuState(0, 32 * GiB, 32 * GiB - 3276 * MiB, 90, 1, 16, 2, 80)
    assert read(ROOT / f"1/{CID}/memsize") == f"{3276 * MiB}\n"
    c.unregister(CID)
    assert c.registrations() == [r2]
    c.unregister("second")
    assert c.registrations() == []


def test_refusals_map_to_the_interface_errors() -> None:
    c = client()
    c.register(reg("a", (0, 16 * GiB, 25)))
    with pytest.raises(AlreadyRegistered) as e:
        c.register(reg("a", (1, GiB, 0)))
    assert e.value.errno == errno.EEXIST and "already registered" in str(e.value)
    with pytest.raises(NotRegistered) as e2:
        c.unregister("nobody")
    assert e2.value.errno == errno.ENOENT and "nobody" in str(e2.value)
    with pytest.raises(NotRegistered):
        c.bind_cgroup("nobody", "/")
    c.unregister("a")


def test_case4_refused_multi_gpu_registration_reserves_nothing() -> None:
    """Acceptance case 4 (docs/acceptance-cases.md): 20480+20480+40960 MiB on
    32 GB cards is refused whole."""
    c = client()
    with pytest.raises(OverCommitted) as e:
        c.register(reg("big", (0, 20480 * MiB, 0), (1, 20480 * MiB, 0), (2, 40960 * MiB, 0)))
    assert e.value.errno == errno.ENOSPC
    msg = str(e.value)
    assert "big" in msg and "GPU 2 has 32768Mi and 100% compute free" in msg
    assert "GPU 0 has" not in msg  # only the GPU that does not fit is named
    assert c.registrations() == []
    assert [c.gpu_state(i).free_memory for i in range(3)] == [32 * GiB] * 3


def test_case5_and_case7_full_gpus_refuse_more() -> None:
    c = client()
    for i, core in enumerate((25, 25, 50)):
        c.register(
            reg(f"fill{i}", *((g, 10 * GiB + (2 * GiB if i == 2 else 0), core) for g in range(3)))
        )
    with pytest.raises(OverCommitted) as e:  # case 7: 25+25+50 = 100%, 10% more
        c.register(reg("more", (0, MiB, 10)))
    assert "0% compute free" in str(e.value)
    with pytest.raises(OverCommitted) as e:  # case 5: memory full, 1024 MiB on each card
        c.register(reg("more", *((g, 1024 * MiB, 0) for g in range(3))))
    assert "GPU 0 has 0Mi and 0% compute free, 3/16 containers" in str(e.value)
    for i in range(3):
        c.unregister(f"fill{i}")


def test_case6_and_other_invalid_requests_explained() -> None:
    c = client()
    cases = [
        (reg("w", (0, GiB, 110)), "compute 110% on GPU 0 is outside 0..100"),
        (reg("bad/id", (0, GiB, 10)), "container ID must be"),
        (reg("twice", (0, GiB, 10), (0, GiB, 10)), "names a GPU twice"),
        (reg("none"), "names no GPU"),
        (reg("default", (0, 0, 10)), "default_memsize is 0"),
        (reg("far", (16, GiB, 10)), "outside 0..15"),
    ]
    for r, words in cases:
        with pytest.raises(KmodError) as e:
            c.register(r)
        assert e.value.errno == errno.EINVAL and words in str(e.value), str(e.value)
    with pytest.raises(KmodError) as e:
        c.register(reg("x", (0, GiB, 10), (7, GiB, 10)))
    assert e.value.errno == errno.ENXIO
    assert "GPU 7 not declared (declared: 0, 1, 2, 3)" in str(e.value)
    c.register(reg("y", (0, 2 * GiB, 0)))
    with pytest.raises(OverCommitted) as e:
        c.declare_gpus([GpuDeclaration(0, GiB)])
    assert "its containers already hold more memory" in str(e.value)
    c.unregister("y")
    assert c.registrations() == []


def test_bind_cgroup_paths(cgroups: MakeCgroup) -> None:
    c = client()
    c.register(reg("a", (0, GiB, 10)))
    c.register(reg("b", (1, GiB, 10)))
    ca = cgroups("k8s.io")
    cgroups("k8s.io/a")
    cgroups("kubepods.slice")
    cgroups("kubepods.slice/kubepods-pod1.slice")
    cb = cgroups("kubepods.slice/kubepods-pod1.slice/cri-containerd-b.scope")
    c.bind_cgroup("a", "/k8s.io/a")  # cgroupfs driver
    c.bind_cgroup("b", "kubepods-pod1.slice:cri-containerd:b")  # systemd driver
    assert c.bindings() == {"a": os.stat(ca / "a").st_ino, "b": os.stat(cb).st_ino}
    c.bind_cgroup("a", str(CGROUP2 / "k8s.io"))  # absolute, under the cgroup2 mount
    assert c.bindings()["a"] == os.stat(ca).st_ino
    with pytest.raises(KmodError) as e:
        c.bind_cgroup("a", "/k8s.io/not-yet")
    assert e.value.errno == errno.ESRCH and "does not exist (yet)" in str(e.value)
    with pytest.raises(KmodError) as e:
        c.bind_cgroup("b", "/k8s.io")
    assert e.value.errno == errno.EBUSY and "already bound" in str(e.value)
    with pytest.raises(KmodError) as e:
        c.bind_cgroup("b", "a:b")
    assert e.value.errno == errno.EINVAL
    with pytest.raises(KmodError) as e:
        c.bind_cgroup("b", "/")  # the cgroup2 root: every process is below it
    assert e.value.errno == errno.EINVAL
    c.unbind_cgroup("a")
    assert c.bindings() == {"b": os.stat(cb).st_ino}
    q = in_child(lambda: abi.query().container_id, cgroup=cb)  # type: ignore[union-attr]
    assert q == "b"
    c.unregister("a")
    c.unregister("b")


def test_not_root() -> None:
    def attempt() -> list[object]:
        c = ProcfsKernelModule()
        try:
            c.register(reg("a", (0, GiB, 0)))
        except KmodError as e:
            return [type(e).__name__, e.errno, str(e)]
        return ["registered"]

    def listing() -> int:
        try:
            ProcfsKernelModule().registrations()
        except KmodError as e:
            return e.errno
        return 0

    c = client()
    name, err, msg = in_child(attempt, uid=NOBODY)  # type: ignore[misc]
    assert (name, err) == ("KmodError", errno.EACCES)
    assert "needs root" in msg
    assert in_child(listing, uid=NOBODY) == errno.EACCES  # inst_ctl is root's only
    assert c.registrations() == []


def test_module_not_loaded() -> None:
    assert unload() == 0
    try:
        c = ProcfsKernelModule()
        assert not c.loaded()
        calls = [
            lambda: c.declare_gpus([GpuDeclaration(0, GiB)]),
            lambda: c.register(reg("a", (0, GiB, 0))),
            lambda: c.bind_cgroup("a", "/"),
            lambda: c.unregister("a"),
            c.registrations,
            lambda: c.gpu_state(0),
        ]
        for call in calls:
            with pytest.raises(ModuleNotLoaded) as e:
                call()
            assert "gpushare.ko is not loaded" in str(e.value)
    finally:
        load()
