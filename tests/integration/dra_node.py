"""A node for the DRA tests: the real daemon (`nri-gpushare run`), the real
driver process (`nri-gpushare dra-driver`, the same config), the test
kubelet (`tests/k8s/dra_kubelet.py`) and the test API server
(`tests/k8s/apiserver.py`), plus helpers that make, schedule and prepare
claims as Kubernetes does."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nri_gpushare.k8s.dra import DRIVER
from nri_gpushare.local.client import ask
from nri_gpushare.local.protocol import Reply, Request
from tests.integration.plugin import ROOT, PluginProcess
from tests.k8s.apiserver import ApiServer
from tests.k8s.dra_kubelet import DraKubelet
from tests.k8s.dra_scheduler import schedule

NODE = "node-a"


class DriverProcess:
    def __init__(self, config: Path, top: Path, api: ApiServer, node: str = NODE) -> None:
        self.config = config
        self.top = top
        self.plugin_dir = top / "plugins" / DRIVER
        self.registry_dir = top / "registry"
        self.cdi_dir = top / "cdi"
        self.credentials = top / "credentials"
        self.credentials.mkdir(mode=0o700, exist_ok=True)
        (self.credentials / "server").write_text(api.url + "\n")
        (self.credentials / "token").write_text(api.token + "\n")
        shutil.copy(api.ca, self.credentials / "ca.crt")
        self.node = node
        self.log_path = top / "dra-driver.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DriverProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nri_gpushare.cli.main", "dra-driver"]
                + ["--config", str(self.config), "--node-name", self.node]
                + ["--plugin-dir", str(self.plugin_dir), "--registry-dir", str(self.registry_dir)]
                + ["--cdi-dir", str(self.cdi_dir), "--credentials-dir", str(self.credentials)]
                + ["--collect-every", "0.5"],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**env, "PYTHONUNBUFFERED": "1"},
            )
        return self

    async def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, 15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what}") from None


@dataclass
class DraNode:
    api: ApiServer
    daemon: PluginProcess
    driver: DriverProcess
    kubelet: DraKubelet

    def devices(self) -> dict[str, dict[str, Any]]:
        """The published slice's devices by name ({} before it is published)."""
        for s in self.api.slices.values():
            if s["spec"]["nodeName"] == self.driver.node:
                return {d["name"]: d for d in s["spec"]["devices"]}
        return {}

    def capacity(self, device: str, name: str) -> str:
        return str(self.devices()[device]["capacity"][name]["value"])

    def claim(
        self, name: str, memory: str | None = "2Gi", compute: str | None = "30", namespace="team"
    ) -> dict[str, Any]:
        """A ResourceClaim as a ResourceClaimTemplate makes it, stored."""
        requests = {k: v for k, v in (("memory", memory), ("compute", compute)) if v is not None}
        exactly: dict[str, Any] = {"deviceClassName": DRIVER}
        if requests:
            exactly["capacity"] = {"requests": requests}
        return self.api.put_claim(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
            }
        )

    def schedule(self, name: str, pod_uid: str | None = None, namespace: str = "team") -> str:
        """Allocate claim `name` as kube-scheduler would, for a pod; "" or why not."""
        return schedule(self.api, namespace, name, (f"pod-{name}", pod_uid or str(uuid.uuid4())))

    def ref(self, name: str, namespace: str = "team") -> tuple[str, str, str]:
        claim = self.api.claims[(namespace, name)]
        return namespace, name, claim["metadata"]["uid"]

    async def prepare(self, *names: str) -> dict[str, Any]:
        return await self.kubelet.prepare(DRIVER, [self.ref(n) for n in names])

    async def unprepare(self, *names: str) -> dict[str, Any]:
        return await self.kubelet.unprepare(DRIVER, [self.ref(n) for n in names])

    def claims(self) -> dict[str, dict[str, Any]]:
        """The daemon's prepared claims by UID."""
        return {c["uid"]: c for c in self.daemon.status()["claims"]}

    def ask(self, request: Request) -> Reply:
        return ask(request, self.daemon.api_socket)

    def take_by_hand(self, cid: str, memory: str, gpu: int | None = None) -> Reply:
        """A share placed the way a hand-started container's is (gpushare-runc)."""
        annotations = {"gpushare.io/gpu-memory": memory}
        if gpu is not None:
            annotations["gpushare.io/gpu-devices"] = str(gpu)
        return self.ask(Request("create", "", cid, via="runc", annotations=annotations))
