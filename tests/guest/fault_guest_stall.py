"""A hung gpushare.ko write and a SIGSTOPped plugin: containerd is answered or
times out cleanly, and the plugin recovers by itself.

The hung write: tests/guest/kprobe_hang/gs_hang.ko holds the module's command
lock (gs_cfg_lock), so a write to /proc/gpushare/inst_ctl sleeps in the
kernel as on a stuck machine.  CreateContainer with a share must then fail
with a message that names the module (the plugin's kmod worker gives up),
the plugin must go on answering (status, a container without a share, a
second share refused at once), and once the lock is let go the registration
that waited is undone by itself and the next share is placed and registered.

The SIGSTOPped plugin: CreateContainer is answered by containerd once its
NRI request timeout has passed (containerd 1.7 fails open: the container is
created without its share); after SIGCONT the same plugin process notices
the closed connection, registers again, lists the container as unserved,
and serves the next one.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from grpclib.exceptions import GRPCError

from tests.guest.fault_support import (
    P,
    consistent,
    create,
    live_containers,
    report,
    until,
)
from tests.guest.kmod_support import refcount, registered

HANG_KO = os.environ.get("GPUSHARE_HANG_KO", "")
PARAMS = Path("/sys/module/gs_hang/parameters")
SHARE = {P + "gpu-memory": "1Gi", P + "gpu-core": "20"}


def held() -> bool:
    return (PARAMS / "held").read_text().strip() == "1"


def hold(ms: int) -> None:
    (PARAMS / "hold_ms").write_text(str(ms))


async def test_a_hung_module_write_fails_the_create_and_the_plugin_recovers(bed, plugins, client):
    if not HANG_KO:
        pytest.fail("GPUSHARE_HANG_KO (tests/guest/kprobe_hang's module) is not set")
    plugin = plugins.running()
    subprocess.run(["insmod", HANG_KO], check=True)
    try:
        pod = await client.run_pod("hang")
        before = await create(client, pod, "before", SHARE)  # the module answers
        assert registered() == [before]

        hold(60000)
        await until(held, "gs_hang to take gpushare's lock")
        # A write now sleeps in the kernel; CreateContainer must still be answered.
        with pytest.raises(GRPCError) as first:
            await create(client, pod, "hung", SHARE)
        message = first.value.message or ""
        assert "gpushare.ko" in message and "did not answer" in message, message
        # The plugin is not wedged: status answers, no-share containers are
        # created, and a second share is refused at once while the module is stuck.
        status = plugin.status()
        assert [a["container_id"] for a in status["allocations"]] == [before], status
        plain = await create(client, pod, "plain", None)
        with pytest.raises(GRPCError) as second:
            await create(client, pod, "second", SHARE)
        message = second.value.message or ""
        assert "gpushare.ko has not answered" in message, message
        assert held()  # all of it while the lock was held
        assert registered() == [before]  # the hung write has not happened yet

        hold(0)
        await until(lambda: not held(), "gs_hang to let go")
        # The registration that waited in the kernel is undone by the plugin.
        await until(lambda: registered() == [before], "the late registration undone")
        after = await create(client, pod, "after", SHARE)
        await client.start(after)
        # gs_hang pins gpushare.ko: one reference more than the registrations
        assert sorted(registered()) == sorted([before, after]) and refcount() == 3
        assert plugin.proc is not None and plugin.proc.poll() is None  # the same process
        counts = await consistent(client, plugin, pinned=1)
        assert counts == {"served": 2, "unserved": 0}, counts
        assert plain not in {a["container_id"] for a in plugin.status()["allocations"]}
        report("hung_module_write", {"first": first.value.message, "second": second.value.message})
    finally:
        if PARAMS.exists():
            hold(0)
        subprocess.run(["rmmod", "gs_hang"], check=False)


async def test_a_sigstopped_plugin_is_timed_out_and_recovers_after_sigcont(bed, plugins, client):
    plugin = plugins.running()
    assert plugin.proc is not None
    sessions = plugin.status()["nri"]["sessions"]
    pod = await client.run_pod("stop")
    served = await create(client, pod, "served", SHARE)
    await client.start(served)

    plugin.proc.send_signal(signal.SIGSTOP)
    try:
        # containerd answers once its NRI request timeout has passed.
        stalled = await create(client, pod, "stalled", SHARE)
        await client.start(stalled)
    finally:
        plugin.proc.send_signal(signal.SIGCONT)
    live = await live_containers(client)
    assert stalled in live.unserved and served in live.served, live
    assert registered() == [served]

    # The same process comes back by itself on a new connection.
    await until(
        lambda: (
            plugin.status()["nri"]["sessions"] > sessions and plugin.status()["nri"]["connected"]
        ),
        "the plugin to register again",
    )
    assert plugin.proc.poll() is None
    counts = await consistent(client, plugin)
    assert counts == {"served": 1, "unserved": 1}, counts
    assert [u["container_id"] for u in plugin.status()["unserved"]] == [stalled]
    again = await create(client, pod, "again", SHARE)
    await client.start(again)
    assert sorted(registered()) == sorted([served, again])
    counts = await consistent(client, plugin)
    assert counts == {"served": 2, "unserved": 1}, counts
    report(
        "sigstop",
        {"sessions_before": sessions, "sessions_after": plugin.status()["nri"]["sessions"]},
    )
