"""The DRA driver's kubelet plugin (`nri_gpushare.k8s.dra.kubelet`) against
a fake Preparer and the test kubelet (tests/k8s/dra_kubelet.py): registration,
NodePrepareResources / NodeUnprepareResources and their errors, sockets
served again, a kubelet restart, the health stream; and the generated
bindings: up to date with the protos, on the wire as the kubelet's API."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from grpclib.client import Channel

from nri_gpushare.k8s.dra import ClaimError, ClaimRef, DeviceHealth, PreparedDevice
from nri_gpushare.k8s.dra.kubelet import KubeletPlugin
from nri_gpushare.k8s.generated.dra import pluginregistration as reg
from nri_gpushare.k8s.generated.dra import v1 as health_v1
from nri_gpushare.k8s.generated.dra import v1alpha1 as health_v1alpha1
from nri_gpushare.k8s.generated.dra.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from nri_gpushare.k8s.generated.dra.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_v1beta1
from tests.k8s.dra_kubelet import DraKubelet
from tests.unit.test_schema_bindings import PLUGIN, PROTOC, TOP, _require, _tree

DRIVER = "gpushare.io"
GENERATED = TOP / "nri_gpushare" / "k8s" / "generated" / "dra"


def device(uid: str, share: str = "") -> PreparedDevice:
    return PreparedDevice(("gpu",), "node-a", "gpu-0", (f"gpushare.io/claim={uid}",), share)


class FakePreparer:
    """Devices per claim UID; `fail[uid]` an exception to raise; `hang` a
    set of UIDs that wait for `release`; every call and the peak of calls at once."""

    def __init__(self) -> None:
        self.devices: dict[str, list[PreparedDevice]] = {}
        self.fail: dict[str, BaseException] = {}
        self.hang: set[str] = set()
        self.release = asyncio.Event()
        self.calls: list[tuple[str, ClaimRef]] = []
        self.running = self.peak = 0
        self.healths = [
            DeviceHealth("node-a", "gpu-0", True),
            DeviceHealth("node-a", "gpu-1", True),
        ]

    async def _call(self, verb: str, claim: ClaimRef) -> None:
        self.calls.append((verb, claim))
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            if claim.uid in self.hang:
                await self.release.wait()
            await asyncio.sleep(0)
            if claim.uid in self.fail:
                raise self.fail[claim.uid]
        finally:
            self.running -= 1

    async def prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        await self._call("prepare", claim)
        return self.devices.get(claim.uid, [device(claim.uid)])

    async def unprepare(self, claim: ClaimRef) -> None:
        await self._call("unprepare", claim)

    def health(self) -> list[DeviceHealth]:
        return list(self.healths)


@dataclass
class Node:
    top: Path
    preparer: FakePreparer
    plugin: KubeletPlugin
    kubelet: DraKubelet
    stop: asyncio.Event
    task: asyncio.Task[None]


@pytest.fixture
def top() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gs-dra-", dir="/tmp"))  # short: socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def start(top: Path, speaks: tuple[str, ...] = ("v1.DRAPlugin",), **kw: float) -> Node:
    preparer = FakePreparer()
    plugin = KubeletPlugin(
        preparer,
        plugin_dir=str(top / "plugins" / DRIVER),
        registry_dir=str(top / "registry"),
        poll=0.05,
        health_poll=0.05,
        **kw,  # type: ignore[arg-type]
    )
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    kubelet = DraKubelet(top / "registry", speaks=speaks)
    await kubelet.start()
    return Node(top, preparer, plugin, kubelet, stop, task)


async def finish(node: Node) -> None:
    node.stop.set()
    await node.task
    await node.kubelet.stop()
    await node.plugin.close()


@pytest.fixture
async def node(top: Path) -> AsyncIterator[Node]:
    n = await start(top)
    await n.kubelet.wait_registered()
    yield n
    await finish(n)


async def until(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    """Until `predicate()` holds; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_get_info_sockets_and_directories(node: Node) -> None:
    plugin = node.plugin
    assert plugin.socket == str(node.top / "plugins" / DRIVER / "dra.sock")
    assert plugin.registration_socket == str(node.top / "registry" / f"{DRIVER}-reg.sock")
    channel = Channel(path=plugin.registration_socket)
    try:
        info = await reg.RegistrationStub(channel).get_info(reg.InfoRequest(), timeout=5)
    finally:
        channel.close()
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, plugin.socket)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    for path in (plugin.socket, plugin.registration_socket):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(node.top / "plugins" / DRIVER).st_mode) == 0o750
    await until(lambda: plugin.registered)
    assert list(node.kubelet.plugins) == [DRIVER]


async def test_a_kubelet_that_speaks_no_version_of_ours_refuses(
    top: Path, caplog: pytest.LogCaptureFixture
) -> None:
    n = await start(top, speaks=("v9.DRAPlugin",))
    try:
        await n.kubelet.wait_for(lambda: bool(n.kubelet.refused))
        await until(lambda: "refused" in caplog.text)
        assert not n.plugin.registered and not n.kubelet.plugins
        assert "v9.DRAPlugin" in n.plugin.registration_error
        (record,) = [r for r in caplog.records if "refused" in r.getMessage()]
        assert record.levelno == logging.ERROR and "v9.DRAPlugin" in record.getMessage()
    finally:
        await finish(n)


@pytest.mark.parametrize("speaks", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
async def test_prepare_and_unprepare_map_every_field(top: Path, speaks: str) -> None:
    n = await start(top, speaks=(speaks,))
    try:
        await n.kubelet.wait_registered()
        n.preparer.devices["u1"] = [device("u1", share="s-1"), device("u1")]
        answer = await n.kubelet.prepare(DRIVER, [("ns", "c1", "u1"), ("ns", "c2", "u2")])
        assert set(answer) == {"u1", "u2"}
        assert answer["u1"].error == "" and len(answer["u1"].devices) == 2
        first, second = answer["u1"].devices
        assert list(first.request_names) == ["gpu"]
        assert (first.pool_name, first.device_name) == ("node-a", "gpu-0")
        assert list(first.cdi_device_ids) == ["gpushare.io/claim=u1"]
        assert (first.share_id, second.share_id) == ("s-1", None)  # unset when empty
        assert ("prepare", ClaimRef("ns", "c2", "u2")) in n.preparer.calls
        gone = await n.kubelet.unprepare(DRIVER, [("ns", "c1", "u1")])
        assert set(gone) == {"u1"} and gone["u1"].error == ""
        assert n.preparer.calls[-1] == ("unprepare", ClaimRef("ns", "c1", "u1"))
    finally:
        await finish(n)


async def test_claim_errors_are_the_claims_answers(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.preparer.fail["bad"] = ClaimError("GPU 0 has no 4 GiB free for claim ns/bad")
    node.preparer.fail["bug"] = RuntimeError("boom")
    claims = [("ns", "ok", "ok"), ("ns", "bad", "bad"), ("ns", "bug", "bug")]
    answer = await node.kubelet.prepare(DRIVER, claims)
    assert answer["ok"].error == "" and answer["ok"].devices
    assert answer["bad"].error == "GPU 0 has no 4 GiB free for claim ns/bad"
    assert not answer["bad"].devices
    assert answer["bug"].error == "internal error in the gpushare.io driver: RuntimeError: boom"
    assert any(r.exc_info and "boom" in str(r.exc_info[1]) for r in caplog.records)
    gone = await node.kubelet.unprepare(DRIVER, claims)
    assert (gone["ok"].error, gone["bad"].error) == ("", "GPU 0 has no 4 GiB free for claim ns/bad")
    assert gone["bug"].error.endswith("RuntimeError: boom")


async def test_a_stuck_prepare_is_a_timeout_error(top: Path) -> None:
    n = await start(top, timeout=0.3)
    try:
        await n.kubelet.wait_registered()
        n.preparer.hang.add("slow")
        answer = await n.kubelet.prepare(DRIVER, [("ns", "slow", "slow"), ("ns", "f", "fast")])
        assert "took more than 0.3 s" in answer["slow"].error and "ns/slow" in answer["slow"].error
        assert answer["fast"].error == "" and answer["fast"].devices
        await until(lambda: n.preparer.running == 0)  # the stuck call was cancelled
        gone = await n.kubelet.unprepare(DRIVER, [("ns", "slow", "slow")])
        assert "unpreparing claim ns/slow (slow) took more than 0.3 s" in gone["slow"].error
        await until(lambda: n.preparer.running == 0)
        n.preparer.hang.clear()
        again = await n.kubelet.prepare(DRIVER, [("ns", "slow", "slow")])
        assert again["slow"].error == ""
    finally:
        await finish(n)


async def test_a_uid_twice_is_prepared_once(node: Node) -> None:
    answer = await node.kubelet.prepare(DRIVER, [("ns", "a", "u"), ("other", "b", "u")])
    assert list(answer) == ["u"]
    assert node.preparer.calls == [("prepare", ClaimRef("ns", "a", "u"))]


async def test_claims_run_concurrently_up_to_the_bound(top: Path) -> None:
    n = await start(top, parallel=3)
    try:
        await n.kubelet.wait_registered()
        uids = [f"u{i}" for i in range(8)]
        n.preparer.hang.update(uids)
        call = asyncio.create_task(n.kubelet.prepare(DRIVER, [("ns", u, u) for u in uids]))
        await until(lambda: n.preparer.running == 3)
        n.preparer.release.set()
        answer = await call
        assert set(answer) == set(uids) and not any(a.error for a in answer.values())
        assert n.preparer.peak == 3
    finally:
        await finish(n)


async def test_hostile_claim_fields_pass_through(node: Node) -> None:
    weird = ("ns\n\x00", "名前/../x" * 50, "")
    answer = await node.kubelet.prepare(DRIVER, [weird])
    assert list(answer) == [""] and answer[""].error == ""
    assert node.preparer.calls == [("prepare", ClaimRef(*weird))]


async def test_removed_sockets_are_served_again(node: Node) -> None:
    plugin, kubelet = node.plugin, node.kubelet
    os.unlink(plugin.socket)
    await until(lambda: os.path.exists(plugin.socket))
    assert (await kubelet.prepare(DRIVER, [("ns", "a", "u")]))["u"].error == ""
    os.unlink(plugin.registration_socket)  # a node cleanup: the plugin watcher sees it go
    await kubelet.wait_for(lambda: bool(kubelet.vanished))
    await kubelet.wait_registered(2)
    await until(lambda: plugin.registered)
    assert (await kubelet.prepare(DRIVER, [("ns", "b", "v")]))["v"].error == ""


async def test_another_process_on_the_socket_is_left_alone(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = node.plugin
    ticks = [0]
    tick = plugin.tick

    async def counted() -> None:
        ticks[0] += 1
        await tick()

    plugin.tick = counted  # type: ignore[method-assign]
    os.unlink(plugin.socket)
    Path(plugin.socket).write_text("not ours")
    await until(lambda: "another process's now" in caplog.text)
    seen = ticks[0]
    await until(lambda: ticks[0] >= seen + 3)  # later checks leave it too
    assert Path(plugin.socket).read_text() == "not ours"
    os.unlink(plugin.socket)
    await until(lambda: Path(plugin.socket).is_socket())
    assert (await node.kubelet.prepare(DRIVER, [("ns", "a", "u")]))["u"].error == ""


async def test_a_restarted_kubelet_registers_again(node: Node) -> None:
    kubelet = node.kubelet
    await kubelet.stop()  # a kubelet restart: it forgets the plugin...
    assert not kubelet.plugins
    await kubelet.start()  # ...and finds its socket in the directory
    await kubelet.wait_registered(2)
    assert (await kubelet.prepare(DRIVER, [("ns", "a", "u")]))["u"].error == ""
    await kubelet.restart()
    await kubelet.wait_registered(3)
    assert node.plugin.registered and not kubelet.refused


@pytest.mark.parametrize("version", ["v1alpha1", "v1"])
async def test_health_stream_initial_list_and_changes(node: Node, version: str) -> None:
    pb = {"v1alpha1": health_v1alpha1, "v1": health_v1}[version]
    kubelet = node.kubelet
    plugin = await kubelet.watch_health(DRIVER, version)
    await kubelet.wait_for(lambda: plugin.health is not None)
    assert plugin.health is not None and plugin.health_updates == 1
    assert [(d.device.pool_name, d.device.device_name) for d in plugin.health] == [
        ("node-a", "gpu-0"),
        ("node-a", "gpu-1"),
    ]
    assert all(d.health == pb.HealthStatus.HEALTHY for d in plugin.health)
    assert all(abs(d.last_updated_time - time.time()) < 60 for d in plugin.health)
    assert all(d.health_check_timeout_seconds == 0 for d in plugin.health)
    node.preparer.healths[1] = DeviceHealth("node-a", "gpu-1", False, "Xid 79")
    await kubelet.wait_for(lambda: plugin.health_updates >= 2)
    assert plugin.health is not None
    assert plugin.health[1].health == pb.HealthStatus.UNHEALTHY
    assert plugin.health[1].message == "Xid 79"
    await node.plugin.close()
    await kubelet.wait_for(lambda: plugin.health_ended is not None)
    assert plugin.health_ended == "ok"
    assert not os.path.exists(node.plugin.socket)
    assert not os.path.exists(node.plugin.registration_socket)


async def test_a_failing_health_read_keeps_the_stream(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = await node.kubelet.watch_health(DRIVER)
    await node.kubelet.wait_for(lambda: plugin.health is not None)
    calls = [0]

    def broken() -> list[DeviceHealth]:
        calls[0] += 1
        raise RuntimeError("NVML is gone")

    node.preparer.health = broken  # type: ignore[method-assign]
    await until(lambda: calls[0] >= 5)
    del node.preparer.health  # the class's again, with a change
    node.preparer.healths[0] = DeviceHealth("node-a", "gpu-0", False)
    await node.kubelet.wait_for(lambda: plugin.health_updates >= 2)
    assert plugin.health_ended is None
    assert caplog.text.count("reading the devices' health failed") == 1


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    _require(shutil.which(PROTOC) is not None, f"protoc not found at {PROTOC}")
    _require(PLUGIN.is_file(), f"betterproto protoc plugin missing: {PLUGIN}")
    out = tmp_path / "generated"
    subprocess.run([TOP / "scripts" / "gen-dra.sh", out], check=True, capture_output=True)
    fresh, committed = _tree(out), _tree(GENERATED)
    assert fresh.keys() == committed.keys()
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"run scripts/gen-dra.sh; out of date: {stale}"


def test_method_paths_are_the_kubelets() -> None:
    for pb, version in ((dra_v1, "v1"), (dra_v1beta1, "v1beta1")):
        assert set(pb.DraPluginBase().__mapping__()) == {
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/{name}"
            for name in ("NodePrepareResources", "NodeUnprepareResources")
        }
    assert set(reg.RegistrationBase().__mapping__()) == {
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    }
    for pb, version in ((health_v1alpha1, "v1alpha1"), (health_v1, "v1")):
        assert set(pb.DraResourceHealthBase().__mapping__()) == {
            f"/{version}.DRAResourceHealth/NodeWatchResources"
        }


def test_wire_field_numbers() -> None:
    claim = b"\x0a\x02ns\x12\x01u\x1a\x01c"  # namespace = 1, uid = 2, name = 3
    assert bytes(dra_v1.Claim(namespace="ns", uid="u", name="c")) == claim
    device = dra_v1.Device(["r"], "p", "d", ["k=v"], share_id="s")
    assert bytes(device) == b"\x0a\x01r\x12\x01p\x1a\x01d\x22\x03k=v\x2a\x01s"
    answer = dra_v1.NodePrepareResourceResponse(error="e")
    assert bytes(answer) == b"\x12\x01e"  # error = 2
    outer = dra_v1.NodePrepareResourcesResponse(claims={"u": answer})
    assert bytes(outer) == b"\x0a\x08\x0a\x01u\x12\x03\x12\x01e"  # map: key 1, value 2
    info = reg.PluginInfo("DRAPlugin", "n", "/e", ["v1.DRAPlugin"])
    assert bytes(info) == b"\x0a\x09DRAPlugin\x12\x01n\x1a\x02/e\x22\x0cv1.DRAPlugin"
    assert bytes(reg.RegistrationStatus(False, "x")) == b"\x12\x01x"
    health = health_v1alpha1.DeviceHealth(
        health_v1alpha1.DeviceIdentifier("p", "d"),
        health_v1alpha1.HealthStatus.UNHEALTHY,
        7,
        0,
        "m",
    )
    assert bytes(health) == b"\x0a\x06\x0a\x01p\x12\x01d\x10\x02\x18\x07\x2a\x01m"
