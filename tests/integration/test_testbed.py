"""The containerd test bed itself, with no NRI plugin attached."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.testbed.containerd import NRI_LOG_MARKER, Containerd, missing_prerequisites
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
