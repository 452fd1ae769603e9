"""`python -m scripts.demo` (make demo): the demo, standalone, on this
machine; `--kernel` (make demo-kernel): the same inside the qemu guest with
gpushare.ko loaded; `--in-guest BUILD` is what the guest runs."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from scripts.demo.checks import DemoFailed
from scripts.demo.enforce import Setting
from scripts.demo.pods import Binaries
from scripts.demo.run import demo, fail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.demo", description=__doc__)
    parser.add_argument("--kernel", action="store_true", help="run it in the qemu guest")
    parser.add_argument("--in-guest", metavar="BUILD", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.kernel:
        from scripts.demo.kernel import demo_kernel

        return demo_kernel()
    try:
        if args.in_guest:
            # Under TCG everything runs 5-20 times slower: longer kernels and
            # slices, and a GPU left idle between slices while processes wake.
            setting = Setting(
                module=True,
                kernel_us=2000,
                slice_us=100000,
                settle_s=4.0,
                window_s=5.0,
                slow=120.0,
                busy_margin=10.0,
            )
            asyncio.run(demo(setting, Binaries(Path(args.in_guest))))
        else:
            asyncio.run(demo(Setting(module=False)))
    except DemoFailed as exc:
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
