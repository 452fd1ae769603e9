"""Values a hostile tenant sets on a pod, a container or an image, through real
CRI pods: the plugin refuses them with a short message naming the key and what
is allowed (never an internal error or a transport error), or ignores what is
not its business."""

from __future__ import annotations

import pytest

from tests.integration.plugin import gpu_inventory
from tests.testbed.cri import GRPCError

GiB = 1 << 30
P = "gpushare.io/"
LONG = "1" * 5000  # beyond Python's int() limit of 4,300 digits
TOO_LONG = "longer than 64 characters"
SHORT_MESSAGE = 1000  # characters: a refusal quotes a value's start, never all of it
# Pods may also ask through labels and the environment here (annotations only by default).
SOURCES = {"pods": {"labels": True, "env": True}}


def start(start_plugin, containerd):
    return start_plugin(containerd, inventory=gpu_inventory(2, "16Gi"), sources=SOURCES)


async def refusal(
    cri,
    name: str,
    annotations: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> str:
    pod_id = await cri.run_pod(name, annotations=annotations)
    with pytest.raises(GRPCError) as info:
        await cri.create_container(
            pod_id, "main", command=["sleep", "3600"], env=env, labels=labels
        )
    return info.value.message or ""


def assert_clear(message: str, *wanted: str) -> None:
    assert "internal error" not in message, message[:2000]
    assert len(message) < SHORT_MESSAGE, message[:2000]
    for text in wanted:
        assert text in message, message


@pytest.mark.parametrize(
    ("annotations", "env", "wanted"),
    [
        ({P + "gpu-memory": "1Gi", P + "gpu-core": LONG}, None, (P + "gpu-core", "multiple of 5")),
        ({P + "gpu-memory": "1Gi", P + "gpu-count": LONG}, None, (P + "gpu-count", "whole")),
        ({P + "gpu-memory": LONG}, None, (P + "gpu-memory", TOO_LONG)),
        ({P + "gpu-memory": "1" * 1_000_000}, None, (P + "gpu-memory", TOO_LONG)),
        ({P + "gpu-memory": "1Gi", P + "gpu-devices": LONG}, None, (P + "gpu-devices", "GPU")),
        (None, {"ALIYUN_COM_GPU_MEM_CONTAINER": LONG}, ("ALIYUN_COM_GPU_MEM_CONTAINER", "GiB")),
        (None, {"EGPU": f"PGPU=0,MEM={LONG}"}, ("EGPU", "MiB")),
    ],
    ids=["gpu-core", "gpu-count", "gpu-memory", "gpu-memory-1M", "gpu-devices", "cgpu", "egpu"],
)
async def test_long_numbers_are_refused_clearly(
    containerd, start_plugin, cri, annotations, env, wanted
):
    plugin = start(start_plugin, containerd)
    message = await refusal(cri, "long", annotations, env)
    assert_clear(message, *wanted)
    assert plugin.status()["allocations"] == []


async def test_a_3mb_value_gets_a_short_refusal_naming_the_key(containerd, start_plugin, cri):
    plugin = start(start_plugin, containerd)
    message = await refusal(cri, "huge", {P + "gpu-memory": "x" * (3 << 20)})
    assert_clear(message, P + "gpu-memory", "not a memory size", "3145728 characters")
    assert plugin.status()["allocations"] == []


async def test_sizes_are_integer_exact(containerd, start_plugin, cri):
    # 1 GiB and 1e-28 GiB: not whole bytes (28-digit decimal arithmetic rounds it to 1 GiB).
    start(start_plugin, containerd)
    message = await refusal(cri, "exact", {P + "gpu-memory": "1.0000000000000000000000000001Gi"})
    assert_clear(message, P + "gpu-memory", "not a whole number of bytes")


async def test_full_width_digits_are_not_a_size(containerd, start_plugin, cri):
    start(start_plugin, containerd)
    message = await refusal(cri, "wide", {P + "gpu-memory": "\uff12Gi"})
    assert_clear(message, P + "gpu-memory=\uff12Gi", "not a memory size", "Ki Mi Gi Ti")


async def test_unknown_gpushare_label_from_the_image_is_ignored(containerd, start_plugin, cri):
    # containerd merges image labels into the container's labels: a label such as
    # gpushare.io/maintainer is not a request and must not stop the container.
    plugin = start(start_plugin, containerd)
    pod_id = await cri.run_pod("labelled", annotations={P + "gpu-memory": "1Gi"})
    cid = await cri.create_container(
        pod_id, "main", command=["sleep", "3600"], labels={P + "maintainer": "x"}
    )
    await cri.start(cid)
    [found] = [a for a in plugin.status()["allocations"] if a["container_id"] == cid]
    assert [g["memory"] for g in found["gpus"]] == [GiB]
    assert f"{P}maintainer" in plugin.log() and "ignored" in plugin.log()


async def test_unknown_gpushare_pod_annotation_is_still_refused(containerd, start_plugin, cri):
    start(start_plugin, containerd)
    message = await refusal(cri, "typo", {P + "gpu-memory": "1Gi", P + "gpu-memroy": "2Gi"})
    assert_clear(message, P + "gpu-memroy", "not a known key")
