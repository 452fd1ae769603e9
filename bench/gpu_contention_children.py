"""bench/gpu_contention.py's workloads, each run in a process of its own.

Real mode: a PyTorch loop of square fp32 matmuls (TF32 off) in a child
Python (`gpu_contention.py --child SPEC`), plain or as CUDA graph replays,
printing one result line.  Fake mode (--fake): the tests' C workload,
libgpushare/tests/compute_load.c, on the fake driver's simulated GPU, so
that everything but PyTorch runs on a machine without a GPU.

A spec (JSON): kind "loop"; mode "plain" (launch per_sync matmuls, then
synchronise: per_sync 20 is gpu_compute.py's pair, 256 a deep queue with
no sync per kernel) or "graph" (a graph of matmuls lasting about graph_ms,
replayed and synchronised: graph_matmuls of them, 0 for as many as
graph_ms takes here); size; seconds measured in rounds of
round_seconds after warmup seconds; start_at (time.time()) to measure
several processes over the same seconds.  The result: rates (matmuls per
second, one per round), graph_matmuls, matmul_ms, late (seconds it began
measuring after start_at; > 0 spoils a pair).

forced_ends(): the stand-in's count of slices ended by force on GPU 0, read
by a GPUSHARE_IOC_SCHED INFO call (ABI 4: an 80-byte struct, forced_ends
its last field) from a child with the stand-in preloaded.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from typing import Any

RESULT = "GPU_CONTENTION_RESULT "


def torch_loop(spec: dict[str, Any]) -> dict[str, Any]:
    """Matmuls per second per round, plain batches or graph replays."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    torch.backends.cuda.matmul.allow_tf32 = False
    n = int(spec["size"])
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    c = torch.empty(n, n, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):  # cuBLAS picks its kernel and workspace first
            torch.matmul(a, b, out=c)
        stream.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            torch.matmul(a, b, out=c)
        stream.synchronize()
        matmul_ms = (time.perf_counter() - t) * 1000 / 20
        k = int(spec["per_sync"])
        graph = None
        if spec["mode"] == "graph":
            k = int(spec.get("graph_matmuls") or 0)  # 0: as many as graph_ms takes
            k = k or max(1, math.ceil(float(spec["graph_ms"]) / matmul_ms))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(k):
                    torch.matmul(a, b, out=c)
            stream.synchronize()

        def batch() -> int:
            if graph is not None:
                graph.replay()
            else:
                for _ in range(k):  # queued, no sync per kernel
                    torch.matmul(a, b, out=c)
            stream.synchronize()
            return k

        def rate(seconds: float) -> float:
            done, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < seconds:
                done += batch()
            return done / elapsed

        rate(float(spec["warmup"]))
        late = 0.0
        if spec.get("start_at"):
            late = time.time() - float(spec["start_at"])
            if late < 0:
                time.sleep(-late)
        rounds = max(1, round(float(spec["seconds"]) / float(spec["round_seconds"])))
        rates = [rate(float(spec["round_seconds"])) for _ in range(rounds)]
    return {"rates": rates, "graph_matmuls": k, "matmul_ms": matmul_ms, "late": late}


def child_main(raw: str) -> int:
    spec = json.loads(raw)
    if spec.get("kind") != "loop":
        print(f"unknown child kind {spec.get('kind')!r}", file=sys.stderr)
        return 2
    print(RESULT + json.dumps(torch_loop(spec)), flush=True)
    return 0


def fake_argv(load: str, spec: dict[str, Any], kernel_us: int) -> tuple[list[str], dict[str, str]]:
    """compute_load's arguments and environment for @spec on the fake GPU:
    kernels of @kernel_us stand for matmuls."""
    seconds = float(spec["seconds"])
    env = {"COMPUTE_LOAD_IN_FLIGHT": str(spec["per_sync"])}
    path = "kernel"
    if spec["mode"] == "graph":
        path = "graph"
        nodes = max(1, math.ceil(float(spec["graph_ms"]) * 1000 / kernel_us))
        env["COMPUTE_LOAD_GRAPH_NODES"] = str(nodes)
    if spec.get("start_at"):
        ahead = float(spec["start_at"]) - time.time()
        env["COMPUTE_LOAD_T0"] = str(time.monotonic_ns() + max(0, int(ahead * 1e9)))
    return [load, path, str(kernel_us), f"{seconds:g}"], env


def fake_result(stdout: str, spec: dict[str, Any], kernel_us: int) -> dict[str, Any] | None:
    """compute_load's RESULT as a loop's result: one round, kernels per second."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return None
    r = json.loads(lines[-1][len("RESULT ") :])
    per_launch = r["kernels"] // max(1, r["launches"])
    return {
        "rates": [r["kernels"] / (r["wall_ns"] / 1e9)],
        "graph_matmuls": per_launch if spec["mode"] == "graph" else int(spec["per_sync"]),
        "matmul_ms": kernel_us / 1000,
        "late": 0.0,
        "gpu_share": r["gpu_ns"] / r["wall_ns"],
    }


# The SCHED INFO call, run with the stand-in preloaded (its open and ioctl
# come first in the global scope: ctypes.CDLL(None)).
INFO_CODE = r"""
import ctypes, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.open.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
fd = libc.open(b"/dev/gpushare", 2)
if fd < 0:
    sys.exit(f"open /dev/gpushare: errno {ctypes.get_errno()}")
buf = ctypes.create_string_buffer(struct.pack("<4I", 80, 0, 0, 0) + bytes(64), 80)
if libc.ioctl(fd, 0xE703, buf) != 0:  # GPUSHARE_IOC_SCHED, op INFO, GPU 0
    sys.exit(f"SCHED INFO: errno {ctypes.get_errno()}")
f = struct.unpack("<4I4Q4I2Q", buf.raw)
print("FORCED_ENDS", f[13], "SLICE_NS", f[6], "DRAIN_NS", f[12], "POLICY", f[8])
"""


def forced_ends(env: dict[str, str]) -> int | None:
    """The forced ends the stand-in counted on GPU 0 of the schedule @env
    names (a container's environment, the stand-in preloaded, no library);
    None when it cannot tell (an ABI 3 stand-in answers 0 drain)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", INFO_CODE], env=env, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    words = proc.stdout.split()
    said = dict(zip(words[::2], words[1::2], strict=False))
    if proc.returncode != 0 or said.get("DRAIN_NS", "0") == "0" or "FORCED_ENDS" not in said:
        return None
    return int(said["FORCED_ENDS"])
