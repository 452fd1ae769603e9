"""What the real-GPU benches (gpu_memory.py, gpu_compute.py,
gpu_contention.py) share: finding GPU 0 with nvidia-smi (and PyTorch
seeing it), building libgpushare.so into a build folder, and their
tables."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


class NoGPU(Exception):
    """There is no usable NVIDIA GPU here."""


def percentile(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank (q in [0, 1])."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table; '|' in cells is escaped."""

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |"]
    lines.append("|" + "|".join("---" for _ in headers) + "|")
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row has {len(row)} cells, table has {len(headers)} columns")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)


@dataclass
class GPU:
    index: int
    uuid: str
    name: str
    memory: int  # bytes


def find_gpu() -> GPU:
    """GPU 0 as nvidia-smi lists it; NoGPU when there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise NoGPU("nvidia-smi is not installed (no NVIDIA driver)")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        proc = subprocess.run(
            [smi, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise NoGPU(f"nvidia-smi failed: {e}") from e
    gpus = []
    for line in proc.stdout.splitlines():
        parts = [s.strip() for s in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit() and parts[1].startswith("GPU-"):
            gpus.append(GPU(int(parts[0]), parts[1], parts[2], int(float(parts[3])) * MiB))
    if proc.returncode != 0 or not gpus:
        why = (proc.stderr or proc.stdout).strip().splitlines()
        raise NoGPU(f"nvidia-smi lists no GPU ({why[0] if why else f'exit {proc.returncode}'})")
    return min(gpus, key=lambda g: g.index)


def build_library(build: Path) -> Path:
    for tool in ("make", os.environ.get("CC", "cc")):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is needed to build libgpushare")
    proc = subprocess.run(
        ["make", "-C", str(ROOT / "libgpushare"), f"BUILD={build}", "all"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"building libgpushare failed:\n{proc.stdout}\n{proc.stderr}")
    return build / "libgpushare.so"


def has_torch_cuda() -> str:
    """'' when PyTorch is installed and sees a GPU, else why not."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot start {sys.executable}: {e}"
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return f"PyTorch is not installed for {sys.executable} ({tail[:120]})"
    if proc.stdout.strip() != "True":
        return "PyTorch does not see a CUDA GPU (torch.cuda.is_available() is False)"
    return ""


def torch_gpu(script: str, no_gpu: str, no_torch: str) -> GPU | None:
    """GPU 0 when there is one and PyTorch sees a GPU; else None, having said
    why on stderr ("script: no NVIDIA GPU: ...; no_gpu", "script: ...;
    no_torch")."""
    try:
        gpu = find_gpu()
    except NoGPU as e:
        print(f"{script}: no NVIDIA GPU: {e}; {no_gpu}", file=sys.stderr)
        return None
    if why := has_torch_cuda():
        print(f"{script}: {why}; {no_torch}", file=sys.stderr)
        return None
    return gpu


def in_build(script: str, build: Path | None, run: Callable[[Path], int]) -> int:
    """run(the build folder): build (--build), else a temporary one; 2 when
    it raises RuntimeError (said on stderr as "script: ...")."""
    try:
        if build:
            return run(build.resolve())
        with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
            return run(Path(tmp))
    except RuntimeError as e:
        print(f"{script}: {e}", file=sys.stderr)
        return 2
