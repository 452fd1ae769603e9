"""Synchronize with Kubernetes-sized nodes, through the real protocol.

For each size (pods/containers) it starts the real plugin process
(`nri-gpushare run`: 2 simulated GPUs, no kernel module, a private state
directory), connects it to bench/nri_runtime.py's NRI runtime in
containerd's role (register, Configure), measures its idle RSS, then sends
the node's pods and containers in one Synchronize, split into requests as
containerd 1.7's NRI splits it (ttrpc's 4 MiB limit, then 512 + 512 objects
per request), every request under the one 2 s deadline.  Objects are
Kubernetes-sized, as the CRI plugin hands them to NRI: a pod has 10 labels
and 10 annotations; a container 10 labels, 10 annotations, 30 environment
variables, 12 mounts, its namespaces, cgroup path and resources.  Every
`--asking`-th pod asks for a GPU share (a gpushare.io/gpu-memory pod
annotation): the plugin finds those containers unserved (created while it
was away), as after a restart.

Printed per size: seconds from the first request sent to the last reply,
the plugin's CPU time meanwhile (user + system: what a loaded machine does
not inflate as much) and this process's (the runtime's side), which reader
read the containers (the native scanner, or Python where the plugin logged
it is not loaded: see nri_gpushare/nri/wire/native), requests (chunks),
the plugin's RSS after the Synchronize and its peak (VmHWM), and whether
it answered within the deadline.  The plugin's log must say it synchronized
every pod and container, and its status must list every asking container
as unserved: otherwise the run fails.

    .venv/bin/python bench/synchronize.py [--sizes 1000/5000,2000/10000,4000/20000]
        [--asking 20] [--grouped] [--json PATH]

--json PATH writes the benchmark convention's object (bench/report_common.py):
  figures: per size N (containers): seconds_N, cpu_seconds_N, rss_mb_N (after),
    rss_peak_mb_N (VmHWM), rss_idle_mb_N, chunks_N;
  rows: [{"pods", "containers", "asking", "seconds", "cpu_seconds",
          "runtime_cpu_seconds", "reader" ("native" or "python"), "rss_mb",
          "rss_peak_mb", "rss_idle_mb", "chunks", "bytes", "ok" (answered within
          the deadline), "deadline"}];
  asking_every: the --asking setting; order: "shuffled" (pods and containers
    in a seeded random order, as containerd's maps list them) or "grouped".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from nri_runtime import NriRuntime  # noqa: E402
from report_common import write_json  # noqa: E402

from nri_gpushare.nri.api import nri  # noqa: E402
from tests.integration.plugin import PluginProcess  # noqa: E402

DEFAULT_SIZES = "1000/5000,2000/10000,4000/20000"

# Placeholders of the final lengths: filling them in keeps every length prefix.
POD_ID = b"@POD-ID@".ljust(64, b"@")
POD_UID = b"@POD-UID@".ljust(36, b"@")
POD_NAME = b"@POD-NAME@".ljust(16, b"@")
CTR_ID = b"@CTR-ID@".ljust(64, b"@")


def _pod(asking: bool) -> nri.PodSandbox:
    name, uid, pid = POD_NAME.decode(), POD_UID.decode(), POD_ID.decode()
    labels = {
        "app.kubernetes.io/name": "web",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "server",
        "app.kubernetes.io/part-of": "shop",
        "app.kubernetes.io/managed-by": "helm",
        "pod-template-hash": "5d8f7c6b9d",
        "io.kubernetes.pod.name": name,
        "io.kubernetes.pod.namespace": "default",
        "io.kubernetes.pod.uid": uid,
        "tier": "backend",
    }
    annotations = {
        "kubernetes.io/config.seen": "2026-11-24T06:40:01.123456789Z",
        "kubernetes.io/config.source": "api",
        "kubectl.kubernetes.io/default-container": "main",
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9090",
        "prometheus.io/path": "/metrics",
        "checksum/config": "3f2a9c1b7d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4",
        "cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
        "sidecar.istio.io/inject": "false",
        "io.kubernetes.cri.sandbox-id": pid,
    }
    if asking:
        annotations["gpushare.io/gpu-memory"] = "1Gi"
        del annotations["sidecar.istio.io/inject"]
    return nri.PodSandbox(
        id=pid,
        name=name,
        uid=uid,
        namespace="default",
        labels=labels,
        annotations=annotations,
        runtime_handler="runc",
        linux=nri.LinuxPodSandbox(
            cgroup_parent=f"kubepods-besteffort-pod{uid}.slice",
            cgroups_path=f"kubepods-besteffort-pod{uid}.slice",
            namespaces=[
                nri.LinuxNamespace(type=t, path=f"/proc/4242/ns/{t}")
                for t in ("network", "ipc", "uts")
            ],
        ),
        pid=4242,
        ips=["10.244.1.17"],
    )


def _container(index: int) -> nri.Container:
    name, uid, pid, cid = POD_NAME.decode(), POD_UID.decode(), POD_ID.decode(), CTR_ID.decode()
    cname = f"container-{index}"
    labels = {
        "io.kubernetes.container.name": cname,
        "io.kubernetes.pod.name": name,
        "io.kubernetes.pod.namespace": "default",
        "io.kubernetes.pod.uid": uid,
        "io.cri-containerd.kind": "container",
        "org.opencontainers.image.title": "web",
        "org.opencontainers.image.version": "1.25.3",
        "org.opencontainers.image.source": "https://github.com/example/web",
        "org.opencontainers.image.revision": "0f1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6",
        "org.opencontainers.image.licenses": "Apache-2.0",
    }
    annotations = {
        "io.kubernetes.cri.container-name": cname,
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.image-name": "registry.example.com/shop/web:1.25.3",
        "io.kubernetes.cri.sandbox-id": pid,
        "io.kubernetes.cri.sandbox-name": name,
        "io.kubernetes.cri.sandbox-namespace": "default",
        "io.kubernetes.cri.sandbox-uid": uid,
        "io.kubernetes.container.hash": "6a3c2f1e",
        "io.kubernetes.container.restartCount": "0",
        "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
    }
    env = [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"HOSTNAME={name}",
        "KUBERNETES_SERVICE_HOST=10.96.0.1",
        "KUBERNETES_SERVICE_PORT=443",
        "KUBERNETES_SERVICE_PORT_HTTPS=443",
        "KUBERNETES_PORT=tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP_PROTO=tcp",
        "KUBERNETES_PORT_443_TCP_PORT=443",
        "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
        "WEB_SERVICE_HOST=10.96.14.27",
        "WEB_SERVICE_PORT=8080",
        "WEB_PORT=tcp://10.96.14.27:8080",
        "WEB_PORT_8080_TCP=tcp://10.96.14.27:8080",
        "WEB_PORT_8080_TCP_PROTO=tcp",
        "WEB_PORT_8080_TCP_PORT=8080",
        "WEB_PORT_8080_TCP_ADDR=10.96.14.27",
        "NGINX_VERSION=1.25.3",
        "NJS_VERSION=0.8.2",
        "PKG_RELEASE=1~bookworm",
        "LANG=C.UTF-8",
        "TZ=UTC",
        "LOG_LEVEL=info",
        "LISTEN_ADDR=0.0.0.0:8080",
        "DATABASE_URL=postgres://shop@db.default.svc.cluster.local:5432/shop",
        "REDIS_URL=redis://cache.default.svc.cluster.local:6379/0",
        f"POD_NAME={name}",
        "POD_NAMESPACE=default",
        "NODE_NAME=worker-17",
        "GOMAXPROCS=2",
    ]
    volumes = f"/var/lib/kubelet/pods/{uid}"
    mounts = [
        nri.Mount("/etc/hosts", "bind", f"{volumes}/etc-hosts", ["rbind", "rprivate", "rw"]),
        nri.Mount(
            "/dev/termination-log",
            "bind",
            f"{volumes}/containers/{cname}/6a3c2f1e",
            ["rbind", "rprivate", "rw"],
        ),
        nri.Mount(
            "/etc/hostname",
            "bind",
            f"/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/{pid}/hostname",
            ["rbind", "rprivate", "rw"],
        ),
        nri.Mount(
            "/etc/resolv.conf",
            "bind",
            f"/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/{pid}/resolv.conf",
            ["rbind", "rprivate", "rw"],
        ),
        nri.Mount(
            "/dev/shm",
            "bind",
            f"/run/containerd/io.containerd.grpc.v1.cri/sandboxes/{pid}/shm",
            ["rbind", "rprivate", "rw"],
        ),
        nri.Mount(
            "/var/run/secrets/kubernetes.io/serviceaccount",
            "bind",
            f"{volumes}/volumes/kubernetes.io~projected/kube-api-access-x7k2p",
            ["rbind", "rprivate", "ro"],
        ),
        *(
            nri.Mount(
                f"/srv/data-{v}",
                "bind",
                f"{volumes}/volumes/kubernetes.io~csi/pvc-{v}-0a1b2c3d/mount",
                ["rbind", "rprivate", "rw"],
            )
            for v in range(4)
        ),
        nri.Mount("/proc", "proc", "proc", ["nosuid", "noexec", "nodev"]),
        nri.Mount("/sys", "sysfs", "sysfs", ["nosuid", "noexec", "nodev", "ro"]),
    ]
    return nri.Container(
        id=cid,
        pod_sandbox_id=pid,
        name=cname,
        state=nri.ContainerState.CONTAINER_RUNNING,
        labels=labels,
        annotations=annotations,
        args=["nginx", "-g", "daemon off;"],
        env=env,
        mounts=mounts,
        linux=nri.LinuxContainer(
            namespaces=[
                nri.LinuxNamespace(type=t, path=f"/proc/4242/ns/{t}" if t != "mount" else "")
                for t in ("pid", "ipc", "uts", "mount", "network", "cgroup")
            ],
            resources=nri.LinuxResources(
                memory=nri.LinuxMemory(limit=nri.OptionalInt64(536870912)),
                cpu=nri.LinuxCpu(
                    shares=nri.OptionalUInt64(256),
                    quota=nri.OptionalInt64(50000),
                    period=nri.OptionalUInt64(100000),
                ),
            ),
            oom_score_adj=nri.OptionalInt(998),
            cgroups_path=f"kubepods-burstable-pod{uid}.slice:cri-containerd:{cid}",
        ),
        pid=5000,
        created_at=1764000000000000000,
        started_at=1764000001000000000,
    )


@dataclass
class Node:
    pods: list[bytes]
    containers: list[bytes]
    asking: int  # containers in pods that ask for a share


def _filler(pod_id: bytes, uid: bytes, name: bytes) -> Callable[[bytes], bytes]:
    def fill(raw: bytes) -> bytes:
        return raw.replace(POD_ID, pod_id).replace(POD_UID, uid).replace(POD_NAME, name)

    return fill


def node(pods: int, containers: int, asking_every: int, shuffled: bool = True) -> Node:
    """`pods` pods holding `containers` containers (as evenly as they go);
    every `asking_every`-th pod asks for a share (0: none).  `shuffled`: pods
    and containers in a (seeded) random order, as containerd lists them (its
    CRI stores are Go maps): a container often comes in a request before its
    pod, which the plugin must then keep until the pod comes."""
    templates = {a: bytes(_pod(a)) for a in (False, True)}
    per_pod = max(1, -(-containers // pods))
    ctr_templates = [bytes(_container(i)) for i in range(per_pod)]
    out = Node([], [], 0)
    for p in range(pods):
        asking = asking_every > 0 and p % asking_every == 0
        pod_id = f"{p:064x}".encode()
        uid = f"{p:08x}-0000-4000-8000-000000000000".encode()
        name = f"web-{p:012d}".encode()

        fill = _filler(pod_id, uid, name)
        out.pods.append(fill(templates[asking]))
        for i in range(per_pod):
            n = len(out.containers)
            if n >= containers:
                break
            out.containers.append(fill(ctr_templates[i]).replace(CTR_ID, f"c{n:063x}".encode()))
            out.asking += asking
    if shuffled:
        order = random.Random(14)
        order.shuffle(out.pods)
        order.shuffle(out.containers)
    return out


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of process `pid` in MB (MiB)."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


NOT_NATIVE = "native scanner"  # what the plugin logs when it reads in Python
SYNCED = re.compile(r"synchronized: (\d+) pod\(s\), (\d+) container\(s\)")


async def measure(
    pods: int, containers: int, asking_every: int, shuffled: bool = True
) -> dict[str, Any]:
    """One size with a fresh plugin process; the row for the report."""
    the_node = node(pods, containers, asking_every, shuffled)
    work = Path(tempfile.mkdtemp(prefix="gs-sync-"))
    runtime = NriRuntime(str(work / "nri.sock"))
    await runtime.start()
    plugin = PluginProcess(
        work / "nri.sock",
        work / "plugin",
        log_level="info",
        containerd={"socket": ""},
        unserved="warn",  # list the asking containers; their pids are made up
    )
    try:
        plugin.start(wait=False)
        assert plugin.proc is not None
        conn = await runtime.wait_plugin()
        await conn.configure()
        await asyncio.sleep(0.5)  # settle: what is idle
        idle, _ = rss_mb(plugin.proc.pid)
        cpu = cpu_seconds(plugin.proc.pid)
        own = time.process_time()
        result = await conn.synchronize(the_node.pods, the_node.containers)
        own = time.process_time() - own
        cpu = cpu_seconds(plugin.proc.pid) - cpu
        rss, peak = rss_mb(plugin.proc.pid)
        status = plugin.status()
        log = plugin.log_path.read_text(errors="replace")
    finally:
        if plugin.proc is not None:
            plugin.stop()
        await runtime.close()
    synced = [(int(p), int(c)) for p, c in SYNCED.findall(log)]
    shutil.rmtree(work, ignore_errors=True)
    if (pods, len(the_node.containers)) not in synced:
        raise SystemExit(
            f"synchronize: the plugin did not report {pods} pods and "
            f"{len(the_node.containers)} containers synchronized (it said {synced})"
        )
    unserved = len(status["unserved"])
    if unserved != the_node.asking:
        raise SystemExit(
            f"synchronize: {the_node.asking} containers ask for a share, the plugin "
            f"lists {unserved} unserved"
        )
    return {
        "pods": pods,
        "containers": len(the_node.containers),
        "asking": the_node.asking,
        "seconds": result.seconds,
        "cpu_seconds": cpu,
        "runtime_cpu_seconds": own,
        "reader": "python" if NOT_NATIVE in log else "native",
        "rss_mb": rss,
        "rss_peak_mb": peak,
        "rss_idle_mb": idle,
        "chunks": len(result.chunks),
        "bytes": result.bytes,
        "deadline": result.deadline,
        "ok": result.within_deadline,
    }


def sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        pods, _, containers = item.strip().partition("/")
        out.append((int(pods), int(containers)))
    return out


async def run(args: argparse.Namespace) -> int:
    rows = []
    for pods, containers in sizes(args.sizes):
        started = time.perf_counter()
        row = await measure(pods, containers, args.asking, not args.grouped)
        rows.append(row)
        print(
            f"{row['pods']:6} pods / {row['containers']:6} containers: "
            f"{row['seconds']:.3f} s (plugin CPU {row['cpu_seconds']:.2f} s, runtime CPU "
            f"{row['runtime_cpu_seconds']:.2f} s, {row['reader']} reader) "
            f"in {row['chunks']} request(s) "
            f"({row['bytes'] / 2**20:.1f} MiB), "
            f"{'within' if row['ok'] else 'PAST'} the {row['deadline']:g} s deadline; "
            f"plugin RSS {row['rss_idle_mb']:.0f} -> {row['rss_mb']:.0f} MiB "
            f"(peak {row['rss_peak_mb']:.0f}); {row['asking']} unserved "
            f"[{time.perf_counter() - started:.0f} s with setup]",
            flush=True,
        )
    figures: dict[str, float] = {}
    for row in rows:
        n = row["containers"]
        figures[f"seconds_{n}"] = row["seconds"]
        figures[f"cpu_seconds_{n}"] = row["cpu_seconds"]
        figures[f"rss_mb_{n}"] = row["rss_mb"]
        figures[f"rss_peak_mb_{n}"] = row["rss_peak_mb"]
        figures[f"rss_idle_mb_{n}"] = row["rss_idle_mb"]
        figures[f"chunks_{n}"] = row["chunks"]
    write_json(
        args.json,
        "synchronize",
        figures,
        rows=rows,
        asking_every=args.asking,
        order="grouped" if args.grouped else "shuffled",
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help=f"pods/containers, comma-separated ({DEFAULT_SIZES}); quick: 100/500",
    )
    ap.add_argument(
        "--asking", type=int, default=20, help="every N-th pod asks for a share (20; 0: none)"
    )
    ap.add_argument(
        "--grouped",
        action="store_true",
        help="send each pod's containers right after it (default: shuffled, as containerd)",
    )
    ap.add_argument("--json", type=Path, help="also write the benchmark JSON object here")
    return asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
