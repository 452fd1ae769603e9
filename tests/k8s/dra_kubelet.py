"""A test kubelet for DRA drivers: the kubelet's plugin watcher and DRA
manager, built from the same protos as the driver
(`nri_gpushare.k8s.generated.dra`).

What it does as the real kubelet (pkg/kubelet/pluginmanager, cm/dra) does:

- it looks at the registry directory every `poll` seconds; a new ``*.sock``
  is asked ``GetInfo``; a type other than ``DRAPlugin`` or no supported
  version it speaks (`speaks`, by default ``v1.DRAPlugin``) is refused with
  ``NotifyRegistrationStatus(false, reason)``, else it connects to the
  endpoint and answers ``NotifyRegistrationStatus(true)``;
- a registration socket that vanished (or is a new file now) drops the
  plugin; a new file at that path registers again;
- `prepare` / `unprepare` call NodePrepareResources / NodeUnprepareResources
  with the plugin's version; `watch_health` follows NodeWatchResources;
- `restart()`: stop (channels closed, plugins forgotten), then start, which
  finds the sockets already in the directory, as a restarted kubelet does.

What it does not: checkpoints, pods, CDI, the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpclib.client import Channel

from nri_gpushare.k8s.generated.dra import pluginregistration as reg
from nri_gpushare.k8s.generated.dra import v1 as health_v1
from nri_gpushare.k8s.generated.dra import v1alpha1 as health_v1alpha1
from nri_gpushare.k8s.generated.dra.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from nri_gpushare.k8s.generated.dra.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_v1beta1

VERSIONS = {"v1.DRAPlugin": dra_v1, "v1beta1.DRAPlugin": dra_v1beta1}
HEALTH = {"v1alpha1": health_v1alpha1, "v1": health_v1}
CALL_TIMEOUT = 10.0

Identity = tuple[int, int, int]


def _identity(path: Path) -> Identity | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


@dataclass
class Plugin:
    """One registered plugin as this kubelet follows it."""

    info: reg.PluginInfo
    socket: Path
    identity: Identity
    version: str
    channel: Channel
    health: list[Any] | None = None
    """The latest NodeWatchResources list."""
    health_updates: int = 0
    health_ended: str | None = None
    """How the health stream ended: "ok" (the plugin ended it), or the error."""
    health_task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def pb(self) -> Any:
        return VERSIONS[self.version]


class DraKubelet:
    """`async with DraKubelet(registry_dir) as kubelet:` ... (see the module doc)."""

    def __init__(
        self,
        registry_dir: str | Path,
        *,
        speaks: Sequence[str] = ("v1.DRAPlugin",),
        poll: float = 0.05,
    ) -> None:
        self.registry_dir = Path(registry_dir)
        self.speaks = tuple(speaks)
        self.poll = poll
        self.plugins: dict[str, Plugin] = {}
        self.refused: list[tuple[Path, str]] = []
        self.vanished: list[Path] = []
        self.registrations = 0
        self.errors: list[str] = []
        """Registration attempts that failed on the wire (tried again)."""
        self._known: dict[Path, Identity] = {}
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()

    async def __aenter__(self) -> DraKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for plugin in list(self.plugins.values()):
            await self._drop(plugin)
        self.plugins.clear()
        self._known.clear()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def _watch(self) -> None:
        while True:
            await self._look()
            await asyncio.sleep(self.poll)

    async def _look(self) -> None:
        for path, known in list(self._known.items()):
            if _identity(path) != known:
                del self._known[path]
                for name, plugin in list(self.plugins.items()):
                    if plugin.socket == path:
                        del self.plugins[name]
                        await self._drop(plugin)
                self.vanished.append(path)
                await self._notify()
        for path in sorted(self.registry_dir.glob("*.sock")):
            identity = _identity(path)
            if identity is None or self._known.get(path) == identity:
                continue
            self._known[path] = identity
            try:
                await self._register(path, identity)
            except Exception as e:  # not served yet, or refused a call: try again
                del self._known[path]
                self.errors.append(f"{path.name}: {type(e).__name__}: {e}")

    async def _register(self, path: Path, identity: Identity) -> None:
        channel = Channel(path=str(path))
        try:
            stub = reg.RegistrationStub(channel)
            info = await stub.get_info(reg.InfoRequest(), timeout=CALL_TIMEOUT)
            version = next((v for v in info.supported_versions if v in self.speaks), None)
            reason = ""
            if info.type != "DRAPlugin":
                reason = f"plugin type {info.type!r} is not DRAPlugin"
            elif version is None:
                reason = (
                    f"none of the versions {list(info.supported_versions)} is one this kubelet "
                    f"speaks ({list(self.speaks)})"
                )
            elif not info.name:
                reason = "the plugin has no name"
            if reason:
                status = reg.RegistrationStatus(plugin_registered=False, error=reason)
                await stub.notify_registration_status(status, timeout=CALL_TIMEOUT)
                self.refused.append((path, reason))
                await self._notify()
                return
            assert version is not None
            old = self.plugins.pop(info.name, None)
            if old is not None:
                await self._drop(old)
            plugin = Plugin(info, path, identity, version, Channel(path=info.endpoint))
            status = reg.RegistrationStatus(plugin_registered=True)
            await stub.notify_registration_status(status, timeout=CALL_TIMEOUT)
            self.plugins[info.name] = plugin
            self.registrations += 1
            await self._notify()
        finally:
            channel.close()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _drop(self, plugin: Plugin) -> None:
        if plugin.health_task is not None:
            plugin.health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await plugin.health_task
        plugin.channel.close()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 15.0) -> None:
        """Until `predicate()` holds (checked after every change); TimeoutError."""
        async with asyncio.timeout(timeout):
            async with self._changed:
                while not predicate():
                    # Also look again now and then: a condition on files changes unnoticed.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), self.poll)

    async def wait_registered(self, count: int = 1, timeout: float = 15.0) -> None:
        """Until `count` registrations in all have been accepted."""
        await self.wait_for(lambda: self.registrations >= count, timeout)

    def plugin(self, name: str) -> Plugin:
        return self.plugins[name]

    async def prepare(self, name: str, claims: Sequence[tuple[str, str, str]]) -> dict[str, Any]:
        """NodePrepareResources for `claims` (namespace, name, uid): the
        answer per claim UID."""
        plugin = self.plugins[name]
        pb = plugin.pb
        request = pb.NodePrepareResourcesRequest(claims=_claims(pb, claims))
        reply = await pb.DraPluginStub(plugin.channel).node_prepare_resources(
            request, timeout=CALL_TIMEOUT
        )
        return dict(reply.claims)

    async def unprepare(self, name: str, claims: Sequence[tuple[str, str, str]]) -> dict[str, Any]:
        """NodeUnprepareResources for `claims`: the answer per claim UID."""
        plugin = self.plugins[name]
        pb = plugin.pb
        request = pb.NodeUnprepareResourcesRequest(claims=_claims(pb, claims))
        reply = await pb.DraPluginStub(plugin.channel).node_unprepare_resources(
            request, timeout=CALL_TIMEOUT
        )
        return dict(reply.claims)

    async def watch_health(self, name: str, version: str = "v1alpha1") -> Plugin:
        """Follow the plugin's NodeWatchResources (of API `version`)."""
        plugin = self.plugins[name]
        plugin.health_task = asyncio.create_task(self._follow_health(plugin, HEALTH[version]))
        return plugin

    async def _follow_health(self, plugin: Plugin, pb: Any) -> None:
        stub = pb.DraResourceHealthStub(plugin.channel)
        try:
            async for response in stub.node_watch_resources(pb.NodeWatchResourcesRequest()):
                plugin.health = list(response.devices)
                plugin.health_updates += 1
                await self._notify()
            plugin.health_ended = "ok"
        except asyncio.CancelledError:
            plugin.health_ended = "cancelled by the kubelet"
            raise
        except Exception as e:
            plugin.health_ended = f"{type(e).__name__}: {e}"
        await self._notify()


def _claims(pb: Any, claims: Sequence[tuple[str, str, str]]) -> list[Any]:
    return [pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
