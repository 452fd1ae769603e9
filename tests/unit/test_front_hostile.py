"""The compiled front (gpushare-runc) where a careless operator or a slow
daemon would trip it: a GPUSHARE_RUNC naming the front itself, a daemon that
answers a create after the front gave up."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from nri_gpushare.daemon import local_bundle
from nri_gpushare.local.protocol import Reply, Request
from tests.unit.fake_local_daemon import PLAN, fake_daemon
from tests.unit.test_runc_wrapper import CONFIG, FRONT, Bed


@pytest.fixture
def daemon():
    with fake_daemon() as d:
        yield d


@pytest.fixture
def bed(tmp_path: Path, daemon) -> Bed:
    assert FRONT.exists(), f"{FRONT} is missing: make prereqs builds and installs it"
    return Bed(tmp_path, daemon.path, FRONT)


def test_a_runc_env_naming_the_front_itself_is_no_exec_loop(bed, daemon, tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "runc").symlink_to(bed.runc)
    link = tmp_path / "gpushare-runc"
    link.symlink_to(FRONT)
    env = dict(bed.env, GPUSHARE_RUNC=str(link), PATH=f"{tmp_path / 'bin'}:/usr/bin:/bin")
    # Before: the front exec'd itself for ever (the timeout killed it).
    proc = subprocess.run(
        [str(link), "state", "c1"], env=env, capture_output=True, timeout=10, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert bed.calls() == [["state", "c1"]]


def test_a_create_answered_too_late_is_neither_run_nor_asked_again(bed, daemon):
    def late(request: Request) -> Reply:
        time.sleep(10.5)  # past the front's 10 s
        return Reply(True, plan=PLAN)

    daemon.answers["create"] = late
    started = time.monotonic()
    done, _ = bed.run(bed.create_args())
    took = time.monotonic() - started
    err = done.stderr.decode()
    # Before: the Python wrapper asked again (another 10 s).  A daemon that
    # answered that second create gave it the same share, which the late
    # answer's undelivery then released: a container with its GPU in
    # config.json and nothing booked.
    assert done.returncode == 1, err
    assert "did not answer in 10 s" in err and "container c1 is not created" in err
    assert bed.calls() == []
    assert took < 15
    (entry,) = bed.log_entries()
    assert entry["level"] == "error" and "did not answer" in entry["msg"]


def test_a_big_config_json_is_created_by_the_python_wrapper(bed, daemon):
    daemon.answers["create"] = Reply(True, plan=PLAN)
    bed.write_config(dict(CONFIG, padding=["x"] * (local_bundle.MAX_CONFIG // 4)))
    done, _ = bed.run(bed.create_args())
    assert done.returncode == 0, done.stderr
    # The daemon read none of it; the wrapper asked, wrote the share, ran runc.
    assert [r.op for r in daemon.outer] == ["runc-create"]
    assert daemon.ops() == ["create", "start"]
    assert bed.runc_saw()["annotations"]["gpushare.io/assigned"] == "gpu1:2Gi"
