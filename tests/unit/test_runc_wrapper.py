"""gpushare-runc with a fake runc (a shell script named by GPUSHARE_RUNC) and
a fake daemon: each test for both programs, the Python console script (the
reference) and the compiled front (front/, installed into the venv by
scripts/install-prereqs.sh), which does create and delete itself and hands
the rest to the Python one."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nri_gpushare.local import real_runc, runc_wrapper
from nri_gpushare.local.protocol import Reply, Request
from tests.unit.fake_local_daemon import PLAN, fake_daemon, short_dir

WRAPPER = Path(sys.executable).with_name("gpushare-runc")
FRONT = Path(sys.executable).with_name("gpushare-front")
PROGRAMS = {"python": WRAPPER, "front": FRONT}

# Logs each call as its argument count then its arguments, NUL-terminated;
# at create, copies the config.json it sees and writes the pid file; at state,
# prints a pid.  $$ is the process runc runs as: the wrapper's own pid when it
# exec'd runc, a child's when it ran it.
FAKE_RUNC = r"""#!/bin/sh
log="$FAKE_RUNC_LOG"
printf '%s\0' "$#" "$@" >> "$log"
cmd=""; prev=""; pidfile=""; bundle="."
for a in "$@"; do
  case "$prev" in
    --pid-file) pidfile="$a" ;;
    --bundle|-b) bundle="$a" ;;
    --root|--log|--log-format|--criu|--rootless) a="" ;;
  esac
  case "$a" in
    --pid-file=*) pidfile="${a#--pid-file=}" ;;
    --bundle=*) bundle="${a#--bundle=}" ;;
    create|delete|state|--version|run) [ -z "$cmd" ] && cmd="$a" ;;
  esac
  prev="$a"
done
echo "$$" > "$log.pid.$cmd"
echo "$$" > "$log.pid"
case "$cmd" in
  create)
    cp "$bundle/config.json" "$log.config"
    if [ -n "$FAKE_RUNC_FD" ]; then
      if [ -e "/proc/self/fd/$FAKE_RUNC_FD" ]; then echo open; else echo closed; fi > "$log.fd"
    fi
    if [ -n "$FAKE_RUNC_SIGNAL" ]; then kill -"$FAKE_RUNC_SIGNAL" $$; fi
    if [ "${FAKE_RUNC_EXIT:-0}" = 0 ] && [ -n "$pidfile" ]; then echo 4242 > "$pidfile"; fi ;;
  state) printf '{"ociVersion":"1.0.2","id":"c1","pid":4343,"status":"created",'
         printf '"bundle":"%s"}\n' "${FAKE_RUNC_BUNDLE:-}" ;;
  --version) echo "runc version fake" ;;
esac
exit "${FAKE_RUNC_EXIT:-0}"
"""

CONFIG = {
    "ociVersion": "1.0.2",
    "process": {"args": ["sh"], "env": ["PATH=/bin", "TERM=xterm"]},
    "root": {"path": "rootfs"},
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
    "annotations": {"gpushare.io/stale": "x", "org.opencontainers.image.title": "t"},
    "linux": {"cgroupsPath": "/default/c1", "resources": {"devices": []}},
}

ROOT = "/run/containerd/runc/default"


class Bed:
    """A bundle at .../io.containerd.runtime.v2.task/default/c1, a fake runc and its log."""

    def __init__(self, tmp: Path, socket_path: str, program: Path = WRAPPER) -> None:
        self.tmp = tmp
        self.program = program
        self.bundle = tmp / "io.containerd.runtime.v2.task" / "default" / "c1"
        self.bundle.mkdir(parents=True)
        self.write_config(CONFIG)
        (self.bundle / "config.json").chmod(0o640)
        self.runc = tmp / "fake-runc"
        self.runc.write_text(FAKE_RUNC)
        self.runc.chmod(0o755)
        self.log = tmp / "runc.log"
        self.pid_file = tmp / "init.pid"
        self.runc_log = tmp / "runc-log.json"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GPUSHARE_RUNC": str(self.runc),
            "GPUSHARE_API_SOCKET": socket_path,
            "FAKE_RUNC_LOG": str(self.log),
            "GPUSHARE_PYBIN": str(WRAPPER.parent),
        }

    def write_config(self, config: object) -> None:
        (self.bundle / "config.json").write_text(json.dumps(config))

    def config(self) -> bytes:
        return (self.bundle / "config.json").read_bytes()

    def create_args(self, *extra: str) -> list[str]:
        return [
            "--root",
            ROOT,
            "--log",
            str(self.runc_log),
            "--log-format",
            "json",
            "create",
            "--bundle",
            str(self.bundle),
            "--pid-file",
            str(self.pid_file),
            *extra,
            "c1",
        ]

    def run(self, args: list[str], **kw) -> tuple[subprocess.CompletedProcess[bytes], int]:
        """Run gpushare-runc with `args`; (result, its pid)."""
        env = dict(self.env, **kw.pop("env", {}))
        proc = subprocess.Popen(
            [str(self.program), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **kw,
        )
        out, err = proc.communicate(timeout=60)
        assert b"Traceback" not in err, err.decode()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid

    def calls(self) -> list[list[str]]:
        """Each runc call's arguments."""
        if not self.log.exists():
            return []
        fields = self.log.read_bytes().split(b"\0")[:-1]
        calls = []
        while fields:
            n = int(fields.pop(0))
            calls.append([f.decode() for f in fields[:n]])
            del fields[:n]
        return calls

    def runc_pid(self, cmd: str | None = None) -> int:
        """The pid runc ran as, at its last `cmd` (its last call when None)."""
        suffix = "" if cmd is None else f".{cmd}"
        return int(Path(f"{self.log}.pid{suffix}").read_text())

    def runc_saw(self) -> dict:
        return json.loads(Path(f"{self.log}.config").read_text())

    def log_entries(self) -> list[dict]:
        if not self.runc_log.exists():
            return []
        return [json.loads(line) for line in self.runc_log.read_text().splitlines()]


@pytest.fixture
def daemon():
    with fake_daemon() as d:
        yield d


@pytest.fixture(params=list(PROGRAMS))
def bed(request, tmp_path: Path, daemon) -> Bed:
    program = PROGRAMS[request.param]
    assert program.exists(), f"{program} is missing: make prereqs builds and installs it"
    return Bed(tmp_path, daemon.path, program)


# -- the fast path: everything but create and delete is runc itself --------------


ODD_GLOBALS = [
    ["--root", ROOT, "--log", "/run/x/log.json", "--log-format", "json", "--systemd-cgroup"],
    ["--debug", "-root", "/var/run/docker/runtime-runc/moby", "--log=/a b/log", "--criu", "c"],
    ["--rootless=true", "--root=/r", "-log-format=text", "--newflag", "v", "--new-switch"],
    ["--root", "delete", "--log", "create"],  # values that look like subcommands
    ["--", "state"],
    [],
]


@pytest.mark.parametrize("globals_", ODD_GLOBALS, ids=lambda g: " ".join(g)[:40])
@pytest.mark.parametrize(
    "command",
    [
        ["state", "c1"],
        ["start", "c1"],
        ["kill", "c1", "9"],
        ["ps", "--format", "json", "c1"],
        ["run", "--bundle", "/b", "c1"],
        ["features"],
        ["events", "--stats", "c\n1", "", " spaced arg ", "\u00e9\u2603"],
    ],
    ids=lambda c: c[0],
)
def test_pass_through_is_exec_with_argv_untouched(bed, daemon, globals_, command):
    args = globals_ + command
    done, pid = bed.run(args)
    assert done.returncode == 0
    assert bed.calls() == [args]
    assert bed.runc_pid() == pid  # exec'd
    assert daemon.connections == 0


def test_pass_through_keeps_runc_exit_status_and_output(bed, daemon):
    done, _ = bed.run(["--version"])
    assert (done.returncode, done.stdout) == (0, b"runc version fake\n")
    done, _ = bed.run(["state", "c1"], env={"FAKE_RUNC_EXIT": "7"})
    assert done.returncode == 7
    for args in (["--help"], ["-v"], ["create", "--help", "c1"], ["create", "-h"], ["create"]):
        done, _ = bed.run(["--root", ROOT, *args])
        assert done.returncode == 0
    assert bed.calls()[-5:] == [
        ["--root", ROOT, "--help"],
        ["--root", ROOT, "-v"],
        ["--root", ROOT, "create", "--help", "c1"],
        ["--root", ROOT, "create", "-h"],
        ["--root", ROOT, "create"],
    ]
    assert daemon.connections == 0


def test_global_help_or_version_before_create_is_runc(bed, daemon):
    for flag in ("--help", "-h", "--version", "-v"):
        done, _ = bed.run([flag, *bed.create_args()[6:]])
        assert done.returncode == 0
    assert daemon.connections == 0


# -- create --------------------------------------------------------------------------------


def test_create_without_a_share_is_runc_untouched(bed, daemon):
    before = bed.config()
    args = bed.create_args("--console-socket", "/run/c.sock", "--no-pivot", "--no-new-keyring")
    done, pid = bed.run(args)
    assert (done.returncode, done.stderr) == (0, b"")
    assert bed.calls() == [args]
    assert bed.runc_pid("create") == pid  # exec'd
    assert bed.config() == before
    assert daemon.requests == [
        Request(
            "create",
            "default",
            "c1",
            via="runc",
            bundle=str(bed.bundle),
            pid=0,
            cgroups_path="/default/c1",
            env={"PATH": "/bin", "TERM": "xterm"},
            annotations={"gpushare.io/stale": "x", "org.opencontainers.image.title": "t"},
            gpu_minors=None,
        )
    ]


def test_create_with_a_share(bed, daemon):
    daemon.answers["create"] = Reply(True, plan=PLAN)
    args = bed.create_args()
    done, pid = bed.run(args)
    assert (done.returncode, done.stderr) == (0, b"")
    assert bed.calls() == [args]
    assert bed.runc_pid("create") != pid  # a child
    config = json.loads(bed.config())
    assert bed.runc_saw() == config  # runc read the edited file
    assert config["process"]["env"] == [
        "PATH=/bin",
        "TERM=xterm",
        "GPUSHARE_MEMORY_LIMIT=2147483648",  # the reply's keys are sorted
        "NVIDIA_VISIBLE_DEVICES=GPU-b",
    ]
    assert [d["path"] for d in config["linux"]["devices"]] == ["/dev/nvidiactl", "/dev/nvidia1"]
    assert config["linux"]["resources"]["devices"] == [
        {"allow": True, "type": "c", "major": 195, "minor": 255, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rwm"},
    ]
    assert config["mounts"][-1]["destination"] == "/etc/ld.so.preload"
    assert config["annotations"] == {
        "org.opencontainers.image.title": "t",
        "gpushare.io/assigned": "gpu1:2Gi",
    }
    assert stat.S_IMODE((bed.bundle / "config.json").stat().st_mode) == 0o640
    assert sorted(os.listdir(bed.bundle)) == ["config.json"]
    assert daemon.ops() == ["create", "start"]
    assert daemon.requests[1] == Request("start", "default", "c1", pid=4242)
    front = bed.program == FRONT
    assert [r.op for r in daemon.outer] == (["runc-create"] if front else [])


def test_create_options_after_the_id_and_relative_paths(bed, daemon):
    daemon.answers["create"] = Reply(True, plan=PLAN)
    args = ["create", "c1", "-b", ".", "--pid-file=pid", "--preserve-fds", "0"]
    done, _ = bed.run(args, cwd=bed.bundle)
    assert done.returncode == 0
    assert bed.calls() == [args]
    assert daemon.requests[0].bundle == str(bed.bundle)
    assert daemon.requests[0].namespace == "default"
    assert daemon.requests[1].pid == 4242
    assert "NVIDIA_VISIBLE_DEVICES=GPU-b" in bed.runc_saw()["process"]["env"]


def test_create_without_pid_file_asks_runc_state(bed, daemon):
    daemon.answers["create"] = Reply(True, plan=PLAN)
    args = ["--root", ROOT, "create", "--bundle", str(bed.bundle), "c1"]
    done, _ = bed.run(args)
    assert done.returncode == 0
    assert bed.calls() == [args, ["--root", ROOT, "state", "c1"]]
    assert daemon.requests[1] == Request("start", "default", "c1", pid=4343)


def test_create_passes_inherited_descriptors_to_runc(bed, daemon):
    daemon.answers["create"] = Reply(True, plan=PLAN)
    r, w = os.pipe()
    os.set_inheritable(r, True)
    try:
        done, _ = bed.run(
            bed.create_args("--preserve-fds", "1"),
            env={"FAKE_RUNC_FD": str(r)},
            pass_fds=(r,),
        )
    finally:
        os.close(r)
        os.close(w)
    assert done.returncode == 0
    assert Path(f"{bed.log}.fd").read_text() == "open\n"


def test_create_failing_in_runc_releases(bed, daemon):
    daemon.answers["create"] = Reply(True, plan=PLAN)
    done, _ = bed.run(bed.create_args(), env={"FAKE_RUNC_EXIT": "3"})
    assert done.returncode == 3
    assert daemon.ops() == ["create", "release"]
    assert daemon.requests[1] == Request("release", "default", "c1")


def test_create_runc_killed_by_a_signal_releases(bed, daemon):
    daemon.answers["create"] = Reply(True, plan=PLAN)
    done, _ = bed.run(bed.create_args(), env={"FAKE_RUNC_SIGNAL": "TERM"})
    assert done.returncode == 128 + signal.SIGTERM
    assert daemon.ops() == ["create", "release"]


def test_create_refused(bed, daemon):
    before = bed.config()
    daemon.answers["create"] = Reply.refused("no GPU has 9 GiB free", "capacity")
    done, _ = bed.run(bed.create_args())
    assert done.returncode == 1
    assert done.stderr == b"gpushare: no GPU has 9 GiB free\n"
    assert bed.calls() == [] and bed.config() == before
    (entry,) = bed.log_entries()  # where containerd's shim reads the error from
    assert (entry["level"], entry["msg"]) == ("error", "gpushare: no GPU has 9 GiB free")
    assert entry["time"].endswith("Z")


def test_create_refused_with_the_daemons_prefix_says_it_once(bed, daemon):
    daemon.answers["create"] = Reply.refused("gpushare: cannot place container 'c1'", "capacity")
    done, _ = bed.run(bed.create_args())
    assert done.returncode == 1
    assert done.stderr == b"gpushare: cannot place container 'c1'\n"
    assert bed.log_entries()[0]["msg"] == "gpushare: cannot place container 'c1'"


def test_create_refused_text_log(bed, daemon):
    daemon.answers["create"] = Reply.refused('say "no"', "invalid")
    args = ["--log", str(bed.runc_log), *bed.create_args()[6:]]
    done, _ = bed.run(args)
    assert done.returncode == 1
    line = bed.runc_log.read_text()
    assert line.startswith('time="') and line.endswith(
        ' level=error msg="gpushare: say \\"no\\""\n'
    )


def test_create_daemon_down_without_a_request_is_runc(bed, daemon):
    bed.write_config(dict(CONFIG, annotations={"gpushare.io/assigned": "stale"}))
    before = bed.config()
    with short_dir() as d:
        args = bed.create_args()
        done, pid = bed.run(args, env={"GPUSHARE_API_SOCKET": os.path.join(d, "none.sock")})
    assert done.returncode == 0
    assert bed.calls() == [args] and bed.runc_pid("create") == pid
    assert bed.config() == before
    (entry,) = bed.log_entries()
    assert entry["level"] == "warning" and "labels are not known" in entry["msg"]


@pytest.mark.parametrize(
    "env, annotations, named",
    [
        (["ALIYUN_COM_GPU_MEM_CONTAINER=2"], {}, "environment 'ALIYUN_COM_GPU_MEM_CONTAINER'"),
        (["EGPU=PGPU=0,MEM=1024"], {}, "environment 'EGPU'"),
        (["GPUSHARE_MEMORY_LIMIT=1"], {}, "environment 'GPUSHARE_MEMORY_LIMIT'"),
        ([], {"gpushare.io/gpu-memory": "1Gi"}, "annotation 'gpushare.io/gpu-memory'"),
    ],
)
def test_create_daemon_down_with_a_request_fails(bed, daemon, env, annotations, named):
    bed.write_config(dict(CONFIG, process={"env": env}, annotations=annotations))
    before = bed.config()
    with short_dir() as d:
        done, _ = bed.run(
            bed.create_args(), env={"GPUSHARE_API_SOCKET": os.path.join(d, "none.sock")}
        )
    assert done.returncode == 1
    err = done.stderr.decode()
    assert err.startswith("gpushare: cannot reach the nri-gpushare daemon")
    assert named in err and "labels are not known" in err and "systemctl start" in err
    assert bed.calls() == [] and bed.config() == before


def test_create_daemon_down_ignores_blank_and_foreign_variables():
    hints = runc_wrapper.share_hints(
        {"ALIYUN_COM_GPU_MEM_CONTAINER": " ", "CGPU_DISABLE": "true", "CUDA_VISIBLE": "0"},
        {"gpushare.io/assigned": "x", "other.io/gpu-memory": "1"},
    )
    assert hints == []


@pytest.mark.parametrize(
    "content, says",
    [
        (b"{not json", "not JSON"),
        (b'{"process": {"env": "PATH=/bin"}}', "process.env: a string, expected an array"),
        (b'{"process": {"env": [1]}}', "process.env[0]: a number"),
        (b'{"annotations": []}', "annotations: an array"),
        (None, "cannot open"),
    ],
)
def test_create_bad_config(bed, daemon, content, says):
    if content is None:
        (bed.bundle / "config.json").unlink()
    else:
        (bed.bundle / "config.json").write_bytes(content)
    done, _ = bed.run(bed.create_args())
    assert done.returncode == 1
    assert done.stderr.decode().startswith("gpushare: ") and says in done.stderr.decode()
    assert bed.calls() == [] and daemon.requests == []  # the front's runc-create asked nothing


def test_create_huge_env(bed, daemon):
    bed.write_config(dict(CONFIG, process={"env": [f"V{i}=x" for i in range(5000)]}))
    done, _ = bed.run(bed.create_args())
    assert done.returncode == 1
    assert b"env: not an object of at most 4096 entries" in done.stderr
    assert bed.calls() == [] and daemon.requests == []  # the front's runc-create asked nothing


def test_create_bad_plan_releases_and_leaves_config(bed, daemon):
    before = bed.config()
    daemon.answers["create"] = Reply(True, plan={"devices": "all"})
    done, _ = bed.run(bed.create_args())
    assert done.returncode == 1
    assert b"plan devices: a string, expected an array" in done.stderr
    assert bed.config() == before and bed.calls() == []
    # The front's runc-create fails the same way in the daemon, which
    # releases; then the Python wrapper asks again and says why.
    assert daemon.ops() == ["create", "release"] * (2 if bed.program == FRONT else 1)


def test_create_daemon_nonsense(bed, daemon):
    daemon.answers["create"] = b"Hello\n"
    done, _ = bed.run(bed.create_args())
    assert done.returncode == 1
    assert b"cannot ask the nri-gpushare daemon about container c1: not JSON" in done.stderr
    assert bed.calls() == []


def test_create_symlinked_config_is_replaced_not_written_through(bed, daemon):
    outside = bed.tmp / "outside"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps(CONFIG))
    original = (outside / "config.json").read_bytes()
    (bed.bundle / "config.json").unlink()
    (bed.bundle / "config.json").symlink_to(outside / "config.json")
    daemon.answers["create"] = Reply(True, plan=PLAN)
    done, _ = bed.run(bed.create_args())
    assert done.returncode == 0
    assert (outside / "config.json").read_bytes() == original
    assert not (bed.bundle / "config.json").is_symlink()
    assert "GPUSHARE_MEMORY_LIMIT=2147483648" in bed.runc_saw()["process"]["env"]


def test_create_start_failure_is_only_a_warning(bed, daemon):
    daemon.answers["create"] = Reply(True, plan=PLAN)
    daemon.answers["start"] = Reply.refused("kmod said no", "kmod")
    done, _ = bed.run(bed.create_args())
    assert (done.returncode, done.stderr) == (0, b"")  # runc's stderr is the container's
    (entry,) = bed.log_entries()
    assert entry["level"] == "warning" and "not bound to its cgroup: kmod said no" in entry["msg"]


def test_create_ambiguous_arguments_are_refused(bed, daemon):
    args = ["create", "--newopt", "c1", "--bundle", str(bed.bundle), "--other", "c2"]
    done, _ = bed.run(args)
    assert done.returncode == 1
    assert b"cannot tell the container ID" in done.stderr
    assert bed.calls() == [] and daemon.requests == []  # the front's runc-create asked nothing


def test_create_unknown_switch_is_tolerated(bed, daemon):
    args = ["create", "--bundle", str(bed.bundle), "--new-switch", "c1"]
    done, _ = bed.run(args)
    assert done.returncode == 0 and bed.calls() == [args]
    assert daemon.requests[0].id == "c1"


# -- delete -------------------------------------------------------------------------------


def test_delete_releases_after_runc(bed, daemon):
    args = [
        "--root",
        "/var/run/docker/runtime-runc/moby",
        "--log",
        "/dev/null",
        "delete",
        "-f",
        "c1",
    ]
    done, pid = bed.run(args)
    assert done.returncode == 0
    assert bed.calls() == [args] and bed.runc_pid("delete") != pid
    assert daemon.requests == [Request("release", "moby", "c1")]


def test_delete_failing_does_not_release(bed, daemon):
    done, _ = bed.run(["delete", "c1"], env={"FAKE_RUNC_EXIT": "1"})
    assert done.returncode == 1
    assert daemon.connections == 0


def test_delete_with_daemon_down_is_runc_status(bed, daemon):
    with short_dir() as d:
        done, _ = bed.run(
            ["delete", "--force", "c1"], env={"GPUSHARE_API_SOCKET": os.path.join(d, "x.sock")}
        )
    assert done.returncode == 0
    assert b"could not release container c1's GPU share" in done.stderr


def test_delete_help_and_bad_arguments_are_runc(bed, daemon):
    for args in (["delete", "--help"], ["delete"], ["delete", "a", "b"]):
        done, pid = bed.run(args)
        assert bed.runc_pid("delete") == pid
    assert daemon.connections == 0


# -- finding the real runc ------------------------------------------------------------------


def test_finds_runc_on_path_skipping_itself(bed, daemon, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "runc").symlink_to(WRAPPER)
    (second / "runc").symlink_to(bed.runc)
    env = dict(bed.env, PATH=f"{first}:{second}:/usr/bin:/bin")
    del env["GPUSHARE_RUNC"]
    proc = subprocess.run(
        [str(first / "runc"), "state", "c1"], env=env, capture_output=True, timeout=60
    )
    assert proc.returncode == 0
    assert bed.calls() == [["state", "c1"]]


def test_find_runc(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUSHARE_RUNC", raising=False)
    me = tmp_path / "me"
    me.write_text("#!/bin/sh\n")
    me.chmod(0o755)
    other = tmp_path / "bin"
    other.mkdir()
    (other / "runc").write_text("#!/bin/sh\n")
    monkeypatch.setattr(real_runc, "FALLBACK_RUNC", ())
    monkeypatch.setenv("PATH", f"{tmp_path}/none::{other}")
    assert real_runc.find_runc(str(me)) is None  # not executable
    (other / "runc").chmod(0o755)
    assert real_runc.find_runc(str(me)) == str(other / "runc")
    assert real_runc.find_runc(str(other / "runc")) is None  # only itself
    monkeypatch.setattr(real_runc, "FALLBACK_RUNC", (str(me),))
    assert real_runc.find_runc(str(other / "runc")) == str(me)
    monkeypatch.setenv("GPUSHARE_RUNC", "/opt/runc")
    assert real_runc.find_runc(str(me)) == "/opt/runc"


def test_no_runc_at_all(monkeypatch, capsys):
    monkeypatch.setattr(runc_wrapper, "find_runc", lambda _: None)
    assert runc_wrapper.main(["gpushare-runc", "state", "c1"]) == 127
    assert "no real runc found" in capsys.readouterr().err
    assert runc_wrapper.main(["gpushare-runc", "create", "c1"]) == 127


# -- argument parsing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, options, at",
    [
        ([], {}, 0),
        (["state", "c1"], {}, 0),
        (["--root", "/r", "create"], {"root": "/r"}, 2),
        (
            ["-root=/r", "--log", "l", "--debug", "x"],
            {"root": "/r", "log": "l", "debug": "true"},
            4,
        ),
        (
            ["--systemd-cgroup", "--rootless", "false", "run"],
            {"systemd-cgroup": "true", "rootless": "false"},
            3,
        ),
        (["--new", "create"], {"new": "true"}, 1),
        (["--new", "v", "create"], {"new": "v"}, 2),
        (["--new", "--debug", "delete"], {"new": "true", "debug": "true"}, 2),
        (["-h"], {"help": "true"}, 1),
        (["--root", "/a", "--root", "/b", "--", "delete"], {"root": "/b"}, 5),
        (["--root"], {"root": ""}, 1),
    ],
)
def test_parse_globals(args, options, at):
    assert runc_wrapper.parse_globals(args) == (options, at)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["c1"], ({}, ["c1"])),
        (["-b", "/b", "c1"], ({"bundle": "/b"}, ["c1"])),
        (["c1", "--bundle=/b", "--no-pivot"], ({"bundle": "/b", "no-pivot": "true"}, ["c1"])),
        (["--pid-file", "-odd", "c1"], ({"pid-file": "-odd"}, ["c1"])),
        (["--", "-c1"], ({}, ["-c1"])),
        (["--bundle"], ({}, [])),
        (["--x", "c1"], ({"x": "true"}, ["c1"])),
        (["--x", "v", "c1"], ({"x": "v"}, ["c1"])),
        (["--x", "v", "c1", "--y", "w"], ({"x": "v", "y": "w"}, ["c1"])),
        (["--x", "a", "--y", "b"], None),
        (["--x=v", "a", "b"], None),
    ],
)
def test_parse_create(args, expected):
    got = runc_wrapper.parse_command(args, runc_wrapper.CREATE_VALUE, runc_wrapper.CREATE_BOOL)
    assert got == expected


def test_create_with_a_runc_that_cannot_run_releases(bed, daemon):
    daemon.answers["create"] = Reply(True, plan=PLAN)
    missing = str(bed.tmp / "no-such-runc")
    done, _ = bed.run(bed.create_args(), env={"GPUSHARE_RUNC": missing})
    assert done.returncode == 127
    assert f"gpushare: cannot run {missing}: No such file or directory" in done.stderr.decode()
    assert daemon.ops() == ["create", "release"]
    done, _ = bed.run(["state", "c1"], env={"GPUSHARE_RUNC": missing})
    assert done.returncode == 127 and b"cannot run" in done.stderr


def _exec_args(process: Path) -> list[str]:
    return ["--root", ROOT, "exec", "--process", str(process), "--detach", "c1"]


def test_exec_gives_the_process_the_shares_variables(bed, daemon, tmp_path):
    config = json.loads(json.dumps(CONFIG))
    config["annotations"]["gpushare.io/assigned"] = "GPU 0 1Gi"
    config["process"]["env"] += [
        "GPUSHARE_MEMORY_LIMIT=1073741824",
        "NVIDIA_VISIBLE_DEVICES=GPU-x",
        "LD_PRELOAD=/usr/lib/gpushare/libgpushare.so",
    ]
    bed.write_config(config)
    process = tmp_path / "process.json"
    process.write_text(
        json.dumps({"args": ["env"], "env": ["PATH=/bin", "GPUSHARE_MEMORY_LIMIT=9"]})
    )
    done, pid = bed.run(_exec_args(process), env={"FAKE_RUNC_BUNDLE": str(bed.bundle)})
    assert done.returncode == 0, done.stderr
    assert json.loads(process.read_text())["env"] == [
        "PATH=/bin",
        "GPUSHARE_MEMORY_LIMIT=1073741824",
        "NVIDIA_VISIBLE_DEVICES=GPU-x",
        "LD_PRELOAD=/usr/lib/gpushare/libgpushare.so",
    ]
    assert bed.calls()[-1] == _exec_args(process)  # then runc, argv untouched
    assert bed.runc_pid() == pid  # exec'd
    assert daemon.connections == 0


def test_exec_into_a_container_without_a_share_changes_nothing(bed, daemon, tmp_path):
    process = tmp_path / "process.json"
    original = json.dumps({"args": ["env"], "env": ["PATH=/bin"]})
    process.write_text(original)
    done, _ = bed.run(_exec_args(process), env={"FAKE_RUNC_BUNDLE": str(bed.bundle)})
    assert done.returncode == 0 and process.read_text() == original
    # runc state cannot tell the bundle: the exec still happens, as asked.
    done, _ = bed.run(_exec_args(process))
    assert done.returncode == 0 and process.read_text() == original
    assert bed.calls()[-1] == _exec_args(process)


def test_share_env_reads_only_what_create_injected():
    assert runc_wrapper.share_env({"process": {"env": ["GPUSHARE_X=1"]}}) == {}
    config = {
        "annotations": {"gpushare.io/assigned": "a"},
        "process": {"env": ["GPUSHARE_X=1", "HOME=/root", 7, "NVIDIA_VISIBLE_DEVICES=u"]},
    }
    assert runc_wrapper.share_env(config) == {"GPUSHARE_X": "1", "NVIDIA_VISIBLE_DEVICES": "u"}
    assert (
        runc_wrapper.share_env({"annotations": {"gpushare.io/assigned": "a"}, "process": 3}) == {}
    )
