"""Resize through the local API (the protocol, the daemon's handler, the
root-only server) and `nri-gpushare resize` (the CLI against a fake daemon
and against the real handler on a real socket)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from nri_gpushare.cli.main import main as cli_main
from nri_gpushare.daemon.local_api import LocalApiHandler
from nri_gpushare.daemon.local_server import LocalApiServer
from nri_gpushare.local import protocol
from nri_gpushare.local.protocol import ProtocolError, Reply, Request
from nri_gpushare.share.model import STANDALONE_SOURCES, ContainerInfo, NodePolicy
from nri_gpushare.share.records import MemoryStore
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, make_gpus
from tests.unit.fake_local_daemon import FakeDaemon

P = "gpushare.io/"


def resize_request(ref="c1", **values) -> Request:
    return Request("resize", "", ref, **values)


def test_the_request_round_trips_and_carries_only_its_fields():
    r = resize_request("ns/pod/main", memory="2Gi,1Gi", core="30", priority="high")
    data = protocol.encode_request(r)
    assert json.loads(data) == {
        "v": 1,
        "op": "resize",
        "namespace": "",
        "id": "ns/pod/main",
        "memory": "2Gi,1Gi",
        "core": "30",
        "priority": "high",
    }
    assert protocol.decode_request(data) == r
    reply = Reply(True, resized={"container_id": "c1", "changed": True, "gpus": []})
    assert protocol.decode_reply(protocol.encode_reply(reply)) == reply


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        ({"id": "c1"}, "give memory, core or priority"),
        ({"id": "c1", "memory": "1" * 2000}, "at most 1024 characters"),
        ({"id": "c1", "memory": 2}, "memory: not a string"),
        ({"id": "c1\n", "memory": "1Gi"}, "not a container ID or name"),
        ({"id": "", "memory": "1Gi"}, "id: missing"),
        ({"id": "c\0", "memory": "1Gi"}, "id: not a string"),
    ],
)
def test_a_malformed_resize_is_a_protocol_error(obj, says):
    with pytest.raises(ProtocolError, match=says):
        protocol.decode_request(json.dumps({"v": 1, "op": "resize", **obj}).encode())


async def make_service(kmod=None):
    kmod = kmod or FakeKernelModule()
    svc = ShareService(
        make_gpus(1, 16 * GiB),
        NodePolicy(pod_sources=STANDALONE_SOURCES),
        Inline(kmod),
        FakeDevices(),
        MemoryStore(),
    )
    await svc.start()
    pod = ContainerInfo(
        id="c1",
        name="main",
        pod_name="p",
        pod_namespace="ns",
        pod_uid="u",
        pod_annotations={P + "gpu-memory": "1Gi"},
    )
    await svc.lifecycle.create_container(pod)
    return svc, kmod


async def test_the_handler_resizes_and_answers_the_share_as_it_now_is():
    svc, kmod = await make_service()
    reply = await LocalApiHandler(svc, None)(resize_request(memory="3Gi", core="25"))
    assert reply.ok, reply.error
    assert reply.resized == {
        "container_id": "c1",
        "name": "main",
        "pod": "ns/p",
        "origin": "nri",
        "priority": "normal",
        "changed": True,
        "gpus": [{"index": 0, "uuid": svc.gpus[0].uuid, "memory": 3 * GiB, "core": 25}],
    }
    assert kmod.regs["c1"].quotas[0].memory_bytes == 3 * GiB
    refused = await LocalApiHandler(svc, None)(resize_request(memory="30Gi"))
    assert not refused.ok and refused.reason == "capacity"
    assert "cannot resize container 'main' (pod ns/p)" in refused.error


async def test_a_resize_from_another_uid_is_refused_and_changes_nothing():
    """Only root (or the daemon's uid) may resize: the socket's peer credentials
    decide, whatever its mode says."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (to connect as another uid)")
    svc, kmod = await make_service()
    top = Path(tempfile.mkdtemp(prefix="gpushare-resize-", dir="/tmp"))
    path = top / "run" / "api.sock"
    server = LocalApiServer(str(path), LocalApiHandler(svc, None))
    await server.start()
    for d in (top, path.parent):
        os.chmod(d, 0o755)
    os.chmod(path, 0o666)  # loosened by mistake: still refused
    client = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.connect(sys.argv[1])\n"
        "s.sendall(sys.stdin.buffer.read())\n"
        "s.shutdown(socket.SHUT_WR)\n"
        "sys.stdout.buffer.write(s.recv(65536))\n"
    )
    data = protocol.encode_request(resize_request(memory="8Gi"))
    try:
        out = await asyncio.to_thread(
            subprocess.run,
            ["/usr/bin/python3", "-I", "-c", client, str(path)],
            input=data,
            capture_output=True,
            user=65534,
            timeout=30,
            check=True,
        )
        reply = json.loads(out.stdout)
        assert reply["ok"] is False and reply["reason"] == "forbidden"
        assert kmod.regs["c1"].quotas[0].memory_bytes == GiB
        assert svc.allocations["c1"].shares[0].memory_bytes == GiB
    finally:
        await server.close()
        shutil.rmtree(top)


def test_the_cli_sends_the_values_and_prints_the_result(tmp_path, capsys):
    resized = {
        "container_id": "c1",
        "name": "main",
        "pod": "ns/p",
        "priority": "high",
        "changed": True,
        "gpus": [{"index": 0, "uuid": "GPU-0", "memory": 2 * GiB, "core": 30}],
    }
    path = str(tmp_path / "api.sock")
    daemon = FakeDaemon(path, {"resize": Reply(True, resized=resized)})
    try:
        code = cli_main(
            ["resize", "c1", "--memory", "2Gi", "--core", "30", "--priority", "high"]
            + ["--api-socket", path]
        )
    finally:
        daemon.close()
    assert code == 0
    assert capsys.readouterr().out == (
        "resized container main (pod ns/p): GPU 0 2048Mi 30%, priority high\n"
    )
    [request] = daemon.requests
    assert (request.op, request.id, request.memory, request.core, request.priority) == (
        "resize",
        "c1",
        "2Gi",
        "30",
        "high",
    )


def test_the_cli_prints_a_refusal_and_fails(tmp_path, capsys):
    path = str(tmp_path / "api.sock")
    daemon = FakeDaemon(path, {"resize": Reply.refused("gpushare: cannot resize x: no", "kmod")})
    try:
        assert cli_main(["resize", "x", "--memory", "2Gi", "--api-socket", path]) == 1
    finally:
        daemon.close()
    assert capsys.readouterr().err == "gpushare: cannot resize x: no\n"


def test_the_cli_without_a_value_or_a_daemon(tmp_path, capsys):
    assert cli_main(["resize", "c1"]) == 2
    assert "give --memory, --core or --priority" in capsys.readouterr().err
    missing = str(tmp_path / "none.sock")
    assert cli_main(["resize", "c1", "--core", "30", "--api-socket", missing]) == 1
    assert "cannot reach the nri-gpushare daemon" in capsys.readouterr().err


async def test_status_and_the_metrics_show_the_resized_share_and_count_the_decision():
    from nri_gpushare.daemon.metrics import Snapshot
    from tests.unit.test_metrics import by_name, scrape

    svc, _ = await make_service()
    assert (await LocalApiHandler(svc, None)(resize_request(memory="3Gi", core="25"))).ok
    doc = svc.status()
    [alloc] = doc["allocations"]
    assert (alloc["gpus"][0]["memory"], alloc["resized"]) == (3 * GiB, True)
    assert doc["gpus"][0]["memory_allocated"] == 3 * GiB
    samples = scrape(Snapshot(doc, dict(svc.decisions.counts), dict(svc.decisions.refusals), {}))
    [quota] = by_name(samples, "gpushare_container_memory_quota_bytes").values()
    assert quota == 3 * GiB
    decisions = by_name(samples, "gpushare_decisions_total")
    assert decisions[frozenset({("decision", "resized")})] == 1


async def test_status_text_says_which_shares_were_resized(capsys):
    from nri_gpushare.cli.main import _print_status

    svc, _ = await make_service()
    _print_status(svc.status())
    assert "resized live" not in capsys.readouterr().out
    assert (await LocalApiHandler(svc, None)(resize_request(memory="2Gi"))).ok
    _print_status(svc.status())
    out = capsys.readouterr().out
    assert "  c1: resized live (its gpushare.io/assigned annotation" in out
    assert " 2048Mi " in out
