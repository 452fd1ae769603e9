"""libgpushare.so on a real GPU: quota enforcement and overhead, standalone mode.

For a machine with an NVIDIA GPU, its driver, PyTorch and/or CuPy, make and a
C compiler (the project's lent H100).  It builds libgpushare.so, then runs
each measurement in a fresh process with

    LD_PRELOAD=libgpushare.so  GPUSHARE_GPU_UUIDS=<GPU 0's UUID>
    GPUSHARE_MEMORY_LIMIT=<quota>  CUDA_VISIBLE_DEVICES=<the same UUID>

(no kernel module: the interposer's standalone mode) and prints markdown:

  * what `torch.cuda.mem_get_info()`, nvidia-smi and NVML report as total;
  * where allocating in 1 MiB steps fails, relative to the quota, with
    PyTorch's native and cudaMallocAsync allocators and CuPy's default and
    async pools, and how much the GPU itself had given the process beyond
    its CUDA context at that point (from nvidia-smi's per-process figure);
  * the cost of an allocation: cudaMalloc/cudaFree and cudaMallocAsync/
    cudaFreeAsync through CuPy's runtime bindings (no pool), and torch.empty
    with PYTORCH_NO_CUDA_MEMORY_CACHING=1, with and without the preload, in
    alternating rounds: median, p99 and their ratio.

Exit status: 0 when every check holds, 1 when one fails, 2 when it cannot run
(no GPU, no compiler, bad arguments).  A framework asked for (--frameworks,
default both) that is not installed is a failed check.

    python3 bench/gpu_memory.py [--quota 4GiB] [--step 1MiB] [--iterations 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import (  # noqa: E402  (a script: its folder on the path first)
    GPU,
    MiB,
    NoGPU,
    build_library,
    find_gpu,
    markdown_table,
    percentile,
)
from report_common import document  # noqa: E402

GiB = 1 << 30
CHILD_TIMEOUT = 600
RESULT = "GPU_MEMORY_RESULT "

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "ki": 1 << 10,
    "kib": 1 << 10,
    "mi": 1 << 20,
    "mib": 1 << 20,
    "gi": 1 << 30,
    "gib": 1 << 30,
}


def parse_size(text: str) -> int:
    """'4GiB', '512Mi', '1073741824', '1.5GB' -> bytes (a positive integer)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4GiB, 512MiB, 1048576)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a whole, positive number of bytes: {text!r}")
    return int(value)


def mib(n: float | None) -> str:
    """Bytes as MiB for the tables ('n/a' for unknown)."""
    if n is None:
        return "n/a"
    return f"{n / MiB:,.1f}" if n % MiB else f"{n // MiB:,}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="libgpushare.so on a real GPU: quota enforcement and allocation overhead."
    )
    p.add_argument("--quota", type=parse_size, default=4 * GiB, help="GPU memory quota (4GiB)")
    p.add_argument(
        "--step", type=parse_size, default=MiB, help="allocation step of the fill (1MiB)"
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=5000,
        help="allocations timed per overhead round and arm (5000)",
    )
    p.add_argument("--rounds", type=int, default=3, help="alternating overhead rounds (3)")
    p.add_argument(
        "--overhead-size", type=parse_size, default=MiB, help="bytes per timed allocation (1MiB)"
    )
    p.add_argument("--build", type=Path, help="build directory (default: a temporary one)")
    p.add_argument("--json", type=Path, help="also write every raw result here")
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["fill", "smi", "overhead"],
        help="leave a part out (repeatable)",
    )
    p.add_argument(
        "--frameworks",
        default="torch,cupy",
        help="comma-separated frameworks to use when installed (torch,cupy; '' for none)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.iterations < 10:
        p.error("--iterations must be at least 10")
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    if a.step > a.quota:
        p.error("--step must not exceed --quota")
    a.frameworks = {f.strip() for f in a.frameworks.split(",") if f.strip()}
    if a.frameworks - {"torch", "cupy"}:
        p.error(f"--frameworks: unknown {sorted(a.frameworks - {'torch', 'cupy'})}")
    return a


# ---------------------------------------------------------------- children
# Each measurement runs in a process of its own (the preload and the
# allocator settings are per process); it prints one RESULT line of JSON.


def _process_gpu_memory() -> int | None:
    """This process's device memory as the driver counts it (nvidia-smi)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [s.strip() for s in line.split(",")]
        if len(parts) == 2 and parts[0] == str(os.getpid()) and parts[1].isdigit():
            return int(parts[1]) * MiB
    return None


def _child_info(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    free, total = torch.cuda.mem_get_info(0)
    return {"free": free, "total": total}


def _fill(spec: dict[str, Any]) -> dict[str, Any]:
    """Allocate spec['step'] bytes at a time until the allocator says no."""
    step, limit = spec["step"], spec["quota"] + GiB  # stop somewhere if nothing refuses
    framework, variant = spec["framework"], spec["variant"]
    held: list[Any] = []
    if framework == "torch":
        import torch

        oom: tuple[type[BaseException], ...] = (torch.cuda.OutOfMemoryError,)
        torch.cuda.init()

        def alloc() -> Any:
            return torch.empty(step, dtype=torch.uint8, device="cuda")

        def info() -> tuple[int, int]:
            return torch.cuda.mem_get_info(0)

        def reserved() -> int | None:
            return int(torch.cuda.memory_reserved(0)) if variant == "native" else None

    else:
        import cupy

        oom = (cupy.cuda.memory.OutOfMemoryError,)
        pool: Any
        if variant == "async":
            pool = cupy.cuda.MemoryAsyncPool()
        else:
            pool = cupy.cuda.MemoryPool()
        cupy.cuda.set_allocator(pool.malloc)

        def alloc() -> Any:
            return cupy.empty(step, dtype=cupy.uint8)

        def info() -> tuple[int, int]:
            free, total = cupy.cuda.runtime.memGetInfo()
            return int(free), int(total)

        def reserved() -> int | None:
            return int(pool.total_bytes()) if variant == "default" else None

    start_total = info()[1]  # creates the context
    at_start = _process_gpu_memory()
    error = None
    while len(held) * step < limit:
        try:
            held.append(alloc())
        except Exception as e:  # the frameworks' OOM types vary by version
            text = str(e).splitlines()[0] if str(e) else ""
            if not isinstance(e, oom) and "out of memory" not in text.lower():
                raise
            error = f"{type(e).__name__}: {text[:160]}"
            break
    free, total = info()
    at_peak = _process_gpu_memory()
    result = {
        "allocated": len(held) * step,
        "refused": error is not None,
        "error": error,
        "reserved": reserved(),
        "free_at_failure": free,
        "total": total,
        "start_total": start_total,
        "process_at_start": at_start,
        "process_at_failure": at_peak,
    }
    held.clear()
    return result


def _overhead(spec: dict[str, Any]) -> dict[str, Any]:
    """Time spec['iterations'] allocations and frees of spec['size'] bytes."""
    size, n, api = spec["size"], spec["iterations"], spec["api"]
    warmup = max(10, n // 10)
    clock = time.perf_counter_ns
    alloc_ns: list[int] = []
    free_ns: list[int] = []
    if api == "torch":
        import torch

        torch.cuda.init()
        torch.cuda.mem_get_info(0)
        for i in range(warmup + n):
            t0 = clock()
            t = torch.empty(size, dtype=torch.uint8, device="cuda")
            t1 = clock()
            del t
            t2 = clock()
            if i >= warmup:
                alloc_ns.append(t1 - t0)
                free_ns.append(t2 - t1)
    else:
        import cupy

        rt = cupy.cuda.runtime
        rt.memGetInfo()
        stream = cupy.cuda.Stream(non_blocking=True)
        for i in range(warmup + n):
            if api == "cudaMalloc":
                t0 = clock()
                p = rt.malloc(size)
                t1 = clock()
                rt.free(p)
                t2 = clock()
            else:
                t0 = clock()
                p = rt.mallocAsync(size, stream.ptr)
                t1 = clock()
                rt.freeAsync(p, stream.ptr)
                t2 = clock()
            if i >= warmup:
                alloc_ns.append(t1 - t0)
                free_ns.append(t2 - t1)
        stream.synchronize()
    return {"alloc_ns": alloc_ns, "free_ns": free_ns}


CHILDREN = {"info": _child_info, "fill": _fill, "overhead": _overhead}


def run_child_main(raw: str) -> int:
    spec = json.loads(raw)
    out = CHILDREN[spec["kind"]](spec)
    print(RESULT + json.dumps(out), flush=True)
    return 0


# ------------------------------------------------------------------ parent


@dataclass
class Report:
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def check(self, what: str, ok: bool, detail: str) -> None:
        self.checks.append((what, ok, detail))

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)


def child_env(gpu: GPU, lib: Path | None, quota: int, extra: dict[str, str]) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING")
        and not k.startswith("GPUSHARE_")
    }
    env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if lib is not None:
        env["LD_PRELOAD"] = str(lib)
        env["GPUSHARE_GPU_UUIDS"] = gpu.uuid
        env["GPUSHARE_MEMORY_LIMIT"] = str(quota)
        env["GPUSHARE_DEBUG"] = "1"
    env.update(extra)
    return env


@dataclass
class ChildResult:
    ok: bool
    value: dict[str, Any]
    stderr: str
    why: str = ""


def run_child(spec: dict[str, Any], env: dict[str, str]) -> ChildResult:
    try:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return ChildResult(False, {}, "", f"timed out after {CHILD_TIMEOUT}s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return ChildResult(False, {}, proc.stderr, tail[:200])
    return ChildResult(True, json.loads(lines[-1][len(RESULT) :]), proc.stderr)


def has_module(name: str) -> bool:
    proc = subprocess.run(
        [sys.executable, "-c", f"import {name}"], capture_output=True, timeout=120
    )
    return proc.returncode == 0


def standalone_said(stderr: str) -> bool:
    """The interposer's GPUSHARE_DEBUG line: it was loaded, standalone."""
    return "ledger standalone" in stderr


def measure_totals(
    args: argparse.Namespace, gpu: GPU, lib: Path, rep: Report, have: set[str]
) -> None:
    q = args.quota
    env = child_env(gpu, lib, q, {})
    if "torch" in have:
        r = run_child({"kind": "info"}, env)
        rep.raw["torch_info"] = r.value
        if r.ok:
            rep.check(
                "torch.cuda.mem_get_info() total is the quota",
                r.value["total"] == q,
                f"total {mib(r.value['total'])} MiB, free {mib(r.value['free'])} MiB",
            )
            rep.check(
                "the interposer is loaded, in standalone mode",
                standalone_said(r.stderr),
                "GPUSHARE_DEBUG said so" if standalone_said(r.stderr) else r.stderr[-200:],
            )
        else:
            rep.check("torch.cuda.mem_get_info() total is the quota", False, r.why)
    if "smi" in args.skip:
        return
    proc = subprocess.run(
        [
            "nvidia-smi",
            "-i",
            gpu.uuid,
            "--query-gpu=memory.total,memory.used,memory.free",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    rep.raw["nvidia_smi"] = proc.stdout
    parts = [s.strip() for s in proc.stdout.strip().split(",")]
    total = int(float(parts[0])) * MiB if len(parts) == 3 and parts[0] else None
    rep.check(
        "nvidia-smi under the preload shows the quota as total",
        total is not None and abs(total - q) < MiB,
        f"total/used/free {proc.stdout.strip() or proc.stderr.strip()[:120]} MiB",
    )
    if "pynvml" in have:
        code = (
            "import pynvml as n; n.nvmlInit(); "
            f"h = n.nvmlDeviceGetHandleByUUID({gpu.uuid!r}); "
            "m = n.nvmlDeviceGetMemoryInfo(h); print(m.total, m.used, m.free)"
        )
        p = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
        )
        got = p.stdout.split()
        rep.raw["pynvml"] = p.stdout
        rep.check(
            "NVML (pynvml) under the preload shows the quota as total",
            bool(got) and got[0] == str(q),
            f"total/used/free {p.stdout.strip() or p.stderr.strip()[-120:]} bytes",
        )


FILLS = [
    ("torch", "native", {"PYTORCH_CUDA_ALLOC_CONF": "backend:native"}),
    ("torch", "cudaMallocAsync", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    ("cupy", "default", {}),
    ("cupy", "async", {}),
]


def measure_fills(
    args: argparse.Namespace, gpu: GPU, lib: Path, rep: Report, have: set[str]
) -> list[list[Any]]:
    q, step = args.quota, args.step
    rows: list[list[Any]] = []
    for framework, variant, extra in FILLS:
        label = f"{framework} {variant}"
        if framework not in have:
            rows.append([label, "not run (not installed or left out)", "", "", "", "", ""])
            continue
        spec = {
            "kind": "fill",
            "framework": framework,
            "variant": variant,
            "step": step,
            "quota": q,
        }
        r = run_child(spec, child_env(gpu, lib, q, extra))
        rep.raw[f"fill {label}"] = r.value or r.why
        if not r.ok:
            rows.append([label, f"error: {r.why}", "", "", "", "", ""])
            rep.check(f"{label}: the fill stops at the quota", False, r.why)
            continue
        v = r.value
        got = v["allocated"]
        beyond = None
        if v["process_at_start"] is not None and v["process_at_failure"] is not None:
            beyond = v["process_at_failure"] - v["process_at_start"]
        rows.append(
            [
                label,
                mib(got),
                mib(q - got),
                mib(v["reserved"]),
                mib(v["free_at_failure"]),
                mib(beyond),
                "" if beyond is None else mib(beyond - q),
            ]
        )
        rep.check(
            f"{label}: allocation fails within one step below the quota",
            v["refused"] and q - step < got <= q,
            f"{mib(got)} MiB allocated of {mib(q)} MiB; {v['error'] or 'never refused'}",
        )
    return rows


OVERHEAD_APIS = [
    ("cudaMalloc", "cupy", "cudaMalloc / cudaFree"),
    ("cudaMallocAsync", "cupy", "cudaMallocAsync / cudaFreeAsync"),
    ("torch", "torch", "torch.empty / del (no caching)"),
]


def measure_overhead(
    args: argparse.Namespace, gpu: GPU, lib: Path, rep: Report, have: set[str]
) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for api, module, label in OVERHEAD_APIS:
        if module not in have:
            rows.append([label, "", "not run (not installed or left out)", "", "", "", "", ""])
            continue
        spec = {
            "kind": "overhead",
            "api": api,
            "size": args.overhead_size,
            "iterations": args.iterations,
        }
        extra = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"} if api == "torch" else {}
        samples: dict[str, dict[str, list[int]]] = {
            "without": {"alloc_ns": [], "free_ns": []},
            "with": {"alloc_ns": [], "free_ns": []},
        }
        failed = ""
        for rnd in range(args.rounds):
            arms = ["without", "with"] if rnd % 2 == 0 else ["with", "without"]
            for arm in arms:
                r = run_child(
                    spec, child_env(gpu, lib if arm == "with" else None, args.quota, extra)
                )
                if not r.ok:
                    failed = f"{arm} preload: {r.why}"
                    break
                for k in ("alloc_ns", "free_ns"):
                    samples[arm][k].extend(r.value[k])
            if failed:
                break
        rep.raw[f"overhead {label}"] = samples if not failed else failed
        if failed:
            rows.append([label, "", f"error: {failed}", "", "", "", "", ""])
            continue
        for op, key in (("alloc", "alloc_ns"), ("free", "free_ns")):
            base, pre = samples["without"][key], samples["with"][key]
            b50, p50 = statistics.median(base), statistics.median(pre)
            b99, p99 = percentile(base, 0.99), percentile(pre, 0.99)
            rows.append(
                [
                    label,
                    op,
                    f"{b50 / 1000:.2f}",
                    f"{p50 / 1000:.2f}",
                    f"{p50 / b50:.3f}",
                    f"{b99 / 1000:.2f}",
                    f"{p99 / 1000:.2f}",
                    f"{p99 / b99:.3f}",
                ]
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return run_child_main(args.child)
    try:
        gpu = find_gpu()
    except NoGPU as e:
        print(f"gpu_memory.py: no NVIDIA GPU: {e}; this benchmark needs one", file=sys.stderr)
        return 2
    have = {m for m in (*args.frameworks, "pynvml") if has_module(m)}
    try:
        if args.build:
            lib = build_library(args.build.resolve())
            return report(args, gpu, lib, have)
        with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
            lib = build_library(Path(tmp))
            return report(args, gpu, lib, have)
    except RuntimeError as e:
        print(f"gpu_memory.py: {e}", file=sys.stderr)
        return 2


def report(args: argparse.Namespace, gpu: GPU, lib: Path, have: set[str]) -> int:
    rep = Report()
    tables: list[dict[str, Any]] = []
    figures: dict[str, float] = {"quota_mib": args.quota / MiB}
    print(f"# libgpushare on {gpu.name} ({gpu.uuid}, {mib(gpu.memory)} MiB), standalone mode\n")
    print(
        f"Quota {mib(args.quota)} MiB, fill step {mib(args.step)} MiB; "
        f"Python {sys.version.split()[0]}; installed: {', '.join(sorted(have)) or 'none'}\n"
    )
    for fw in sorted(args.frameworks):
        rep.check(f"{fw} is installed", fw in have, f"{sys.executable} -c 'import {fw}'")
    measure_totals(args, gpu, lib, rep, have)
    if "fill" not in args.skip:
        rows = measure_fills(args, gpu, lib, rep, have)
        print("## Filling the GPU in steps until refused (MiB)\n")
        headers = [
            "allocator",
            "allocated at failure",
            "quota - allocated",
            "allocator reserved",
            "free reported then",
            "device use beyond the context",
            "device use - quota",
        ]
        print(markdown_table(headers, rows))
        title = "Filling the GPU in steps until refused (MiB)"
        tables.append({"title": title, "headers": headers, "rows": rows})
        for row in rows:
            for column, name in ((1, "allocated_mib"), (5, "device_mib")):
                try:  # cells are printed numbers ("4,096"), or why there is none
                    figures[f"fill {row[0]} {name}"] = float(str(row[column]).replace(",", ""))
                except ValueError:
                    pass
        print(
            "\n'device use beyond the context' is nvidia-smi's figure for the process at "
            "failure minus the figure right after the CUDA context was created (MiB "
            "resolution): what the GPU really gave, including the driver's rounding and "
            "pool growth the interposer does not see.\n"
        )
    if "overhead" not in args.skip:
        rows = measure_overhead(args, gpu, lib, rep, have)
        print(
            f"## Allocation overhead, {mib(args.overhead_size)} MiB, "
            f"{args.rounds} x {args.iterations} per arm (microseconds)\n"
        )
        headers = [
            "API",
            "op",
            "median without",
            "median with",
            "ratio",
            "p99 without",
            "p99 with",
            "ratio",
        ]
        print(markdown_table(headers, rows))
        print()
        title = f"Allocation overhead, {mib(args.overhead_size)} MiB (microseconds)"
        tables.append({"title": title, "headers": headers, "rows": rows})
    print("## Checks\n")
    print(
        markdown_table(
            ["check", "result", "detail"],
            [[w, "ok" if ok else "FAIL", d] for w, ok, d in rep.checks],
        )
    )
    if args.json:
        # The benchmark convention's object (bench/report_common.py), plus
        # checks: [[what, ok, detail]]; tables: [{"title", "headers", "rows"}]
        # as printed; gpu: the GPU's name and UUID; raw: every child's result.
        doc = document(
            "gpu_memory",
            figures,
            checks=rep.checks,
            tables=tables,
            gpu=f"{gpu.name} ({gpu.uuid})",
            raw=rep.raw,
        )
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
