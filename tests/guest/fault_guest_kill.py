"""The plugin SIGKILLed at random points of pod lifecycles, with gpushare.ko.

`fault_support.Chaos` (4 lifecycles at once through CRI, LIFECYCLES in all,
KILLS of their steps drawn from the seed get a SIGKILL of the plugin, a new
plugin at once while the lifecycles go on) with the module's side of
`consistent()` after each restart: registrations, their memory, the cgroup
binding and the reference count match the allocations, which match the
live containers whose spec has the share.  At the end, with every pod
removed, nothing is allocated or registered.

Under TCG a lifecycle takes seconds, so CI runs a few here; the 200
lifecycles run on the host test bed (tests/integration/test_faults.py).
The seed is $GPUSHARE_FAULT_SEED (printed by the host driver);
GPUSHARE_FAULT_LIFECYCLES and GPUSHARE_FAULT_KILLS change the size.
"""

from __future__ import annotations

import os

from tests.guest.fault_support import Chaos, consistent, report, rng, seed, served_lifecycle
from tests.guest.kmod_support import refcount, registered
from tests.integration.plugin import PluginProcess

LIFECYCLES = int(os.environ.get("GPUSHARE_FAULT_LIFECYCLES") or 8)
KILLS = int(os.environ.get("GPUSHARE_FAULT_KILLS") or 1)


async def test_sigkill_at_random_points_of_pod_lifecycles(bed, plugins, client):
    plugins.running()

    async def check(plugin: PluginProcess) -> dict[str, int]:
        return await consistent(client, plugin)

    chaos = Chaos(client, plugins, rng("lifecycles"), check, lifecycles=LIFECYCLES, kills=KILLS)
    summary = {"seed": seed(), **await chaos.run()}
    report("sigkill_lifecycles", summary)
    print(summary)

    plugin = plugins.running()
    assert await consistent(client, plugin) == {"served": 0, "unserved": 0}
    await served_lifecycle(client, plugin)
    assert registered() == [] and refcount() == 0
    assert plugin.status()["allocations"] == []
    assert chaos.kills >= 1, summary
    assert chaos.checks, summary
