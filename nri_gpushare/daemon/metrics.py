"""Prometheus metrics (config `metrics.listen`): http://<listen>/metrics.

Everything but the counters is computed at scrape time from the daemon's
status document, the same one `nri-gpushare status --json` prints, so the
two always agree.  The document is made on the event loop (as for the status
socket) and handed to the HTTP server's thread, together with copies of the
decision counters and the NRI handler latencies: the loop never waits on a
scrape, and a scrape waits at most `SCRAPE_WAIT` seconds for the loop
(`gpushare_scrape_ok` 0 says it did not get the figures).  Scrapes at the
same time share one snapshot, and the server answers at most
`MAX_CONNECTIONS` connections at once, each closed after `IDLE_TIMEOUT`
seconds without progress: whoever reaches the port (a pod, when it listens
beyond the node) can neither pile work onto the loop nor threads into the
daemon.

Labels are bounded: a container's series carry its ID, pod, origin and name
and vanish with the container; refusals are counted by reason class
(`nri_gpushare.share.decisions.REFUSAL_REASONS`), never by message.
The families are listed in docs/monitoring.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from nri_gpushare.config import ConfigError
from nri_gpushare.daemon.nri_handler import LATENCY_BUCKETS, Histogram
from nri_gpushare.share.decisions import DECISIONS, REFUSAL_REASONS
from nri_gpushare.share.model import KMOD_MODES

log = logging.getLogger(__name__)

SCRAPE_WAIT = 5.0
"""Seconds a scrape waits for the event loop's snapshot."""
MAX_CONNECTIONS = 16
"""Connections served at once; more are closed unanswered."""
IDLE_TIMEOUT = 10.0
"""Seconds a connection may stay silent (sending its request, reading the answer)."""
LABEL_CHARS = 128
"""A label value taken from a container (its name) is cut to this many characters."""


@dataclass(frozen=True)
class Snapshot:
    """What one scrape reports: the status document and copies of the counters."""

    status: Mapping[str, Any]
    decisions: Mapping[str, int]
    refusals: Mapping[str, int]
    latency: Mapping[str, Histogram]


# -- the families ---------------------------------------------------------------------


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _cut(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def container_labels(alloc: Mapping[str, Any]) -> list[str]:
    """container_id, pod_namespace, pod_name, origin, name."""
    namespace, _, pod = str(alloc.get("pod") or "").partition("/")
    return [
        str(alloc["container_id"]),
        namespace,
        _cut(pod),
        str(alloc.get("origin") or "nri"),
        _cut(str(alloc.get("name") or "")),
    ]


CONTAINER_LABELS = ("container_id", "pod_namespace", "pod_name", "origin", "name", "gpu", "uuid")
GPU_LABELS = ("gpu", "uuid", "model")


def families(snap: Snapshot | None) -> Iterator[Metric]:
    """Every family of one scrape; with no snapshot only gpushare_scrape_ok 0."""
    ok = _gauge("gpushare_scrape_ok", "1 when this scrape got the daemon's figures in time")
    ok.add_metric([], 0 if snap is None else 1)
    yield ok
    if snap is None:
        return
    status = snap.status
    yield from _plugin(status)
    yield from _gpus(status)
    yield from _containers(status)
    yield from _counters(snap)


def _plugin(status: Mapping[str, Any]) -> Iterator[Metric]:
    info = InfoMetricFamily("gpushare_plugin", "The running nri-gpushare daemon")
    info.add_metric([], {"version": str(status.get("version") or "unknown")})
    yield info
    kmod = status.get("kmod", {})
    loaded = _gauge("gpushare_kmod_loaded", "1 when gpushare.ko is loaded and in use")
    loaded.add_metric([], 1 if kmod.get("loaded") else 0)
    yield loaded
    mode = _gauge("gpushare_kmod_mode", "The config's kmod mode (1 for the one in force)", ["mode"])
    for m in KMOD_MODES:
        mode.add_metric([m], 1 if kmod.get("mode") == m else 0)
    yield mode
    nri = status.get("nri", {})
    connected = _gauge("gpushare_nri_connected", "1 when the plugin is synchronized with NRI")
    connected.add_metric([], 1 if nri.get("connected") else 0)
    yield connected
    sessions = CounterMetricFamily(
        "gpushare_nri_sessions", "NRI connections that reached Synchronize"
    )
    sessions.add_metric([], int(nri.get("sessions") or 0))
    yield sessions
    unserved = _gauge(
        "gpushare_unserved_containers",
        "Live containers that asked for a share and run without one",
    )
    unserved.add_metric([], len(status.get("unserved", [])))
    yield unserved


def _gpus(status: Mapping[str, Any]) -> Iterator[Metric]:
    total = _gauge("gpushare_gpu_memory_total_bytes", "GPU memory", GPU_LABELS)
    reserved = _gauge(
        "gpushare_gpu_memory_reserved_bytes", "GPU memory kept back from shares", GPU_LABELS
    )
    allocated = _gauge(
        "gpushare_gpu_memory_allocated_bytes", "GPU memory given to shares", GPU_LABELS
    )
    used = _gauge(
        "gpushare_gpu_memory_used_bytes",
        "GPU memory held by the shares' processes (kernel ledger); absent when any is unknown",
        GPU_LABELS,
    )
    core = _gauge("gpushare_gpu_core_allocated_percent", "Compute given to shares", GPU_LABELS)
    containers = _gauge("gpushare_gpu_containers", "Containers holding a share", GPU_LABELS)
    policy = _gauge(
        "gpushare_gpu_sched_policy",
        "The module's compute policy (0..5); absent when unknown",
        GPU_LABELS,
    )
    used_by_gpu: dict[int, int | None] = {}
    for alloc in status.get("allocations", []):
        for share in alloc["gpus"]:
            before = used_by_gpu.get(share["index"], 0)
            value = share.get("memory_used")
            used_by_gpu[share["index"]] = (
                None if before is None or value is None else before + int(value)
            )
    for gpu in status.get("gpus", []):
        labels = [str(gpu["index"]), str(gpu["uuid"]), _cut(str(gpu.get("name", "")))]
        total.add_metric(labels, gpu["memory_total"])
        reserved.add_metric(labels, gpu.get("memory_reserved", 0))
        allocated.add_metric(labels, gpu["memory_allocated"])
        if (value := used_by_gpu.get(gpu["index"], 0)) is not None:
            used.add_metric(labels, value)
        core.add_metric(labels, gpu["core_allocated"])
        containers.add_metric(labels, len(gpu.get("containers", [])))
        if isinstance(gpu.get("policy"), int):
            policy.add_metric(labels, gpu["policy"])
    yield from (total, reserved, allocated, used, core, containers, policy)


def _containers(status: Mapping[str, Any]) -> Iterator[Metric]:
    quota = _gauge(
        "gpushare_container_memory_quota_bytes", "A container's memory share", CONTAINER_LABELS
    )
    used = _gauge(
        "gpushare_container_memory_used_bytes",
        "Memory its processes hold (kernel ledger); absent when unknown",
        CONTAINER_LABELS,
    )
    processes = _gauge(
        "gpushare_container_processes",
        "Its processes holding GPU memory; absent when unknown",
        CONTAINER_LABELS,
    )
    target = _gauge(
        "gpushare_container_compute_target_percent",
        "Its gpu-core target; absent when it has no compute limit",
        CONTAINER_LABELS,
    )
    got = _gauge(
        "gpushare_container_compute_used_percent",
        "Percent of the GPU's time charged to it over the last minute; absent when unknown",
        CONTAINER_LABELS,
    )
    high = _gauge("gpushare_container_high_priority", "1 for priority high", CONTAINER_LABELS)
    for alloc in status.get("allocations", []):
        who = container_labels(alloc)
        for share in alloc["gpus"]:
            labels = [*who, str(share["index"]), str(share["uuid"])]
            quota.add_metric(labels, share["memory"])
            if share.get("memory_used") is not None:
                used.add_metric(labels, share["memory_used"])
                processes.add_metric(labels, share.get("processes", 0))
            if share.get("compute_target") is not None:
                target.add_metric(labels, share["compute_target"])
            if share.get("compute_used_pct") is not None:
                got.add_metric(labels, share["compute_used_pct"])
            high.add_metric(labels, 1 if alloc.get("priority") == "high" else 0)
    yield from (quota, used, processes, target, got, high)


def _counters(snap: Snapshot) -> Iterator[Metric]:
    decisions = CounterMetricFamily(
        "gpushare_decisions", "Decisions taken about containers", labels=["decision"]
    )
    for d in DECISIONS:
        decisions.add_metric([d], snap.decisions.get(d, 0))
    yield decisions
    refusals = CounterMetricFamily(
        "gpushare_refusals", "Containers refused a share, by reason", labels=["reason"]
    )
    for reason in REFUSAL_REASONS:
        refusals.add_metric([reason], snap.refusals.get(reason, 0))
    yield refusals
    latency = HistogramMetricFamily(
        "gpushare_nri_handler_seconds",
        "Time the plugin spent handling an NRI event",
        labels=["event"],
    )
    for event, h in sorted(snap.latency.items()):
        cumulative, buckets = 0, []
        for le, n in zip((*LATENCY_BUCKETS, float("inf")), h.counts, strict=True):
            cumulative += n
            buckets.append(("+Inf" if le == float("inf") else repr(le), cumulative))
        latency.add_metric([event], buckets, h.total)
    yield latency


# -- serving ------------------------------------------------------------------------------


class SnapshotCollector(Collector):
    """Collects by asking the event loop for a `Snapshot` (from the server's thread)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, take: Callable[[], Awaitable[Snapshot]]
    ) -> None:
        self.loop = loop
        self.take = take
        self._lock = threading.Lock()
        self._pending: concurrent.futures.Future[Snapshot] | None = None

    def _snapshot(self) -> concurrent.futures.Future[Snapshot]:
        """The snapshot being taken, or a new one: scrapes at once share one."""
        if self.loop.is_closed():
            raise RuntimeError("the daemon is shutting down")
        with self._lock:
            if self._pending is None or self._pending.done():
                self._pending = asyncio.run_coroutine_threadsafe(_awaited(self.take), self.loop)
            return self._pending

    def collect(self) -> Iterator[Metric]:
        snap = None
        future: concurrent.futures.Future[Snapshot] | None = None
        try:
            future = self._snapshot()  # RuntimeError once the loop is closed (shutting down)
            snap = future.result(SCRAPE_WAIT)
        except Exception as e:  # noqa: BLE001 - the scrape says so (gpushare_scrape_ok 0)
            if future is not None:
                future.cancel()
            log.warning("metrics: no status snapshot for this scrape: %s", e or type(e).__name__)
        yield from families(snap)


async def _awaited(take: Callable[[], Awaitable[Snapshot]]) -> Snapshot:
    return await take()


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never holds the daemon's exit
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # closed unanswered: no thread for it
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away: not worth a traceback on stderr."""
        log.debug("metrics: connection from %s failed", client_address, exc_info=True)


class _QuietHandler(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT  # the socket's: a silent client is dropped, its thread ends

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


def parse_listen(listen: str) -> tuple[str, int]:
    """'127.0.0.1:9400' or '[::1]:9400' -> (host, port) (the config checked the form)."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


class MetricsServer:
    """The /metrics endpoint on its own threads."""

    def __init__(self, listen: str, collector: Collector) -> None:
        self.listen = listen
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen; ConfigError naming metrics.listen when it cannot."""
        host, port = parse_listen(self.listen)
        metrics = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            if environ.get("PATH_INFO") not in ("/metrics", "/metrics/"):
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"nri-gpushare serves /metrics\n"]
            result: Iterable[bytes] = metrics(environ, start_response)
            return result

        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
            server_class = type("MetricsHttp", (_Server,), {"address_family": family})
            self._server = make_server(host, port, app, server_class, _QuietHandler)
        except OSError as e:
            raise ConfigError(
                f"metrics.listen {self.listen}: cannot listen there: {e.strerror or e} "
                f"(another process on that port, or an address this node does not have?)"
            ) from None
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="gpushare-metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics: serving http://%s/metrics", self.listen)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
