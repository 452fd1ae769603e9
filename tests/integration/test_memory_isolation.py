"""Memory isolation through real CRI pods: the interposer (libgpushare.so)
mounted read-only and preloaded through the container's /etc/ld.so.preload
for isolation full|memory, nothing for isolation none, and a refusal that
reaches the CRI caller when the node lacks the library."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.plugin import ROOT
from tests.integration.test_share_e2e import env_of, refused, reserved, run_sleeper

P = "gpushare.io/"
IN_CONTAINER = "/usr/lib/gpushare/libgpushare.so"
REAL_BUILD = ROOT / "libgpushare" / "build" / "libgpushare.so"

SHOW = (
    "cat /etc/ld.so.preload 2>/dev/null || echo 'no /etc/ld.so.preload'; "
    f"md5sum {IN_CONTAINER} 2>/dev/null || echo 'no library'; "
    "grep -E ' (/etc/ld.so.preload|/usr/lib/gpushare/libgpushare.so) ' /proc/mounts; "
    f"(echo x > {IN_CONTAINER}) 2>/dev/null && echo 'library writable'; "
    "(echo x > /etc/ld.so.preload) 2>/dev/null && echo 'preload writable'; "
    "env"
)


@pytest.fixture
def library() -> Iterator[Path]:
    """The node's libgpushare.so: the real build when there is one, else a
    small stand-in (only its bytes are checked: the busybox image is static,
    so nothing in it loads the library)."""
    directory = Path(tempfile.mkdtemp(prefix="gs-lib-"))
    path = directory / "libgpushare.so"
    if REAL_BUILD.is_file():
        shutil.copyfile(REAL_BUILD, path)
    else:
        path.write_bytes(b"\x7fELF not really a library, bytes to compare\n")
    path.chmod(0o644)
    yield path
    shutil.rmtree(directory, ignore_errors=True)


def mounts_of(lines: list[str]) -> dict[str, list[str]]:
    """/proc/mounts lines of the output: mount point -> options."""
    found = {}
    for line in lines:
        fields = line.split()
        if len(fields) == 6 and fields[1] in ("/etc/ld.so.preload", IN_CONTAINER):
            found[fields[1]] = fields[3].split(",")
    return found


@pytest.mark.parametrize("isolation", ["full", "memory"])
async def test_the_interposer_is_mounted_and_preloaded(
    containerd, start_plugin, cri, library, isolation
):
    plugin = start_plugin(containerd, interposer={"library": str(library)})
    run = await cri.run_container(
        ["sh", "-c", SHOW],
        pod_annotations={P + "gpu-memory": "2Gi", P + "isolation": isolation},
    )
    assert run.exit_code == 0, run.lines
    assert run.lines[0] == IN_CONTAINER, run.lines  # /etc/ld.so.preload: one line
    digest = hashlib.md5(library.read_bytes()).hexdigest()
    assert f"{digest}  {IN_CONTAINER}" in run.lines
    mounts = mounts_of(run.lines)
    assert "ro" in mounts["/etc/ld.so.preload"] and "ro" in mounts[IN_CONTAINER], run.lines
    assert "library writable" not in run.lines and "preload writable" not in run.lines
    env = env_of(run.lines)
    assert "LD_PRELOAD" not in env and "GPUSHARE_ALLOW_MANAGED" not in env
    assert env["GPUSHARE_ISOLATION"] == isolation
    state_dir = Path(yaml_config(plugin)["state_dir"])
    assert (state_dir / "ld.so.preload").read_text() == IN_CONTAINER + "\n"

    cid = await run_sleeper(cri, "held", {P + "gpu-memory": "1Gi", P + "isolation": isolation})
    [entry] = [a for a in plugin.status()["allocations"] if a["container_id"] == cid]
    assert entry["interposer"] is True
    assert entry["guards"][0] == "interposer"  # kmod off: no kernel ledger, per process
    assert "kmod: off" in entry["unguarded"]["kernel-ledger"]
    [share] = entry["gpus"]
    assert (share["memory"], share["memory_used"]) == (1 << 30, None)
    assert share["memory_used_why"] == "unknown: kmod: off"


async def test_isolation_none_gets_neither(containerd, start_plugin, cri, library):
    plugin = start_plugin(containerd, interposer={"library": str(library)})
    run = await cri.run_container(
        ["sh", "-c", SHOW], pod_annotations={P + "gpu-memory": "2Gi", P + "isolation": "none"}
    )
    assert run.exit_code == 0, run.lines
    assert "no /etc/ld.so.preload" in run.lines and "no library" in run.lines
    assert mounts_of(run.lines) == {}
    assert "LD_PRELOAD" not in env_of(run.lines)
    cid = await run_sleeper(cri, "free", {P + "gpu-memory": "1Gi", P + "isolation": "none"})
    [entry] = [a for a in plugin.status()["allocations"] if a["container_id"] == cid]
    assert (entry["interposer"], entry["guards"]) == (False, ["none"])


async def test_preload_env_sets_ld_preload_and_leaves_etc_alone(
    containerd, start_plugin, cri, library
):
    start_plugin(
        containerd,
        interposer={"library": str(library), "preload": "env", "allow_managed": True},
    )
    run = await cri.run_container(["sh", "-c", SHOW], pod_annotations={P + "gpu-memory": "2Gi"})
    assert run.exit_code == 0, run.lines
    assert "no /etc/ld.so.preload" in run.lines
    assert list(mounts_of(run.lines)) == [IN_CONTAINER]
    env = env_of(run.lines)
    assert env["LD_PRELOAD"] == IN_CONTAINER and env["GPUSHARE_ALLOW_MANAGED"] == "1"


async def test_a_missing_library_is_refused_through_cri_and_reserves_nothing(
    containerd, start_plugin, cri, tmp_path
):
    missing = tmp_path / "no" / "libgpushare.so"
    plugin = start_plugin(containerd, interposer={"library": str(missing)})
    message = await refused(cri, "refused", {P + "gpu-memory": "2Gi"})
    assert f"{missing} does not exist on this node" in message, message
    assert "interposer.missing: warn" in message and "isolation: none" in message, message
    assert plugin.status()["allocations"] == []
    assert all(v == (0, 0, 0) for v in reserved(plugin).values())
    assert plugin.status()["interposer"]["problem"] == "does not exist"
    # isolation none needs no library
    cid = await run_sleeper(cri, "free", {P + "gpu-memory": "1Gi", P + "isolation": "none"})
    assert [a["container_id"] for a in plugin.status()["allocations"]] == [cid]


async def test_a_missing_library_with_warn_runs_without_it(containerd, start_plugin, cri, tmp_path):
    plugin = start_plugin(
        containerd, interposer={"library": str(tmp_path / "none.so"), "missing": "warn"}
    )
    run = await cri.run_container(["sh", "-c", SHOW], pod_annotations={P + "gpu-memory": "2Gi"})
    assert run.exit_code == 0, run.lines
    assert "no /etc/ld.so.preload" in run.lines and "no library" in run.lines
    assert "created without the CUDA interposer (interposer.missing: warn)" in plugin.log()


def yaml_config(plugin) -> dict:
    import yaml

    return yaml.safe_load(plugin.config_path.read_text())
