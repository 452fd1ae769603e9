"""Synchronize with many containers, from a real containerd, over ttrpc's 4 MiB.

A node's pods and containers reach a (re)connecting plugin in one
Synchronize.  NRI 0.8 (containerd 2.0/2.1, 1.7.26+) splits one that ttrpc
refuses to send (over 4 MiB) into requests flagged `more`, and closes a plugin
that answers one of those with updates; NRI 0.6 (containerd 1.7.24) sends it
whole (its ttrpc does not refuse it).  Here the containers' environments make the node's
Synchronize about 6 MiB; some pods ask for a share while no plugin runs, so
the plugin must list exactly those containers as unserved.
"""

from __future__ import annotations

import re

import pytest

from tests.testbed.containerd import Containerd

pytestmark = pytest.mark.containerd

P = "gpushare.io/"
PODS, PER_POD = 12, 3
ASKING = range(0, PODS, 4)  # pods 0, 4, 8 ask for a share
ENV_BYTES = 170 * 1024  # per container, in 64 KiB variables (execve's limit is 128 KiB each)


def big_env(seed: int) -> dict[str, str]:
    left, env, i = ENV_BYTES, {}, 0
    while left > 0:
        size = min(left, 64 * 1024)
        env[f"FILL_{i}"] = f"{seed:04d}" * (size // 4)
        left, i = left - size, i + 1
    return env


async def test_a_synchronize_over_four_mib_reaches_the_plugin_whole(make_containerd, start_plugin):
    bed: Containerd = make_containerd(log_level="debug")
    asking: set[str] = set()
    async with bed.cri_client() as cri:
        for p in range(PODS):
            annotations = {P + "gpu-memory": "1Gi"} if p in ASKING else None
            pod_id = await cri.run_pod(f"sync-{p}", annotations=annotations)
            for c in range(PER_POD):
                cid = await cri.create_container(
                    pod_id, f"c{c}", command=["sleep", "3600"], env=big_env(p * PER_POD + c)
                )
                await cri.start(cid)
                if p in ASKING:
                    asking.add(cid)
        seen = len(bed.log_text())
        plugin = start_plugin(bed, unserved="warn")  # listed, not killed
        synced = re.search(r"synchronized: (\d+) pod\(s\), (\d+) container\(s\)", plugin.log())
        assert synced, plugin.log()[-3000:]
        assert (int(synced[1]), int(synced[2])) == (PODS, PODS * PER_POD)
        assert {e["container_id"] for e in plugin.status()["unserved"]} == asking
        sends = re.findall(
            r"sending sync message, (\d+)/\d+, (\d+)/\d+ \(more: (\w+)\)", bed.log_text()[seen:]
        )
        if bed.version >= (2, 0, 0):  # NRI 0.8: split after ttrpc refused the whole
            assert len(sends) > 2 and sends[-1][2] == "false", sends
            assert sum(int(c) for _, c, _ in sends[1:]) == PODS * PER_POD, sends
        else:
            assert sends == []  # NRI 0.6 never splits (nor logs such a line)
