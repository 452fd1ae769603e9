"""GPU share requests end to end: real containerd, real CRI pods, the real plugin
process with a static inventory (no GPU, kernel module off)."""

from __future__ import annotations

import json

import pytest

from tests.integration.plugin import gpu_inventory
from tests.testbed.cri import GRPCError

MiB, GiB = 1 << 20, 1 << 30
P = "gpushare.io/"
EGPU = "POLICY=0,ONLINE=0,TYPE=DOCKER:PGPU=0,MEM=3276,WEIGHT=10:PGPU=1,MEM=3276,WEIGHT=10"


def env_of(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines if "=" in line)


def uuids(count: int, memory: str = "16Gi") -> list[str]:
    return [g["uuid"] for g in gpu_inventory(count, memory)]


async def run_sleeper(
    cri, name: str, annotations: dict[str, str] | None = None, env: dict[str, str] | None = None
) -> str:
    """A pod whose container keeps running (and so keeps its share)."""
    pod_id = await cri.run_pod(name, annotations=annotations)
    cid = await cri.create_container(pod_id, "main", command=["sleep", "3600"], env=env)
    await cri.start(cid)
    return cid


async def refused(cri, name: str, annotations: dict[str, str]) -> str:
    pod_id = await cri.run_pod(name, annotations=annotations)
    with pytest.raises(GRPCError) as info:
        await cri.create_container(pod_id, "main", command=["sleep", "3600"])
    return info.value.message or ""


def allocation(plugin, cid: str) -> dict:
    [found] = [a for a in plugin.status()["allocations"] if a["container_id"] == cid]
    return found


def reserved(plugin) -> dict[int, tuple[int, int, int]]:
    """GPU index -> (memory allocated, core allocated, containers)."""
    return {
        g["index"]: (g["memory_allocated"], g["core_allocated"], len(g["containers"]))
        for g in plugin.status()["gpus"]
    }


async def test_two_gib_share_on_two_gpus(containerd, start_plugin, cri):
    plugin = start_plugin(containerd, inventory=gpu_inventory(2, "16Gi"))
    run = await cri.run_container(
        ["sh", "-c", "env; ls -l /dev/nvidia0 /dev/nvidiactl"],
        pod_annotations={P + "gpu-memory": "2Gi"},
    )
    env = env_of(run.lines)
    assert run.exit_code == 0, run.lines
    assert env["GPUSHARE_MEMORY_LIMIT"] == "2147483648"
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuids(1)[0]  # binpack: first GPU
    assert env["GPUSHARE_GPU_UUIDS"] == uuids(1)[0]
    assert env["GPUSHARE_PRIORITY"] == "normal"
    assert "GPUSHARE_CORE_LIMIT" not in env
    devices = [line for line in run.lines if line.startswith("c")]
    assert any("195,   0" in line and "/dev/nvidia0" in line for line in devices), devices
    assert any("195, 255" in line and "/dev/nvidiactl" in line for line in devices), devices
    info = await cri.container_info(run.container_id)
    assigned = json.loads(info["runtimeSpec"]["annotations"][P + "assigned"])
    assert [g["uuid"] for g in assigned["gpus"]] == [uuids(1)[0]]
    # The container exited: StopContainer released its share.
    assert plugin.status()["allocations"] == []


async def test_egpu_case4_partial_reservation_rolls_back(containerd, start_plugin, cri):
    """Acceptance case 4 (docs/acceptance-cases.md): 20480+20480+40960 MiB on
    32 GiB cards is refused; nothing stays."""
    plugin = start_plugin(containerd, inventory=gpu_inventory(4, "32Gi"))
    message = await refused(cri, "case4", {P + "gpu-memory": "20480Mi,20480Mi,40960Mi"})
    assert "GPU" in message and "40960Mi" in message, message
    assert "8192Mi" in message, message  # the shortfall on a 32768Mi card
    assert all(v == (0, 0, 0) for v in reserved(plugin).values())
    assert plugin.status()["allocations"] == []


async def test_egpu_case5_full_cards_refuse_a_fourth(containerd, start_plugin, cri):
    plugin = start_plugin(containerd, inventory=gpu_inventory(4, "32Gi"))
    for index in range(3):
        await run_sleeper(
            cri, f"fill{index}", {P + "gpu-memory": "32768Mi", P + "gpu-devices": str(index)}
        )
    before = reserved(plugin)
    message = await refused(cri, "fourth", {P + "gpu-memory": "1024Mi", P + "gpu-devices": "0,1,2"})
    for index in range(3):
        assert f"GPU {index} ({uuids(4)[index]})" in message, message
    assert "gpu-memory 1024Mi exceeds the free 0Mi by 1024Mi" in message, message
    assert reserved(plugin) == before
    assert len(plugin.status()["allocations"]) == 3


async def test_egpu_case6_core_110_refused_before_reserving(containerd, start_plugin, cri):
    plugin = start_plugin(containerd, inventory=gpu_inventory(4, "32Gi"))
    message = await refused(cri, "case6", {P + "gpu-memory": "1024Mi", P + "gpu-core": "110"})
    assert "gpushare.io/gpu-core" in message and "110" in message, message
    assert plugin.status()["allocations"] == []


async def test_egpu_case7_full_compute_refuses_ten_percent(containerd, start_plugin, cri):
    plugin = start_plugin(containerd, inventory=gpu_inventory(4, "32Gi"))
    for name, core in (("a", "25"), ("b", "25"), ("c", "50")):
        await run_sleeper(
            cri, name, {P + "gpu-memory": "1024Mi", P + "gpu-core": core, P + "gpu-count": "4"}
        )
    assert {v[1] for v in reserved(plugin).values()} == {100}
    message = await refused(cri, "d", {P + "gpu-memory": "1024Mi", P + "gpu-core": "10"})
    for index in range(4):
        assert f"GPU {index} ({uuids(4)[index]})" in message, message
    assert "gpu-core 10% exceeds the free 0% by 10%" in message, message
    assert {v[1] for v in reserved(plugin).values()} == {100}
    assert len(plugin.status()["allocations"]) == 3


@pytest.mark.parametrize(("placement", "expected"), [("binpack", [0, 0]), ("spread", [0, 1])])
async def test_binpack_and_spread_example(containerd, start_plugin, cri, placement, expected):
    """The placement example (docs/acceptance-cases.md): 2 x 15 GiB; pod1 2 GiB, pod2 3 GiB."""
    plugin = start_plugin(containerd, inventory=gpu_inventory(2, "15Gi"), placement=placement)
    first = await run_sleeper(cri, "pod1", {P + "gpu-memory": "2"})
    second = await run_sleeper(cri, "pod2", {P + "gpu-memory": "3"})
    placed = [allocation(plugin, cid)["gpus"][0]["index"] for cid in (first, second)]
    assert placed == expected


async def test_placement_annotation_beats_node_default(containerd, start_plugin, cri):
    plugin = start_plugin(containerd, inventory=gpu_inventory(2, "15Gi"))
    first = await run_sleeper(cri, "pod1", {P + "gpu-memory": "2"})
    second = await run_sleeper(cri, "pod2", {P + "gpu-memory": "3", P + "placement": "spread"})
    assert allocation(plugin, first)["gpus"][0]["index"] == 0
    assert allocation(plugin, second)["gpus"][0]["index"] == 1


ENV_SOURCES = {"pods": {"env": True}}  # cGPU/eGPU variables in pods are opt-in


async def test_cgpu_short_list_on_four_gpus(containerd, start_plugin, cri):
    start_plugin(containerd, inventory=gpu_inventory(4, "16Gi"), sources=ENV_SOURCES)
    run = await cri.run_container_env(env={"ALIYUN_COM_GPU_MEM_CONTAINER": "3,1"})
    env = env_of(run.lines)
    assert env["GPUSHARE_MEMORY_LIMIT"] == f"{3 * GiB},{GiB},{GiB},{GiB}"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids(4))


async def test_egpu_string_is_honoured(containerd, start_plugin, cri):
    start_plugin(containerd, inventory=gpu_inventory(4, "32Gi"), sources=ENV_SOURCES)
    run = await cri.run_container_env(env={"EGPU": EGPU, "NVIDIA_VISIBLE_DEVICES": "0,1"})
    env = env_of(run.lines)
    assert env["GPUSHARE_MEMORY_LIMIT"] == f"{3276 * MiB},{3276 * MiB}"
    assert env["GPUSHARE_CORE_LIMIT"] == "10,10"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids(2))


async def test_stop_and_remove_release_everything(containerd, start_plugin, cri):
    plugin = start_plugin(containerd, inventory=gpu_inventory(2, "16Gi"))
    stopped = await run_sleeper(cri, "stopped", {P + "gpu-memory": "4Gi"})
    removed = await run_sleeper(cri, "removed", {P + "gpu-memory": "2Gi", P + "gpu-core": "20"})
    assert len(plugin.status()["allocations"]) == 2
    await cri.stop(stopped)
    assert [a["container_id"] for a in plugin.status()["allocations"]] == [removed]
    await cri.remove(removed)  # CRI stops it first; tests/unit/test_daemon covers remove alone
    await cri.cleanup()
    assert plugin.status()["allocations"] == []
    assert all(v == (0, 0, 0) for v in reserved(plugin).values())


async def test_plugin_restart_keeps_identical_allocations(containerd, start_plugin, cri):
    first = start_plugin(containerd, inventory=gpu_inventory(2, "16Gi"))
    await run_sleeper(cri, "a", {P + "gpu-memory": "6Gi", P + "gpu-core": "30"})
    await run_sleeper(cri, "b", {P + "gpu-memory": "3Gi,1Gi", P + "gpu-count": "2"})
    await run_sleeper(cri, "c", {P + "gpu-memory": "2Gi", P + "priority": "high"})
    before = first.status()
    assert first.stop() == 0
    second = start_plugin(containerd, inventory=gpu_inventory(2, "16Gi"))
    after = second.status()
    assert after["allocations"] == before["allocations"]
    assert after["gpus"] == before["gpus"]
    # No double allocation: a new request sees the same free memory.
    cid = await run_sleeper(cri, "d", {P + "gpu-memory": "1Gi"})
    assert len(second.status()["allocations"]) == 4
    assert allocation(second, cid)["gpus"][0]["memory"] == GiB


async def test_container_stopped_while_plugin_down_is_released(containerd, start_plugin, cri):
    first = start_plugin(containerd, inventory=gpu_inventory(2, "16Gi"))
    kept = await run_sleeper(cri, "kept", {P + "gpu-memory": "2Gi"})
    gone = await run_sleeper(cri, "gone", {P + "gpu-memory": "5Gi"})
    first.kill()  # no clean shutdown: the plugin never hears of the stop below
    await cri.stop(gone)
    second = start_plugin(containerd, inventory=gpu_inventory(2, "16Gi"))
    assert [a["container_id"] for a in second.status()["allocations"]] == [kept]
    assert reserved(second)[0] == (2 * GiB, 0, 1)
