"""The demo's CUDA pods: containers that run a program on the tests' fake
CUDA driver (libgpushare/tests/fake), with the interposer preloaded through
the /etc/ld.so.preload the plugin mounts, like any pod with a share.

The image is the test bed's static busybox; the program is dynamically
linked, so the host's glibc directories are mounted read-only, and the fake
driver's directory (libcuda.so.1, libnvidia-ml.so.1) is on LD_LIBRARY_PATH,
where a real image has NVIDIA's.  FAKECUDA_GPU_STATE names one file that
every process on the node shares: the simulated GPU, which runs one kernel
at a time for whoever submitted it, as a real GPU runs contexts in turn.

The pods share the host's PID namespace (hostPID): the fake driver files its
record of each process under getpid(), which in a PID namespace of its own
would be the container's number, the same in every container; a real driver
numbers every process by the host's PID, whatever its namespace.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.testbed.cri import CriClient, cri
from tests.testbed.images import BUSYBOX_IMAGE

GiB = 1 << 30
P = "gpushare.io/"
GPU_DIR = "/gs-gpu"  # the simulated GPU's directory, in the container
FAKE_UUIDS = [f"GPU-face0000-0000-0000-0000-{i:012x}" for i in range(2)]


@dataclass(frozen=True)
class Binaries:
    """What the demo built: the interposer, the fake driver's directory, the
    programs run in pods, and the simulated GPU's reader."""

    dir: Path

    @property
    def interposer(self) -> Path:
        return self.dir / "libgpushare.so"

    @property
    def fake_dir(self) -> Path:
        return self.dir / "fake"

    @property
    def programs(self) -> Path:
        return self.dir / "bin"

    @property
    def gpu_state(self) -> Path:
        return self.dir / "gpu_state"


def host_pid() -> cri.NamespaceOption:
    return cri.NamespaceOption(network=cri.NamespaceMode.NODE, pid=cri.NamespaceMode.NODE)


async def run_pod(client: CriClient, name: str, annotations: Mapping[str, str]) -> str:
    """RunPodSandbox on the host's network and PID namespace."""
    uid = str(uuid.uuid4())
    config = cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name=name, uid=uid, namespace="default"),
        annotations=dict(annotations),
        linux=cri.LinuxPodSandboxConfig(
            security_context=cri.LinuxSandboxSecurityContext(namespace_options=host_pid()),
        ),
    )
    if client.log_dir is not None:
        config.log_directory = str(client.log_dir / f"default_{name}_{uid}")
    resp = await client.runtime.run_pod_sandbox(cri.RunPodSandboxRequest(config=config))
    client.pods[resp.pod_sandbox_id] = config
    return resp.pod_sandbox_id


async def cuda_container(
    client: CriClient,
    pod: str,
    binaries: Binaries,
    gpu_dir: Path,
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    ctl_dir: Path | None = None,
) -> str:
    """Create and start a container in `pod` running `command` (a program in
    /gs) on the fake driver, the simulated GPU in `gpu_dir`."""
    mounts = [
        cri.Mount(container_path="/gs", host_path=str(binaries.programs), readonly=True),
        cri.Mount(container_path="/gs-fake", host_path=str(binaries.fake_dir), readonly=True),
        cri.Mount(container_path=GPU_DIR, host_path=str(gpu_dir)),
        cri.Mount(container_path="/lib64", host_path="/lib64", readonly=True),
        cri.Mount(
            container_path="/lib/x86_64-linux-gnu",
            host_path="/lib/x86_64-linux-gnu",
            readonly=True,
        ),
    ]
    if ctl_dir is not None:
        mounts.append(cri.Mount(container_path="/gs-ctl", host_path=str(ctl_dir)))
    envs = {
        "LD_LIBRARY_PATH": "/gs-fake",
        "FAKECUDA_GPU_STATE": f"{GPU_DIR}/gpu",
        "FAKECUDA_DEVICES": "2",
        "FAKECUDA_MEMORY": str(16 * GiB),
        **(env or {}),
    }
    config = cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name="main"),
        image=cri.ImageSpec(image=BUSYBOX_IMAGE),
        command=list(command),
        envs=[cri.KeyValue(key=k, value=v) for k, v in envs.items()],
        mounts=mounts,
        linux=cri.LinuxContainerConfig(
            security_context=cri.LinuxContainerSecurityContext(namespace_options=host_pid()),
        ),
        log_path="main.log",
    )
    resp = await client.runtime.create_container(
        cri.CreateContainerRequest(
            pod_sandbox_id=pod, config=config, sandbox_config=client.pod_config(pod)
        )
    )
    await client.start(resp.container_id)
    return resp.container_id
