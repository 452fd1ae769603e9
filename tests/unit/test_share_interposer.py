"""The CUDA interposer in the injection plan: who gets it, how it is loaded,
what happens when the node lacks it, and that it survives a restart."""

import logging
import os
import stat

import pytest

from nri_gpushare.host.devices import library_problem, write_preload_file
from nri_gpushare.share.interposer import preload_file_text
from nri_gpushare.share.model import (
    STANDALONE_SOURCES,
    ContainerInfo,
    InterposerPolicy,
    Mount,
    NodePolicy,
    ShareRefused,
)
from nri_gpushare.share.records import MemoryStore
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, done, make_gpus

P = "gpushare.io/"
LIB = "/usr/lib/nri-gpushare/libgpushare.so"
IN_CONTAINER = "/usr/lib/gpushare/libgpushare.so"
PRELOAD_FILE = "/var/lib/nri-gpushare/ld.so.preload"
RO = ("rbind", "ro", "nosuid", "nodev")
LIBRARY_MOUNT = Mount(LIB, IN_CONTAINER, options=RO)
PRELOAD_MOUNT = Mount(PRELOAD_FILE, "/etc/ld.so.preload", options=RO)


class Library:
    """A LibraryCheck whose answer the test sets."""

    def __init__(self, problem: str = "") -> None:
        self.problem = problem
        self.asked: list[str] = []

    def __call__(self, path: str) -> str:
        self.asked.append(path)
        return self.problem


def make(library=None, store=None, kmod=None, **interposer):
    interposer.setdefault("preload_file", PRELOAD_FILE)
    kmod = kmod if kmod is not None else FakeKernelModule()
    svc = ShareService(
        make_gpus(2, 16 * GiB),
        NodePolicy(pod_sources=STANDALONE_SOURCES, interposer=InterposerPolicy(**interposer)),
        Inline(kmod),
        FakeDevices(),
        store,
        library_check=library if library is not None else Library(),
    )
    done(svc.start())
    return svc, kmod


def ctr(cid, isolation=None, env=None, memory="2Gi"):
    annotations = {P + "gpu-memory": memory}
    if isolation:
        annotations[P + "isolation"] = isolation
    return ContainerInfo(
        id=cid,
        name=cid,
        pod_name=f"pod-{cid}",
        pod_namespace="ns",
        pod_uid=f"uid-{cid}",
        pod_annotations=annotations,
        env=env or {},
    )


@pytest.mark.parametrize("isolation", [None, "full", "memory"])
async def test_full_and_memory_get_the_library_and_ld_so_preload(isolation):
    svc, _ = make()
    plan = await svc.lifecycle.create_container(ctr("c1", isolation))
    assert plan.mounts == (LIBRARY_MOUNT, PRELOAD_MOUNT)
    assert "LD_PRELOAD" not in plan.env and "GPUSHARE_ALLOW_MANAGED" not in plan.env
    assert svc.allocations["c1"].interposer is True
    [entry] = svc.status()["allocations"]
    assert entry["interposer"] is True
    assert entry["guards"] == ["interposer", "kernel-ledger"]


async def test_isolation_none_gets_nothing_and_needs_no_library():
    library = Library("does not exist")
    svc, _ = make(library)
    plan = await svc.lifecycle.create_container(ctr("c1", "none"))
    assert plan.mounts == ()
    assert "LD_PRELOAD" not in plan.env
    assert library.asked == []
    [entry] = svc.status()["allocations"]
    assert entry["guards"] == ["none"] and "isolation none" in entry["unguarded"]["none"]


async def test_no_interposer_on_the_node_injects_nothing():
    svc = ShareService(
        make_gpus(1), NodePolicy(pod_sources=STANDALONE_SOURCES), None, FakeDevices()
    )
    plan = await svc.lifecycle.create_container(ctr("c1"))
    assert plan.mounts == () and svc.allocations["c1"].interposer is False
    assert "no interposer" in svc.status()["allocations"][0]["unguarded"]["interposer"]


async def test_preload_env_puts_ours_first_and_keeps_theirs():
    svc, _ = make(preload="env", preload_file="")
    plan = await svc.lifecycle.create_container(ctr("c1", env={"LD_PRELOAD": "/opt/their.so"}))
    assert plan.mounts == (LIBRARY_MOUNT,)
    assert plan.env["LD_PRELOAD"] == f"{IN_CONTAINER}:/opt/their.so"
    plan = await svc.lifecycle.create_container(ctr("c2"))
    assert plan.env["LD_PRELOAD"] == IN_CONTAINER


async def test_allow_managed_and_another_container_path():
    svc, _ = make(allow_managed=True, container_path="/opt/gs/lib.so")
    plan = await svc.lifecycle.create_container(ctr("c1"))
    assert plan.env["GPUSHARE_ALLOW_MANAGED"] == "1"
    assert plan.mounts[0] == Mount(LIB, "/opt/gs/lib.so", options=RO)
    assert preload_file_text(svc.policy.interposer) == "/opt/gs/lib.so\n"


async def test_missing_library_refuses_with_advice_and_reserves_nothing():
    svc, kmod = make(Library("does not exist"))
    with pytest.raises(ShareRefused) as info:
        await svc.lifecycle.create_container(ctr("c1", "memory"))
    message = str(info.value)
    assert info.value.reason == "interposer"
    assert f"{LIB} does not exist on this node" in message
    for advice in ("install libgpushare.so", "isolation: none", "interposer.missing: warn"):
        assert advice in message, message
    assert svc.allocations == {} and kmod.regs == {}
    assert all(g["memory_allocated"] == 0 for g in svc.status()["gpus"])
    assert svc.status()["interposer"]["problem"] == "does not exist"


async def test_a_share_that_does_not_fit_is_refused_for_that_first():
    svc, _ = make(Library("does not exist"))
    with pytest.raises(ShareRefused) as info:
        await svc.lifecycle.create_container(ctr("c1", memory="17Gi"))
    assert info.value.reason == "capacity"


async def test_missing_library_with_warn_creates_without_it(caplog):
    caplog.set_level(logging.WARNING)
    svc, kmod = make(Library("does not exist"), missing="warn")
    plan = await svc.lifecycle.create_container(ctr("c1"))
    assert plan.mounts == () and "LD_PRELOAD" not in plan.env
    assert "created without the CUDA interposer (interposer.missing: warn)" in caplog.text
    assert "c1" in kmod.regs  # still registered: the module's books stay right
    [entry] = svc.status()["allocations"]
    assert entry["guards"] == ["none"]
    assert "was missing on the node" in entry["unguarded"]["interposer"]
    assert "without the interposer nothing reserves" in entry["unguarded"]["kernel-ledger"]


async def test_asked_again_gives_the_same_mounts():
    svc, _ = make()
    c = ctr("c1")
    assert await svc.lifecycle.create_container(c) == await svc.lifecycle.create_container(c)


async def test_the_interposer_survives_a_restart_in_the_records():
    store = MemoryStore()
    svc, _ = make(store=store)
    plans = {cid: await svc.lifecycle.create_container(ctr(cid, iso)) for cid, iso in [("a", None)]}
    library = Library("does not exist")
    warned, _ = make(library, store=store, missing="warn")
    # The library went missing meanwhile: warned-about create, recorded without it.
    plans["b"] = await warned.lifecycle.create_container(ctr("b"))
    assert '"interposer":true' in store.text and store.text.count("interposer") == 1
    again, _ = make(store=store, kmod=FakeKernelModule(loaded=False))
    live = []
    for cid, plan in plans.items():
        c = ctr(cid)
        live.append(
            ContainerInfo(
                id=c.id,
                name=c.name,
                pod_name=c.pod_name,
                pod_namespace=c.pod_namespace,
                pod_uid=c.pod_uid,
                pod_annotations=c.pod_annotations,
                annotations=dict(plan.annotations),
            )
        )
    await again.recovery.synchronize(live)
    assert again.allocations["a"].interposer is True
    assert again.allocations["b"].interposer is False


# -- the host side -----------------------------------------------------------------------------


def test_library_problem(tmp_path):
    lib = tmp_path / "libgpushare.so"
    assert library_problem(str(lib)) == "does not exist"
    lib.mkdir()
    assert library_problem(str(lib)) == "is not a regular file"
    lib.rmdir()
    lib.write_bytes(b"")
    assert library_problem(str(lib)) == "is empty"
    lib.write_bytes(b"\x7fELF")
    lib.chmod(0o600)
    assert "not readable by every user (mode 0600" in library_problem(str(lib))
    lib.chmod(0o644)
    assert library_problem(str(lib)) == ""


def test_preload_file_is_written_once_readable_by_all(tmp_path):
    path = write_preload_file(str(tmp_path), IN_CONTAINER + "\n")
    assert path == str(tmp_path / "ld.so.preload")
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o644
    assert open(path).read() == IN_CONTAINER + "\n"
    write_preload_file(str(tmp_path), IN_CONTAINER + "\n")
    assert os.stat(path).st_ino == st.st_ino  # the same content: left alone
    write_preload_file(str(tmp_path), "/opt/other.so\n")
    assert open(path).read() == "/opt/other.so\n"
    os.unlink(path)
    os.symlink("/etc/passwd", path)  # never written through
    write_preload_file(str(tmp_path), IN_CONTAINER + "\n")
    assert not os.path.islink(path) and open(path).read() == IN_CONTAINER + "\n"
    assert sorted(os.listdir(tmp_path)) == ["ld.so.preload"]


def test_resolved_follows_each_swap_of_the_library(tmp_path) -> None:
    """The mount source is looked up again when the installer swaps the
    symlink to a new version, and when the file it leads to is renamed."""
    import os

    from nri_gpushare.share.interposer import resolved

    for version in ("1", "2", "3"):
        (tmp_path / version).mkdir()
        (tmp_path / version / "libgpushare.so").write_bytes(b"x")
    link = tmp_path / "libgpushare.so"
    for version in ("1", "2", "1"):
        os.symlink(f"{version}/libgpushare.so", tmp_path / ".new")
        os.replace(tmp_path / ".new", link)  # as scripts/install-node.sh swaps it
        assert resolved(str(link)) == str(tmp_path / version / "libgpushare.so")
        assert resolved(str(link)) == os.path.realpath(link)
    os.rename(tmp_path / "1", tmp_path / "1-old")  # the same inode under another path
    assert resolved(str(link)) == os.path.realpath(link)  # dangling: as realpath says
    os.replace(tmp_path / "3" / "libgpushare.so", tmp_path / "1-old" / "moved.so")
    os.symlink("1-old/moved.so", tmp_path / ".new")
    os.replace(tmp_path / ".new", link)
    assert resolved(str(link)) == str(tmp_path / "1-old" / "moved.so")
