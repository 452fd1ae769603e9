"""The metrics collector on a fake status document, parsed back with
prometheus-client's own parser; the HTTP server; the event loop's snapshot."""

import asyncio
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nri_gpushare.config import ConfigError
from nri_gpushare.daemon import metrics
from nri_gpushare.daemon.metrics import (
    MetricsServer,
    Snapshot,
    SnapshotCollector,
    families,
)
from nri_gpushare.daemon.nri_handler import HandlerLatency
from nri_gpushare.share.decisions import REFUSAL_REASONS

GiB = 1 << 30


def share(index, memory, core=0, used=None, why="", got=None, got_why="unknown: no sample yet"):
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "memory": memory,
        "core": core,
        "memory_used": used,
        "memory_used_why": why,
        "processes": 2 if used is not None else 0,
        "pids": [10, 11] if used is not None else None,
        "compute_target": core or None,
        "compute_used_pct": got,
        "compute_used_why": None if got is not None else got_why,
    }


def status(**extra):
    doc = {
        "version": "9.9",
        "kmod": {"mode": "optional", "loaded": True, "problem": ""},
        "nri": {"connected": True, "sessions": 3},
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-{i}",
                "name": "Sim",
                "memory_total": 16 * GiB,
                "memory_reserved": 0,
                "memory_allocated": [10 * GiB, 1 * GiB][i],
                "core_allocated": [30, 0][i],
                "containers": [["a", "b"], ["c"]][i],
                "policy": [3, None][i],
            }
            for i in range(2)
        ],
        "allocations": [
            {
                "container_id": "a",
                "name": "main",
                "pod": "ml/train",
                "priority": "high",
                "origin": "nri",
                "gpus": [share(0, 8 * GiB, 30, used=3 * GiB, got=27.5)],
            },
            {
                "container_id": "b",
                "name": "main",
                "pod": "ml/notebook",
                "priority": "normal",
                "origin": "nri",
                "gpus": [share(0, 2 * GiB, used=GiB)],
            },
            {
                "container_id": "c",
                "name": "job",
                "pod": "",
                "priority": "normal",
                "origin": "runc:default",
                "gpus": [share(1, 1 * GiB, why="unknown: kmod: off")],
            },
        ],
        "unserved": [],
    }
    doc.update(extra)
    return doc


def scrape(snap):
    class Fixed:
        def collect(self):
            return families(snap)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    return parse(generate_latest(registry).decode())


def parse(text):
    """{(sample name, frozenset(labels)): value}"""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def by_name(samples, name):
    return {labels: v for (n, labels), v in samples.items() if n == name}


def lab(**kw):
    return frozenset(kw.items())


def snapshot(doc=None, refusals=None, latency=None):
    return Snapshot(
        doc or status(),
        {"placed": 4, "refused": 2},
        refusals or {"capacity": 2},
        latency.copy() if latency else {},
    )


def container(cid, pod, origin="nri", name="main", gpu="0"):
    namespace, _, pod_name = pod.partition("/")
    return lab(
        container_id=cid,
        pod_namespace=namespace,
        pod_name=pod_name,
        origin=origin,
        name=name,
        gpu=gpu,
        uuid=f"GPU-{gpu}",
    )


def test_gpu_families_match_the_status():
    s = scrape(snapshot())
    gpu0 = lab(gpu="0", uuid="GPU-0", model="Sim")
    gpu1 = lab(gpu="1", uuid="GPU-1", model="Sim")
    assert by_name(s, "gpushare_gpu_memory_total_bytes") == {gpu0: 16 * GiB, gpu1: 16 * GiB}
    assert by_name(s, "gpushare_gpu_memory_allocated_bytes") == {gpu0: 10 * GiB, gpu1: GiB}
    # GPU 1's only share has unknown use: no figure rather than a made-up one.
    assert by_name(s, "gpushare_gpu_memory_used_bytes") == {gpu0: 4 * GiB}
    assert by_name(s, "gpushare_gpu_core_allocated_percent") == {gpu0: 30, gpu1: 0}
    assert by_name(s, "gpushare_gpu_containers") == {gpu0: 2, gpu1: 1}
    assert by_name(s, "gpushare_gpu_sched_policy") == {gpu0: 3}


def test_container_families_match_the_status():
    s = scrape(snapshot())
    a, b = container("a", "ml/train"), container("b", "ml/notebook")
    c = container("c", "", origin="runc:default", name="job", gpu="1")
    assert by_name(s, "gpushare_container_memory_quota_bytes") == {
        a: 8 * GiB,
        b: 2 * GiB,
        c: GiB,
    }
    assert by_name(s, "gpushare_container_memory_used_bytes") == {a: 3 * GiB, b: GiB}
    assert by_name(s, "gpushare_container_processes") == {a: 2, b: 2}
    assert by_name(s, "gpushare_container_compute_target_percent") == {a: 30}
    assert by_name(s, "gpushare_container_compute_used_percent") == {a: 27.5}
    assert by_name(s, "gpushare_container_high_priority") == {a: 1, b: 0, c: 0}


def test_containers_that_went_away_vanish():
    doc = status()
    doc["allocations"] = doc["allocations"][:1]
    s = scrape(snapshot(doc))
    quota = by_name(s, "gpushare_container_memory_quota_bytes")
    assert list(quota) == [container("a", "ml/train")]


def test_plugin_and_kmod_state():
    s = scrape(snapshot())
    assert by_name(s, "gpushare_plugin_info") == {lab(version="9.9"): 1}
    assert by_name(s, "gpushare_kmod_loaded") == {lab(): 1}
    assert by_name(s, "gpushare_kmod_mode") == {
        lab(mode="required"): 0,
        lab(mode="optional"): 1,
        lab(mode="off"): 0,
    }
    assert by_name(s, "gpushare_nri_connected") == {lab(): 1}
    assert by_name(s, "gpushare_nri_sessions_total") == {lab(): 3}
    assert by_name(s, "gpushare_scrape_ok") == {lab(): 1}
    off = status(kmod={"mode": "off", "loaded": False, "problem": ""}, nri={"connected": False})
    s = scrape(snapshot(off))
    assert by_name(s, "gpushare_kmod_loaded") == {lab(): 0}
    assert by_name(s, "gpushare_kmod_mode")[lab(mode="off")] == 1
    assert by_name(s, "gpushare_nri_connected") == {lab(): 0}


def test_refusals_by_reason_and_decisions():
    s = scrape(snapshot(refusals={"capacity": 2, "kmod": 1}))
    refusals = by_name(s, "gpushare_refusals_total")
    assert set(refusals) == {lab(reason=r) for r in REFUSAL_REASONS}
    assert refusals[lab(reason="capacity")] == 2 and refusals[lab(reason="kmod")] == 1
    assert refusals[lab(reason="other")] == 0
    decisions = by_name(s, "gpushare_decisions_total")
    assert decisions == {lab(decision="placed"): 4, lab(decision="refused"): 2,
                         lab(decision="released"): 0, lab(decision="resized"): 0}  # fmt: skip


def test_latency_histogram():
    latency = HandlerLatency()
    for seconds in (0.0004, 0.003, 0.003, 7.0):
        latency.observe("create_container", seconds)
    latency.observe("remove_container", 0.02)
    s = scrape(snapshot(latency=latency))
    buckets = by_name(s, "gpushare_nri_handler_seconds_bucket")
    assert buckets[lab(event="create_container", le="0.001")] == 1
    assert buckets[lab(event="create_container", le="0.005")] == 3
    assert buckets[lab(event="create_container", le="5.0")] == 3
    assert buckets[lab(event="create_container", le="+Inf")] == 4
    assert buckets[lab(event="remove_container", le="0.01")] == 0
    assert buckets[lab(event="remove_container", le="0.025")] == 1
    counts = by_name(s, "gpushare_nri_handler_seconds_count")
    assert counts == {lab(event="create_container"): 4, lab(event="remove_container"): 1}
    total = by_name(s, "gpushare_nri_handler_seconds_sum")[lab(event="create_container")]
    assert total == pytest.approx(7.0064)


def test_no_snapshot_says_so_and_nothing_else():
    s = scrape(None)
    assert s == {("gpushare_scrape_ok", lab()): 0}


def test_long_names_are_cut_in_labels():
    doc = status()
    doc["allocations"][2]["name"] = "n" * 1000
    s = scrape(snapshot(doc))
    names = {dict(labels)["name"] for labels in by_name(s, "gpushare_container_memory_quota_bytes")}
    assert max(len(n) for n in names) == metrics.LABEL_CHARS


async def test_collector_takes_the_snapshot_on_the_loop():
    loop = asyncio.get_running_loop()
    seen = []

    async def take():
        seen.append(asyncio.get_running_loop())
        return snapshot()

    collector = SnapshotCollector(loop, take)
    got = await asyncio.to_thread(lambda: list(collector.collect()))
    assert seen == [loop]
    assert {f.name for f in got} >= {"gpushare_gpu_memory_total_bytes", "gpushare_refusals"}


async def test_collector_without_an_answer_reports_scrape_not_ok(monkeypatch):
    monkeypatch.setattr(metrics, "SCRAPE_WAIT", 0.05)
    never = asyncio.Event()

    async def take():
        await never.wait()

    collector = SnapshotCollector(asyncio.get_running_loop(), take)
    got = await asyncio.to_thread(lambda: list(collector.collect()))
    assert [(f.name, f.samples[0].value) for f in got] == [("gpushare_scrape_ok", 0)]


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url) as response:
        return bytes(response.read())


async def test_server_serves_metrics_over_http():
    async def take():
        return snapshot()

    server = MetricsServer("127.0.0.1:0", SnapshotCollector(asyncio.get_running_loop(), take))
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        body = await asyncio.to_thread(_get, url + "/metrics")
        s = parse(body.decode())
        assert by_name(s, "gpushare_gpu_containers")[lab(gpu="1", uuid="GPU-1", model="Sim")] == 1
        with pytest.raises(urllib.error.HTTPError) as e:
            await asyncio.to_thread(_get, url + "/other")
        e.value.close()
        assert e.value.code == 404
    finally:
        await asyncio.to_thread(server.close)


def test_a_listen_address_in_use_is_a_config_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MetricsServer(f"127.0.0.1:{port}", SnapshotCollector(None, None))  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=f"metrics.listen 127.0.0.1:{port}: cannot listen"):
            server.start()


async def test_concurrent_scrapes_share_one_snapshot():
    """A flood of scrapes (a pod can reach a node's port) costs the event
    loop one snapshot at a time, not one per scrape."""
    release = asyncio.Event()
    calls = []

    async def take():
        calls.append(1)
        await release.wait()
        return snapshot()

    loop = asyncio.get_running_loop()
    collector = SnapshotCollector(loop, take)
    started = []

    def scrape_():
        started.append(1)
        return list(collector.collect())

    scrapes = [asyncio.create_task(asyncio.to_thread(scrape_))]
    while not calls:
        await asyncio.sleep(0.01)
    scrapes += [asyncio.create_task(asyncio.to_thread(scrape_)) for _ in range(4)]
    while len(started) < 5:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # from started to waiting on the snapshot
    release.set()
    results = await asyncio.gather(*scrapes)
    assert calls == [1]
    assert all(r[0].samples[0].value == 1 for r in results)  # each got the figures
    await asyncio.to_thread(lambda: list(collector.collect()))
    assert calls == [1, 1]  # a later scrape gets fresh ones


def _connect(port: int) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port))
    conn.settimeout(30)
    return conn


async def _serving():
    async def take():
        return snapshot()

    server = MetricsServer("127.0.0.1:0", SnapshotCollector(asyncio.get_running_loop(), take))
    server.start()
    return server


async def _scrape_ok(server: MetricsServer) -> bool:
    url = f"http://127.0.0.1:{server.port}/metrics"
    body = await asyncio.to_thread(_get, url)
    return b"gpushare_scrape_ok 1.0" in body


async def test_connections_beyond_the_bound_are_closed_unanswered(monkeypatch):
    """At most max_connections are served at once: the rest are closed
    unanswered, so no one can pile up threads in the daemon."""
    monkeypatch.setattr(metrics._QuietHandler, "timeout", None)
    monkeypatch.setattr(metrics._Server, "max_connections", 2)
    server = await _serving()
    try:
        idle = [_connect(server.port), _connect(server.port)]
        idle[0].sendall(b"GET /metrics HTTP/1.1\r\n")  # requests never finished
        idle[1].sendall(b"GET /metrics HTTP/1.1\r\n")
        await asyncio.sleep(0.1)  # both accepted (the bound holds either way)
        extra = _connect(server.port)
        assert await asyncio.to_thread(extra.recv, 1) == b""  # closed, never served
        extra.close()
        for conn in idle:  # their threads end, their slots free
            conn.close()
        for _ in range(200):  # once their threads have ended
            try:
                assert await _scrape_ok(server)
                break
            except (urllib.error.URLError, ConnectionError):
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("the slots of closed connections were never freed")
    finally:
        await asyncio.to_thread(server.close)


async def test_silent_connections_are_dropped(monkeypatch):
    """A connection that never sends its request (slowloris) is closed
    after the handler's timeout."""
    monkeypatch.setattr(metrics._QuietHandler, "timeout", 0.3)
    server = await _serving()
    try:
        idle = _connect(server.port)
        assert await asyncio.to_thread(idle.recv, 1) == b""
        idle.close()
        assert await _scrape_ok(server)
    finally:
        await asyncio.to_thread(server.close)


@pytest.mark.parametrize(
    "listen",
    ["127.0.0.1:²", "127.0.0.1:٩٤٠٠", "127.0.0.1:0", "0.0.0.0:99999", ":9400", "[::1]", "a b:1"],
)
def test_hostile_listen_addresses_are_config_errors(listen: str) -> None:
    """Never a traceback, never a port other than the one written."""
    from nri_gpushare.config import parse_config

    with pytest.raises(ConfigError, match="metrics.listen"):
        parse_config({"metrics": {"listen": listen}})


@pytest.mark.parametrize("listen", ["127.0.0.1:9400", "[::1]:9400", "[::]:9400", "node:9400"])
def test_listen_addresses(listen: str) -> None:
    from nri_gpushare.config import parse_config

    assert parse_config({"metrics": {"listen": listen}}).metrics_listen == listen


def test_a_scrape_after_the_loop_closed_says_scrape_not_ok():
    """The daemon shutting down: its loop is gone, the scrape still answers."""
    loop = asyncio.new_event_loop()
    loop.close()

    async def take():
        return snapshot()

    got = list(SnapshotCollector(loop, take).collect())
    assert [(f.name, f.samples[0].value) for f in got] == [("gpushare_scrape_ok", 0)]
