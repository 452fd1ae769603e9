"""A small NRI *runtime* for benchmarks: it drives a real plugin process over
the real protocol (mux + ttrpc, this project's own wire layer), in the role
containerd plays.

    runtime = NriRuntime(socket_path)       # the plugin's config: nri.socket
    await runtime.start()                   # listens (a private socket)
    ... start the plugin process (`nri-gpushare run --config ...`) ...
    plugin = await runtime.wait_plugin()    # it connected and sent RegisterPlugin
    events = await plugin.configure()       # ConfigureRequest -> its event mask
    sync = await plugin.synchronize(pods, containers)   # chunked, one deadline
    reply, seconds = await plugin.create_container(pod, container)
    await plugin.remove_container(pod, container)       # StateChange, as 1.7 sends
    await runtime.close()

Pods and containers are given serialized (`bytes`, the cheapest: encode them
once, before any timing) or as betterproto messages (`nri.PodSandbox`,
`nri.Container`), which are serialized first.

Synchronize is split as NRI's runtime side splits it (containerd 1.7.24's
NRI): first everything in one request; when that request is larger than
ttrpc's message limit (4 MiB), both counts are scaled by min(0.9, limit /
size), and when pods + containers are still more than 1024 they become
512 and 512; a request still too big shrinks again the same way.  The counts
then stay for the remaining requests (fewer when a list runs short).  Every
request but the last has `more` set, and the plugin must answer those with
`more` set and no updates.  All requests share one deadline, the request
timeout (2 s by default, as NRI's), counted from the first request sent;
`SyncResult.seconds` is the time from the first request sent to the last
reply received, and `within_deadline` whether that was under the deadline.
With `enforce_deadline=True` (the runtime's behaviour) a request past the
deadline fails with TtrpcError(DEADLINE_EXCEEDED); by default the benchmark
waits for the answers, to measure how long the plugin really takes.

Everything is asyncio; use it from one event loop.  `PluginConnection.call`
sends any plugin-service method with a raw payload.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import betterproto

from nri_gpushare.nri.api import fields as F
from nri_gpushare.nri.api import nri
from nri_gpushare.nri.wire import PLUGIN_CONN, RUNTIME_CONN, Code, MuxConnection, TtrpcError, pb
from nri_gpushare.nri.wire.ttrpc import MAX_SEND_MESSAGE, Request

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
MAX_OBJECTS_PER_MESSAGE = 1024
"""After a split, NRI sends at most this many pods + containers per request."""
MIN_OBJECTS_PER_MESSAGE = 8
"""NRI gives up splitting below this many objects per request."""

Object = bytes | betterproto.Message


def serialized(obj: Object) -> bytes:
    """A pod or container as bytes."""
    return obj if isinstance(obj, bytes) else bytes(obj)


def _field_size(payload_len: int) -> int:
    """Bytes of a length-delimited field with a one-byte key."""
    return 1 + len(pb.uvarint(payload_len)) + payload_len


def message_size(payload_len: int, method: str, timeout: float | None) -> int:
    """Bytes of the ttrpc Request carrying a payload of `payload_len` bytes."""
    envelope = Request(PLUGIN_SERVICE, method, b"", _nanos(timeout)).encode()
    return len(envelope) + _field_size(payload_len)


def _nanos(timeout: float | None) -> int:
    return max(int(timeout * 1e9), 0) if timeout is not None else 0


@dataclass
class SyncChunk:
    """One Synchronize request: how many pods and containers, its size, its round trip."""

    pods: int
    containers: int
    bytes: int
    seconds: float
    more: bool


@dataclass
class SyncResult:
    """A whole (chunked) Synchronize."""

    seconds: float
    """First request sent to last reply received."""
    deadline: float
    chunks: list[SyncChunk] = field(default_factory=list)
    updates: bytes = b""
    """The last reply's payload (a SynchronizeResponse)."""

    @property
    def within_deadline(self) -> bool:
        return self.seconds <= self.deadline

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.chunks)


def split_counts(pods: int, containers: int, size: int, limit: int) -> tuple[int, int]:
    """The per-request counts after a request of `size` bytes was over `limit`.

    Raises ValueError where NRI gives up (too few objects left to split)."""
    if pods + containers <= MIN_OBJECTS_PER_MESSAGE:
        raise ValueError(
            f"cannot split Synchronize further: {pods} pods + {containers} containers"
            f" still take {size} bytes, over {limit}"
        )
    factor = min(0.9, limit / size)
    pods, containers = int(factor * pods), int(factor * containers)
    if pods + containers > MAX_OBJECTS_PER_MESSAGE:
        pods = containers = MAX_OBJECTS_PER_MESSAGE // 2
    return pods, containers


def synchronize_payload(pods: Sequence[bytes], containers: Sequence[bytes], more: bool) -> bytes:
    """A serialized SynchronizeRequest."""
    S = F.SynchronizeRequest
    return b"".join(
        [
            *(pb.len_field(S.PODS, p) for p in pods),
            *(pb.len_field(S.CONTAINERS, c) for c in containers),
            pb.bool_field(S.MORE, more),
        ]
    )


def _container_request(pod: Object, container: Object) -> bytes:
    """Any {pod = 1, container = 2} request (Create, Stop, Update...)."""
    return pb.len_field(1, serialized(pod)) + pb.len_field(2, serialized(container))


class PluginConnection:
    """One registered plugin, as the runtime sees it."""

    def __init__(
        self,
        runtime: NriRuntime,
        connection: MuxConnection,
        registration: nri.RegisterPluginRequest,
    ) -> None:
        self.runtime = runtime
        self.connection = connection
        self.name = registration.plugin_name
        self.index = registration.plugin_idx
        self.events = 0
        """The event mask the plugin subscribed to in Configure."""

    async def call(self, method: str, payload: bytes, timeout: float | None = None) -> bytes:
        """Call a plugin-service method; the reply's payload (TtrpcError on an error status)."""
        client = self.connection.client(PLUGIN_CONN)
        return await client.call(
            PLUGIN_SERVICE,
            method,
            payload,
            timeout=self.runtime.request_timeout if timeout is None else timeout,
        )

    async def timed(self, method: str, payload: bytes) -> tuple[bytes, float]:
        """`call`, and its round trip in seconds."""
        started = time.perf_counter()
        reply = await self.call(method, payload)
        return reply, time.perf_counter() - started

    async def configure(self, config: str = "") -> int:
        """Configure as containerd 1.7 sends it (no timeouts, no NRI version);
        returns the plugin's event mask."""
        request = nri.ConfigureRequest(
            config=config,
            runtime_name=self.runtime.runtime_name,
            runtime_version=self.runtime.runtime_version,
            registration_timeout=self.runtime.send_timeouts[0],
            request_timeout=self.runtime.send_timeouts[1],
        )
        reply = nri.ConfigureResponse().parse(await self.call("Configure", bytes(request)))
        self.events = reply.events
        return self.events

    async def synchronize(
        self,
        pods: Sequence[Object],
        containers: Sequence[Object],
        *,
        enforce_deadline: bool = False,
        limit: int = MAX_SEND_MESSAGE,
    ) -> SyncResult:
        """Send the pods and containers in as many requests as NRI would."""
        pod_bytes = [serialized(p) for p in pods]
        ctr_bytes = [serialized(c) for c in containers]
        sizes_pods = [_field_size(len(p)) for p in pod_bytes]
        sizes_ctrs = [_field_size(len(c)) for c in ctr_bytes]
        deadline = self.runtime.request_timeout
        per_pods, per_ctrs = len(pod_bytes), len(ctr_bytes)
        p = c = 0
        started = time.perf_counter()
        result = SyncResult(0.0, deadline)
        while True:
            n_pods, n_ctrs = min(per_pods, len(pod_bytes) - p), min(per_ctrs, len(ctr_bytes) - c)
            more = p + n_pods < len(pod_bytes) or c + n_ctrs < len(ctr_bytes)
            left = deadline - (time.perf_counter() - started)
            timeout = left if enforce_deadline else max(left, 0.0) + 60.0
            payload_len = sum(sizes_pods[p : p + n_pods]) + sum(sizes_ctrs[c : c + n_ctrs])
            payload_len += 2 if more else 0
            size = message_size(payload_len, "Synchronize", timeout)
            if size > limit:  # NRI learns this from its ttrpc client's refusal
                per_pods, per_ctrs = split_counts(n_pods, n_ctrs, size, limit)
                continue
            if enforce_deadline and left <= 0:
                raise TtrpcError(Code.DEADLINE_EXCEEDED, "Synchronize: past the deadline")
            payload = synchronize_payload(
                pod_bytes[p : p + n_pods], ctr_bytes[c : c + n_ctrs], more
            )
            sent = time.perf_counter()
            reply = await self.call("Synchronize", payload, timeout=timeout)
            result.chunks.append(
                SyncChunk(n_pods, n_ctrs, len(payload), time.perf_counter() - sent, more)
            )
            p, c = p + n_pods, c + n_ctrs
            if not more:
                result.updates = reply
                break
            answer = nri.SynchronizeResponse().parse(reply)
            if answer.update or not answer.more:
                raise TtrpcError(Code.INTERNAL, "plugin does not handle split sync requests")
        result.seconds = time.perf_counter() - started
        return result

    async def create_container(self, pod: Object, container: Object) -> tuple[bytes, float]:
        """CreateContainer; (reply payload, round trip in seconds)."""
        return await self.timed("CreateContainer", _container_request(pod, container))

    async def stop_container(self, pod: Object, container: Object) -> tuple[bytes, float]:
        return await self.timed("StopContainer", _container_request(pod, container))

    async def state_change(
        self, event: int, pod: Object, container: Object | None = None
    ) -> tuple[bytes, float]:
        """A StateChange event (how containerd 1.7 sends the notifications)."""
        S = F.StateChangeEvent
        payload = pb.varint_field(S.EVENT, event) + pb.len_field(S.POD, serialized(pod))
        if container is not None:
            payload += pb.len_field(S.CONTAINER, serialized(container))
        return await self.timed("StateChange", payload)

    async def start_container(self, pod: Object, container: Object) -> tuple[bytes, float]:
        return await self.state_change(nri.Event.START_CONTAINER, pod, container)

    async def remove_container(self, pod: Object, container: Object) -> tuple[bytes, float]:
        return await self.state_change(nri.Event.REMOVE_CONTAINER, pod, container)

    async def close(self) -> None:
        await self.connection.close()


class NriRuntime:
    """Listens on an NRI socket and registers the plugins that connect."""

    def __init__(
        self,
        socket_path: str,
        *,
        runtime_name: str = "containerd",
        runtime_version: str = "1.7.24",
        request_timeout: float = 2.0,
        send_timeouts: tuple[int, int] = (0, 0),
    ) -> None:
        """`request_timeout`: seconds the runtime waits for a reply (and for a
        whole Synchronize); `send_timeouts`: (registration, request) in ms put
        in ConfigureRequest (containerd 1.7 sends neither: 0, 0)."""
        self.socket_path = socket_path
        self.runtime_name = runtime_name
        self.runtime_version = runtime_version
        self.request_timeout = request_timeout
        self.send_timeouts = send_timeouts
        self.connections: list[MuxConnection] = []
        """Every connection, kept referenced (asyncio holds a reader weakly)."""
        self._registered: asyncio.Queue[PluginConnection] = asyncio.Queue()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._accept, path=self.socket_path)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = MuxConnection(reader, writer)
        self.connections.append(conn)

        async def runtime_service(service: str, method: str, payload: bytes) -> bytes:
            if service != RUNTIME_SERVICE:
                raise TtrpcError(Code.UNIMPLEMENTED, f"no service {service}")
            if method == "RegisterPlugin":
                request = nri.RegisterPluginRequest().parse(payload)
                await self._registered.put(PluginConnection(self, conn, request))
                return b""
            if method == "UpdateContainers":
                return bytes(nri.UpdateContainersResponse())
            raise TtrpcError(Code.UNIMPLEMENTED, method)

        conn.serve(RUNTIME_CONN, runtime_service)

    async def wait_plugin(self, timeout: float = 30.0) -> PluginConnection:
        """The next plugin that registers."""
        return await asyncio.wait_for(self._registered.get(), timeout)

    async def close(self) -> None:
        for conn in self.connections:
            await conn.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
