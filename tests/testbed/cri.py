"""A small asyncio CRI v1 client (grpclib) for driving the test bed like a kubelet.

Pods use the host network and the host UTS namespace, so no CNI is needed.
The client remembers every pod it started; cleanup() stops and removes them
all (a failed CreateContainer leaves its sandbox behind, so always clean up).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

from tests.testbed.cri_generated.runtime import v1 as cri
from tests.testbed.images import BUSYBOX_IMAGE

__all__ = ["ContainerRun", "CriClient", "GRPCError", "cri", "parse_cri_log", "wait_images"]


def parse_cri_log(text: str) -> list[tuple[str, str]]:
    """Parse CRI log lines `TIMESTAMP STREAM P|F TEXT` into (stream, line) pairs.

    Partial (P) chunks are joined with the following chunks of the same stream.
    """
    out: list[tuple[str, str]] = []
    partial: dict[str, str] = {}
    for raw in text.splitlines():
        parts = raw.split(" ", 3)
        if len(parts) < 3:
            continue
        _, stream, tag = parts[:3]
        chunk = parts[3] if len(parts) == 4 else ""
        if tag == "P":
            partial[stream] = partial.get(stream, "") + chunk
        else:
            out.append((stream, partial.pop(stream, "") + chunk))
    out += list(partial.items())
    return out


def wait_images(socket: Path | str, names: Sequence[str], timeout: float = 30.0) -> None:
    """CriClient.wait_images from synchronous code (also inside a running
    event loop, e.g. an async test that starts a containerd): its own loop in
    a thread."""

    async def wait() -> None:
        client = CriClient(socket)
        try:
            await client.wait_ready(timeout)
            await client.wait_images(names, timeout)
        finally:
            client.channel.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, wait()).result()


@dataclass
class ContainerRun:
    """What run_container() returns once the container has exited."""

    pod_id: str
    container_id: str
    exit_code: int
    lines: list[str]
    status: cri.ContainerStatus = field(repr=False)


class CriClient:
    """CRI RuntimeService/ImageService client on a containerd gRPC socket."""

    def __init__(self, socket: Path | str, log_dir: Path | str | None = None) -> None:
        self.socket = str(socket)
        self.log_dir = Path(log_dir) if log_dir else None
        self.channel = Channel(path=self.socket)
        self.runtime = cri.RuntimeServiceStub(self.channel, timeout=30)
        self.images = cri.ImageServiceStub(self.channel, timeout=30)
        self.pods: dict[str, cri.PodSandboxConfig] = {}

    async def __aenter__(self) -> CriClient:
        await self.wait_ready()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        try:
            await self.cleanup()
        finally:
            self.channel.close()

    async def wait_ready(self, timeout: float = 30.0) -> cri.StatusResponse:
        """Wait until CRI answers Status with RuntimeReady.

        Call it again after Containerd.restart(): the first call on the old
        connection fails and the channel reconnects.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = await self.runtime.status(cri.StatusRequest())
                ready = {c.type: c.status for c in status.status.conditions}
                if ready.get("RuntimeReady"):
                    return status
                error: object = status
            except (GRPCError, StreamTerminatedError, OSError) as e:
                error = e  # also a connection to a containerd since restarted
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRI at {self.socket} not ready: {error}")
            await asyncio.sleep(0.05)

    async def version(self) -> cri.VersionResponse:
        return await self.runtime.version(cri.VersionRequest())

    async def wait_images(self, names: Sequence[str], timeout: float = 30.0) -> None:
        """Wait until CRI's image cache has every image in `names`.

        CRI learns of an image imported with ctr from containerd's events,
        asynchronously (2.x often after ctr has returned): a pod started
        before that finds no sandbox image and tries to pull it.
        """
        deadline = time.monotonic() + timeout
        while True:
            listed = await self.images.list_images(cri.ListImagesRequest())
            missing = set(names) - {tag for image in listed.images for tag in image.repo_tags}
            if not missing:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRI at {self.socket} does not list {sorted(missing)}")
            await asyncio.sleep(0.02)

    # -- pods ------------------------------------------------------------

    async def run_pod(
        self,
        name: str,
        namespace: str = "default",
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        cgroup_parent: str = "",
        uid: str = "",
    ) -> str:
        """RunPodSandbox on the host network; returns the pod sandbox id
        (`uid`: the pod's, as the API server gave it; default a new one)."""
        uid = uid or str(uuid.uuid4())
        config = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=name, uid=uid, namespace=namespace),
            labels=dict(labels or {}),
            annotations=dict(annotations or {}),
            linux=cri.LinuxPodSandboxConfig(
                cgroup_parent=cgroup_parent,
                security_context=cri.LinuxSandboxSecurityContext(
                    namespace_options=cri.NamespaceOption(network=cri.NamespaceMode.NODE),
                ),
            ),
        )
        if self.log_dir is not None:
            config.log_directory = str(self.log_dir / f"{namespace}_{name}_{uid}")
        resp = await self.runtime.run_pod_sandbox(cri.RunPodSandboxRequest(config=config))
        self.pods[resp.pod_sandbox_id] = config
        return resp.pod_sandbox_id

    def pod_config(self, pod_id: str) -> cri.PodSandboxConfig:
        return self.pods[pod_id]

    async def stop_pod(self, pod_id: str) -> None:
        await self.runtime.stop_pod_sandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod_id))

    async def remove_pod(self, pod_id: str) -> None:
        await self.runtime.remove_pod_sandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
        self.pods.pop(pod_id, None)

    async def list_pods(self) -> list[cri.PodSandbox]:
        return (await self.runtime.list_pod_sandbox(cri.ListPodSandboxRequest())).items

    async def cleanup(self) -> None:
        """Stop and remove every pod this client started (and their containers)."""
        errors = []
        for pod_id in list(self.pods):
            try:
                await self.stop_pod(pod_id)
                await self.remove_pod(pod_id)
            except (GRPCError, StreamTerminatedError, OSError) as e:
                errors.append(f"{pod_id}: {e}")
        if errors:
            raise RuntimeError("CRI cleanup failed: " + "; ".join(errors))

    # -- containers ------------------------------------------------------

    async def create_container(
        self,
        pod_id: str,
        name: str,
        image: str = BUSYBOX_IMAGE,
        command: Sequence[str] = (),
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        pod_config: cri.PodSandboxConfig | None = None,
        cdi_devices: Sequence[str] = (),
    ) -> str:
        """CreateContainer in pod_id; returns the container id.  `cdi_devices`:
        fully qualified CDI device names, as the kubelet passes a prepared
        DRA claim's."""
        pod_config = pod_config or self.pods[pod_id]
        config = cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=name),
            image=cri.ImageSpec(image=image),
            command=list(command),
            args=list(args),
            envs=[cri.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            labels=dict(labels or {}),
            annotations=dict(annotations or {}),
            linux=cri.LinuxContainerConfig(
                security_context=cri.LinuxContainerSecurityContext(
                    namespace_options=cri.NamespaceOption(network=cri.NamespaceMode.NODE),
                ),
            ),
        )
        config.cdi_devices = [cri.CdiDevice(name=n) for n in cdi_devices]
        if pod_config.log_directory:
            config.log_path = f"{name}.log"
        resp = await self.runtime.create_container(
            cri.CreateContainerRequest(
                pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config
            )
        )
        return resp.container_id

    async def start(self, container_id: str) -> None:
        await self.runtime.start_container(cri.StartContainerRequest(container_id=container_id))

    async def stop(self, container_id: str, timeout: int = 0) -> None:
        await self.runtime.stop_container(
            cri.StopContainerRequest(container_id=container_id, timeout=timeout)
        )

    async def remove(self, container_id: str) -> None:
        await self.runtime.remove_container(cri.RemoveContainerRequest(container_id=container_id))

    async def container_status(self, container_id: str) -> cri.ContainerStatus:
        resp = await self.runtime.container_status(
            cri.ContainerStatusRequest(container_id=container_id)
        )
        return resp.status

    async def container_info(self, container_id: str) -> dict[str, Any]:
        """containerd's verbose status info (pid, runtimeSpec, ...) as a dict."""
        resp = await self.runtime.container_status(
            cri.ContainerStatusRequest(container_id=container_id, verbose=True)
        )
        return json.loads(resp.info["info"])

    async def list_containers(self, pod_id: str = "") -> list[cri.Container]:
        req = cri.ListContainersRequest(filter=cri.ContainerFilter(pod_sandbox_id=pod_id))
        return (await self.runtime.list_containers(req)).containers

    async def wait_exit(self, container_id: str, timeout: float = 30.0) -> cri.ContainerStatus:
        """Poll until the container has exited; returns its final status."""
        deadline = time.monotonic() + timeout
        while True:
            status = await self.container_status(container_id)
            if status.state == cri.ContainerState.CONTAINER_EXITED:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"container {container_id} still {status.state.name}")
            await asyncio.sleep(0.05)

    async def read_logs(self, container_id: str, stream: str | None = None) -> list[str]:
        """The container's output lines from its CRI log file (both streams by default)."""
        status = await self.container_status(container_id)
        if not status.log_path:
            raise RuntimeError(f"container {container_id} has no CRI log path")
        text = Path(status.log_path).read_text(errors="replace")
        return [line for s, line in parse_cri_log(text) if stream is None or s == stream]

    # -- convenience -----------------------------------------------------

    async def run_container(
        self,
        command: Sequence[str],
        *,
        name: str = "tb",
        image: str = BUSYBOX_IMAGE,
        env: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        pod_annotations: Mapping[str, str] | None = None,
        pod_labels: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> ContainerRun:
        """Run a pod with one container to completion; returns its output.

        The pod stays registered with this client (cleanup() removes it).
        """
        pod_id = await self.run_pod(name, annotations=pod_annotations, labels=pod_labels)
        cid = await self.create_container(
            pod_id,
            name,
            image=image,
            command=command,
            env=env,
            labels=labels,
            annotations=annotations,
        )
        await self.start(cid)
        status = await self.wait_exit(cid, timeout)
        return ContainerRun(pod_id, cid, status.exit_code, await self.read_logs(cid), status)

    async def run_container_env(
        self,
        annotations: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        **kwargs: object,
    ) -> ContainerRun:
        """Run `env` in a fresh pod; .lines holds its environment, one K=V a line."""
        return await self.run_container(["env"], annotations=annotations, env=env, **kwargs)
