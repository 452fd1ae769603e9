"""Isolation enforced and measured: a pod held to its memory quota, pods
held to their shares of the GPU's time (measured on the simulated GPU),
then gpushare-smi showing what they use."""

from __future__ import annotations

import asyncio
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scripts.demo.checks import (
    BUSY_MARGIN,
    DemoFailed,
    Pod,
    Window,
    check_quota,
    check_shares,
    measured,
)
from scripts.demo.measure import SimulatedGpu
from scripts.demo.pods import Binaries, GiB, P, cuda_container, run_pod
from tests.testbed.cri import CriClient

MEMORY_GPU = 0
COMPUTE_GPU = 1
KMOD_ROOT = Path("/proc/gpushare")


@dataclass
class Setting:
    """What differs between `make demo` (standalone) and `make demo-kernel`."""

    module: bool  # gpushare.ko is loaded (the plugin runs with kmod: required)
    kernel_us: int = 100  # each simulated kernel's length
    slice_us: int | None = None  # the module's slice on the compute GPU
    settle_s: float = 3.0  # from the loads' start to a window
    window_s: float = 4.0
    slow: float = 30.0  # generous waits
    tries: int = 4
    busy_margin: float = BUSY_MARGIN


@dataclass
class Enforcement:
    client: CriClient
    binaries: Binaries
    setting: Setting
    workdir: Path
    gpu: SimulatedGpu = field(init=False)
    release: Path = field(init=False)
    memory_cid: str = ""
    loads: list[Pod] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.workdir / "gpu").mkdir(parents=True, exist_ok=True)
        (self.workdir / "ctl").mkdir(parents=True, exist_ok=True)
        self.gpu = SimulatedGpu(self.binaries.gpu_state, self.workdir / "gpu" / "gpu")
        self.release = self.workdir / "ctl" / "release"

    async def lines(self, cid: str, upto: str) -> list[str]:
        deadline = time.monotonic() + self.setting.slow
        while True:
            got = await self.client.read_logs(cid)
            if any(line.startswith(upto) for line in got):
                return got
            if time.monotonic() > deadline:
                raise DemoFailed(f"memory quota: the program printed only {got}")
            await asyncio.sleep(0.2)

    async def memory(self) -> None:
        """A pod with gpu-memory 1Gi allocates up to its quota and one byte more."""
        annotations = {P + "gpu-memory": "1Gi", P + "gpu-devices": str(MEMORY_GPU)}
        say(
            f"pod quota {annotations}: a CUDA driver-API program (scripts/demo/cuda_demo.c) "
            "on the fake driver sees the card, then allocates 256Mi at a time"
        )
        pod = await run_pod(self.client, "quota", annotations)
        step = str(256 << 20)
        command = ["/gs/cuda_demo", str(MEMORY_GPU), step, "/gs-ctl/release"]
        self.memory_cid = await cuda_container(
            self.client,
            pod,
            self.binaries,
            self.workdir / "gpu",
            command,
            ctl_dir=self.workdir / "ctl",
        )
        got = await self.lines(self.memory_cid, "held ")
        for line in got:
            print("   ", line)
        check_quota(got, GiB)
        print("    quota held: 1Gi is the card's size, and one byte past it is refused")
        if self.setting.module:
            meminfo = KMOD_ROOT / str(MEMORY_GPU) / self.memory_cid / "meminfo"
            print(f"    the module's ledger, {meminfo}:")
            for line in meminfo.read_text().splitlines():
                print("     ", line)

    async def start_load(self, name: str, core: int | None) -> str:
        annotations = {P + "gpu-memory": "256Mi", P + "gpu-devices": str(COMPUTE_GPU)}
        if core is not None:
            annotations[P + "gpu-core"] = str(core)
        pod = await run_pod(self.client, name, annotations)
        command = ["/gs/compute_load", "kernel", str(self.setting.kernel_us), "600"]
        return await cuda_container(
            self.client, pod, self.binaries, self.workdir / "gpu", [*command, str(COMPUTE_GPU)]
        )

    async def compute(self) -> None:
        """Pods at gpu-core 30 and 60 on one GPU, then one with none beside them."""
        s = self.setting
        say(
            "pods core-30 and core-60 (gpu-core 30 and 60, both on GPU 1) run the same busy "
            "loop of simulated kernels (libgpushare/tests/compute_load.c)"
        )
        print(
            textwrap.fill(mode_text(s.module), 100, initial_indent="    ", subsequent_indent="    ")
        )
        if s.module:
            (KMOD_ROOT / str(COMPUTE_GPU) / "policy").write_text("3\n")
            if s.slice_us:
                (KMOD_ROOT / str(COMPUTE_GPU) / "slice_us").write_text(f"{s.slice_us}\n")
            print(
                f"    GPU {COMPUTE_GPU}: policy 3 (fixed share: gpu-core is a percent of the GPU)"
            )
        for name, core in (("core-30", 30), ("core-60", 60)):
            self.loads.append(Pod(name, await self.start_load(name, core), core))
        await self.measure(self.loads)
        say("pod no-core (no gpu-core) joins them with the same loop")
        self.loads.append(Pod("no-core", await self.start_load("no-core", None), None))
        if not s.module:  # standalone: nothing holds back a process without a limit
            self.loads[1] = Pod("core-60", self.loads[1].container_id, 60, exact=False)
        await self.measure(self.loads)

    async def measure(self, pods: Sequence[Pod]) -> Window:
        s = self.setting
        await asyncio.sleep(s.settle_s)
        ids = [p.container_id for p in pods]

        def one() -> Window:
            return self.gpu.window(COMPUTE_GPU, s.window_s, ids)

        before = self.gputime(ids)
        window, tries = await asyncio.to_thread(
            measured, pods, one, s.tries, s.busy_margin, lambda: time.sleep(s.settle_s / 2)
        )
        charged = self.gputime(ids)
        print(share_table(pods, window, tries, charged, before, s.module))
        check_shares(pods, window)
        return window

    def gputime(self, ids: Sequence[str]) -> dict[str, tuple[float, int]]:
        """The module's charged GPU time per container (monotonic s, ns)."""
        if not self.setting.module:
            return {}
        out = {}
        for cid in ids:
            text = (KMOD_ROOT / str(COMPUTE_GPU) / cid / "gputime").read_text()
            out[cid] = (time.monotonic(), int(text.split()[0]))
        return out

    def done_with_memory(self) -> None:
        self.release.touch()


def mode_text(module: bool) -> str:
    if module:
        return (
            "mode: module (gpushare.ko loaded): the kernel runs one schedule for the whole GPU; "
            "each container's processes ask it for slices through /dev/gpushare, and nothing a "
            "tenant sets in its container can unset it"
        )
    return (
        "mode: standalone (no kernel module): each process holds itself to its gpu-core, "
        "with the module's scheduler core compiled into libgpushare.so and NVML's count of "
        "its own GPU time correcting it (standalone feedback).  A share is a cap per process "
        "that the tenant could unset; with gpushare.ko (make demo-kernel) the kernel runs one "
        "schedule for the GPU, which a tenant cannot unset, and a pod without gpu-core gets "
        "only the time the others leave"
    )


def share_table(
    pods: Sequence[Pod],
    window: Window,
    tries: int,
    charged: dict[str, tuple[float, int]],
    before: dict[str, tuple[float, int]],
    module: bool,
) -> str:
    rows = [("pod", "gpu-core", "measured", "check")]
    for p in pods:
        got = window.shares.get(p.container_id, 0.0)
        if p.target is None:
            check = "best effort: the time the others leave" if module else "not held"
        elif p.exact:
            check = f"{p.target} ± 3: ok"
        else:
            check = f"at most {p.target} + 3: ok (a cap, standalone)"
        target = "-" if p.target is None else f"{p.target}%"
        rows.append((p.name, target, f"{got:.1f}%", check))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [
        "    " + "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[3]])
        for r in rows
    ]
    lines.insert(1, "    " + "-" * (sum(widths) + 6 + max(len(r[3]) for r in rows)))
    waited = (
        ""
        if window.cpu_wait is None
        else f"; the loads waited {window.cpu_wait:.1f}% of it for a CPU"
    )
    lines.append(
        f"    GPU {COMPUTE_GPU} busy {window.total:.1f}% of the {window.seconds:.1f} s window "
        f"(window {tries}{waited}), measured from the simulated GPU's own record of each process"
    )
    for p in pods:
        if p.container_id in charged and p.container_id in before:
            (t1, g1), (t0, g0) = charged[p.container_id], before[p.container_id]
            pct = 100 * (g1 - g0) / ((t1 - t0) * 1e9)
            lines.append(f"    {p.name}: the module's gputime charged it {pct:.1f}% meanwhile")
    return "\n".join(lines)


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)
