"""Deep queues against the real module, inside the guest: the paced gate of
libgpushare.so (ABI 4: early renewal, heartbeating drains) with gpushare.ko's
scheduler, when every process keeps far more work queued than a slice holds.

Before ABI 4 a slice was ended by force a quarter slice after its end while
the queue still ran, the next holder was not alone, and weights 1:2 came
out near 1:1.  Here each load keeps 512 kernels of 600 us in flight (307 ms
of work against a 60 ms slice, scaled for TCG as in
kmod_guest_sched_interposer.py), and the shares are read from the module's
books and from the kernel time the fake GPU ran for each.  The criteria are
the policies' shares as numbers; the slices the module ended by force are
counted (the paced gate drains inside its hold, so a forced end is the
exception).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.guest.kmod_guest_sched_interposer import (
    FAKE_DIR,
    LEAD_S,
    LIB,
    LOAD,
    SEC,
    SLICE_US,
    Loads,
    module_shares,
)
from tests.guest.kmod_race_support import mark
from tests.guest.kmod_support import ROOT, MakeContainer, ok, value, write

pytestmark = pytest.mark.usefixtures("kmod")

DEEP = {"COMPUTE_LOAD_IN_FLIGHT": "512"}


@pytest.fixture
def loads(tmp_path: Path) -> Iterator[Loads]:
    """The interposer's side (test_kmod.py builds it; missing fails) and
    the loads of a test, killed at its end."""
    for p in (LIB, FAKE_DIR / "libcuda.so.1", LOAD):
        assert p.is_file(), f"{p} is missing: run through tests/guest/test_kmod.py"
    lds = Loads(tmp_path)
    try:
        yield lds
    finally:
        lds.close()


def forced_ends() -> int:
    """Slices of GPU 0 the module ended by force, so far."""
    return value(ROOT / "0/forced_ends")


@pytest.mark.parametrize("window", ["0", "1"])
def test_weights_1_to_2_hold_with_512_kernels_queued(
    container: MakeContainer, loads: Loads, window: str
) -> None:
    """Policy 2, weights 10:20, both containers 512 kernels deep (a batch
    application, then a window one that never lets its queue empty): 1:2
    within 5 % in the module's books and on the fake GPU, the GPU kept busy,
    and hardly a slice ended by force."""
    ok("gpu 0 1000")
    assert write(ROOT / "0/slice_us", SLICE_US) == 0
    a = container("da", "0:100:10")
    b = container("db", "0:100:20")
    env = {**DEEP, "COMPUTE_LOAD_WINDOW": window}
    t0 = time.monotonic_ns() + int(LEAD_S * SEC)
    forced0 = forced_ends()
    la, lb = loads.start(a, 8, t0=t0, extra_env=env), loads.start(b, 8, t0=t0, extra_env=env)
    got = module_shares(["da", "db"], t0 + 1 * SEC, t0 + 7 * SEC)
    ra, rb = la.result(), lb.result()
    forced = forced_ends() - forced0
    ratio = got["db"] / got["da"]
    traced = [ld.window(r, 1.0, 7.0) for ld, r in ((la, ra), (lb, rb))]
    mark(
        f"deep (512, window {window}) weights 10:20 -> module {got} (1:{ratio:.3f}),"
        f" traced {traced}, forced ends {forced}"
    )
    assert abs(ratio / 2 - 1) <= 0.05, got
    assert abs(traced[1] / traced[0] / 2 - 1) <= 0.05, traced
    assert sum(traced) >= 0.85, traced
    # 8 s of 60 ms slices is about 130 slices: a forced end is an exception.
    assert forced <= 5, forced


def test_fixed_shares_hold_with_512_kernels_queued(container: MakeContainer, loads: Loads) -> None:
    """Policy 3, 20 % and 50 %, 512 kernels deep: each within 3 points."""
    ok("gpu 0 1000")
    assert write(ROOT / "0/slice_us", SLICE_US) == 0
    assert write(ROOT / "0/policy", "3") == 0
    a = container("f20", "0:100:20")
    b = container("f50", "0:100:50")
    t0 = time.monotonic_ns() + int(LEAD_S * SEC)
    la, lb = loads.start(a, 7, t0=t0, extra_env=DEEP), loads.start(b, 7, t0=t0, extra_env=DEEP)
    got = module_shares(["f20", "f50"], t0 + 1 * SEC, t0 + 6 * SEC)
    ra, rb = la.result(), lb.result()
    traced = [ld.window(r, 1.0, 6.0) for ld, r in ((la, ra), (lb, rb))]
    mark(f"deep (512) fixed 20/50 -> module {got}, traced {traced}")
    assert abs(traced[0] * 100 - 20) <= 3, traced
    assert abs(traced[1] * 100 - 50) <= 3, traced
