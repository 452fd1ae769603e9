"""CRI CreateContainer latency with the gpushare plugin connected vs without.

Starts four private containerd 1.7.24 instances (the test bed), all with NRI
enabled: one with no plugin (the baseline), one with the upstream Go
reference plugin that does nothing (bench/go-null-plugin: containerd's own
Go stub, built offline from Debian packages by its build.sh), one with this
project's Python plugin that does nothing (bench/null_plugin.py: the cost of
any plugin on this stub and transport), one with `nri-gpushare run`.
It creates N containers with a GPU share request in each, rotating between
them so that load on the machine hits all alike.  Each container is removed
right after it is created (its share is released), so the node never fills.
Prints p50/p99 of each, the difference to the baseline, and gpushare's own
handling time from its status socket.

    .venv/bin/python bench/create_latency.py [--containers 200] [--no-go] [--json PATH]

--json PATH also writes the benchmark convention's object (bench/report_common.py):
  figures: "<arm> p50_ms", "<arm> p99_ms", "<arm> added_p50_ms" (p50 minus the
    no-plugin arm's) for each arm; "null plugin ratio_to_go" and "gpushare
    ratio_to_go" (added p50 over the Go null plugin's, with the Go arm);
    "gpushare handling p50_ms" / "gpushare handling p99_ms" (its own handler
    time, from its status socket), and "null plugin handling p50_ms" / "...
    p99_ms" where bench/null_plugin.py writes its own (--stats, at exit);
  samples_ms: {arm: [each timed CreateContainer in ms, in order]};
  handling_ms: {plugin: {"count", "p50", "p99"}} for each plugin that reports it;
  containers: containers per arm; request: the share each asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report_common import write_json  # noqa: E402

from tests.integration.plugin import PluginProcess  # noqa: E402
from tests.testbed.containerd import Containerd  # noqa: E402

REQUEST = {"gpushare.io/gpu-memory": "1Gi", "gpushare.io/gpu-core": "10"}
ARMS = ["no plugin", "Go null plugin", "null plugin", "gpushare"]
GO_BUILD = Path(__file__).resolve().parent / "go-null-plugin" / "build.sh"
WARMUP = 10


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed_create(client, pod_id: str, name: str) -> float:
    started = time.perf_counter()
    cid = await client.create_container(pod_id, name, command=["true"])
    elapsed = time.perf_counter() - started
    await client.remove(cid)
    return elapsed


async def wait_registered(bed: Containerd, name: str) -> None:
    marker = f'registered as \\"10-{name}\\"'
    deadline = time.monotonic() + 15
    while marker not in bed.log_text():
        if time.monotonic() > deadline:
            raise RuntimeError(f"plugin {name} did not register:\n{bed.log_tail(20)}")
        await asyncio.sleep(0.05)


async def main(containers: int, go: bool, json_path: Path | None = None) -> None:
    arms = ARMS if go else [a for a in ARMS if a != "Go null plugin"]
    go_plugin = (
        subprocess.run([GO_BUILD], check=True, capture_output=True, text=True) if go else None
    )
    workdir = Path(tempfile.mkdtemp(prefix="gs-bench-"))
    beds = {arm: Containerd().start() for arm in arms}  # all with NRI enabled
    # The node's interposer library: the plugin checks it and mounts it (the
    # benchmark's busybox containers are static, so its content does not matter).
    library = workdir / "libgpushare.so"
    library.write_bytes(b"\x7fELF stand-in")
    library.chmod(0o644)
    plugin = PluginProcess(
        beds["gpushare"].nri_socket,
        workdir / "plugin",  # its state_dir is the sibling workdir/state: private to this run
        log_level="info",  # the default: a decision line per create and remove is its cost
        interposer={"library": str(library)},
    )
    null_stats = workdir / "null-stats.json"
    null_handler: dict[str, float] = {}
    null = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("null_plugin.py")),
            str(beds["null plugin"].nri_socket),
            "--stats",  # its own handling times, written at exit (where it supports it)
            str(null_stats),
        ]
    )
    go_null = None
    if go_plugin is not None:
        binary = go_plugin.stdout.strip().splitlines()[-1]
        socket = str(beds["Go null plugin"].nri_socket)
        go_null = subprocess.Popen(
            [binary, "-socket", socket, "-name", "gonull", "-idx", "10"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # its log is containerd's too (wait_registered)
        )
    timings: dict[str, list[float]] = {arm: [] for arm in arms}
    try:
        plugin.start()
        await wait_registered(beds["null plugin"], "null")
        if go_null is not None:
            await wait_registered(beds["Go null plugin"], "gonull")
        async with contextlib.AsyncExitStack() as stack:
            clients = {
                arm: await stack.enter_async_context(bed.cri_client()) for arm, bed in beds.items()
            }
            pods = {
                arm: await client.run_pod("bench", annotations=REQUEST)
                for arm, client in clients.items()
            }
            for i in range(containers + WARMUP):
                # Rotate which arm goes first so none gets a systematic edge.
                order = arms[i % len(arms) :] + arms[: i % len(arms)]
                for arm in order:
                    elapsed = await timed_create(clients[arm], pods[arm], f"c{i}")
                    if i >= WARMUP:
                        timings[arm].append(elapsed)
        handler = plugin.status()["nri"]["handler_ms"]["CreateContainer"]
        total = containers + WARMUP
        assert handler["count"] == total, f"plugin saw {handler['count']} creates"
        assert plugin.status()["allocations"] == [], "removed containers kept shares"
        placed = plugin.log().count("decision=placed ")
        assert placed == total, f"gpushare placed {placed} of {total} shares"
    finally:
        plugin.stop()
        for proc in (null, go_null):
            if proc is not None:
                proc.terminate()
                proc.wait()
        for bed in beds.values():
            bed.stop()
        if null_stats.exists():
            null_handler = json.loads(null_stats.read_text()).get("CreateContainer", {})
        shutil.rmtree(workdir, ignore_errors=True)

    def ms(value: float) -> str:
        return f"{value * 1000:7.2f} ms"

    base50 = percentile(timings["no plugin"], 0.5)
    base99 = percentile(timings["no plugin"], 0.99)
    figures: dict[str, float] = {}
    for arm, values in timings.items():
        figures[f"{arm} p50_ms"] = percentile(values, 0.5) * 1000
        figures[f"{arm} p99_ms"] = percentile(values, 0.99) * 1000
        figures[f"{arm} added_p50_ms"] = (percentile(values, 0.5) - base50) * 1000
    print(f"CRI CreateContainer, {containers} containers per arm, request {REQUEST}")
    print(f"{'':15} {'p50':>10} {'p99':>10} {'mean':>10} {'+p50':>10} {'+p99':>10}")
    for arm, values in timings.items():
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        print(
            f"{arm:15} {ms(p50)} {ms(p99)} {ms(statistics.mean(values))} "
            f"{ms(p50 - base50)} {ms(p99 - base99)}"
        )
    if go:
        go_added = percentile(timings["Go null plugin"], 0.5) - base50
        for arm in ("null plugin", "gpushare"):
            added = percentile(timings[arm], 0.5) - base50
            ratio = f"{added / go_added:.2f}x" if go_added > 0 else "n/a (Go added nothing)"
            print(f"{arm}'s added p50 against the Go null plugin's: {ratio}")
            if go_added > 0:
                figures[f"{arm} ratio_to_go"] = added / go_added
    print(
        f"gpushare's own CreateContainer handling: p50 {handler['p50']:.3f} ms, "
        f"p99 {handler['p99']:.3f} ms"
    )
    figures["gpushare handling p50_ms"] = handler["p50"]
    figures["gpushare handling p99_ms"] = handler["p99"]
    handling = {"gpushare": handler}
    if "p50" in null_handler:
        print(
            f"the null plugin's own CreateContainer handling: p50 {null_handler['p50']:.3f} ms, "
            f"p99 {null_handler['p99']:.3f} ms"
        )
        figures["null plugin handling p50_ms"] = null_handler["p50"]
        figures["null plugin handling p99_ms"] = null_handler["p99"]
        handling["null plugin"] = null_handler
    write_json(
        json_path,
        "create_latency",
        figures,
        samples_ms={arm: [v * 1000 for v in values] for arm, values in timings.items()},
        handling_ms=handling,
        containers=containers,
        request=REQUEST,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=200)
    parser.add_argument("--no-go", action="store_true", help="leave the Go baseline out")
    parser.add_argument("--json", type=Path, help="also write the figures and samples here")
    args = parser.parse_args()
    asyncio.run(main(args.containers, not args.no_go, args.json))
