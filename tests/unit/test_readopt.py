"""A container placed just before the plugin reconnected, and missing from
the reconnect's Synchronize snapshot (containerd lists it only once created),
gets its recorded share back at its start instead of being found unserved
(and, with the default `unserved: deny`, killed)."""

from __future__ import annotations

import pytest

from nri_gpushare.daemon.main import build_service
from nri_gpushare.daemon.nri_handler import GpuShareHandler
from nri_gpushare.names import ASSIGNED
from nri_gpushare.nri.api import lite, nri
from nri_gpushare.share import records
from nri_gpushare.share.recovery import FORGOTTEN_KEPT
from tests.unit.test_daemon import off_config, pod_asking_1gi

CREATED = nri.ContainerState.CONTAINER_CREATED
RUNNING = nri.ContainerState.CONTAINER_RUNNING


def container(cid: str, pid: int = 0, state: nri.ContainerState = CREATED, **annotations: str):
    return lite.decode_container(
        bytes(
            nri.Container(
                id=cid,
                pod_sandbox_id="p",
                name="main",
                pid=pid,
                state=state,
                annotations=annotations,
            )
        )
    )


async def placed_then_forgotten(tmp_path, cid: str = "c1", **settings):
    """A handler that placed `cid`, then synchronized without it; and the
    annotation containerd gave the container from the plugin's answer."""
    handler = GpuShareHandler(await build_service(off_config(tmp_path, **settings), None))
    pod = pod_asking_1gi()
    adjustment = await handler.create_container(pod, container(cid))
    assert adjustment is not None
    assigned = adjustment.annotations[ASSIGNED]
    await handler.synchronize([pod], [])  # the snapshot was taken before it existed
    assert cid not in handler.service.allocations
    return handler, pod, assigned


@pytest.mark.parametrize("dropped_start", [False, True])
async def test_a_container_missing_from_the_snapshot_gets_its_share_back(
    tmp_path, monkeypatch, dropped_start
):
    handler, pod, assigned = await placed_then_forgotten(tmp_path, unserved="deny")
    killed: list[str] = []

    def kill(cid: str, pid: int) -> str:
        killed.append(cid)
        return "killed"

    monkeypatch.setattr("nri_gpushare.daemon.unserved_policy.kill_container", kill)
    if not dropped_start:  # else: its StartContainer was the event containerd dropped
        await handler.start_container(pod, container("c1", **{ASSIGNED: assigned}))
    await handler.post_start_container(pod, container("c1", 42, RUNNING, **{ASSIGNED: assigned}))
    service = handler.service
    assert "c1" in service.allocations and service.unserved == {} and killed == []
    assert service.status()["allocations"][0]["container_id"] == "c1"
    # recorded again: a restart finds it in the records
    text = service.store.load()
    assert text is not None and "c1" in records.decode(text, service.gpus)


async def test_a_container_that_does_not_carry_its_record_is_unserved(tmp_path):
    handler, pod, assigned = await placed_then_forgotten(tmp_path, unserved="warn")
    forged = assigned.replace("1073741824", "2147483648")
    await handler.start_container(pod, container("c1", **{ASSIGNED: forged}))
    assert "c1" not in handler.service.allocations and list(handler.service.unserved) == ["c1"]


async def test_a_share_whose_room_was_taken_meanwhile_is_unserved(tmp_path, caplog):
    handler, pod, assigned = await placed_then_forgotten(tmp_path, unserved="warn")
    big = lite.decode_pod_sandbox(
        bytes(nri.PodSandbox(id="q", name="big", annotations={"gpushare.io/gpu-memory": "16Gi"}))
    )
    taker = lite.decode_container(bytes(nri.Container(id="c2", pod_sandbox_id="q", name="main")))
    assert await handler.create_container(big, taker) is not None
    await handler.start_container(pod, container("c1", **{ASSIGNED: assigned}))
    assert "c1" not in handler.service.allocations and list(handler.service.unserved) == ["c1"]
    assert "taken" in caplog.text


def test_only_the_latest_forgotten_records_are_kept() -> None:
    from nri_gpushare.share.model import Allocation
    from nri_gpushare.share.recovery import keep_latest

    def record(cid: str) -> Allocation:
        return Allocation(cid, "main", "ns/pod", ())

    kept: dict[str, Allocation] = {}
    keep_latest(kept, {f"x{i}": record(f"x{i}") for i in range(FORGOTTEN_KEPT + 5)}, set())
    assert len(kept) == FORGOTTEN_KEPT and "x4" not in kept and "x5" in kept
    keep_latest(kept, {"x5": record("x5")}, {"x6"})  # x5 again: the latest; x6 listed: decided
    assert list(kept)[-1] == "x5" and "x6" not in kept
