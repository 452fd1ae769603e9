"""A test kubelet: the kubelet's side of the device-plugin API, built from the
same protos as the plugin (`nri_gpushare.k8s.generated.v1beta1`).

What it does as the real kubelet (pkg/kubelet/cm/devicemanager) does:

- on `start()` it deletes every file in the device-plugin directory, then
  serves ``v1beta1.Registration`` on ``<dir>/kubelet.sock``; `restart()` is
  stop + start, so plugins see their sockets vanish and a new kubelet.sock;
- ``Register`` refuses a version other than v1beta1 and a resource name
  without a domain, then (after answering) connects to the plugin's
  ``<dir>/<endpoint>``, asks ``GetDevicePluginOptions`` and follows
  ``ListAndWatch``, keeping the latest device list per resource; a second
  registration of a resource replaces the first one's connection;
- `allocate` and `preferred` call ``Allocate`` and ``GetPreferredAllocation``
  for one container as the kubelet does at admission.

What it does not: checkpoints, pods, choosing devices itself, the grace
period before a plugin that went away loses its devices.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from nri_gpushare.k8s import API_VERSION, HEALTHY, KUBELET_SOCKET
from nri_gpushare.k8s.generated import v1beta1 as pb

Devices = list[pb.Device]


@dataclass
class Plugin:
    """One registered plugin as this kubelet follows it."""

    request: pb.RegisterRequest
    channel: Channel
    stub: pb.DevicePluginStub
    options: pb.DevicePluginOptions | None = None
    devices: Devices | None = None
    updates: int = 0
    ended: str | None = None
    """How ListAndWatch ended: "ok" (the plugin ended it), or the error."""
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class _Registration(pb.RegistrationBase):  # type: ignore[misc]
    def __init__(self, kubelet: TestKubelet) -> None:
        self.kubelet = kubelet

    async def register(self, request: pb.RegisterRequest) -> pb.Empty:
        if request.version != API_VERSION:
            raise GRPCError(Status.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        if "/" not in request.resource_name:
            raise GRPCError(Status.INVALID_ARGUMENT, f"bad resource {request.resource_name!r}")
        await self.kubelet.registered(request)
        return pb.Empty()


class TestKubelet:
    """`async with TestKubelet(dir) as kubelet:` ... (see the module doc)."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.socket = self.directory / KUBELET_SOCKET
        self.requests: list[pb.RegisterRequest] = []
        self.plugins: dict[str, Plugin] = {}
        self.ended: list[Plugin] = []
        """Plugins replaced by a later registration or by a restart."""
        self._server: Server | None = None
        self._changed = asyncio.Condition()

    async def __aenter__(self) -> TestKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, remove_sockets: bool = True) -> None:
        """Serve; first remove every file in the directory, as the real
        kubelet does, unless `remove_sockets` is false (only kubelet.sock then)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for entry in self.directory.iterdir():
            if not entry.is_dir() and (remove_sockets or entry == self.socket):
                entry.unlink()
        self._server = Server([_Registration(self)])
        await self._server.start(path=str(self.socket))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
            self.socket.unlink(missing_ok=True)  # as Go's listener does on Close
        for plugin in list(self.plugins.values()):
            await self._drop(plugin)
        self.plugins.clear()

    async def restart(self, remove_sockets: bool = True) -> None:
        """As a kubelet restart: every socket in the directory is removed and
        kubelet.sock comes back as a new file."""
        await self.stop()
        await self.start(remove_sockets)

    async def registered(self, request: pb.RegisterRequest) -> None:
        async with self._changed:
            self.requests.append(request)
            self._spawn(request)
            self._changed.notify_all()

    def _spawn(self, request: pb.RegisterRequest) -> None:
        old = self.plugins.get(request.resource_name)
        if old is not None:
            self.ended.append(old)
            self._cancel(old)
        channel = Channel(path=str(self.directory / request.endpoint))
        plugin = Plugin(request, channel, pb.DevicePluginStub(channel))
        self.plugins[request.resource_name] = plugin
        plugin.task = asyncio.create_task(self._follow(plugin))

    async def _follow(self, plugin: Plugin) -> None:
        try:
            plugin.options = await plugin.stub.get_device_plugin_options(pb.Empty())
            async for response in plugin.stub.list_and_watch(pb.Empty()):
                async with self._changed:
                    plugin.devices = list(response.devices)
                    plugin.updates += 1
                    self._changed.notify_all()
            plugin.ended = "ok"
        except asyncio.CancelledError:
            plugin.ended = "cancelled by the kubelet"
            raise
        except Exception as e:
            plugin.ended = f"{type(e).__name__}: {e}"
        async with self._changed:
            self._changed.notify_all()

    def _cancel(self, plugin: Plugin) -> None:
        if plugin.task is not None:
            plugin.task.cancel()
        plugin.channel.close()

    async def _drop(self, plugin: Plugin) -> None:
        self.ended.append(plugin)
        self._cancel(plugin)
        if plugin.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await plugin.task

    async def wait_for(
        self,
        resource: str,
        predicate: Callable[[Devices], bool] = lambda devices: True,
        timeout: float = 15.0,
    ) -> Devices:
        """The latest device list of `resource` once `predicate` holds for it
        (a registration must have come first); TimeoutError otherwise."""

        def ready() -> bool:
            plugin = self.plugins.get(resource)
            return plugin is not None and plugin.devices is not None and predicate(plugin.devices)

        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(ready)
        devices = self.plugins[resource].devices
        assert devices is not None
        return devices

    async def wait_registered(self, count: int, timeout: float = 15.0) -> None:
        """Until `count` Register calls in all have arrived."""
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(lambda: len(self.requests) >= count)

    def allocatable(self, resource: str) -> int:
        """How many healthy devices the resource lists (the node's allocatable)."""
        return healthy(self.plugins[resource].devices or [])

    async def allocate(self, resource: str, ids: Sequence[str]) -> dict[str, str]:
        """Allocate `ids` for one container; the annotations the plugin answers."""
        reply = await self.plugins[resource].stub.allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(list(ids))]),
            timeout=10,
        )
        (container,) = reply.container_responses
        assert not container.envs and not container.mounts and not container.devices
        return dict(container.annotations)

    async def preferred(
        self, resource: str, available: Sequence[str], must: Sequence[str], size: int
    ) -> list[str]:
        request = pb.ContainerPreferredAllocationRequest(list(available), list(must), size)
        reply = await self.plugins[resource].stub.get_preferred_allocation(
            pb.PreferredAllocationRequest(container_requests=[request]), timeout=10
        )
        (container,) = reply.container_responses
        return list(container.device_i_ds)

    def sockets(self) -> set[str]:
        """The names of the sockets in the directory."""
        return {e.name for e in self.directory.iterdir() if e.is_socket()}


def healthy(devices: Devices) -> int:
    return sum(d.health == HEALTHY for d in devices)
