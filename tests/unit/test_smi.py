"""gpushare-smi: its JSON view and table from a status document (unknowns
say n/a with a footnote, never 0; every line fits 120 columns; names a pod
chose are cut and cleaned), the command against a missing daemon, --watch
when stdout is not a terminal, and the PIDs the status now carries."""

import json
import os
import pty
import select

import pytest

from nri_gpushare.cli import main as cli
from nri_gpushare.cli import smi, smi_table, smi_view
from nri_gpushare.host.meminfo import ModuleMemInfo
from nri_gpushare.host.worker import BlockingWorker
from nri_gpushare.share.model import STANDALONE_SOURCES, ContainerInfo, InterposerPolicy, NodePolicy
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, MiB, done, make_gpus
from tests.unit.test_metrics import status

P = "gpushare.io/"


def test_view_sums_known_use_and_says_why_when_unknown():
    doc = smi_view.view(status(), now=0)
    assert doc["schema"] == "gpushare-smi/1" and doc["time"] == "1970-01-01T00:00:00Z"
    g0, g1 = doc["gpus"]
    assert (g0["memory_used"], g0["memory_used_why"]) == (4 * GiB, None)
    assert (g0["core_used"], g0["core_used_why"]) == (None, "unknown: no sample yet")
    assert (g0["policy"], g0["policy_name"], g0["policy_why"]) == (3, "fixed share", None)
    assert (g1["memory_used"], g1["memory_used_why"]) == (None, "unknown: kmod: off")
    assert g1["policy"] is None and "registered" in g1["policy_why"]
    a, b, c = doc["containers"]
    assert (a["pod"], a["name"], a["origin"], a["priority"]) == ("ml/train", "main", "nri", "high")
    [s] = a["gpus"]
    assert (s["memory_quota"], s["memory_used"], s["core_target"], s["core_used"]) == (
        8 * GiB,
        3 * GiB,
        30,
        27.5,
    )
    assert (s["pids"], s["pids_why"]) == ([10, 11], None)
    [s] = c["gpus"]
    assert (s["memory_used"], s["memory_used_why"]) == (None, "unknown: kmod: off")
    assert (s["pids"], s["pids_why"]) == (None, "unknown: kmod: off")
    assert c["origin"] == "runc:default"
    json.dumps(doc)  # JSON-able


def test_table_shows_na_with_footnotes_never_zero():
    text = smi_table.render(smi_view.view(status()), local_time="then")
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= smi_table.WIDTH
    row = next(line for line in lines if "ml/train" in line)
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells == ["0", "ml/train (main)", "a", "8Gi", "3Gi", "30%", "27.5%", "high", "10,11"]
    row = next(line for line in lines if "(runc:default)" in line)
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1] == "job (runc:default)"
    assert cells[4] == cells[8] != "0"
    mark = cells[4]
    assert mark.startswith("n/a[")
    note = next(line for line in lines if line.startswith(mark[3:] + " "))
    assert note.endswith("unknown: kmod: off")
    gpu1 = next(line for line in lines if line.startswith("|   1 | Sim"))
    assert gpu1.split("|")[5].strip() == mark  # GPU 1 used: unknown, not 0
    assert smi_table.PID_NOTE in lines


def test_long_and_hostile_names_are_cut_and_cleaned():
    doc = status()
    doc["allocations"][0]["pod"] = "a-very-long-namespace/" + "p" * 80 + "-tail"
    doc["allocations"][0]["name"] = "c\x1b[2Jx"
    doc["allocations"][0]["gpus"][0]["pids"] = list(range(100000, 100020))
    text = smi_table.render(smi_view.view(doc))
    assert "\x1b" not in text
    assert max(len(line) for line in text.splitlines()) <= smi_table.WIDTH
    row = next(line for line in text.splitlines() if "a-very-lo" in line)
    owner = row.split("|")[2].strip()
    assert owner.startswith("a-very-lo") and owner.endswith("tail (c?[2Jx)") and "…" in owner
    assert row.split("|")[9].strip() == "100000 +19"


def test_no_containers_and_unserved():
    doc = status(allocations=[], unserved=[{"container_id": "u" * 64, "pod": "ns/p", "asked": "1Gi",
                                            "action": "warned"}])  # fmt: skip
    for gpu in doc["gpus"]:
        gpu["containers"] = []
    text = smi_table.render(smi_view.view(doc))
    assert "No containers hold a share." in text
    assert "UNSERVED uuuuuuuuuuuu ns/p: asked for 1Gi" in text
    assert "n/a" not in text.split("POLICY")[1].split("\n", 3)[3].split("|")[5]  # used: '-'


def test_unreachable_daemon_is_a_clear_error(tmp_path, capsys):
    missing = str(tmp_path / "status.sock")
    assert smi.main(["--status-socket", missing]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the plugin at {missing}" in err and "nri-gpushare run" in err
    assert cli.main(["smi", "--json", "--status-socket", missing]) == 1


@pytest.mark.parametrize(
    "reply",
    [
        {"gpus": [{"index": 0}]},
        {"allocations": [{"gpus": []}]},
        {"unserved": [{}]},
        {"gpus": "not a list"},
        [],
    ],
)
def test_a_status_it_cannot_read_is_a_clear_error(monkeypatch, capsys, reply):
    """A daemon of another version (or something else on the socket): a
    message, never a traceback; --watch goes on."""
    monkeypatch.setattr("nri_gpushare.host.sockets.query_status", lambda path: reply)
    for args in ([], ["--json"]) if "unserved" not in reply else ([],):  # JSON passes it on
        assert smi.main(args) == 1
        err = capsys.readouterr().err
        assert "cannot read the daemon's status" in err and "version" in err, err


def test_a_long_module_problem_is_wrapped_and_cleaned():
    """The module's problem (a path, an errno text) still fits the width and
    sends nothing to the terminal."""
    doc = status()
    doc["kmod"] = {"mode": "optional", "loaded": False, "problem": "x\x1b[2J " * 40}
    text = smi_table.render(smi_view.view(doc), local_time="then")
    assert max(len(line) for line in text.splitlines()) <= smi_table.WIDTH
    assert "\x1b" not in text


def test_json_from_the_daemon(monkeypatch, capsys):
    monkeypatch.setattr("nri_gpushare.host.sockets.query_status", lambda path: status())
    assert cli.main(["smi", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["container_id"] for c in doc["containers"]] == ["a", "b", "c"]


def test_watch_not_on_a_terminal_prints_frames_and_keeps_going(monkeypatch, capsys):
    """One frame per interval separated by a blank line; an unreachable daemon
    is a frame saying so; Ctrl-C ends it with status 0."""
    answers = iter([status(), OSError(111, "Connection refused"), status()])

    def query(path):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr("nri_gpushare.host.sockets.query_status", query)
    monkeypatch.setattr(smi.time, "sleep", sleep)
    assert smi.main(["--watch", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    frames = out.split("\n\n")
    assert len(frames) == 4 and frames[3] == ""
    assert "ml/train" in frames[0] and "ml/train" in frames[2]
    assert "cannot reach the plugin" in frames[1] and "retrying every 0.5 s" in frames[1]
    assert sleeps == [0.5, 0.5, 0.5]


def test_watch_json_prints_one_document_per_line(monkeypatch, capsys):
    answers = iter([status(), OSError(2, "No such file or directory")])

    def query(path):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def sleep(seconds):
        if next(ticks):
            raise KeyboardInterrupt

    ticks = iter([False, True])
    monkeypatch.setattr("nri_gpushare.host.sockets.query_status", query)
    monkeypatch.setattr(smi.time, "sleep", sleep)
    assert smi.main(["--json", "--watch"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert json.loads(first)["schema"] == "gpushare-smi/1"
    assert "No such file or directory" in json.loads(second)["error"]


def test_watch_interval_is_checked():
    with pytest.raises(SystemExit):
        smi.main(["--watch", "0"])


# -- the PIDs in the status document ----------------------------------------------------


class FakeProcfs:
    def __init__(self, infos):
        self.infos = infos

    def meminfo(self, gpu, container_id):
        return self.infos[gpu, container_id]


class MemInfo:
    def __init__(self, free, processes):
        self.free, self.processes = free, processes


async def test_status_carries_the_pids_of_the_modules_meminfo():
    procfs = FakeProcfs({(0, "a"): MemInfo(GiB, {4242: 600 * MiB, 17: 400 * MiB})})
    usage = ModuleMemInfo(procfs, BlockingWorker("test-meminfo"))
    svc = ShareService(
        make_gpus(2, 16 * GiB),
        NodePolicy(
            pod_sources=STANDALONE_SOURCES, interposer=InterposerPolicy(preload_file="/s/p")
        ),
        Inline(FakeKernelModule()),
        FakeDevices(),
        usage=usage,
        library_check=lambda path: "",
    )
    done(svc.start())
    try:
        for cid, isolation in (("a", "full"), ("b", "none")):
            annotations = {P + "gpu-memory": "2Gi", P + "isolation": isolation}
            await svc.lifecycle.create_container(
                ContainerInfo(
                    id=cid,
                    name=cid,
                    pod_name=cid,
                    pod_namespace="ns",
                    pod_uid=cid,
                    pod_annotations=annotations,
                )  # fmt: skip
            )
        doc = svc.status(await svc.read_usage())
    finally:
        usage.close()
    a, b = (entry["gpus"][0] for entry in doc["allocations"])
    assert a["pids"] == [17, 4242] and a["memory_used"] == GiB
    assert b["pids"] is None  # unknown, not "no process"
    rows = smi_view.view(doc)["containers"]
    assert rows[0]["gpus"][0]["pids"] == [17, 4242]
    assert "isolation none" in rows[1]["gpus"][0]["pids_why"]


def test_smi_is_a_subcommand_too():
    parser = cli.build_parser()
    args = parser.parse_args(["smi", "--watch", "3", "--config", "/x.yaml"])
    assert (args.watch, args.config, args.func) == (3.0, "/x.yaml", smi.run)


def test_watch_on_a_terminal_redraws_in_place(monkeypatch):
    """On a terminal: the screen is cleared once, each frame is drawn from the
    top over the last (lines cleared to their end, the rest of the screen
    below), the cursor comes back at Ctrl-C, and the exit status is 0."""
    master, slave = pty.openpty()
    terminal = os.fdopen(slave, "w")
    answers = iter([status(), OSError(111, "Connection refused")])

    def query(path):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    ticks = iter([False, True])

    def sleep(seconds):
        if next(ticks):
            raise KeyboardInterrupt

    monkeypatch.setattr("nri_gpushare.host.sockets.query_status", query)
    monkeypatch.setattr(smi.time, "sleep", sleep)
    monkeypatch.setattr(smi.sys, "stdout", terminal)
    try:
        assert smi.main(["--watch"]) == 0
        terminal.flush()
        out = b""
        while select.select([master], [], [], 0)[0]:
            out += os.read(master, 65536)
    finally:
        terminal.close()
        os.close(master)
    text = out.decode()
    assert text.startswith("\x1b[?25l\x1b[H\x1b[2J")  # cursor hidden, cleared once
    assert text.count("\x1b[2J") == 1
    frames = text.split("\x1b[H")[2:]
    assert len(frames) == 2
    assert "ml/train" in frames[0] and frames[0].rstrip().endswith("\x1b[J")
    assert "cannot reach the plugin" in frames[1] and "retrying every 2 s" in frames[1]
    assert all(line.endswith("\x1b[K") for line in frames[1].split("\r\n")[:-2])
    assert text.endswith("\x1b[?25h\r\n")  # the cursor is back


def test_config_gives_the_status_socket(tmp_path, monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(
        "nri_gpushare.host.sockets.query_status", lambda path: asked.append(path) or status()
    )
    config = tmp_path / "gpushare.yaml"
    config.write_text(f"status_socket: {tmp_path}/s.sock\n")
    assert smi.main(["--config", str(config)]) == 0
    assert asked == [f"{tmp_path}/s.sock"]
    config.write_text("status_socket: [not, a, path]\n")
    assert smi.main(["--config", str(config)]) == 2
    assert "status_socket" in capsys.readouterr().err
