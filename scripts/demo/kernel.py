"""`make demo-kernel`: the demo inside the qemu guest (Debian's 6.1 kernel
under TCG, as tests/guest runs it) with gpushare.ko loaded, so that the
module's ledger, its scheduler and gpushare-smi's figures from them are
shown.  Slow (minutes: everything in the guest runs 5-20 times slower).

The host builds what the guest runs (the module against the guest
kernel's headers, the interposer, the fake driver, the demo's programs,
the busybox image), boots the guest with the module loaded, and runs
`python -m scripts.demo --in-guest BUILD` there: the same code as `make
demo`, with `kmod: required`.  The guest shares the host's file system
read-only; its writes are thrown away."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from scripts.demo.bed import ROOT, build
from tests.guest.harness import build_module, kmod_source
from tests.guest.harness.vm import GuestError, Kernel, check_prereqs, run_in_guest
from tests.testbed.images import build_images

TIMEOUT_S = 1500


def demo_kernel() -> int:
    try:
        kernel = check_prereqs()
    except GuestError as exc:
        print(f"demo: FAILED: the qemu guest cannot run here: {exc}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="gs-demo-kernel-"))
    try:
        return _boot(kernel, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _boot(kernel: Kernel, work: Path) -> int:
    print(
        f"== building gpushare.ko for the guest's kernel {kernel.version}, the interposer "
        "and the fake CUDA driver",
        flush=True,
    )
    ko = build_module(kmod_source(), work / "kmod", kernel)
    binaries = build(work / "build")
    build_images()  # cached on the host: the guest's writes are thrown away
    print("== booting the guest with gpushare.ko loaded (minutes under TCG)", flush=True)
    try:
        result = run_in_guest(
            [sys.executable, "-m", "scripts.demo", "--in-guest", str(binaries.dir)],
            cwd=ROOT,
            env={"PYTHONUNBUFFERED": "1"},
            timeout=TIMEOUT_S,
            modules=[ko],
            memory_mb=1536,
            smp=2,
        )
    except GuestError as exc:
        print(f"\ndemo: FAILED: the guest: {exc}", file=sys.stderr)
        return 1
    return result.status
