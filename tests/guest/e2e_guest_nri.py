"""End to end inside the qemu guest: a real containerd 1.7 with CRI and NRI, the
real plugin (`nri-gpushare run`, kmod: required) and the real gpushare.ko.

Run by tests/guest/test_e2e_guest.py, which builds the module, has the guest
load it and passes GPUSHARE_E2E_QUERY (a static build of kmod_query.c).  The
tests run in file order on one containerd; the last one unloads the module.
Every test ends with nothing registered in the module (checked).

The guest root is an overlay over the host's file system, which overlayfs
cannot use as an upper layer, so containerd's dirs and the shim sockets go to
fresh tmpfs mounts; the loopback interface is brought up for CRI's stream
server.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from nri_gpushare.kmod import abi
from nri_gpushare.kmod.procfs import ProcfsKernelModule
from nri_gpushare.ops import kmod_admin as admin
from tests.guest.kmod_support import (
    CGROUP2,
    CTL,
    ROOT,
    ctl,
    in_child,
    loaded,
    read,
    refcount,
    registered,
    snapshot,
    value,
)
from tests.integration.plugin import PluginProcess, gpu_inventory
from tests.testbed.containerd import Containerd
from tests.testbed.cri import CriClient, GRPCError, cri
from tests.testbed.images import BUSYBOX_IMAGE, build_images

GiB = 1 << 30
P = "gpushare.io/"
BASE = Path("/tmp/gs-e2e")  # short: unix socket paths
QUERY_EXE = os.environ.get("GPUSHARE_E2E_QUERY", "")
CUDA_PROBE = os.environ.get("GPUSHARE_E2E_CUDA_PROBE", "")
FAKE_DRIVER_DIR = os.environ.get("GPUSHARE_E2E_FAKE_DRIVER", "")
INTERPOSER = os.environ.get("GPUSHARE_E2E_INTERPOSER", "")
SLOW = 120.0  # generous waits: everything is 5-20x slower under TCG
SHARE = {P + "gpu-memory": "2Gi", P + "gpu-core": "30"}
# Two 16 GiB GPUs with the UUIDs of the tests' fake CUDA driver's devices, so
# that the interposer finds a device's quota by its UUID.
GPUS = [
    {**gpu, "uuid": f"GPU-face0000-0000-0000-0000-0000000000{i:02x}"}
    for i, gpu in enumerate(gpu_inventory(2, "16Gi"))
]


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


class Plugins:
    """The plugin processes of this module, one running at a time."""

    def __init__(self, nri_socket: Path) -> None:
        self.nri_socket = nri_socket
        self.started: list[PluginProcess] = []

    @property
    def current(self) -> PluginProcess | None:
        return self.started[-1] if self.started else None

    def start(self) -> PluginProcess:
        plugin = PluginProcess(
            self.nri_socket,
            BASE / f"p{len(self.started)}",
            kmod="required",
            use_nvml=False,
            inventory=GPUS,
            interposer={"library": INTERPOSER},
        )
        self.started.append(plugin)
        plugin.start(wait=False)
        plugin.wait_connected(timeout=SLOW)
        return plugin

    def running(self) -> PluginProcess:
        plugin = self.current
        if plugin is None or plugin.proc is None or plugin.proc.poll() is not None:
            plugin = self.start()
        return plugin

    def stop_all(self) -> None:
        for plugin in self.started:
            if plugin.proc is not None:
                plugin.stop()


@pytest.fixture(scope="module")
def bed() -> Iterator[Containerd]:
    if os.environ.get("GPUSHARE_IN_GUEST") != "1":
        pytest.fail("e2e_guest_* tests run only inside the qemu guest (see test_e2e_guest.py)")
    assert loaded(), "the host side loads gpushare.ko before the suite"
    for point in (BASE, Path("/run/containerd")):
        point.mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(point))
    sh("ip", "link", "set", "lo", "up")
    containerd = Containerd(
        BASE / "ctd", plugin_registration_timeout="60s", plugin_request_timeout="60s"
    )
    containerd.start(timeout=SLOW)
    yield containerd
    containerd.stop()


@pytest.fixture(scope="module")
def plugins(bed: Containerd) -> Iterator[Plugins]:
    plugins = Plugins(bed.nri_socket)
    yield plugins
    plugins.stop_all()


@pytest.fixture
def plugin(plugins: Plugins) -> PluginProcess:
    return plugins.running()


@pytest.fixture(autouse=True)
def module_left_empty() -> Iterator[None]:
    """After each test (and its pods' cleanup): nothing registered, no reference."""
    yield
    if not loaded():
        return  # the uninstall test unloaded it
    leftovers = registered()
    for cid in leftovers:
        ctl(f"del {cid}")  # so one failure does not fail the next tests
    assert leftovers == [], "containers left registered in gpushare.ko"
    assert refcount() == 0


# What the daemon samples from the module every few seconds (the compute
# windows and the GPUs' scheduler settings): two status reads at different
# moments, or across a restart, may differ there and nowhere else.
SAMPLED_GPU_KEYS = ("policy", "prio_ratio", "slice_us", "drain_us", "forced_ends")


def settled(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Status entries (allocations or GPUs) without their sampled fields."""

    def strip(d: dict[str, Any]) -> dict[str, Any]:
        return {
            k: ([strip(g) for g in v] if k == "gpus" else v)
            for k, v in d.items()
            if not k.startswith("compute_") and k not in SAMPLED_GPU_KEYS
        }

    return [strip(e) for e in entries]


@pytest_asyncio.fixture
async def client(bed: Containerd, plugins: Plugins) -> AsyncIterator[CriClient]:
    """A CRI client; the pods it started are stopped and removed afterwards."""
    async with bed.cri_client() as c:
        c.runtime.timeout = c.images.timeout = SLOW
        await c.wait_ready(SLOW)
        try:
            yield c
        finally:
            plugins.running()  # pods are stopped through a live plugin


# -- helpers --------------------------------------------------------------------------


async def sleeper(client: CriClient, name: str, annotations: dict[str, str]) -> str:
    """A running container in a new pod with these pod annotations."""
    pod = await client.run_pod(name, annotations=annotations)
    cid = await client.create_container(pod, "main", command=["sleep", "3600"])
    await client.start(cid)
    return cid


async def cgroup_of(client: CriClient, cid: str) -> Path:
    """The container's cgroup v2 directory (cgroupfs driver: /k8s.io/<id>)."""
    info = await client.container_info(cid)
    path = info["runtimeSpec"]["linux"]["cgroupsPath"]
    assert path == f"/k8s.io/{cid}", path
    return CGROUP2 / path.lstrip("/")


def py_query() -> object:
    """GPUSHARE_IOC_QUERY through nri_gpushare.kmod.abi, as JSON-able lists."""
    r = abi.query()
    if r is None:
        return None
    return [
        r.container_id,
        r.cgroup_id,
        [[q.gpu_index, q.memory_bytes, q.core_percent, q.high_priority] for q in r.quotas],
    ]


async def create_querying(client: CriClient, pod: str) -> str:
    """A container that first asks the module for its quota (the static
    kmod_query, bind-mounted in, through the /dev/gpushare the plugin injected),
    then sleeps; its log holds the answer, so no exec into the container is
    needed."""
    if not QUERY_EXE:
        pytest.fail("GPUSHARE_E2E_QUERY (a static kmod_query) is not set")
    config = cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name="main"),
        image=cri.ImageSpec(image=BUSYBOX_IMAGE),
        command=["sh", "-c", "/gs-query; exec sleep 3600"],
        mounts=[cri.Mount(container_path="/gs-query", host_path=QUERY_EXE, readonly=True)],
        log_path="main.log",
        linux=cri.LinuxContainerConfig(
            security_context=cri.LinuxContainerSecurityContext(
                namespace_options=cri.NamespaceOption(network=cri.NamespaceMode.NODE)
            )
        ),
    )
    resp = await client.runtime.create_container(
        cri.CreateContainerRequest(
            pod_sandbox_id=pod, config=config, sandbox_config=client.pod_config(pod)
        )
    )
    return resp.container_id


def probe_control(name: str) -> tuple[Path, Path]:
    """A directory shared with a probe's container, and the file that lets
    the probe free what it holds once it exists."""
    if not (CUDA_PROBE and FAKE_DRIVER_DIR):
        pytest.fail("GPUSHARE_E2E_CUDA_PROBE / GPUSHARE_E2E_FAKE_DRIVER are not set")
    ctl_dir = BASE / name
    ctl_dir.mkdir(exist_ok=True)
    release = ctl_dir / "release"
    release.unlink(missing_ok=True)
    return ctl_dir, release


async def start_probe(
    client: CriClient, pod: str, held: int, ctl_dir: Path, script: str = ""
) -> str:
    """A running container of `pod` whose CUDA client (cuda_probe.c, on the
    fake driver under the preloaded interposer) checks its quota, holds
    `held` bytes until `ctl_dir`/release exists, then sleeps; `script`: the
    container's shell script instead."""
    script = script or f"/gs/cuda_probe {held} /gs-ctl/release; exec sleep 3600"
    config = cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name="main"),
        image=cri.ImageSpec(image=BUSYBOX_IMAGE),
        command=["sh", "-c", script],
        envs=[
            cri.KeyValue(key="LD_LIBRARY_PATH", value="/gs-fake"),
            cri.KeyValue(key="FAKECUDA_MEMORY", value=str(16 * GiB)),
        ],
        mounts=[
            cri.Mount(container_path="/gs/cuda_probe", host_path=CUDA_PROBE, readonly=True),
            cri.Mount(container_path="/gs-fake", host_path=FAKE_DRIVER_DIR, readonly=True),
            cri.Mount(container_path="/gs-ctl", host_path=str(ctl_dir)),
            # glibc for the dynamically linked probe (the image is static busybox)
            cri.Mount(container_path="/lib64", host_path="/lib64", readonly=True),
            cri.Mount(
                container_path="/lib/x86_64-linux-gnu",
                host_path="/lib/x86_64-linux-gnu",
                readonly=True,
            ),
        ],
        log_path="main.log",
    )
    resp = await client.runtime.create_container(
        cri.CreateContainerRequest(
            pod_sandbox_id=pod, config=config, sandbox_config=client.pod_config(pod)
        )
    )
    await client.start(resp.container_id)
    return resp.container_id


async def probe_lines(client: CriClient, cid: str, upto: str, times: int = 1) -> list[str]:
    """The probe's output, once it has printed `upto` (`times` times)."""
    deadline = time.monotonic() + SLOW
    while (got := await client.read_logs(cid)).count(upto) < times:
        assert time.monotonic() < deadline, f"probe printed only {got}"
        await asyncio.sleep(0.2)
    return got


async def first_line(client: CriClient, cid: str) -> str:
    deadline = time.monotonic() + SLOW
    while not (lines := await client.read_logs(cid)):
        assert time.monotonic() < deadline, f"container {cid} printed nothing"
        await asyncio.sleep(0.2)
    return lines[0]


# -- tests ----------------------------------------------------------------------------


async def test_share_registered_bound_queried_and_released(bed, plugin, client):
    kmod = plugin.status()["kmod"]
    assert (kmod["mode"], kmod["loaded"]) == ("required", True), kmod
    assert read(ROOT / "0" / "total_memsize") == f"{16 * GiB}\n"
    assert refcount() == 0

    pod = await client.run_pod("share", annotations=SHARE)
    cid = await create_querying(client, pod)
    # CreateContainer registered it; its cgroup does not exist yet, so unbound.
    assert registered() == [cid]
    d = ROOT / "0" / cid
    assert value(d / "memsize") == 2 * GiB
    assert value(d / "weight") == 30
    assert value(d / "highprio") == 0
    assert value(d / "cgroup") == 0
    assert value(ROOT / "0" / "free_memsize") == 14 * GiB
    assert value(ROOT / "0" / "free_weight") == 70
    assert not (ROOT / "1" / cid).exists()
    assert refcount() == 1

    await client.start(cid)
    cgroup = await cgroup_of(client, cid)
    ino = os.stat(cgroup).st_ino
    assert value(d / "cgroup") == ino  # StartContainer bound it
    assert read(CTL).splitlines()[-1] == f"bind {cid} {ino}"
    assert refcount() == 1

    # The container itself (its first output line, from kmod_query) and any
    # process moved into its cgroup get its quota; others get none.
    want = [cid, ino, [[0, 2 * GiB, 30, False]]]
    assert in_child(py_query, cgroup=cgroup) == want
    assert in_child(py_query) is None  # the root cgroup has no registration
    assert await first_line(client, cid) == f"{cid} {ino} 0:{2 * GiB}:30:0"

    info = await client.container_info(cid)
    spec = info["runtimeSpec"]
    assert "GPUSHARE_MEMORY_LIMIT=2147483648" in spec["process"]["env"]
    assert "GPUSHARE_CORE_LIMIT=30" in spec["process"]["env"]
    assert "/dev/gpushare" in [dev["path"] for dev in spec["linux"]["devices"]]

    [alloc] = plugin.status()["allocations"]
    assert alloc["container_id"] == cid and alloc["registered"] is True
    [share] = alloc["gpus"]
    memory_keys = ("index", "uuid", "memory", "core", "memory_used", "memory_used_why")
    assert {k: share[k] for k in (*memory_keys, "processes", "nvml_limit")} == {
        "index": 0,
        "uuid": GPUS[0]["uuid"],
        "memory": 2 * GiB,
        "core": 30,
        "memory_used": 0,  # kmod_query reserves nothing
        "memory_used_why": "",
        "processes": 0,
        "nvml_limit": False,
    }
    # Its compute target, next to what the module charged it (nothing: it
    # launches nothing) once the daemon has sampled gputime twice.
    assert share["compute_target"] == 30
    if share["compute_used_pct"] is None:
        assert share["compute_used_why"].startswith("unknown: "), share
    else:
        assert share["compute_used_pct"] == 0.0, share

    await client.stop_pod(pod)
    assert registered() == [] and not d.exists()
    assert refcount() == 0
    assert value(ROOT / "0" / "free_memsize") == 16 * GiB
    assert value(ROOT / "0" / "free_weight") == 100
    await client.remove_pod(pod)
    assert refcount() == 0 and plugin.status()["allocations"] == []


async def test_refusals_leave_the_module_untouched(bed, plugin, client):
    await sleeper(client, "held", SHARE)
    before = snapshot()
    assert refcount() == 1

    # The plugin refuses: more memory than a 16 GiB GPU has.
    pod = await client.run_pod("refused")
    with pytest.raises(GRPCError) as info:
        await client.create_container(
            pod, "greedy", command=["sleep", "3600"], annotations={P + "gpu-memory": "20Gi"}
        )
    assert "20480Mi" in (info.value.message or ""), info.value.message
    assert snapshot() == before and refcount() == 1
    assert len(plugin.status()["allocations"]) == 1

    # The module refuses what the plugin would place: a registration the
    # plugin does not know (made behind its back) holds GPU 1's memory.
    assert ctl(f"add foreign 1:{15 * GiB}") == 0
    before = snapshot()
    with pytest.raises(GRPCError) as info:
        await client.create_container(
            pod,
            "pinned",
            command=["sleep", "3600"],
            annotations={P + "gpu-memory": "4Gi", P + "gpu-devices": "1"},
        )
    message = info.value.message or ""
    assert "kernel module refused" in message and f"errno {errno.ENOSPC}" in message, message
    assert snapshot() == before and refcount() == 2
    status = plugin.status()
    assert len(status["allocations"]) == 1  # nothing stayed reserved in the plugin
    assert status["gpus"][1]["memory_allocated"] == 0
    assert ctl("del foreign") == 0


async def test_plugin_restart_keeps_registrations_identical(bed, plugins, plugin, client):
    first = await sleeper(client, "a", SHARE)
    second = await sleeper(
        client, "b", {P + "gpu-memory": "1Gi,3Gi", P + "gpu-count": "2", P + "priority": "high"}
    )
    registry, procfs = read(CTL), snapshot()
    assert sorted(registered()) == sorted([first, second]) and refcount() == 2
    before = plugin.status()

    assert plugin.stop() == 0
    assert read(CTL) == registry  # a plugin going away unregisters nothing
    restarted = plugins.start()
    assert restarted is not plugin
    assert read(CTL) == registry and snapshot() == procfs
    assert refcount() == 2  # no double registration
    after = restarted.status()
    assert settled(after["allocations"]) == settled(before["allocations"])
    assert settled(after["gpus"]) == settled(before["gpus"])  # nothing counted twice
    assert all(a["registered"] for a in after["allocations"])

    await client.cleanup()
    assert registered() == [] and refcount() == 0


async def test_with_the_module_loaded_recovery_rests_on_its_registry(bed, plugins, plugin, client):
    """Without the daemon's records (deleted), the module's registry is what a
    restart recovers."""
    cid = await sleeper(client, "mod", SHARE)
    before = plugin.status()
    plugin.kill()
    (plugin.workdir.parent / "state" / "allocations.json").unlink()
    restarted = plugins.start()
    after = restarted.status()
    assert [a["container_id"] for a in after["allocations"]] == [cid]
    assert settled(after["allocations"])[0]["gpus"] == settled(before["allocations"])[0]["gpus"]
    assert after["unserved"] == []
    await client.cleanup()
    assert registered() == [] and refcount() == 0


async def test_synchronize_removes_a_stale_registration(bed, plugins, plugin, client):
    pod = await client.run_pod("stale", annotations=SHARE)
    cid = await client.create_container(pod, "main", command=["sleep", "3600"])
    await client.start(cid)
    assert registered() == [cid] and refcount() == 1

    plugin.kill()  # SIGKILL: no chance to clean up
    await client.stop(cid)  # containerd has no plugin to tell
    assert (await client.container_status(cid)).state == cri.ContainerState.CONTAINER_EXITED
    assert registered() == [cid] and refcount() == 1  # stale now

    restarted = plugins.start()
    assert registered() == [] and refcount() == 0
    assert restarted.status()["allocations"] == []
    assert "gone; removing its kernel-module registration" in restarted.log()


async def test_a_pod_is_held_to_its_memory_quota_by_the_interposer_and_the_ledger(
    bed, plugin, client
):
    """A pod with gpu-memory 1Gi runs a CUDA client (cuda_probe.c) on the tests'
    fake driver; libgpushare.so, preloaded through the /etc/ld.so.preload the
    plugin mounted, reserves through /dev/gpushare: the client sees 1Gi as the
    card's size, 1Gi + 1 byte fails with CUDA's out-of-memory error, meminfo
    shows its PID while it holds memory and nothing once it has freed it."""
    ctl_dir, release = probe_control("probe-ctl")
    held = 256 << 20

    pod = await client.run_pod("quota", annotations={P + "gpu-memory": "1Gi"})
    cid = await start_probe(client, pod, held, ctl_dir)

    async def lines(upto: str) -> list[str]:
        return await probe_lines(client, cid, upto)

    got = await lines("held")
    assert got[:5] == [
        f"info {GiB} {GiB} 0",
        f"devtotal {GiB} 0",
        f"over {GiB + 1} 2",  # CUDA_ERROR_OUT_OF_MEMORY
        f"hold {held} 0",
        "held",
    ], got
    meminfo = ROOT / "0" / cid / "meminfo"
    procs = (await cgroup_of(client, cid)) / "cgroup.procs"
    pids = {int(p) for p in procs.read_text().split()}
    shown = read(meminfo).splitlines()
    assert shown[0] == f"Free: {GiB - held}", shown
    [(pid, mem)] = [line.split()[1::2] for line in shown[1:]]
    assert int(pid) in pids and int(mem) == held, (shown, pids)
    [alloc] = plugin.status()["allocations"]
    assert alloc["container_id"] == cid
    assert {"interposer", "kernel-ledger"} <= set(alloc["guards"]), alloc
    [gpu] = alloc["gpus"]
    assert (gpu["memory"], gpu["memory_used"], gpu["processes"]) == (GiB, held, 1), gpu
    assert gpu["pids"] == [int(pid)], gpu
    # gpushare-smi shows what the module's ledger counts, the real CLI on the status socket
    smi = subprocess.run(
        [sys.executable, "-m", "nri_gpushare.cli.smi", "--json"]
        + ["--status-socket", plugin.status_socket],
        capture_output=True,
        text=True,
        timeout=SLOW,
    )
    assert smi.returncode == 0, smi.stderr
    view = json.loads(smi.stdout)
    [shown_ctr] = view["containers"]
    [shown_share] = shown_ctr["gpus"]
    assert shown_ctr["container_id"] == cid and shown_share["pids"] == [int(pid)], view
    assert (shown_share["memory_quota"], shown_share["memory_used"]) == (GiB, held), view
    assert view["plugin"]["kmod"]["loaded"] is True, view

    release.touch()
    got = await lines("freed 0")
    assert read(meminfo) == f"Free: {GiB}\n"
    await client.stop_pod(pod)
    assert registered() == [] and refcount() == 0
    await client.remove_pod(pod)


def resize(plugin: PluginProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """`nri-gpushare resize ARGS` against `plugin` (its local API socket)."""
    return subprocess.run(
        [sys.executable, "-m", "nri_gpushare.cli.main", "resize", *args]
        + ["--config", str(plugin.config_path)],
        capture_output=True,
        text=True,
        timeout=SLOW,
    )


async def test_a_running_pod_is_resized_live_and_a_restart_keeps_it(bed, plugins, plugin, client):
    """A pod with gpu-memory 1Gi whose CUDA client holds 768Mi: `nri-gpushare
    resize` raises it to 2Gi and 40% compute in the module (memsize, weight)
    while the client runs; status and gpushare-smi show it; a second client
    started then in the same running container sees 2Gi and holds 1Gi more
    (1792Mi in all, past the 1Gi it was created with); a shrink below what
    the two hold is refused with the amount and changes nothing; a restarted
    plugin keeps 2Gi (its records), and the module still holds it."""
    ctl_dir, release = probe_control("resize-ctl")
    (ctl_dir / "go").unlink(missing_ok=True)
    held, more = 768 << 20, GiB
    script = (
        f"/gs/cuda_probe {held} /gs-ctl/release & "
        "while [ ! -e /gs-ctl/go ]; do sleep 0.2; done; "
        f"/gs/cuda_probe {more} /gs-ctl/release; wait; exec sleep 3600"
    )
    pod = await client.run_pod("resize", annotations={P + "gpu-memory": "1Gi"})
    cid = await start_probe(client, pod, held, ctl_dir, script)
    assert (await probe_lines(client, cid, "held"))[3] == f"hold {held} 0"
    files = ROOT / "0" / cid
    assert (value(files / "memsize"), value(files / "weight")) == (GiB, 0)

    grown = resize(plugin, cid[:12], "--memory", "2Gi", "--core", "40")
    assert grown.returncode == 0, grown.stderr
    assert (
        grown.stdout == "resized container main (pod default/resize): GPU 0 2048Mi 40%, "
        "priority normal\n"
    ), grown.stdout
    assert (value(files / "memsize"), value(files / "weight")) == (2 * GiB, 40)
    assert read(files / "meminfo").splitlines()[0] == f"Free: {2 * GiB - held}"
    [alloc] = plugin.status()["allocations"]
    [gpu] = alloc["gpus"]
    assert (gpu["memory"], gpu["core"], gpu["memory_used"]) == (2 * GiB, 40, held), gpu
    assert alloc["resized"] is True
    assert "decision=resized" in plugin.log() and "was_memory=1024Mi" in plugin.log()
    smi = subprocess.run(
        [sys.executable, "-m", "nri_gpushare.cli.smi", "--json"]
        + ["--status-socket", plugin.status_socket],
        capture_output=True,
        text=True,
        timeout=SLOW,
    )
    [shown] = json.loads(smi.stdout)["containers"][0]["gpus"]
    assert (shown["memory_quota"], shown["memory_used"]) == (2 * GiB, held), shown

    (ctl_dir / "go").touch()  # the second client, in the container as it runs
    second = (await probe_lines(client, cid, "held", times=2))[5:10]
    assert second == [
        f"info {2 * GiB} {2 * GiB - held} 0",
        f"devtotal {2 * GiB} 0",
        f"over {2 * GiB + 1} 2",  # CUDA_ERROR_OUT_OF_MEMORY past the new quota
        f"hold {more} 0",
        "held",
    ], second
    assert value(files / "memused") == held + more

    shrunk = resize(plugin, cid[:12], "--memory", "1Gi")
    assert shrunk.returncode == 1
    assert "its processes hold 1792Mi on GPU 0; it cannot shrink below that (asked 1024Mi)" in (
        shrunk.stderr
    ), shrunk.stderr
    assert (value(files / "memsize"), value(files / "weight")) == (2 * GiB, 40)
    assert plugin.status()["gpus"][0]["memory_allocated"] == 2 * GiB

    assert plugin.stop() == 0
    restarted = plugins.start()
    assert (value(files / "memsize"), value(files / "weight")) == (2 * GiB, 40)
    [alloc] = restarted.status()["allocations"]
    assert [(g["memory"], g["core"]) for g in alloc["gpus"]] == [(2 * GiB, 40)], alloc
    assert alloc["resized"] is True and registered() == [cid]
    # Recovered from the daemon's record (it still matches what the container
    # carries, the annotation it was created with), not only from the module's.
    assert "differs from the kernel module" not in restarted.log()
    assert "does not carry the share recorded for it" not in restarted.log()
    assert {"interposer", "kernel-ledger"} <= set(alloc["guards"]), alloc

    release.touch()
    await probe_lines(client, cid, "freed 0", times=2)
    await client.stop_pod(pod)
    assert registered() == [] and refcount() == 0
    await client.remove_pod(pod)


async def test_a_ctr_container_is_registered_bound_and_released_like_a_pod(bed, plugin, client):
    """`ctr run` through gpushare-runc: registered with the module at create,
    bound to its cgroup once runc created it, released at `ctr task rm`."""
    wrapper = plugin.runc_wrapper()

    def ctr(*args: str) -> str:
        argv = [str(bed.ctr), "-a", str(bed.grpc_address), "-n", "default", *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SLOW)
        assert done.returncode == 0, f"ctr {' '.join(args)}: {done.stderr}"
        return done.stdout

    ctr("images", "import", str(build_images()))
    cid = "gs-ctr-e2e"
    ctr(
        "run", "-d", "--runc-binary", str(wrapper), "--runc-root", str(bed.runc_root),
        "--label", P + "gpu-memory=2Gi", "--label", P + "gpu-core=30",
        BUSYBOX_IMAGE, cid, "sleep", "3600",
    )  # fmt: skip
    try:
        assert registered() == [cid]
        d = ROOT / "0" / cid
        assert value(d / "memsize") == 2 * GiB and value(d / "weight") == 30
        cgroup = CGROUP2 / "default" / cid
        ino = os.stat(cgroup).st_ino
        assert value(d / "cgroup") == ino  # bound once runc created the cgroup
        assert in_child(py_query, cgroup=cgroup) == [cid, ino, [[0, 2 * GiB, 30, False]]]
        assert refcount() == 1
        [alloc] = plugin.status()["allocations"]
        assert (alloc["container_id"], alloc["origin"]) == (cid, "runc:default")
        assert alloc["registered"] is True
    finally:
        ctr("task", "kill", "-s", "SIGKILL", cid)
        deadline = time.monotonic() + SLOW  # kill only signals: rm once it has stopped
        while [cid, "STOPPED"] not in [
            [f[0], f[-1]] for f in map(str.split, ctr("task", "ls").splitlines()[1:]) if f
        ]:
            assert time.monotonic() < deadline, f"task {cid} did not stop"
            time.sleep(0.05)
        ctr("task", "rm", cid)
    assert registered() == [] and refcount() == 0
    assert plugin.status()["allocations"] == []
    ctr("containers", "rm", cid)


async def test_uninstall_refuses_then_unloads(bed, plugin, client):
    """Last: `nri-gpushare uninstall` unloads the module once nothing is registered;
    the plugin, still running with kmod: required, then refuses shares."""
    cid = await sleeper(client, "last", SHARE)
    code, message = admin.uninstall(ProcfsKernelModule())  # what the command runs
    assert code == admin.EXIT_REFUSED, message
    assert "refusing to unload gpushare" in message and cid in message
    assert loaded() and refcount() == 1

    await client.cleanup()
    assert registered() == [] and refcount() == 0
    command = [sys.executable, "-m", "nri_gpushare.cli.main", "uninstall"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done
    assert "unloaded gpushare" in done.stdout
    assert not loaded() and not ROOT.exists()

    pod = await client.run_pod("after", annotations=SHARE)
    with pytest.raises(GRPCError) as info:
        await client.create_container(pod, "main", command=["sleep", "3600"])
    assert "kernel module is not loaded" in (info.value.message or ""), info.value.message
    kmod = plugin.status()["kmod"]
    assert (kmod["mode"], kmod["loaded"]) == ("required", False), kmod
