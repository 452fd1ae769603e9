"""N pods created at once through CRI, on a simulated inventory they do not
all fit: all that fit are placed, none over capacity, the rest refused with
the reason.

One private containerd 1.7.24 (the test bed) with `nri-gpushare run` on a
simulated inventory (--gpus GPUs of --gpu-memory each, no kernel module).
All pods start together (asyncio.gather over one CRI connection each): each
runs its sandbox with the pod annotation gpushare.io/gpu-memory=--request
(and gpu-core=--core when given), creates a container that sleeps, and
starts it.  Then, from the plugin's status socket (what `nri-gpushare status
--json` prints):

  * placed: containers created = min(pods, what fits), where what fits is
    computed from the status before the run: per GPU, its free memory over
    the request, its free compute over --core, and max_inst less what it holds;
  * none over capacity: per GPU, the allocations' memory summed <= its memory
    less the reserve, their compute <= 100 %, their count <= max_inst, and
    the GPU's own totals equal those sums;
  * refused: every CreateContainer that failed names `gpushare: cannot place`
    and what it asked for (gpu-memory) in the message the CRI caller got;
  * wall time from the first RunPodSandbox to the last container started.

Exit status 0 when every check holds, 1 when one fails.

    .venv/bin/python bench/concurrent_pods.py [--pods 50] [--gpus 3] [--gpu-memory 12Gi]
        [--request 1Gi] [--core 10] [--json PATH]

--json PATH also writes the benchmark convention's object (bench/report_common.py):
  figures: pods, fit (expected), placed, refused, over_capacity (GPUs over),
    wrong_refusals, wall_s, "<step> p50_ms"/"<step> p99_ms" for step in
    run_pod, create, start;
  samples_ms: {step: [each pod's time for it]}; checks: [[what, ok, detail]];
  gpus: [{index, memory_total, memory_reserved, memory_allocated, core_allocated,
    containers}] after the run; refusals: the distinct refusal messages (first 3).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from grpclib.exceptions import GRPCError  # noqa: E402
from report_common import percentile, write_json  # noqa: E402

from nri_gpushare.units import parse_size  # noqa: E402
from tests.integration.plugin import PluginProcess, gpu_inventory  # noqa: E402
from tests.testbed.containerd import Containerd  # noqa: E402
from tests.testbed.cri import CriClient  # noqa: E402

GiB = 1 << 30


@dataclass
class Outcome:
    placed: list[str] = field(default_factory=list)  # container IDs
    refused: list[str] = field(default_factory=list)  # the CRI caller's messages
    errors: list[str] = field(default_factory=list)  # any other failure
    samples: dict[str, list[float]] = field(
        default_factory=lambda: {"run_pod": [], "create": [], "start": []}
    )


def fits(status: dict[str, Any], memory: int, core: int) -> int:
    """How many shares of `memory` bytes and `core` % the GPUs take, from status."""
    max_inst = status["policy"]["max_inst"]
    total = 0
    for gpu in status["gpus"]:
        n = min(gpu["memory_free"] // memory, max_inst - len(gpu["containers"]))
        if core:
            n = min(n, gpu["core_free"] // core)
        total += max(0, n)
    return total


def capacity_checks(status: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """Per GPU: the allocations' sums within its capacity and equal to its totals."""
    max_inst = status["policy"]["max_inst"]
    memory: dict[int, int] = {}
    core: dict[int, int] = {}
    count: dict[int, int] = {}
    for alloc in status["allocations"]:
        for share in alloc["gpus"]:
            i = share["index"]
            memory[i] = memory.get(i, 0) + share["memory"]
            core[i] = core.get(i, 0) + (share.get("core") or 0)
            count[i] = count.get(i, 0) + 1
    checks = []
    for gpu in status["gpus"]:
        i = gpu["index"]
        room = gpu["memory_total"] - gpu["memory_reserved"]
        m, c, n = memory.get(i, 0), core.get(i, 0), count.get(i, 0)
        ok = m <= room and c <= 100 and n <= max_inst
        checks.append(
            (
                f"GPU {i} within capacity",
                ok,
                f"{m / GiB:g} GiB of {room / GiB:g}, {c} % compute, {n} of {max_inst} containers",
            )
        )
        same = m == gpu["memory_allocated"] and c == gpu["core_allocated"]
        checks.append(
            (
                f"GPU {i} totals equal its allocations",
                same,
                f"status says {gpu['memory_allocated'] / GiB:g} GiB, "
                f"{gpu['core_allocated']} %; allocations sum to {m / GiB:g} GiB, {c} %",
            )
        )
    return checks


async def one_pod(
    client: CriClient, i: int, annotations: dict[str, str], out: Outcome, wall: list[float]
) -> None:
    t0 = time.perf_counter()
    pod = await client.run_pod(f"pod{i}", annotations=annotations)
    t1 = time.perf_counter()
    out.samples["run_pod"].append((t1 - t0) * 1000)
    try:
        cid = await client.create_container(pod, "main", command=["sleep", "3600"])
    except GRPCError as e:
        out.samples["create"].append((time.perf_counter() - t1) * 1000)
        out.refused.append(e.message or "")
        return
    t2 = time.perf_counter()
    out.samples["create"].append((t2 - t1) * 1000)
    await client.start(cid)
    t3 = time.perf_counter()
    out.samples["start"].append((t3 - t2) * 1000)
    out.placed.append(cid)
    wall.append(t3)


async def run(args: argparse.Namespace) -> int:
    memory = parse_size(args.request)
    annotations = {"gpushare.io/gpu-memory": args.request}
    if args.core:
        annotations["gpushare.io/gpu-core"] = str(args.core)
    work = Path(tempfile.mkdtemp(prefix="gs-pods-"))
    out = Outcome()
    checks: list[tuple[str, bool, str]] = []
    with Containerd() as bed:
        plugin = PluginProcess(
            bed.nri_socket,
            work / "plugin",
            log_level="warning",
            inventory=gpu_inventory(args.gpus, args.gpu_memory),
        ).start()
        try:
            before = plugin.status()
            fit = fits(before, memory, args.core)
            async with bed.cri_client() as client:
                ends: list[float] = []
                started = time.perf_counter()
                results = await asyncio.gather(
                    *(one_pod(client, i, annotations, out, ends) for i in range(args.pods)),
                    return_exceptions=True,
                )
                wall = (max(ends, default=started) if ends else time.perf_counter()) - started
                out.errors = [f"{type(r).__name__}: {r}" for r in results if r is not None]
                after = plugin.status()
                # Leaving: pods (and their containers) stop and go with the client.
        finally:
            plugin.stop()
    shutil.rmtree(work, ignore_errors=True)

    expected = min(args.pods, fit)
    ids = {a["container_id"] for a in after["allocations"]}
    checks.append(("no other failure", not out.errors, "; ".join(out.errors[:3]) or "none"))
    checks.append(
        (
            "all that fit placed",
            len(out.placed) == expected,
            f"{len(out.placed)} placed, {expected} fit ({args.pods} pods)",
        )
    )
    checks.append(
        (
            "the allocations are the placed containers",
            ids == set(out.placed),
            f"{len(ids)} allocations, {len(out.placed)} placed",
        )
    )
    checks += capacity_checks(after)
    wrong = [m for m in out.refused if "gpushare: cannot place" not in m or "gpu-memory" not in m]
    checks.append(
        (
            "each refusal names the reason and the request",
            not wrong,
            f"{len(out.refused)} refused, {len(wrong)} without 'gpushare: cannot place' "
            f"and 'gpu-memory'" + (f": {wrong[0]!r}" if wrong else ""),
        )
    )
    over = sum(1 for what, ok, _ in checks if what.endswith("within capacity") and not ok)

    print(
        f"{args.pods} pods at once through CRI, each asking {annotations}; "
        f"{args.gpus} simulated GPUs of {args.gpu_memory}"
    )
    print(f"placed {len(out.placed)}, refused {len(out.refused)}, fit {expected}")
    print(f"wall time {wall:.2f} s (first RunPodSandbox to last container started)")
    for step, values in out.samples.items():
        if values:
            print(
                f"  {step:8} p50 {percentile(values, 0.5):8.1f} ms  "
                f"p99 {percentile(values, 0.99):8.1f} ms  (n={len(values)})"
            )
    for what, ok, detail in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {detail}")
    figures: dict[str, float] = {
        "pods": args.pods,
        "fit": expected,
        "placed": len(out.placed),
        "refused": len(out.refused),
        "over_capacity": over,
        "wrong_refusals": len(wrong),
        "wall_s": wall,
    }
    for step, values in out.samples.items():
        if values:
            figures[f"{step} p50_ms"] = percentile(values, 0.5)
            figures[f"{step} p99_ms"] = percentile(values, 0.99)
    keys = ("index", "memory_total", "memory_reserved", "memory_allocated", "core_allocated")
    write_json(
        args.json,
        "concurrent_pods",
        figures,
        samples_ms=out.samples,
        checks=checks,
        gpus=[
            {**{k: g[k] for k in keys}, "containers": len(g["containers"])} for g in after["gpus"]
        ],
        refusals=list(dict.fromkeys(out.refused))[:3],
        request=annotations,
    )
    return 0 if all(ok for _, ok, _ in checks) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=3, help="simulated GPUs (3)")
    ap.add_argument("--gpu-memory", default="12Gi", help="memory of each (12Gi)")
    ap.add_argument("--request", default="1Gi", help="gpu-memory each pod asks for (1Gi)")
    ap.add_argument("--core", type=int, default=10, help="gpu-core each pod asks for (10; 0: none)")
    ap.add_argument("--json", type=Path, help="also write the figures and samples here")
    args = ap.parse_args()
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
