"""The daemon's translation between NRI messages and the share domain."""

from __future__ import annotations

import pytest

from nri_gpushare.api import lite, nri
from nri_gpushare.config import ConfigError, parse_config
from nri_gpushare.daemon import (
    GpuShareHandler,
    adjustment,
    build_service,
    container_info,
    kmod_worker,
)
from nri_gpushare.share.model import DeviceNode, InjectionPlan, Mount
from nri_gpushare.stub import PluginError
from tests.fakes import FakeKernelModule, Inline

UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
INVENTORY = [{"index": 0, "uuid": UUID, "memory": "16Gi"}]


def views(pod: nri.PodSandbox, container: nri.Container):
    request = lite.decode_create_container_request(
        bytes(nri.CreateContainerRequest(pod=pod, container=container))
    )
    return request.pod, request.container


def test_container_info_reads_pod_and_container():
    pod, container = views(
        nri.PodSandbox(
            id="p",
            name="train",
            namespace="ml",
            uid="u1",
            annotations={"gpushare.io/gpu-memory": "2Gi"},
        ),
        nri.Container(
            id="c",
            name="main",
            labels={"a": "b"},
            annotations={"x": "y"},
            env=["A=1", "B=x=y", "EMPTY="],
            linux=nri.LinuxContainer(cgroups_path="/k8s.io/c"),
        ),
    )
    info = container_info(pod, container)
    assert (info.id, info.name, info.pod_name, info.pod_namespace, info.pod_uid) == (
        "c",
        "main",
        "train",
        "ml",
        "u1",
    )
    assert info.pod_annotations == {"gpushare.io/gpu-memory": "2Gi"}
    assert info.labels == {"a": "b"} and info.annotations == {"x": "y"}
    assert info.env == {"A": "1", "B": "x=y", "EMPTY": ""}
    assert info.cgroups_path == "/k8s.io/c"


def test_adjustment_carries_the_plan():
    plan = InjectionPlan(
        devices=(DeviceNode("/dev/nvidia0", "c", 195, 0),),
        env={"GPUSHARE_MEMORY_LIMIT": "2147483648"},
        annotations={"gpushare.io/assigned": "{}"},
        mounts=(Mount("/host/lib", "/usr/lib/gpushare"),),
    )
    encoded = lite.encode_create_container_response(adjustment(plan))
    adjust = nri.CreateContainerResponse().parse(encoded).adjust
    [device] = adjust.linux.devices
    assert (device.path, device.type, device.major, device.minor) == ("/dev/nvidia0", "c", 195, 0)
    assert device.file_mode.value == 0o666
    assert [(kv.key, kv.value) for kv in adjust.env] == [("GPUSHARE_MEMORY_LIMIT", "2147483648")]
    assert adjust.annotations == {"gpushare.io/assigned": "{}"}
    [mount] = adjust.mounts
    assert (mount.source, mount.destination, mount.options) == (
        "/host/lib",
        "/usr/lib/gpushare",
        ["rbind", "ro"],
    )


async def test_kmod_required_without_module_refuses_to_start(tmp_path):
    config = parse_config(
        {
            "kmod": "required",
            "kmod_root": str(tmp_path / "none"),
            "use_nvml": False,
            "inventory": INVENTORY,
        }
    )
    kmod = kmod_worker(config)
    with pytest.raises(ConfigError, match="kmod: required.*not loaded"):
        await build_service(config, kmod)


async def test_no_gpus_is_a_config_error():
    with pytest.raises(ConfigError, match="no GPUs"):
        await build_service(parse_config({"use_nvml": False, "kmod": "off"}), None)


async def test_handler_refusal_is_a_plugin_error_and_release_is_idempotent():
    config = parse_config({"kmod": "optional", "use_nvml": False, "inventory": INVENTORY})
    kmod = FakeKernelModule()
    handler = GpuShareHandler(await build_service(config, Inline(kmod)))
    pod, big = views(
        nri.PodSandbox(id="p", name="p", annotations={"gpushare.io/gpu-memory": "17Gi"}),
        nri.Container(id="big", name="main"),
    )
    with pytest.raises(PluginError, match="GPU 0"):
        await handler.create_container(pod, big)
    pod, ok = views(
        nri.PodSandbox(id="p", name="p", annotations={"gpushare.io/gpu-memory": "1Gi"}),
        nri.Container(id="ok", name="main"),
    )
    assert await handler.create_container(pod, ok) is not None
    assert [r.container_id for r in kmod.registrations()] == ["ok"]
    await handler.stop_container(pod, ok)
    await handler.remove_container(pod, ok)
    assert kmod.registrations() == [] and handler.service.allocations == {}


async def test_remove_without_stop_releases():
    config = parse_config({"kmod": "optional", "use_nvml": False, "inventory": INVENTORY})
    kmod = FakeKernelModule()
    handler = GpuShareHandler(await build_service(config, Inline(kmod)))
    pod, container = views(
        nri.PodSandbox(id="p", name="p", annotations={"gpushare.io/gpu-memory": "1Gi"}),
        nri.Container(id="c", name="main"),
    )
    await handler.create_container(pod, container)
    await handler.remove_container(pod, container)  # e.g. after a crash: no StopContainer
    assert handler.service.allocations == {} and kmod.registrations() == []
