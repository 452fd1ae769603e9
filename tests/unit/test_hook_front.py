"""The CDI hooks as the runtime runs them (a program, the state on stdin):
the compiled front (`gpushare-front hook ...`: the daemon reads the state
and the bundle, `hook` op) and `nri-gpushare hook ...` (the reference, which
the front hands odd cases to), each test for both, against a fake daemon
that answers the front's op with the daemon's own code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nri_gpushare.local.protocol import Reply, Request
from tests.unit.fake_local_daemon import PLAN, fake_daemon, short_dir

BIN = Path(sys.executable).parent
PROGRAMS = {"front": BIN / "gpushare-front", "python": BIN / "nri-gpushare"}
CONFIG = {
    "process": {"env": ["PATH=/bin", "GPUSHARE_X=1"]},
    "annotations": {"gpushare.io/gpu-memory": "2Gi"},
    "linux": {
        "cgroupsPath": "/default/c1",
        "devices": [{"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2}],
    },
}


@pytest.fixture(params=list(PROGRAMS))
def program(request) -> Path:
    path = PROGRAMS[request.param]
    assert path.exists(), f"{path} is missing: make prereqs builds and installs it"
    return path


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    b = tmp_path / "io.containerd.runtime.v2.task" / "default" / "c1"
    b.mkdir(parents=True)
    (b / "config.json").write_text(json.dumps(CONFIG))
    return b


def state(bundle: Path, cid: str = "c1", pid: int = 4242) -> bytes:
    return json.dumps(
        {"ociVersion": "1.0.2", "id": cid, "pid": pid, "bundle": str(bundle)}
    ).encode()


def hook(program: Path, *args: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    env = {"PATH": os.environ.get("PATH", "/bin"), "GPUSHARE_PYBIN": str(BIN)}
    done = subprocess.run(
        [str(program), "hook", *args], input=stdin, capture_output=True, env=env, timeout=60
    )
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    return done


def created(bundle: Path) -> Request:
    return Request(
        "create",
        "default",
        "c1",
        via="cdi",
        bundle=str(bundle),
        pid=4242,
        cgroups_path="/default/c1",
        env={"PATH": "/bin", "GPUSHARE_X": "1"},
        annotations={"gpushare.io/gpu-memory": "2Gi"},
        gpu_minors=(2,),
    )


def test_create_runtime_asks_create_and_changes_nothing(program, bundle):
    before = (bundle / "config.json").read_bytes()
    with fake_daemon({"create": Reply(True, plan=PLAN)}) as daemon:
        done = hook(program, "create-runtime", "--socket", daemon.path, stdin=state(bundle))
    assert (done.returncode, done.stderr) == (0, b"")
    assert daemon.requests == [created(bundle)]
    assert (bundle / "config.json").read_bytes() == before
    front = program.name == "gpushare-front"
    assert [r.op for r in daemon.outer] == (["hook"] if front else [])  # the front's own op


def test_create_runtime_refused_says_why(program, bundle):
    refusal = Reply.refused("gpushare: GPU 2 has 1 GiB free", "capacity")
    with fake_daemon({"create": refusal}) as daemon:
        done = hook(program, "create-runtime", f"--socket={daemon.path}", stdin=state(bundle))
    assert (done.returncode, done.stderr) == (1, b"gpushare: GPU 2 has 1 GiB free\n")
    with fake_daemon({"create": b'{"ok":false,"reason":"kmod"}\n'}) as daemon:
        done = hook(program, "create-runtime", "--socket", daemon.path, stdin=state(bundle))
    assert done.returncode == 1 and b"refused the container (kmod)" in done.stderr


def test_without_the_daemon_create_fails_closed_and_poststop_succeeds(program, bundle):
    with short_dir() as d:
        sock = os.path.join(d, "none.sock")
        done = hook(program, "create-runtime", "--socket", sock, stdin=state(bundle))
        assert done.returncode == 1
        assert done.stderr.startswith(b"gpushare: the nri-gpushare daemon is not running")
        assert b"not started unguarded" in done.stderr
        done = hook(program, "poststop", "--socket", sock, stdin=state(bundle))
        assert done.returncode == 0 and b"could not release container c1" in done.stderr


def test_poststop_releases(program, bundle):
    with fake_daemon() as daemon:
        done = hook(program, "poststop", "--socket", daemon.path, stdin=state(bundle))
    assert (done.returncode, done.stderr) == (0, b"")
    assert daemon.requests == [Request("release", "default", "c1")]
    assert len(daemon.outer) == (program.name == "gpushare-front")


def test_a_symlinked_config_is_followed_as_runc_follows_it(program, bundle, tmp_path):
    """The daemon never follows it; the Python hook, running for the front, does."""
    real = tmp_path / "elsewhere.json"
    (bundle / "config.json").rename(real)
    (bundle / "config.json").symlink_to(real)
    with fake_daemon() as daemon:
        done = hook(program, "create-runtime", "--socket", daemon.path, stdin=state(bundle))
    assert done.returncode == 0, done.stderr
    assert daemon.requests == [created(bundle)]


@pytest.mark.parametrize(
    "stdin, says",
    [
        (b"{not json", b"OCI state: not JSON"),
        (b'{"id": "c1", "bundle": "relative"}', b"is not an absolute path"),
        (b'{"id": "c1", "bundle": "/b\xff"}', b"not JSON"),
        (b'{"id": "c1", "bundle": "/b", "x": "' + b"a" * (4 << 20) + b'"}', b"more than"),
        (b"", b"not JSON"),
    ],
    ids=["garbage", "relative", "not-utf8", "huge", "empty"],
)
def test_bad_state_fails_create_and_not_poststop(program, stdin, says):
    with fake_daemon() as daemon:
        done = hook(program, "create-runtime", "--socket", daemon.path, stdin=stdin)
        assert done.returncode == 1 and says in done.stderr, done.stderr
        assert done.stderr.startswith(b"gpushare: create-runtime hook: ")
        done = hook(program, "poststop", "--socket", daemon.path, stdin=stdin)
        assert done.returncode == 0 and says in done.stderr
    assert daemon.requests == []


def test_a_missing_config_fails_create(program, bundle):
    (bundle / "config.json").unlink()
    with fake_daemon() as daemon:
        done = hook(program, "create-runtime", "--socket", daemon.path, stdin=state(bundle))
    assert done.returncode == 1 and b"config.json: cannot open" in done.stderr
    assert daemon.requests == []


def test_usage(program):
    done = hook(program, "--help", stdin=b"")
    assert done.returncode == 0 and b"create-runtime" in done.stdout
    done = hook(program, "create-runtime", "--timeout", "x", stdin=b"")
    assert done.returncode == 2 and b"--timeout 'x'" in done.stderr
    done = hook(program, "poststop", "--bogus", stdin=b"")
    assert done.returncode == 0  # a poststop hook never fails a delete


def test_the_front_without_its_python_fails_create_and_never_poststop(bundle, tmp_path):
    """The Python hook it hands odd cases to is missing (a broken install)."""
    env = {"PATH": "/bin:/usr/bin", "GPUSHARE_PYBIN": str(tmp_path / "nothing")}
    with short_dir() as d:
        sock = os.path.join(d, "none.sock")
        for args, code in (
            (["create-runtime", "--socket", sock], 127),
            (["poststop", "--socket", sock], 0),
            (["--socket", sock, "poststop"], 0),  # was 127: the socket taken for the hook
        ):
            done = subprocess.run(
                [str(PROGRAMS["front"]), "hook", *args],
                input=state(bundle), capture_output=True, env=env, timeout=60,
            )  # fmt: skip
            assert done.returncode == code and b"gpushare: cannot run" in done.stderr
