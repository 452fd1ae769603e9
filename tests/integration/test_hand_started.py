"""Containers NRI never sees get their shares from the same daemon: `ctr run`
through gpushare-runc (`--runc-binary`), on a real containerd, next to CRI
pods, with containerd's events and a reconciliation behind the hooks."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.plugin import ROOT, PluginProcess, gpu_inventory
from tests.integration.test_share_e2e import env_of, reserved, run_sleeper
from tests.testbed.containerd import Containerd
from tests.testbed.images import BUSYBOX_IMAGE, build_images

pytestmark = pytest.mark.containerd

P = "gpushare.io/"
NS = "default"
GiB = 1 << 30
# Bounds a wait that normally ends at once (a broken path fails instead of hanging).
STUCK = 60.0
# gpushare-runc and the CDI hooks: the compiled front (installed) and the
# Python programs (its reference and fallback); the key tests run both.
PROGRAMS = ["gpushare-front", "gpushare-runc"]
HOOK_PROGRAMS = ["gpushare-front", "nri-gpushare"]


def ctr(bed: Containerd, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(bed.ctr), "-a", str(bed.grpc_address), "-n", NS, *args],
        capture_output=True,
        text=True,
        timeout=STUCK,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"ctr {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    return done


def ctr_run(
    bed: Containerd, runtime: Path, cid: str, command: list[str], *flags: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return ctr(
        bed,
        "run",
        "--runc-binary",
        str(runtime),
        "--runc-root",
        str(bed.runc_root),
        *flags,
        BUSYBOX_IMAGE,
        cid,
        *command,
        check=check,
    )


@pytest.fixture
def bed(containerd: Containerd) -> Iterator[Containerd]:
    """The module's test bed with the busybox image in ctr's namespace; every
    container a test started with ctr is removed after it."""
    if not containerd.running:
        containerd.start()
    ctr(containerd, "images", "import", str(build_images()))
    yield containerd
    if containerd.running:
        for line in ctr(containerd, "containers", "ls", "-q", check=False).stdout.split():
            ctr(containerd, "tasks", "kill", "-s", "SIGKILL", line, check=False)
            ctr(containerd, "tasks", "rm", "-f", line, check=False)
            ctr(containerd, "containers", "rm", line, check=False)


def name() -> str:
    return "gs-" + uuid.uuid4().hex[:10]


def init_env(pid: int) -> dict[str, str]:
    """The environment the container's first process started with (what runc
    ran from the bundle gpushare-runc edited; containerd's stored spec, which
    `ctr task exec` starts from, is not edited)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return env_of([entry.decode() for entry in raw.split(b"\0") if entry])


def task_fields(bed: Containerd, cid: str) -> list[str]:
    """`ctr task ls`'s line of the task: its ID, pid and status."""
    for line in ctr(bed, "task", "ls").stdout.splitlines()[1:]:
        fields = line.split()
        if fields[0] == cid:
            return fields
    raise AssertionError(f"no task {cid}")


def task_pid(bed: Containerd, cid: str) -> int:
    return int(task_fields(bed, cid)[1])


def kill_and_remove(bed: Containerd, cid: str) -> None:
    """`ctr task kill -s SIGKILL`, then `ctr task rm` once the task has
    stopped: kill only sends the signal, and an rm at once can find the task
    still running (seen on a loaded machine)."""
    ctr(bed, "task", "kill", "-s", "SIGKILL", cid)
    deadline = time.monotonic() + STUCK
    while task_fields(bed, cid)[2] != "STOPPED":
        assert time.monotonic() < deadline, f"task {cid} did not stop after SIGKILL"
        time.sleep(0.05)
    ctr(bed, "task", "rm", cid)


def bundle_config(bed: Containerd, cid: str) -> dict:
    path = bed.base / "state" / "io.containerd.runtime.v2.task" / NS / cid / "config.json"
    return json.loads(path.read_text())


def local(plugin: PluginProcess) -> dict[str, dict]:
    """The hand-started containers' allocations in `status`, by container ID."""
    return {a["container_id"]: a for a in plugin.status()["allocations"] if a["origin"] != "nri"}


@pytest.mark.parametrize("program", PROGRAMS)
async def test_ctr_run_with_a_label_gets_its_share_next_to_a_pod(bed, start_plugin, cri, program):
    plugin = start_plugin(bed, inventory=gpu_inventory(1, "8Gi"))
    runtime = plugin.runc_wrapper(program)
    pod = await run_sleeper(cri, "pod", {P + "gpu-memory": "3Gi"})
    cid = name()
    ctr_run(bed, runtime, cid, ["sleep", "3600"], "-d", "--label", P + "gpu-memory=2Gi")
    env = init_env(task_pid(bed, cid))
    assert env["GPUSHARE_MEMORY_LIMIT"] == str(2 * GiB)
    # A process exec'd into it is given the share's variables too.
    execd = env_of(ctr(bed, "task", "exec", "--exec-id", "e", cid, "env").stdout.splitlines())
    assert execd["GPUSHARE_MEMORY_LIMIT"] == str(2 * GiB)
    assert execd["GPUSHARE_GPU_UUIDS"] == env["GPUSHARE_GPU_UUIDS"]
    assert env["GPUSHARE_GPU_UUIDS"] == plugin.status()["gpus"][0]["uuid"]
    shown = local(plugin)[cid]
    assert shown["origin"] == "runc:" + NS
    assert [s["memory"] for s in shown["gpus"]] == [2 * GiB]
    gpu = plugin.status()["gpus"][0]
    assert sorted(gpu["containers"]) == sorted([pod, cid])
    assert gpu["memory_allocated"] == 5 * GiB
    spec = bundle_config(bed, cid)  # what the wrapper gave runc
    assert P + "assigned" in spec["annotations"]
    assert "/dev/nvidia0" in [d["path"] for d in spec["linux"]["devices"]]
    kill_and_remove(bed, cid)
    assert cid not in local(plugin)
    assert reserved(plugin)[0][0] == 3 * GiB


@pytest.mark.parametrize("program", PROGRAMS)
async def test_ctr_run_rm_shows_the_share_and_gives_it_back(bed, start_plugin, program):
    plugin = start_plugin(bed, inventory=gpu_inventory(1, "8Gi"))
    runtime = plugin.runc_wrapper(program)
    cid = name()
    env = ["ALIYUN_COM_GPU_MEM_CONTAINER=6"]
    done = ctr_run(bed, runtime, cid, ["env"], "--rm", "--env", env[0])
    shown = env_of(done.stdout.splitlines())
    assert shown["GPUSHARE_MEMORY_LIMIT"] == str(6 * GiB), done.stdout
    assert local(plugin) == {}
    assert reserved(plugin)[0][0] == 0


@pytest.mark.parametrize("program", PROGRAMS)
async def test_a_request_that_does_not_fit_fails_ctr_run_with_the_reason(
    bed, start_plugin, program
):
    plugin = start_plugin(bed, inventory=gpu_inventory(1, "8Gi"))
    runtime = plugin.runc_wrapper(program)
    cid = name()
    done = ctr_run(
        bed, runtime, cid, ["true"], "--rm", "--label", P + "gpu-memory=12Gi", check=False
    )
    assert done.returncode != 0
    assert "gpushare:" in done.stderr and "12" in done.stderr, done.stderr
    assert "free" in done.stderr, done.stderr
    assert local(plugin) == {} and reserved(plugin)[0][0] == 0
    # A malformed value gets the key and what is allowed.
    bad = ctr_run(
        bed, runtime, name(), ["true"], "--rm", "--label", P + "gpu-memory=lots", check=False
    )
    assert bad.returncode != 0 and P + "gpu-memory" in bad.stderr, bad.stderr


async def test_a_container_without_a_request_runs_untouched(bed, start_plugin):
    plugin = start_plugin(bed, inventory=gpu_inventory(1, "8Gi"))
    done = ctr_run(bed, plugin.runc_wrapper(), name(), ["env"], "--rm")
    assert "GPUSHARE_" not in done.stdout
    assert local(plugin) == {}


async def test_a_pod_and_a_ctr_container_compete_for_the_last_memory(bed, start_plugin, cri):
    plugin = start_plugin(bed, inventory=gpu_inventory(1, "8Gi"))
    runtime = plugin.runc_wrapper()
    cid = name()

    async def pod() -> bool:
        try:
            await run_sleeper(cri, "rival", {P + "gpu-memory": "5Gi"})
        except Exception:
            return False
        return True

    async def hand() -> bool:
        proc = await asyncio.create_subprocess_exec(
            str(bed.ctr), "-a", str(bed.grpc_address), "-n", NS, "run", "-d",
            "--runc-binary", str(runtime), "--runc-root", str(bed.runc_root),
            "--label", P + "gpu-memory=5Gi", BUSYBOX_IMAGE, cid, "sleep", "3600",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), STUCK)
        if proc.returncode:
            assert b"gpushare:" in err, err
        return proc.returncode == 0

    won = await asyncio.gather(pod(), hand())
    assert sorted(won) == [False, True], won
    gpu = plugin.status()["gpus"][0]
    assert gpu["memory_allocated"] == 5 * GiB and len(gpu["containers"]) == 1


async def test_a_task_deleted_behind_the_daemons_back_is_reconciled(bed, start_plugin):
    """The container's process is killed and its task deleted while the
    daemon is down (no hook reaches it), containerd restarts: the daemon,
    back, releases the share from what containerd says."""
    settings = {"inventory": gpu_inventory(1, "8Gi")}
    plugin = start_plugin(bed, **settings)
    runtime = plugin.runc_wrapper()
    gone, alive = name(), name()
    for cid in (gone, alive):
        ctr_run(bed, runtime, cid, ["sleep", "3600"], "-d", "--label", P + "gpu-memory=2Gi")
    assert set(local(plugin)) == {gone, alive}
    plugin.kill()  # SIGKILL: nothing is said on the way out
    kill_and_remove(bed, gone)  # the wrapper cannot reach the daemon: released by nobody
    bed.restart()
    again = start_plugin(bed, **settings)
    deadline = asyncio.get_running_loop().time() + STUCK
    while gone in local(again):
        assert asyncio.get_running_loop().time() < deadline, again.log()[-3000:]
        await asyncio.sleep(0.1)
    assert set(local(again)) == {alive}
    assert reserved(again)[0][0] == 2 * GiB
    assert f"decision=released container={gone} origin=runc:{NS} " in again.log()


async def test_docker_run_with_the_gpushare_runtime_gets_the_cgpu_share(
    bed, start_plugin, make_dockerd
):
    """As the cGPU documents show it: ALIYUN_COM_GPU_MEM_CONTAINER=6 on a 16 GiB
    GPU gets 6 GiB; `docker rm -f` gives it back."""
    plugin = start_plugin(bed, inventory=gpu_inventory(1, "16Gi"))
    docker = make_dockerd(runtimes={"gpushare": plugin.runc_wrapper()})
    cgpu = ["-e", "ALIYUN_COM_GPU_MEM_CONTAINER=6", "-e", "ALIYUN_COM_GPU_MEM_DEV=16"]
    run = docker.docker(
        "run", "-d", "--network", "none", "--runtime", "gpushare", *cgpu,
        BUSYBOX_IMAGE, "sleep", "3600",
    )  # fmt: skip
    cid = run.stdout.strip()
    pid = int(docker.docker("inspect", "--format", "{{.State.Pid}}", cid).stdout)
    env = init_env(pid)
    assert env["GPUSHARE_MEMORY_LIMIT"] == str(6 * GiB)
    execd = env_of(docker.docker("exec", cid, "env").stdout.splitlines())
    assert execd["GPUSHARE_MEMORY_LIMIT"] == str(6 * GiB)
    shown = local(plugin)[cid]
    assert shown["origin"] == "runc:moby" and [s["memory"] for s in shown["gpus"]] == [6 * GiB]
    docker.docker("rm", "-f", cid)
    assert local(plugin) == {} and reserved(plugin)[0][0] == 0
    # More than the GPU has left fails `docker run` with the reason.
    refused = docker.docker(
        "run", "--rm", "--network", "none", "--runtime", "gpushare",
        "-e", "ALIYUN_COM_GPU_MEM_CONTAINER=20", BUSYBOX_IMAGE, "true", check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "gpushare:" in refused.stderr, refused.stderr
    assert local(plugin) == {}


def cdi_spec(plugin: PluginProcess, directory: Path, hook: str = "gpushare-front") -> Path:
    """The node's CDI spec, written by `nri-gpushare cdi generate` for
    `plugin`, its hooks run by `hook` (the front, or nri-gpushare itself)."""
    directory.mkdir(exist_ok=True)
    out = directory / "gpushare.io-gpu.json"
    subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "nri-gpushare"),
            "cdi",
            "generate",
            "--config",
            str(plugin.config_path),
            "--output",
            str(out),
            "--hook-path",
            str(ROOT / ".venv" / "bin" / hook),
        ],
        check=True,
        capture_output=True,
        timeout=STUCK,
    )
    return out


@pytest.mark.parametrize("hook", HOOK_PROGRAMS)
async def test_docker_with_a_cdi_device_asks_the_daemon_through_the_hooks(
    bed, start_plugin, make_dockerd, hook
):
    plugin = start_plugin(bed, inventory=gpu_inventory(2, "8Gi"))
    spec_dir = plugin.workdir / "cdi"
    cdi_spec(plugin, spec_dir, hook)
    docker = make_dockerd(cdi_spec_dirs=[spec_dir])
    share = ["--annotation", P + "gpu-memory=2Gi", "--annotation", P + "isolation=none"]
    run = docker.docker(
        "run", "-d", "--network", "none", "--device", "gpushare.io/gpu=1", *share,
        BUSYBOX_IMAGE, "sleep", "3600",
    )  # fmt: skip
    cid = run.stdout.strip()
    shown = local(plugin)[cid]
    assert shown["origin"] == "cdi:moby"
    assert [(s["index"], s["memory"]) for s in shown["gpus"]] == [(1, 2 * GiB)]
    pid = int(docker.docker("inspect", "--format", "{{.State.Pid}}", cid).stdout)
    uuid1 = plugin.status()["gpus"][1]["uuid"]
    assert init_env(pid)["GPUSHARE_GPU_UUIDS"] == uuid1  # the device's static env
    docker.docker("rm", "-f", cid)  # poststop releases
    assert local(plugin) == {} and reserved(plugin)[1][0] == 0
    # Enforced isolation needs the kernel module on the CDI path: refused, saying so.
    refused = docker.docker(
        "run", "--rm", "--network", "none", "--device", "gpushare.io/gpu=0",
        "--annotation", P + "gpu-memory=2Gi", BUSYBOX_IMAGE, "true", check=False,
    )  # fmt: skip
    assert refused.returncode != 0, refused.stdout
    assert "gpushare.ko" in refused.stderr and "gpushare-runc" in refused.stderr, refused.stderr
    # More than the GPU has: refused with the reason, nothing left reserved.
    big = docker.docker(
        "run", "--rm", "--network", "none", "--device", "gpushare.io/gpu=0",
        "--annotation", P + "gpu-memory=12Gi", "--annotation", P + "isolation=none",
        BUSYBOX_IMAGE, "true", check=False,
    )  # fmt: skip
    assert big.returncode != 0 and "free" in big.stderr, big.stderr
    assert local(plugin) == {} and reserved(plugin)[0][0] == 0
