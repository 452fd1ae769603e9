"""The demo from start to end, on this machine (`make demo`, standalone) or
inside the qemu guest with gpushare.ko loaded (`make demo-kernel`, which
boots the guest and runs `python -m scripts.demo --in-guest BUILD` there)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts.demo import control
from scripts.demo.bed import build, node
from scripts.demo.checks import DemoFailed
from scripts.demo.enforce import Enforcement, Setting, say
from scripts.demo.pods import Binaries
from tests.testbed.containerd import missing_prerequisites

GUEST_BASE = Path("/tmp/gs-demo")  # short: unix socket paths


async def demo(setting: Setting, binaries: Binaries | None = None) -> None:
    missing = missing_prerequisites()
    if missing:
        raise DemoFailed("missing prerequisites: " + "; ".join(missing) + " (run `make prereqs`)")
    if setting.module:
        workdir = guest_dirs()
    else:
        workdir = Path(tempfile.mkdtemp(prefix="gs-demo-"))
    try:
        if binaries is None:
            say("building the CUDA interposer libgpushare.so and the tests' fake CUDA driver")
            binaries = build(workdir / "build")
        extra = {"base": workdir / "ctd", "plugin_registration_timeout": "60s"}
        if setting.module:
            extra["plugin_request_timeout"] = "60s"
        say(
            "starting a private containerd 1.7.24 with NRI, and nri-gpushare on a simulated "
            "inventory: 2 x 16Gi GPUs (kmod: "
            + ("required, gpushare.ko loaded)" if setting.module else "off)")
        )
        with node(workdir, binaries, setting.module, setting.slow, **extra) as (
            bed,
            plugin,
            address,
        ):
            async with bed.cri_client() as cri:
                cri.runtime.timeout = cri.images.timeout = setting.slow
                await cri.wait_ready(setting.slow)
                try:
                    await control.shares(cri)
                    part = Enforcement(cri, binaries, setting, workdir)
                    await part.memory()
                    await part.compute()
                    smi_env = {
                        "LD_LIBRARY_PATH": str(binaries.fake_dir),
                        "FAKECUDA_GPU_STATE": str(part.gpu.state),
                        "FAKECUDA_MEMORY": str(16 << 30),
                    }
                    control.status(plugin)
                    control.smi(plugin, smi_env)
                    part.done_with_memory()
                    await control.refusal(cri, plugin)
                    control.metrics(address)
                finally:
                    say("cleaning up: stopping and removing every pod releases its share")
                    await cri.cleanup()
            control.status(plugin)
    finally:
        if not setting.module:
            shutil.rmtree(workdir, ignore_errors=True)
    say("done")


def guest_dirs() -> Path:
    """In the guest: the root is an overlay that overlayfs cannot stack on,
    so containerd's directories and shim sockets go to fresh tmpfs mounts,
    and the loopback interface is brought up for CRI's stream server."""
    for point in (GUEST_BASE, Path("/run/containerd")):
        point.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(point)], check=True)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    return GUEST_BASE


def fail(exc: BaseException) -> int:
    print(f"\ndemo: FAILED: {exc}", file=sys.stderr, flush=True)
    return 1
