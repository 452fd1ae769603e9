"""The demo's node: what it builds (the interposer, the fake driver, the
programs run in pods, the simulated GPU's reader), a private containerd
1.7.24 with CRI and NRI, and `nri-gpushare run` on a simulated inventory of
two 16 GiB GPUs (the UUIDs of the fake driver's devices, so that a
container's interposer finds its GPU by UUID as on a real node)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scripts.demo.pods import FAKE_UUIDS, Binaries
from tests.integration.plugin import PluginProcess, gpu_inventory
from tests.testbed.containerd import Containerd

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def build(out: Path) -> Binaries:
    """make -C libgpushare (the interposer, the fake driver, compute_load),
    and the demo's two C programs."""
    b = Binaries(out)
    load = out / "tests" / "compute_load"
    make = ["make", "-s", "-C", str(ROOT / "libgpushare"), f"BUILD={out}"]
    subprocess.run([*make, "all", "fake", str(load)], check=True)
    b.programs.mkdir(parents=True, exist_ok=True)
    shutil.copy2(load, b.programs / "compute_load")
    cc = [shutil.which("cc") or "gcc", "-O2", "-Wall", "-Wextra", "-Werror"]
    subprocess.run(
        [*cc, "-o", str(b.programs / "cuda_demo"), str(HERE / "cuda_demo.c")], check=True
    )
    fake_h = ROOT / "libgpushare" / "tests" / "fake"
    subprocess.run(
        [*cc, f"-I{fake_h}", "-o", str(b.gpu_state), str(HERE / "gpu_state.c")], check=True
    )
    return b


def inventory() -> list[dict[str, Any]]:
    return [{**g, "uuid": FAKE_UUIDS[i]} for i, g in enumerate(gpu_inventory(2, "16Gi"))]


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@contextmanager
def node(
    workdir: Path, binaries: Binaries, module: bool, slow: float, **containerd: Any
) -> Iterator[tuple[Containerd, PluginProcess, str]]:
    """containerd and the plugin, stopped at the end; yields them and the
    metrics endpoint's address."""
    bed = Containerd(**containerd).start(timeout=slow)
    metrics = free_port()
    plugin = PluginProcess(
        bed.nri_socket,
        workdir / "plugin",
        log_level="info",
        inventory=inventory(),
        kmod="required" if module else "off",
        interposer={"library": str(binaries.interposer)},
        metrics={"listen": metrics},
    )
    try:
        plugin.start(wait=False)
        plugin.wait_connected(timeout=slow)
        yield bed, plugin, metrics
    finally:
        if plugin.proc is not None:
            plugin.stop()
        bed.stop()
