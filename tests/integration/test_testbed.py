"""The containerd test bed itself, with no NRI plugin attached."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.testbed.containerd import (
    NRI_LOG_MARKER,
    SELECT_VAR,
    SID_BIN,
    TRIXIE_BIN,
    Containerd,
    ContainerdError,
    missing_prerequisites,
    selected_bin_dir,
)
from tests.testbed.cri import CriClient, GRPCError, parse_cri_log

pytestmark = pytest.mark.containerd


def test_parse_cri_log_joins_partial_lines() -> None:
    text = (
        "2024-01-01T00:00:00.1Z stdout P hel\n"
        "2024-01-01T00:00:00.2Z stderr F oops\n"
        "2024-01-01T00:00:00.3Z stdout F lo world\n"
        "2024-01-01T00:00:00.4Z stdout F \n"
    )
    assert parse_cri_log(text) == [("stderr", "oops"), ("stdout", "hello world"), ("stdout", "")]


async def test_containerd_runs_with_nri_enabled(containerd: Containerd, cri: CriClient) -> None:
    assert containerd.running
    version = await cri.version()
    assert version.runtime_name == "containerd"
    assert version.runtime_api_version == "v1"
    log = containerd.log_text()
    if containerd.major >= 2:  # 2.x logs the plugin's id as a field of its own
        assert f'msg="loading plugin" id={NRI_LOG_MARKER} ' in log
    else:
        assert f'loading plugin \\"{NRI_LOG_MARKER}\\"' in log
    assert "created NRI interface" in log
    assert containerd.nri_socket.is_socket()


def test_nri_marker_absent_when_disabled(make_containerd) -> None:
    bed: Containerd = make_containerd(nri=False, images=False)
    assert "created NRI interface" not in bed.log_text()
    assert not bed.nri_socket.exists()


async def test_env_reaches_container(cri: CriClient) -> None:
    run = await cri.run_container_env(env={"FOO": "bar"}, pod_annotations={"a.example/x": "1"})
    assert run.exit_code == 0
    assert "FOO=bar" in run.lines
    assert any(line.startswith("PATH=") for line in run.lines)
    assert [c.id for c in await cri.list_containers(run.pod_id)] == [run.container_id]


async def test_failed_create_leaves_no_pods(containerd: Containerd) -> None:
    async with containerd.cri_client() as client:
        pod_id = await client.run_pod("broken")
        with pytest.raises(GRPCError):
            await client.create_container(pod_id, "c", image="docker.io/gpushare/absent:none")
        assert pod_id in {p.id for p in await client.list_pods()}
    async with containerd.cri_client() as client:
        assert pod_id not in {p.id for p in await client.list_pods()}


async def test_container_stop_and_remove(cri: CriClient) -> None:
    pod_id = await cri.run_pod("sleeper", labels={"app": "tb"})
    cid = await cri.create_container(pod_id, "sleep", command=["sleep", "300"])
    await cri.start(cid)
    assert (await cri.container_status(cid)).state.name == "CONTAINER_RUNNING"
    await cri.stop(cid, timeout=0)
    status = await cri.wait_exit(cid)
    assert status.exit_code != 0
    await cri.remove(cid)
    assert await cri.list_containers(pod_id) == []


async def test_restart_keeps_working(make_containerd) -> None:
    bed: Containerd = make_containerd(log_level="debug")
    async with bed.cri_client() as client:
        before = await client.run_container(["echo", "before"], name="one")
        assert before.lines == ["before"]
        pod_id = await client.run_pod("survivor")
        cid = await client.create_container(pod_id, "sleep", command=["sleep", "300"])
        await client.start(cid)
        pid = (await client.container_info(cid))["pid"]
        first_pid = bed.pid
        bed.restart()
        assert bed.pid != first_pid
        assert bed.log_text().count("starting containerd") == 2
        await client.wait_ready()
        # The container outlives the daemon, as with a real containerd restart.
        assert (await client.container_status(cid)).state.name == "CONTAINER_RUNNING"
        assert _alive(pid)
        after = await client.run_container_env(env={"AFTER": "restart"})
        assert "AFTER=restart" in after.lines


def _alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (killed, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _mounts_under(base: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [p for p in (line.split()[4] for line in f) if p.startswith(f"{base}/")]


async def test_stop_kills_only_what_it_started(make_containerd) -> None:
    bed: Containerd = make_containerd()
    client = bed.cri_client()
    await client.wait_ready()
    pod_id = await client.run_pod("left-behind")
    cid = await client.create_container(pod_id, "sleep", command=["sleep", "300"])
    await client.start(cid)
    pid = (await client.container_info(cid))["pid"]
    client.channel.close()  # no CRI cleanup: stop() must cope on its own
    shims = bed._shims()
    assert shims and _mounts_under(bed.base)
    bed.stop(remove=False)
    assert not bed.running
    assert not _alive(pid)
    assert not bed._shims()
    assert not _mounts_under(bed.base)
    shutil.rmtree(bed.base)


def test_missing_prerequisites_are_named(tmp_path: Path) -> None:
    missing = missing_prerequisites(tmp_path)
    assert any("containerd" in m and "install-prereqs" in m for m in missing)
    assert missing_prerequisites() == []


def test_the_run_selects_its_containerd(monkeypatch: pytest.MonkeyPatch) -> None:
    for choice, bin_dir, major in (("", TRIXIE_BIN, 1), ("1.7", TRIXIE_BIN, 1), ("2", SID_BIN, 2)):
        monkeypatch.setenv(SELECT_VAR, choice)
        assert selected_bin_dir() == bin_dir
        bed = Containerd(images=False)
        assert (bed.bin_dir, bed.major) == (bin_dir, major)
        assert f"version = {major + 1}\n" in bed.config_text()
        shutil.rmtree(bed.base)
    assert Containerd(bin_dir=SID_BIN).version[:2] == (2, 1)
    monkeypatch.setenv(SELECT_VAR, "1.6")
    with pytest.raises(ContainerdError, match="GPUSHARE_CONTAINERD='1.6'"):
        selected_bin_dir()


async def test_runc_is_the_releases_own(containerd: Containerd, cri: CriClient) -> None:
    """2.x runs sid's runc 1.3 (patched to sid's loader: it needs glibc 2.38),
    1.7 bookworm's 1.1; the shim finds it first on containerd's PATH."""
    done = subprocess.run([containerd.runc, "--version"], capture_output=True, text=True)
    assert done.stdout.startswith(
        "runc version 1.3." if containerd.major >= 2 else "runc version 1.1."
    ), done.stdout
    run = await cri.run_container_env(env={"X": "1"})
    assert run.exit_code == 0
    assert (containerd.runc_root / "k8s.io").is_dir()  # the shim's runc used the bed's root
