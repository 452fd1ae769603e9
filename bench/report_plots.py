"""bench/report's PNG plots, drawn with matplotlib (Agg) from the benchmarks'
JSON documents (the convention of bench/report_common.py).

`draw_all(docs, out)` draws what each document allows into `out` and returns
{benchmark: [file name, ...]}.  Every figure carries its benchmark's machine
and date at the bottom.  A plot that cannot be drawn from a document (keys
missing) is left out rather than failing the report.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

Doc = dict[str, Any]


def _figure(doc: Doc, title: str, ncols: int = 1) -> tuple[Figure, list[Any]]:
    fig, axes = plt.subplots(1, ncols, figsize=(6.4 * ncols, 4.4), squeeze=False)
    fig.suptitle(title, fontsize=11)
    fig.text(
        0.01,
        0.005,
        f"{doc.get('machine', '?')}  ·  {doc.get('date', '?')}",
        fontsize=7,
        color="0.35",
    )
    return fig, list(axes[0])


def _save(fig: Figure, out: Path, name: str) -> str:
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def _ecdf(ax: Any, samples: dict[str, list[float]], unit: str) -> None:
    """Each arm's latency distribution as a CDF, the x axis to the slowest p99."""
    top = 0.0
    for arm, values in samples.items():
        if not values:
            continue
        ordered = sorted(values)
        n = len(ordered)
        ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=f"{arm} (n={n})")
        top = max(top, ordered[min(n - 1, math.ceil(0.99 * n) - 1)])
    if top > 0:
        ax.set_xlim(left=0, right=top * 1.1)
    ax.set_ylim(0, 1.02)
    ax.axhline(0.5, color="0.7", lw=0.8, ls=":")
    ax.set_xlabel(unit)
    ax.set_ylabel("fraction of calls")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _box(ax: Any, samples: dict[str, list[float]], unit: str) -> None:
    arms = [a for a, v in samples.items() if v]
    ax.boxplot([samples[a] for a in arms], showfliers=False)
    ax.set_xticks(range(1, len(arms) + 1), arms, rotation=15, fontsize=8)
    ax.set_ylabel(unit)
    ax.grid(axis="y", alpha=0.3)


def plot_create(doc: Doc, out: Path) -> list[str]:
    samples = doc["samples_ms"]
    fig, (cdf, box) = _figure(doc, "CRI CreateContainer latency per configuration", 2)
    _ecdf(cdf, samples, "ms")
    cdf.set_title("distribution (to the slowest arm's p99)", fontsize=9)
    _box(box, samples, "ms")
    box.set_title("box: quartiles, whiskers 1.5 IQR", fontsize=9)
    names = [_save(fig, out, "create_latency.png")]
    handling = doc.get("handling_ms", {})
    if handling:
        fig, (ax,) = _figure(doc, "CreateContainer handling inside the plugin, p50")
        plugins = list(handling)
        values = [handling[p]["p50"] * 1000 for p in plugins]
        ax.bar(plugins, values, color="tab:blue")
        ax.axhline(150, color="tab:red", ls="--", label="goal: 150 µs")
        ax.set_ylabel("µs")
        ax.legend(fontsize=8)
        names.append(_save(fig, out, "create_handling.png"))
    return names


def plot_handler(doc: Doc, out: Path) -> list[str]:
    title = "CreateContainer handling in process (decode, handler, encode)"
    fig, (cdf, box) = _figure(doc, title, 2)
    _ecdf(cdf, doc["samples_us"], "µs")
    cdf.axvline(150, color="tab:red", ls="--", lw=0.8)
    _box(box, doc["samples_us"], "µs")
    box.axhline(150, color="tab:red", ls="--", label="goal for gpushare: 150 µs")
    box.legend(fontsize=8)
    return [_save(fig, out, "handler_latency.png")]


def plot_sync(doc: Doc, out: Path) -> list[str]:
    rows = [r for r in doc["rows"] if isinstance(r.get("containers"), int | float)]
    rows.sort(key=lambda r: r["containers"])
    x = [r["containers"] for r in rows]
    fig, (sec, rss) = _figure(doc, "Synchronize vs containers on the node", 2)
    sec.plot(x, [r.get("seconds") for r in rows], "o-", label="Synchronize (all chunks)")
    sec.axhline(2.0, color="0.5", ls=":", label="NRI's deadline 2 s")
    sec.plot([10000, 20000], [0.5, 1.0], "r_", ms=20, mew=2, label="goals")
    sec.set_xlabel("containers")
    sec.set_ylabel("s")
    sec.grid(alpha=0.3)
    sec.legend(fontsize=8)
    if any("rss_mb" in r for r in rows):
        rss.plot(x, [r.get("rss_mb") for r in rows], "o-", color="tab:green", label="after")
        if any("rss_peak_mb" in r for r in rows):
            peak = [r.get("rss_peak_mb") for r in rows]
            rss.plot(x, peak, "^-", color="tab:orange", label="peak (VmHWM)")
        if any("rss_idle_mb" in r for r in rows):
            idle = [r.get("rss_idle_mb") for r in rows]
            rss.plot(x, idle, "o--", color="0.5", label="before")
        rss.plot([10000], [100], "r_", ms=20, mew=2, label="goal at 10k")
        rss.set_xlabel("containers")
        rss.set_ylabel("plugin RSS (MB)")
        rss.grid(alpha=0.3)
        rss.legend(fontsize=8)
    return [_save(fig, out, "synchronize.png")]


def plot_pods(doc: Doc, out: Path) -> list[str]:
    samples = doc.get("samples_ms", {})
    gpus = doc.get("gpus", [])
    fig, (box, cap) = _figure(doc, f"{doc['figures'].get('pods', '?'):.0f} pods at once", 2)
    if samples:
        _box(box, samples, "ms per pod")
        box.set_title(f"wall time {doc['figures'].get('wall_s', 0):.2f} s", fontsize=9)
    if gpus:
        idx = [str(g["index"]) for g in gpus]
        usable = [(g["memory_total"] - g.get("memory_reserved", 0)) / 2**30 for g in gpus]
        used = [g["memory_allocated"] / 2**30 for g in gpus]
        cap.bar(idx, usable, color="0.85", label="usable memory")
        cap.bar(idx, used, width=0.5, color="tab:blue", label="allocated")
        cap.set_xlabel("GPU")
        cap.set_ylabel("GiB")
        cap.legend(fontsize=8)
        cap.set_title("allocated vs capacity after the run", fontsize=9)
    return [_save(fig, out, "concurrent_pods.png")]


def plot_rss(doc: Doc, out: Path) -> list[str]:
    samples = doc["samples"]
    figs = doc["figures"]
    x = [s[0] for s in samples]
    y = [s[1] / 1024 for s in samples]
    fig, (ax,) = _figure(doc, f"Plugin RSS over {figs.get('cycles', 0):.0f} create/remove cycles")
    ax.plot(x, y, ".-", label="RSS (VmRSS)")
    ax.axhline(figs["idle_rss_kib"] / 1024, color="0.5", ls=":", label="idle")
    warmup = doc.get("warmup", 0)
    after = [s for s in samples if s[0] >= warmup]
    if len(after) >= 2 and "kib_per_cycle" in figs:
        x0, y0 = after[0][0], figs["start_rss_kib"]
        x1 = samples[-1][0]
        fit_y = [(y0 + figs["kib_per_cycle"] * (c - x0)) / 1024 for c in (x0, x1)]
        label = f"fit after warm-up: {figs['kib_per_cycle']:.3f} KiB/cycle"
        ax.plot([x0, x1], fit_y, "r--", label=label)
    if warmup:
        ax.axvspan(0, warmup, color="0.9", label="warm-up")
    ax.set_xlabel("cycles")
    ax.set_ylabel("MiB")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return [_save(fig, out, "rss_cycles.png")]


def plot_start(doc: Doc, out: Path) -> list[str]:
    fig, (ax,) = _figure(doc, "Container start: wall time per arm")
    _box(ax, doc["samples_ms"], "ms")
    return [_save(fig, out, "container_start.png")]


def plot_overhead(doc: Doc, out: Path) -> list[str]:
    kinds = doc["samples_ns"]
    fig, axes = _figure(doc, "Interposer: ns per allocate + free pair (fake driver)", len(kinds))
    for ax, (kind, configs) in zip(axes, kinds.items(), strict=True):
        _box(ax, configs, "ns per pair")
        ax.set_title(kind, fontsize=9)
    return [_save(fig, out, "interposer_overhead.png")]


def plot_compute(doc: Doc, out: Path) -> list[str]:
    rows = [a for a in doc["accuracy"] if a.get("unit") == "%"]
    if not rows:
        return []
    fig, (ax,) = _figure(doc, "Compute shares: requested vs achieved (fake driver)")
    for i, a in enumerate(rows):
        color = f"C{i % 10}"
        ax.scatter([a["target"]] * len(a["samples"]), a["samples"], s=10, alpha=0.4, c=color)
        ax.scatter([a["target"]], [a["median"]], marker="x", s=50, c=color, label=a["name"])
    top = max(max(a["target"], *a["samples"], a["median"]) for a in rows) * 1.1
    ax.plot([0, top], [0, top], color="0.6", ls=":", label="achieved = requested")
    ax.set_xlabel("requested % of the GPU")
    ax.set_ylabel("achieved % of the GPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return [_save(fig, out, "interposer_compute.png")]


def plot_gpu_memory(doc: Doc, out: Path) -> list[str]:
    """Per allocator: what it had allocated when refused, and what the GPU had
    really given the process beyond its context then, against the quota."""
    figs = doc["figures"]
    quota = figs["quota_mib"]
    names = [k[5:-14] for k in figs if k.startswith("fill ") and k.endswith(" allocated_mib")]
    if not names:
        return []
    fig, (ax,) = _figure(doc, f"GPU memory: requested quota {quota:.0f} MiB vs achieved")
    xs = range(len(names))
    allocated = [figs[f"fill {n} allocated_mib"] for n in names]
    device = [figs.get(f"fill {n} device_mib", 0.0) for n in names]
    ax.bar([x - 0.2 for x in xs], allocated, 0.4, color="tab:blue", label="allocated when refused")
    ax.bar([x + 0.2 for x in xs], device, 0.4, color="tab:green", label="device use (nvidia-smi)")
    for x, a, d in zip(xs, allocated, device, strict=True):
        ax.text(x - 0.2, a, f"{a:,.0f}", ha="center", va="bottom", fontsize=7)
        if d:
            ax.text(x + 0.2, d, f"{d:,.0f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(quota, color="tab:red", ls="--", label="requested quota")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("MiB")
    ax.set_ylim(0, quota * 1.15)
    ax.tick_params(axis="x", labelsize=8, rotation=15)
    ax.legend(fontsize=8, loc="lower right")
    return [_save(fig, out, "gpu_memory.png")]


def plot_gpu_compute(doc: Doc, out: Path) -> list[str]:
    """From the throughput table, rows [loop, share asked, matmuls/s, % of none]:
    the levels' curve, and the pairs' shares side by side."""
    rows = next(t["rows"] for t in doc["tables"] if t["title"].startswith("Throughput"))
    series: dict[str, list[tuple[float, float]]] = {}
    pairs: dict[str, list[tuple[str, float]]] = {}
    for row in rows:
        try:
            loop, asked, achieved = str(row[0]), str(row[1]), float(row[3])
        except (TypeError, ValueError, IndexError):
            continue  # the unrestricted rows, errors
        if ", pair" in loop:
            pairs.setdefault(loop.split(", ", 1)[1], []).append((asked, achieved))
            continue
        try:
            series.setdefault(loop, []).append((float(asked.rstrip(" %")), achieved))
        except ValueError:
            continue
    if not series:
        return []
    fig, axes = _figure(doc, "GPU compute: requested vs achieved share", 2 if pairs else 1)
    ax = axes[0]
    for loop, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=loop)
    ax.plot([0, 100], [0, 100], color="0.6", ls=":", label="achieved = requested")
    ax.set_xlabel("GPUSHARE_CORE_LIMIT (%), standalone mode")
    ax.set_ylabel("% of the throughput without the library")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if pairs:
        ax = axes[1]
        x = 0
        ticks, labels = [], []
        for pair, members in pairs.items():
            for asked, achieved in members:
                ax.bar(x, achieved, color="tab:blue" if "module" in pair else "tab:orange")
                ax.text(x, achieved + 1, f"{achieved:.1f}", ha="center", fontsize=7)
                ticks.append(x)
                labels.append(f"{pair}\n{asked}")
                x += 1
            x += 0.5
        ax.set_xticks(ticks, labels, fontsize=7)
        ax.set_ylabel("% of the GPU's throughput alone")
        ax.set_title("two processes at once: each one's share (goal 1:2)", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    return [_save(fig, out, "gpu_compute.png")]


PLOTS: dict[str, Callable[[Doc, Path], list[str]]] = {
    "create_latency": plot_create,
    "handler_latency": plot_handler,
    "synchronize": plot_sync,
    "concurrent_pods": plot_pods,
    "rss_cycles": plot_rss,
    "container_start": plot_start,
    "interposer_overhead": plot_overhead,
    "interposer_compute": plot_compute,
    "gpu_memory": plot_gpu_memory,
    "gpu_compute": plot_gpu_compute,
}


def draw_all(docs: dict[str, Doc], out: Path) -> dict[str, list[str]]:
    """Every plot the documents allow, into `out`; {benchmark: [PNG names]}."""
    drawn: dict[str, list[str]] = {}
    for name, doc in docs.items():
        if name not in PLOTS:
            continue
        try:
            drawn[name] = PLOTS[name](doc, out)
        except (KeyError, TypeError, ValueError, IndexError, StopIteration) as e:
            plt.close("all")
            print(f"report_plots: no plot for {name}: {e!r}", file=sys.stderr)
    return drawn
