"""The interposer against the real module, inside the guest: the compute
gate of libgpushare.so (libgpushare/src/gate*.c) in module mode, asking
gpushare.ko's scheduler (GPUSHARE_IOC_SCHED) for the GPU, end to end.

Each simulated container is a registered container bound to its own
cgroup; its process runs libgpushare/tests/compute_load (built on the host
by test_kmod.py into $GPUSHARE_CUDA_BUILD, run here from the host's file
system, which the guest shares) under LD_PRELOAD=libgpushare.so, on the
fake CUDA driver whose simulated GPU (one kernel at a time) is shared by
every load of a test through FAKECUDA_GPU_STATE.  GPUSHARE_GPU_UUIDS names
the fake's device 0, so the container's one GPU (module GPU 0) is that
device.

What each container got is read twice: from the module's own books
(<gpu>/<id>/gputime, the GPU time the interposer reported) and from
compute_load (the kernel time the fake ran for it: gpu_ns, and per 100 ms
in its trace), over a window while every load is busy.  The criteria are
the policies' shares as numbers: weights 1:2 within 5 %, a fixed share
within 3 points; none is a bound on how fast anything runs.  TCG is slow:
slices are 60 ms and kernels 600 us, so a slice holds a few launches'
worth of queued work and the guest's wake-up latency is a small part of
it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.guest.kmod_race_support import mark
from tests.guest.kmod_support import (
    ROOT,
    MakeContainer,
    enter,
    loaded,
    ok,
    read,
    refcount,
    registered,
    unload,
    value,
    write,
)

pytestmark = pytest.mark.usefixtures("kmod")

BUILD = Path(os.environ.get("GPUSHARE_CUDA_BUILD", "/nonexistent"))
LIB = BUILD / "libgpushare.so"
FAKE_DIR = BUILD / "fake"
LOAD = BUILD / "tests" / "compute_load"
# The fake driver's device 0 (libgpushare/tests/fake/fake_cuda.c), and a GPU
# that is none of the fake's.
UUID0 = "GPU-face0000-0000-0000-0000-000000000000"
OTHER = "GPU-0ther000-0000-0000-0000-000000000000"
SEC = 1_000_000_000
SLICE_US = "60000"
KERNEL_US = 600  # 64 kernels in flight (compute_load's bound): 38.4 ms queued
TRACE_MS = 100
LEAD_S = 1.5  # from starting the loads to their first launch (exec under TCG)
CUDA_ERROR_NOT_PERMITTED = 800


@pytest.fixture
def built() -> None:
    """The interposer's side is there (test_kmod.py builds it): a missing
    build fails the test, never skips it."""
    for p in (LIB, FAKE_DIR / "libcuda.so.1", LOAD):
        assert p.is_file(), f"{p} is missing: run through tests/guest/test_kmod.py"


def gputime(cid: str) -> int:
    """ns of GPU time the module charged cid on GPU 0."""
    return value(ROOT / f"0/{cid}/gputime")


@dataclass
class Load:
    """One compute_load process of a container."""

    p: subprocess.Popen[str]
    seconds: float
    t0: int  # CLOCK_MONOTONIC ns of its first launch

    def finish(self) -> tuple[int, str, str]:
        out, err = self.p.communicate(timeout=self.seconds + 60)
        return self.p.returncode, out, err

    def result(self) -> dict[str, Any]:
        """Its RESULT line; it must have run in module mode, and only there."""
        rc, out, err = self.finish()
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert rc == 0 and lines, f"compute_load failed ({rc}):\n{out}\n{err}"
        assert "compute module, weights [" in err, err
        assert "refused" not in err and "not scheduled" not in err, err
        r: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
        return r

    def window(self, r: dict[str, Any], t_from: float, t_to: float) -> float:
        """Its share of the GPU from t_from to t_to seconds after t0, from
        the trace (kernel time submitted per TRACE_MS)."""
        lo, hi = round(t_from * 1000 / TRACE_MS), round(t_to * 1000 / TRACE_MS)
        samples = r["trace"][lo:hi]
        assert len(samples) == hi - lo, f"trace too short: {len(r['trace'])} samples"
        return sum(samples) / ((hi - lo) * TRACE_MS * 1_000_000)


class Loads:
    """Starts compute_load in a container's cgroup on the shared simulated
    GPU; whatever is still running at the end is killed (and so closes its
    /dev/gpushare file) before the module is unloaded."""

    def __init__(self, tmp: Path) -> None:
        self.gpu_state = tmp / "gpu"
        self.started: list[subprocess.Popen[str]] = []

    def start(
        self,
        cg: Path,
        seconds: float,
        *,
        path: str = "kernel",
        t0: int | None = None,
        uuids: str = UUID0,
        kernel_us: int = KERNEL_US,
        extra_env: dict[str, str] | None = None,
    ) -> Load:
        t0 = t0 if t0 is not None else time.monotonic_ns() + int(LEAD_S * SEC)
        env = {
            "PATH": "/usr/bin:/bin",
            "LD_PRELOAD": str(LIB),
            "LD_LIBRARY_PATH": str(FAKE_DIR),
            "FAKECUDA_DEVICES": "1",
            "FAKECUDA_GPU_STATE": str(self.gpu_state),
            "GPUSHARE_GPU_UUIDS": uuids,
            "GPUSHARE_DEBUG": "1",
            "COMPUTE_LOAD_T0": str(t0),
            "COMPUTE_LOAD_TRACE_MS": str(TRACE_MS),
            **(extra_env or {}),
        }
        argv = [str(LOAD), path, str(kernel_us), str(seconds)]
        p = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: enter(cg, None),
        )
        self.started.append(p)
        return Load(p, seconds, t0)

    def close(self) -> None:
        for p in self.started:
            if p.poll() is None:
                p.kill()
            p.communicate()


@pytest.fixture
def loads(built: None, tmp_path: Path) -> Iterator[Loads]:
    lds = Loads(tmp_path)
    try:
        yield lds
    finally:
        lds.close()


def sleep_until(t_ns: int) -> None:
    time.sleep(max(0.0, (t_ns - time.monotonic_ns()) / SEC))


def module_shares(cids: list[str], t_from: int, t_to: int) -> dict[str, float]:
    """Sleep until t_from then t_to (CLOCK_MONOTONIC ns); each container's
    gputime charged in between as a fraction of that window."""
    sleep_until(t_from)
    start, w0 = {c: gputime(c) for c in cids}, time.monotonic_ns()
    sleep_until(t_to)
    end, w1 = {c: gputime(c) for c in cids}, time.monotonic_ns()
    return {c: (end[c] - start[c]) / (w1 - w0) for c in cids}


def holding(cid: str, within_s: float = 2.0) -> bool:
    """Wait (at most within_s) until cid holds the GPU: its gputime grows
    over three reads in a row (a slice held counts so far; a release adds
    once, and the next grant is a slice away)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        g0 = gputime(cid)
        time.sleep(0.002)
        g1 = gputime(cid)
        time.sleep(0.002)
        if g0 < g1 < gputime(cid):
            return True
    return False


def test_weights_1_to_2_through_the_interposer(container: MakeContainer, loads: Loads) -> None:
    """Policy 2 (the default): two busy containers of weights 10 and 20,
    each a process launching kernels through libgpushare.so, get GPU time
    1:2 within 5 %: in the module's books and in the kernel time the fake
    GPU ran for each."""
    ok("gpu 0 1000")
    assert write(ROOT / "0/slice_us", SLICE_US) == 0
    a = container("wa", "0:100:10")
    b = container("wb", "0:100:20")
    assert value(ROOT / "0/policy") == 2
    t0 = time.monotonic_ns() + int(LEAD_S * SEC)
    la, lb = loads.start(a, 8, t0=t0), loads.start(b, 8, t0=t0)
    got = module_shares(["wa", "wb"], t0 + 1 * SEC, t0 + 7 * SEC)
    ra, rb = la.result(), lb.result()
    ratio = got["wb"] / got["wa"]
    own = rb["gpu_ns"] / ra["gpu_ns"]
    traced = [ld.window(r, 1.0, 7.0) for ld, r in ((la, ra), (lb, rb))]
    mark(
        f"interposer weights 10:20 -> module {got} (1:{ratio:.3f}), compute_load"
        f" gpu_ns 1:{own:.3f}, traced {traced}, launches {ra['launches']}/{rb['launches']}"
    )
    print(f"module window {got}, ratio {ratio:.3f}; compute_load ratio {own:.3f}, {traced}")
    assert abs(ratio / 2 - 1) <= 0.05, got
    assert abs(own / 2 - 1) <= 0.05, (ra["gpu_ns"], rb["gpu_ns"])
    assert abs(traced[1] / traced[0] / 2 - 1) <= 0.05, traced
    # The module charged at least what the fake GPU ran for each (it charges
    # a stream's span in the slice, which includes the load's own gaps).
    for cid, r in (("wa", ra), ("wb", rb)):
        assert gputime(cid) >= r["gpu_ns"], (cid, gputime(cid), r["gpu_ns"])


def test_fixed_share_of_a_graph_through_the_interposer(
    container: MakeContainer, loads: Loads
) -> None:
    """Policy 3: a container at 30 % launching CUDA graphs (16 kernel nodes
    each) alone gets 30 % of the wall time, never more, within ±3 points,
    over the window it is busy."""
    ok("gpu 0 1000")
    assert write(ROOT / "0/slice_us", SLICE_US) == 0
    assert write(ROOT / "0/policy", "3") == 0
    cg = container("g30", "0:100:30")
    load = loads.start(cg, 5, path="graph")
    got = module_shares(["g30"], load.t0 + 1 * SEC, load.t0 + 4 * SEC)["g30"]
    r = load.result()
    traced = load.window(r, 1.0, 4.0)
    whole = r["gpu_ns"] / r["wall_ns"]
    mark(
        f"interposer graph at 30 % -> module {got:.4f}, traced {traced:.4f}, whole run"
        f" {whole:.4f}, {r['launches']} graphs, {r['kernels']} kernels"
    )
    print(f"graph 30 %: module {got:.4f}, traced {traced:.4f}, whole {whole:.4f}")
    assert r["kernels"] == 16 * r["launches"], r
    assert abs(got * 100 - 30) <= 3, got
    assert abs(traced * 100 - 30) <= 3, traced


def test_sigkill_of_a_container_s_process_leaves_the_gpu_to_the_other(
    container: MakeContainer, loads: Loads
) -> None:
    """Policy 2, weights 50:50, both busy; SIGKILL of one container's
    process while it holds the GPU: the other's load keeps going and gets the whole
    GPU afterwards, the killed one is charged nothing more, its files stay
    consistent, and once every process is gone the module has no open file
    and unloads."""
    ok("gpu 0 1000")
    assert write(ROOT / "0/slice_us", SLICE_US) == 0
    v = container("victim", "0:100:50")
    s = container("survivor", "0:100:50")
    t0 = time.monotonic_ns() + int(LEAD_S * SEC)
    lv, ls = loads.start(v, 10, t0=t0), loads.start(s, 5, t0=t0)
    before = module_shares(["victim", "survivor"], t0 + 1 * SEC, t0 + 2500 * SEC // 1000)
    assert holding("victim"), "the victim never seen holding the GPU"
    lv.p.send_signal(signal.SIGKILL)
    rc, _, _ = lv.finish()
    assert rc == -signal.SIGKILL
    killed = time.monotonic_ns() - t0
    charged = gputime("victim")
    settled, end = killed + SEC // 2, 4500 * SEC // 1000  # after t0
    after = module_shares(["victim", "survivor"], t0 + settled, t0 + end)
    r = ls.result()
    traced = ls.window(r, settled / SEC, end / SEC)
    mark(
        f"interposer SIGKILL at {killed / SEC:.2f} s: before {before}, after {after},"
        f" survivor traced {traced:.4f}, victim charged {charged}"
    )
    print(f"SIGKILL: before {before}, after {after}, survivor traced {traced:.4f}")
    # Both had the GPU, half each (weights 50:50; a short window: ±5 points).
    assert all(abs(x - 0.5) <= 0.05 for x in before.values()), before
    assert gputime("victim") == charged
    assert after["victim"] == 0
    # The survivor holds the GPU all along (the module's books) and the fake
    # ran its kernels nearly all the time: what is missing is its own gap
    # between a synchronisation and its next launch, the scheduler's none.
    assert after["survivor"] >= 0.95, after
    assert traced >= 0.9, traced
    # Everything is gone: no file of /dev/gpushare is open (the module's
    # references are the two containers' own), the books read sensibly, and
    # the module unloads.
    assert refcount() == 2
    for cid in ("victim", "survivor"):
        assert read(ROOT / f"0/{cid}/meminfo").strip() == "Free: 100", cid
        assert value(ROOT / f"0/{cid}/memused") == 0
    assert value(ROOT / "0/free_weight") == 0
    for cid in ("victim", "survivor"):
        ok(f"del {cid}")
    assert registered() == []
    assert refcount() == 0
    assert unload() == 0
    assert not loaded()


@pytest.mark.parametrize("path", ["kernel", "graph"])
def test_a_gpu_not_the_container_s_is_refused(
    container: MakeContainer, loads: Loads, path: str
) -> None:
    """Module mode fails closed: a process of a registered container whose
    GPUSHARE_GPU_UUIDS names another GPU gets its first launch refused with
    CUDA_ERROR_NOT_PERMITTED (compute_load stops there), said on stderr;
    nothing is charged."""
    ok("gpu 0 1000")
    cg = container("wrong", "0:100:30")
    rc, out, err = loads.start(cg, 1, path=path, t0=0, uuids=OTHER).finish()
    mark(f"interposer {path} on another GPU -> exit {rc}: {err.strip()!r}")
    assert rc == 1, (rc, out, err)
    assert "RESULT" not in out
    assert f"compute_load: {path}: error {CUDA_ERROR_NOT_PERMITTED}" in err, err
    refused = "gpushare: launches on CUDA device 0 are refused: it is not one of"
    assert err.count(refused) == 1, err
    assert gputime("wrong") == 0
