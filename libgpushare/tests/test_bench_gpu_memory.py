"""bench/gpu_memory.py's logic that needs no GPU: arguments, sizes, tables,
the no-GPU exit, and its NVML checks end to end on the fake drivers (with a
stand-in nvidia-smi that asks NVML through pynvml, under the preload)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from conftest import FAKE_MEMORY, ROOT, Build, GiB, MiB

SCRIPT = ROOT / "bench" / "gpu_memory.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("gpu_memory", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_memory"] = mod  # its dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules["gpu_memory"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4GiB", 4 * GiB),
        ("1MiB", MiB),
        ("512Mi", 512 * MiB),
        ("1048576", MiB),
        ("1.5GB", 1_500_000_000),
    ],
)
def test_bench_parses_sizes(bench: ModuleType, text: str, value: int) -> None:
    assert bench.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "4x", "-1", "0", "0.5", "GiB", "1.5B"])
def test_bench_refuses_bad_sizes(bench: ModuleType, text: str) -> None:
    with pytest.raises(Exception, match="size|bytes"):
        bench.parse_size(text)


def test_bench_defaults_and_argument_errors(bench: ModuleType) -> None:
    a = bench.parse_args([])
    assert (a.quota, a.step, a.frameworks) == (4 * GiB, MiB, {"torch", "cupy"})
    a = bench.parse_args(["--quota", "2GiB", "--frameworks", "", "--skip", "fill"])
    assert (a.quota, a.frameworks, a.skip) == (2 * GiB, set(), ["fill"])
    for bad in (["--step", "8GiB"], ["--frameworks", "jax"], ["--iterations", "1"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_bench_markdown_table_and_percentile(bench: ModuleType) -> None:
    assert bench.markdown_table(["a", "b|c"], [[1, "x|y"], ["", 2.5]]) == (
        "| a | b\\|c |\n|---|---|\n| 1 | x\\|y |\n|  | 2.5 |"
    )
    with pytest.raises(ValueError):
        bench.markdown_table(["a"], [[1, 2]])
    values = list(range(1, 101))
    assert bench.percentile(values, 0.99) == 99
    assert bench.percentile(values, 0.5) == 50
    assert bench.percentile([7], 0.99) == 7
    assert (
        bench.mib(4 * GiB) == "4,096" and bench.mib(MiB // 2) == "0.5" and bench.mib(None) == "n/a"
    )


def test_bench_without_a_gpu_exits_2_and_says_why(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path))  # no nvidia-smi anywhere
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "no NVIDIA GPU" in proc.stderr


FAKE_SMI = """#!{python}
# A stand-in for nvidia-smi: the --query forms the benchmark uses, from NVML.
import sys
import pynvml as n

args = sys.argv[1:]
query = next(a for a in args if a.startswith("--query-"))
if query.startswith("--query-compute-apps"):
    sys.exit(0)
fields = query.split("=", 1)[1].split(",")
only = args[args.index("-i") + 1] if "-i" in args else None
n.nvmlInit()
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    uuid = n.nvmlDeviceGetUUID(h)
    if only not in (None, str(i), uuid):
        continue
    m = n.nvmlDeviceGetMemoryInfo(h)
    row = {{"index": i, "uuid": uuid, "name": n.nvmlDeviceGetName(h),
           "memory.total": m.total >> 20, "memory.used": m.used >> 20,
           "memory.free": m.free >> 20}}
    print(", ".join(str(row[f]) for f in fields))
"""


def test_bench_nvml_checks_pass_on_the_fake_drivers(build: Build, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "LD_PRELOAD" and not k.startswith(("GPUSHARE_", "FAKECUDA_"))
    }
    env.update(
        PATH=f"{tmp_path}:{env.get('PATH', '')}",
        LD_LIBRARY_PATH=str(build.fake_dir),
        FAKECUDA_DEVICES="1",
        FAKECUDA_MEMORY=str(FAKE_MEMORY),
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--build",
            str(build.dir),
            "--frameworks",
            "",
            "--quota",
            "3GiB",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"{out}\n{proc.stderr}"
    assert "| nvidia-smi under the preload shows the quota as total | ok |" in out
    assert "| NVML (pynvml) under the preload shows the quota as total | ok |" in out
    assert "3072, 0, 3072" in out  # total, used, free in MiB
    assert "| torch native | not run" in out
    assert "FAIL" not in out
