"""`nri-gpushare hook create-runtime|poststop` against a fake daemon."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nri_gpushare.local import hook
from nri_gpushare.local.protocol import Reply, Request
from tests.unit.fake_local_daemon import PLAN, fake_daemon, short_dir

CONFIG = {
    "process": {"env": ["PATH=/bin", "GPUSHARE_X=1"], "args": ["sh"]},
    "annotations": {"gpushare.io/gpu-memory": "2Gi"},
    "linux": {
        "cgroupsPath": "/default/c1",
        "devices": [
            {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
            {"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2},
            {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
        ],
    },
}


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    b = tmp_path / "io.containerd.runtime.v2.task" / "default" / "c1"
    b.mkdir(parents=True)
    (b / "config.json").write_text(json.dumps(CONFIG))
    return b


def state(bundle: Path, cid: str = "c1", pid: int = 4242, status: str = "created") -> bytes:
    return json.dumps(
        {"ociVersion": "1.0.2", "id": cid, "status": status, "pid": pid, "bundle": str(bundle)}
    ).encode()


@pytest.fixture(autouse=True)
def no_socket_env(monkeypatch):
    monkeypatch.delenv(hook.SOCKET_ENV, raising=False)


def run(monkeypatch, argv: list[str], stdin: bytes) -> int:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    return hook.main(argv)


def test_create_runtime_asks_create(monkeypatch, bundle, capsys):
    with fake_daemon() as daemon:
        code = run(monkeypatch, ["create-runtime", "--socket", daemon.path], state(bundle))
    assert code == 0
    assert daemon.requests == [
        Request(
            "create",
            "default",
            "c1",
            via="cdi",
            bundle=str(bundle),
            pid=4242,
            cgroups_path="/default/c1",
            env={"PATH": "/bin", "GPUSHARE_X": "1"},
            annotations={"gpushare.io/gpu-memory": "2Gi"},
            gpu_minors=(2, 0),
        )
    ]
    assert capsys.readouterr().err == ""


def test_create_runtime_with_a_plan_applies_nothing(monkeypatch, bundle):
    before = (bundle / "config.json").read_bytes()
    with fake_daemon({"create": Reply(True, plan=PLAN)}) as daemon:
        assert run(monkeypatch, ["create-runtime", f"--socket={daemon.path}"], state(bundle)) == 0
    assert (bundle / "config.json").read_bytes() == before


def test_create_runtime_without_gpu_nodes_lets_the_daemon_choose(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text('{"linux": {"devices": []}}')
    with fake_daemon() as daemon:
        assert run(monkeypatch, ["create-runtime", "--socket", daemon.path], state(tmp_path)) == 0
    assert daemon.requests[0].gpu_minors is None
    assert daemon.requests[0].namespace == ""  # not a containerd bundle


def test_create_runtime_refused(monkeypatch, bundle, capsys):
    refusal = Reply.refused("GPU 2 has 1 GiB free, the container asks for 2 GiB", "capacity")
    with fake_daemon({"create": refusal}) as daemon:
        assert run(monkeypatch, ["create-runtime", "--socket", daemon.path], state(bundle)) == 1
    err = capsys.readouterr().err
    assert err == "gpushare: GPU 2 has 1 GiB free, the container asks for 2 GiB\n"


def test_create_runtime_refusal_prefixed_once(monkeypatch, bundle, capsys):
    refusal = Reply.refused("gpushare: cannot create container 'c1': no module", "kmod")
    with fake_daemon({"create": refusal}) as daemon:
        assert run(monkeypatch, ["create-runtime", "--socket", daemon.path], state(bundle)) == 1
    assert capsys.readouterr().err == "gpushare: cannot create container 'c1': no module\n"


def test_create_runtime_refused_without_message(monkeypatch, bundle, capsys):
    with fake_daemon({"create": b'{"ok":false,"reason":"kmod"}\n'}) as daemon:
        assert run(monkeypatch, ["create-runtime", "--socket", daemon.path], state(bundle)) == 1
    assert "refused the container (kmod)" in capsys.readouterr().err


def test_create_runtime_without_daemon_fails_closed(monkeypatch, bundle, capsys):
    with short_dir() as d:
        sock = os.path.join(d, "none.sock")
        assert run(monkeypatch, ["create-runtime", "--socket", sock], state(bundle)) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpushare: the nri-gpushare daemon is not running")
    assert sock in err and "not started unguarded" in err
    assert "systemctl start nri-gpushare" in err


def test_create_runtime_daemon_nonsense(monkeypatch, bundle, capsys):
    with fake_daemon({"create": b"<html>\n"}) as daemon:
        assert run(monkeypatch, ["create-runtime", "--socket", daemon.path], state(bundle)) == 1
    assert capsys.readouterr().err.startswith("gpushare: create-runtime hook: not JSON")


@pytest.mark.parametrize(
    "config, says",
    [
        (b"{not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"process": {"env": "PATH=/bin"}}', "process.env: a string, expected an array"),
        (b'{"linux": {"devices": [7]}}', r"linux.devices[0]: a number"),
        (None, "cannot open"),
    ],
)
def test_create_runtime_bad_config(monkeypatch, bundle, capsys, config, says):
    if config is None:
        (bundle / "config.json").unlink()
    else:
        (bundle / "config.json").write_bytes(config)
    with fake_daemon() as daemon:
        assert run(monkeypatch, ["create-runtime", "--socket", daemon.path], state(bundle)) == 1
    assert daemon.connections == 0
    err = capsys.readouterr().err
    assert err.startswith("gpushare: create-runtime hook: ") and says in err


def test_create_runtime_huge_env_is_a_clear_error(monkeypatch, bundle, capsys):
    config = dict(CONFIG, process={"env": [f"V{i}=x" for i in range(5000)]})
    (bundle / "config.json").write_text(json.dumps(config))
    with fake_daemon() as daemon:
        assert run(monkeypatch, ["create-runtime", "--socket", daemon.path], state(bundle)) == 1
    assert daemon.connections == 0
    assert "env: not an object of at most 4096 entries" in capsys.readouterr().err


@pytest.mark.parametrize(
    "stdin, says",
    [(b"", "not JSON"), (b"{}", "id: missing"), (b'{"id":"c1","bundle":"x"}', "absolute")],
)
def test_create_runtime_bad_state(monkeypatch, capsys, stdin, says):
    with fake_daemon() as daemon:
        assert run(monkeypatch, ["create-runtime", "--socket", daemon.path], stdin) == 1
    assert says in capsys.readouterr().err


def test_poststop_releases(monkeypatch, bundle, capsys):
    with fake_daemon() as daemon:
        assert run(monkeypatch, ["poststop", "--socket", daemon.path], state(bundle, pid=0)) == 0
    assert daemon.requests == [Request("release", "default", "c1")]
    assert capsys.readouterr().err == ""


def test_poststop_always_exits_0(monkeypatch, bundle, capsys):
    with short_dir() as d:
        sock = os.path.join(d, "none.sock")
        assert run(monkeypatch, ["poststop", "--socket", sock], state(bundle)) == 0
        assert "could not release container c1's GPU share" in capsys.readouterr().err
        assert run(monkeypatch, ["poststop", "--socket", sock], b"garbage") == 0
        assert "poststop hook: OCI state: not JSON" in capsys.readouterr().err
        assert run(monkeypatch, ["poststop", "--timeout", "soon"], state(bundle)) == 0
        assert "--timeout 'soon'" in capsys.readouterr().err
    refusal = Reply.refused("state directory is read-only", "state")
    with fake_daemon({"release": refusal}) as daemon:
        assert run(monkeypatch, ["poststop", "--socket", daemon.path], state(bundle)) == 0
    assert "state directory is read-only" in capsys.readouterr().err
    with fake_daemon({"release": b"\0\0"}) as daemon:
        assert run(monkeypatch, ["poststop", "--socket", daemon.path], state(bundle)) == 0
    assert "not JSON" in capsys.readouterr().err


def test_socket_from_environment_and_argument(monkeypatch, bundle):
    with fake_daemon() as env_daemon, fake_daemon() as arg_daemon:
        monkeypatch.setenv(hook.SOCKET_ENV, env_daemon.path)
        assert run(monkeypatch, ["poststop"], state(bundle)) == 0
        assert run(monkeypatch, ["poststop", "--socket", arg_daemon.path], state(bundle)) == 0
    assert env_daemon.ops() == ["release"] and arg_daemon.ops() == ["release"]


def test_parse_args():
    assert hook.parse_args(["poststop", "--timeout=2.5", "--socket=/s"]) == ("poststop", "/s", 2.5)
    assert hook.parse_args(["--timeout", "1", "create-runtime"])[2] == 1.0
    for bad in (
        [],
        ["create"],
        ["poststop", "poststop"],
        ["poststop", "--socket"],
        ["poststop", "--socket="],
        ["poststop", "--timeout", "0"],
        ["poststop", "--timeout", "nan"],
        ["poststop", "--timeout", "-1"],
        ["poststop", "--verbose"],
    ):
        with pytest.raises(hook._Usage):
            hook.parse_args(bad)


def test_usage(capsys):
    assert hook.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: nri-gpushare hook {create-runtime|poststop}")
    assert hook.main(["create-runtime", "extra"]) == 2
    err = capsys.readouterr().err
    assert "unexpected argument 'extra'" in err and "usage:" in err
    # A broken create-runtime hook fails the container even if "poststop" is in it;
    # a broken poststop never fails a delete.
    assert hook.main(["create-runtime", "poststop"]) == 2
    assert hook.main(["poststop", "--verbose"]) == 0


def test_a_terminal_is_not_a_state(monkeypatch, capsys):
    class Tty(io.TextIOWrapper):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty(io.BytesIO(b"")))
    assert hook.main(["create-runtime", "--socket", "/nonexistent"]) == 1
    assert "expects the OCI state on stdin" in capsys.readouterr().err


def test_the_installed_command(bundle):
    """Through the console script and cli's dispatch, as runc runs it: state on
    stdin, the bundle as working directory, no traceback ever."""
    script = Path(sys.executable).with_name("nri-gpushare")
    with fake_daemon() as daemon:
        done = subprocess.run(
            [str(script), "hook", "create-runtime", "--socket", daemon.path],
            input=state(bundle),
            cwd=bundle,
            capture_output=True,
            timeout=60,
        )
        assert (done.returncode, done.stderr) == (0, b"")
        done = subprocess.run(
            [str(script), "hook", "poststop", "--socket", daemon.path],
            input=b"\xff" * 10,
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0 and b"Traceback" not in done.stderr
    assert daemon.ops() == ["create"]
