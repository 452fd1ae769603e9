"""The interposer under a versioned path: a container's mount names the file
the configured link resolves to at create time, so a later swap of the link
(an upgrade) changes nothing a container has (HAMi's #727/#753)."""

from __future__ import annotations

import os
from pathlib import Path

from nri_gpushare.ops import cdi
from nri_gpushare.share.interposer import interposer_injection
from nri_gpushare.share.model import Gpu, InterposerPolicy
from tests.fakes import FakeDevices

GiB = 1 << 30


def _install(libdir: Path, version: str) -> None:
    """What scripts/install-node.sh does: a new versioned file, then an atomic
    swap of the link (a link under a temporary name renamed over it)."""
    (libdir / version).mkdir()
    (libdir / version / "libgpushare.so").write_bytes(b"\x7fELF " + version.encode())
    os.symlink(f"{version}/libgpushare.so", libdir / ".libgpushare.so.new")
    os.rename(libdir / ".libgpushare.so.new", libdir / "libgpushare.so")


def _policy(libdir: Path) -> InterposerPolicy:
    return InterposerPolicy(
        library=str(libdir / "libgpushare.so"),
        container_path="/usr/lib/gpushare/libgpushare.so",
        preload_file="/var/lib/nri-gpushare/ld.so.preload",
    )


def test_mount_names_the_version_the_link_resolves_to(tmp_path: Path) -> None:
    libdir = tmp_path.resolve()
    _install(libdir, "0.1.0")
    before, _ = interposer_injection(_policy(libdir), {})
    assert before[0].source == str(libdir / "0.1.0" / "libgpushare.so")

    _install(libdir, "0.2.0")
    after, _ = interposer_injection(_policy(libdir), {})
    assert after[0].source == str(libdir / "0.2.0" / "libgpushare.so")
    # The file the first container mounted is still there, unchanged.
    assert Path(before[0].source).read_bytes() == b"\x7fELF 0.1.0"


def test_cdi_spec_names_the_version(tmp_path: Path) -> None:
    libdir = tmp_path.resolve()
    _install(libdir, "0.1.0")
    gpu = Gpu(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA H100", 80 * GiB, 0)
    spec = cdi.build_spec([gpu], FakeDevices(uvm=True, control=True), _policy(libdir), "/bin/x")
    sources = [m["hostPath"] for m in spec["containerEdits"]["mounts"]]
    assert str(libdir / "0.1.0" / "libgpushare.so") in sources
