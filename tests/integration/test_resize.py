"""`nri-gpushare resize` on the CRI test bed: the real CLI asking the real
plugin process about real pods and a container started by hand (ctr through
gpushare-runc).  The test bed has no kernel module, so every share here runs
standalone and a resize of it must be refused, saying why, with nothing
changed and nothing recorded: a plugin restarted afterwards holds the share
as created.  The refusals that come before the module (a bad value, no room,
a share the kubelet accounted) are those a node with the module gives too;
the applied path is the guest's (tests/guest/e2e_guest_nri.py) and the
domain tests' (tests/unit/test_resize.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nri_gpushare.names import MEMORY
from tests.integration.plugin import ROOT, PluginProcess, gpu_inventory
from tests.integration.test_hand_started import bed, ctr_run, kill_and_remove, name  # noqa: F401
from tests.integration.test_kubelet_requests import Kubelet, sleeper
from tests.integration.test_share_e2e import allocation, reserved, run_sleeper

pytestmark = pytest.mark.containerd

GiB = 1 << 30
P = "gpushare.io/"


def resize(plugin: PluginProcess, container: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nri_gpushare.cli.main", "resize", container, *args]
        + ["--config", str(plugin.config_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def shares(plugin: PluginProcess, cid: str) -> list[tuple[int, int, int]]:
    return [(g["index"], g["memory"], g["core"]) for g in allocation(plugin, cid)["gpus"]]


async def test_a_running_pod_is_refused_clearly_and_keeps_its_share_across_a_restart(
    containerd, start_plugin, cri
):
    plugin = start_plugin(containerd, inventory=gpu_inventory(1, "8Gi"))
    cid = await run_sleeper(cri, "nb", {P + "gpu-memory": "1Gi", P + "gpu-core": "30"})
    await run_sleeper(cri, "other", {P + "gpu-memory": "5Gi"})
    before = (shares(plugin, cid), reserved(plugin))

    bad = resize(plugin, cid[:12], "--memory", "3Gx")
    assert bad.returncode == 1 and "memory '3Gx'" in bad.stderr, bad.stderr

    over = resize(plugin, cid[:12], "--memory", "4Gi")
    assert over.returncode == 1, over.stderr
    assert "cannot resize container 'main' (pod default/nb)" in over.stderr
    assert "memory 4096Mi exceeds the 3072Mi it can have" in over.stderr, over.stderr

    for args in (["--memory", "2Gi"], ["--core", "50"], ["--priority", "high"]):
        live = resize(plugin, cid[:12], *args)
        assert live.returncode == 1, live.stderr
        assert "cannot resize container 'main' (pod default/nb) live" in live.stderr
        assert "runs standalone" in live.stderr and "(kmod: off)" in live.stderr
        assert "GPUSHARE_MEMORY_LIMIT" in live.stderr and "nothing was changed" in live.stderr
    assert (shares(plugin, cid), reserved(plugin)) == before
    assert allocation(plugin, cid)["resized"] is False
    assert "decision=refused" in plugin.log() and "operation=resize" in plugin.log()

    # A restarted plugin holds what was created: nothing was recorded as resized.
    plugin.stop()
    again = start_plugin(containerd, inventory=gpu_inventory(1, "8Gi"))
    assert (shares(again, cid), reserved(again)) == before
    unknown = resize(again, "nosuch", "--memory", "1Gi")
    assert unknown.returncode == 1 and "no container holding a share" in unknown.stderr


async def test_a_pod_the_kubelet_accounted_is_told_how_to_resize(containerd, start_plugin, cri):
    plugin = start_plugin(containerd, inventory=gpu_inventory(1, "16Gi"))
    annotations = await Kubelet(plugin, 1, 16 * GiB).allocate({MEMORY: 2})
    cid = await sleeper(cri, "limits", annotations=annotations)
    before = shares(plugin, cid)
    done = resize(plugin, cid, "--memory", "4Gi")
    assert done.returncode == 1
    assert "its share comes from the pod's resources.limits (gpushare.io/gpu-memory)" in (
        done.stderr
    )
    assert "recreating it with new resources.limits" in done.stderr
    assert "in-place pod resize does not cover extended resources" in done.stderr
    assert shares(plugin, cid) == before


async def test_a_container_started_by_hand_is_resized_through_the_same_path(bed, start_plugin):  # noqa: F811
    plugin = start_plugin(bed, inventory=gpu_inventory(1, "8Gi"))
    cid = name()
    ctr_run(
        bed, plugin.runc_wrapper(), cid, ["sleep", "3600"], "-d", "--label", P + "gpu-memory=2Gi"
    )
    before = shares(plugin, cid)
    over = resize(plugin, cid, "--memory", "9Gi")
    assert over.returncode == 1 and f"container '{cid}' (runc:default)" in over.stderr
    assert "exceeds the 8192Mi it can have" in over.stderr, over.stderr
    live = resize(plugin, cid, "--memory", "3Gi")
    assert live.returncode == 1 and "runs standalone" in live.stderr, live.stderr
    same = resize(plugin, cid, "--memory", "2Gi")  # already so: nothing to refuse
    assert same.returncode == 0 and same.stdout.startswith("unchanged"), same.stderr
    assert shares(plugin, cid) == before
    kill_and_remove(bed, cid)
