"""Decision logs: one line per placed / refused / released, in text (logfmt,
escaped) and JSON, that values a pod chose cannot break into more lines or
fields; and that the service logs each decision exactly once."""

import io
import json
import logging
import re

import pytest

from nri_gpushare.share.decisions import (
    REFUSAL_REASONS,
    DecisionLog,
    JsonFormatter,
    TextFormatter,
    configure_logging,
    escape,
    logfmt,
    refusal_reason,
)
from nri_gpushare.share.model import (
    STANDALONE_SOURCES,
    Allocation,
    ContainerInfo,
    GpuShare,
    NodePolicy,
    ShareRefused,
)
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, done, make_gpus

P = "gpushare.io/"
HOSTILE = (
    'x\n2026-01-01 00:00:00,000 INFO nri_gpushare.decisions: decision=placed container=evil "a=b'
)


@pytest.fixture
def captured():
    """(lines of text output, lines of json output) of the decisions logger."""
    text, js = io.StringIO(), io.StringIO()
    handlers = []
    for stream, formatter in ((text, TextFormatter()), (js, JsonFormatter())):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        handlers.append(handler)
    logger = logging.getLogger("nri_gpushare")
    old_level = logger.level
    logger.setLevel(logging.INFO)
    for h in handlers:
        logger.addHandler(h)
    yield lambda: (text.getvalue().splitlines(), js.getvalue().splitlines())
    for h in handlers:
        logger.removeHandler(h)
    logger.setLevel(old_level)


def parse_logfmt(message: str) -> dict[str, str]:
    """The fields of a decision line's message, as a log parser would read them."""
    fields = {}
    pos = 0
    pattern = re.compile(r'([a-z_]+)=("(?:[^"\\]|\\.)*"|[^ "]+)( |$)')
    while pos < len(message):
        m = pattern.match(message, pos)
        assert m, f"not logfmt at {pos}: {message[pos:]!r}"
        value = m.group(2)
        if value.startswith('"'):
            value = json.loads(value)  # the escapes used are a subset of JSON's
        assert m.group(1) not in fields, f"field {m.group(1)} twice"
        fields[m.group(1)] = value
        pos = m.end()
    return fields


def alloc(name="train", pod="ml/train", origin="", namespace="") -> Allocation:
    return Allocation(
        "c" * 64,
        name,
        pod,
        (GpuShare(0, "GPU-a", 8 * GiB, 30), GpuShare(1, "GPU-b", 4 * GiB, 0)),
        origin=origin,
        namespace=namespace,
    )


def test_placed_text_line_is_greppable(captured):
    DecisionLog().placed(alloc())
    [text], _ = captured()
    message = text.split("nri_gpushare.decisions: ", 1)[1]
    assert " INFO " in text
    assert message == (
        f"decision=placed container={'c' * 64} pod=ml/train name=train "
        "gpus=0(GPU-a),1(GPU-b) memory=8192Mi,4096Mi core=30,- priority=normal isolation=full"
    )


def test_json_line_has_the_fields(captured):
    log = DecisionLog()
    log.placed(alloc(origin="runc", namespace="default", pod="", name="job"))
    log.released(alloc(), "stopped (StopContainer)")
    _, [placed, released] = captured()
    doc = json.loads(placed)
    assert {k: doc[k] for k in ("level", "logger", "decision", "container", "origin", "name")} == {
        "level": "info",
        "logger": "nri_gpushare.decisions",
        "decision": "placed",
        "container": "c" * 64,
        "origin": "runc:default",
        "name": "job",
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", doc["ts"])
    assert doc["gpus"] == [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}]
    assert (doc["memory"], doc["core"]) == ([8 * GiB, 4 * GiB], [30, 0])
    assert "pod" not in doc
    assert doc["msg"].startswith("placed container job (runc:default): GPU 0 8192Mi 30%")
    doc = json.loads(released)
    assert (doc["decision"], doc["pod"], doc["why"]) == (
        "released",
        "ml/train",
        "stopped (StopContainer)",
    )


def test_hostile_values_stay_in_their_field(captured):
    """A pod name and a refusal message with newlines, quotes and '=' stay one
    line and one field each, in both formats, and come back exactly."""
    log = DecisionLog()
    log.refused("id1", "capacity", f"gpushare: cannot place {HOSTILE}", pod=HOSTILE, name=HOSTILE)
    log.placed(alloc(name=HOSTILE, pod=HOSTILE))
    text, js = captured()
    assert len(text) == 2 and len(js) == 2
    refused = parse_logfmt(text[0].split("nri_gpushare.decisions: ", 1)[1])
    assert list(refused) == ["decision", "container", "pod", "name", "reason", "message"]
    assert refused["pod"] == refused["name"] == HOSTILE
    assert refused["message"] == f"gpushare: cannot place {HOSTILE}"
    assert refused["container"] == "id1" and refused["decision"] == "refused"
    placed = parse_logfmt(text[1].split("nri_gpushare.decisions: ", 1)[1])
    assert placed["decision"] == "placed" and placed["container"] == "c" * 64
    assert placed["name"] == HOSTILE
    doc = json.loads(js[0])
    assert (doc["pod"], doc["message"], doc["reason"]) == (
        HOSTILE,
        f"gpushare: cannot place {HOSTILE}",
        "capacity",
    )


def test_text_format_escapes_every_message(captured):
    """Not only decisions: any message that quotes a pod's value stays one line."""
    logging.getLogger("nri_gpushare.daemon.main").warning("container %s: odd", HOSTILE)
    logging.getLogger("nri_gpushare.daemon.main").warning("tab\there \x1b[31mred\u2028sep")
    text, js = captured()
    assert len(text) == 2
    assert "x\\n2026-01-01" in text[0]
    assert "\\x1b[31m" in text[1] and "\\u2028" in text[1] and "\\t" in text[1]
    assert json.loads(js[0])["msg"] == f"container {HOSTILE}: odd"


def test_text_tracebacks_cannot_forge_a_record(captured):
    """A traceback spans lines, but an exception's message quoting a pod's
    value can neither start a line that looks like a record (every
    continuation line is indented) nor send escape sequences."""
    try:
        raise ValueError(f"bad annotation {HOSTILE}\x1b[2J\u2028end")
    except ValueError:
        logging.getLogger("nri_gpushare.daemon.main").exception("failed")
    text, _ = captured()
    assert text[0].endswith("ERROR nri_gpushare.daemon.main: failed")
    assert len(text) > 2 and all(line.startswith("  ") for line in text[1:]), text
    assert not any("\x1b" in line or "\u2028" in line for line in text)
    assert "  ValueError: bad annotation x" in text


def test_values_needing_no_quotes_stay_bare():
    assert logfmt({"a": "ns/name", "b": "", "c": "x y", "d": 'q"', "e": "k=v"}) == (
        'a=ns/name b="" c="x y" d="q\\"" e="k=v"'
    )
    assert escape("a\\b\r\n\x00") == "a\\\\b\\r\\n\\x00"


def test_json_format_keeps_tracebacks_in_one_object(captured):
    try:
        raise ValueError("boom\nline")
    except ValueError:
        logging.getLogger("nri_gpushare.daemon.main").exception("failed")
    _, [line] = captured()
    doc = json.loads(line)
    assert doc["msg"] == "failed" and "ValueError: boom" in doc["exc"]


def test_configure_logging_json_makes_every_line_json(capsys):
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        configure_logging("info", "json")
        logging.getLogger("grpclib").info("hello %s", "world")
        logging.getLogger("x").debug("hidden")
        err = capsys.readouterr().err.splitlines()
        assert [json.loads(line)["msg"] for line in err] == ["hello world"]
    finally:
        root.handlers[:] = before[0]
        root.setLevel(before[1])


def test_refusal_reasons_are_a_fixed_set():
    for reason in ("capacity", "invalid", "conflict", "forbidden", "interposer", "kmod", "state"):
        assert refusal_reason(reason) in REFUSAL_REASONS
    assert refusal_reason("invalid") == "invalid_request"
    assert refusal_reason("forbidden") == "source_denied"
    assert refusal_reason("interposer") == "interposer_missing"
    assert refusal_reason("a pod's free text") == "other"


# -- the service logs each decision once --------------------------------------------------


def ctr(cid, **keys):
    return ContainerInfo(
        id=cid,
        name="main",
        pod_name=f"pod-{cid}",
        pod_namespace="ns",
        pod_uid=cid,
        pod_annotations={P + k.replace("_", "-"): v for k, v in keys.items()},
    )


def make(**policy):
    svc = ShareService(
        make_gpus(2, 16 * GiB),
        NodePolicy(pod_sources=STANDALONE_SOURCES, **policy),
        Inline(FakeKernelModule()),
        FakeDevices(),
    )
    done(svc.start())
    return svc


def decisions(lines):
    return [parse_logfmt(line.split("nri_gpushare.decisions: ", 1)[1]) for line in lines]


async def test_service_logs_placed_refused_released_once_each(captured):
    svc = make()
    await svc.lifecycle.create_container(ctr("a", gpu_memory="8Gi", gpu_core="30"))
    await svc.lifecycle.create_container(ctr("a", gpu_memory="8Gi", gpu_core="30"))  # asked again
    with pytest.raises(ShareRefused):
        await svc.lifecycle.create_container(ctr("b", gpu_memory="40Gi"))
    with pytest.raises(ShareRefused):
        await svc.lifecycle.create_container(ctr("c", gpu_memory="lots"))
    await svc.lifecycle.create_container(ctr("d"))  # asks for nothing: no decision
    assert await svc.lifecycle.release("a", "stopped (StopContainer)")
    assert not await svc.lifecycle.release("a", "removed (RemoveContainer)")
    text, _ = captured()
    got = decisions([line for line in text if "decision=" in line])
    assert [(d["decision"], d["container"]) for d in got] == [
        ("placed", "a"),
        ("refused", "b"),
        ("refused", "c"),
        ("released", "a"),
    ]
    assert got[0]["pod"] == "ns/pod-a" and got[0]["memory"] == "8192Mi" and got[0]["core"] == "30"
    assert (got[1]["reason"], got[2]["reason"]) == ("capacity", "invalid_request")
    assert "exceeds the free" in got[1]["message"]
    assert got[3]["why"] == "stopped (StopContainer)"
    assert svc.decisions.refusals == {"capacity": 1, "invalid_request": 1}
    assert svc.decisions.counts == {"placed": 1, "refused": 2, "released": 1}


async def test_synchronize_logs_the_release_of_containers_gone(captured):
    svc = make()
    await svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi"))
    await svc.recovery.synchronize([])  # the runtime no longer has it
    text, _ = captured()
    got = decisions([line for line in text if "decision=" in line])
    assert [(d["decision"], d["container"]) for d in got] == [("placed", "a"), ("released", "a")]
    assert got[1]["why"].startswith("gone")


def test_held_lines_are_counted_at_once_and_written_when_released(captured):
    log = DecisionLog()
    releases = []
    with log.held(releases.append):
        log.placed(alloc())
        log.refused("c1", "capacity", "no room")
        assert log.counts["placed"] == 1 and log.refusals["capacity"] == 1
    assert captured() == ([], []) and len(releases) == 1
    releases[0]()
    text, _ = captured()
    assert [parse_logfmt(t.split("decisions: ", 1)[1])["decision"] for t in text] == [
        "placed",
        "refused",
    ]
    log.released(alloc(), "stopped")  # outside: at once
    assert len(captured()[0]) == 3


async def test_handler_writes_its_decision_after_answering(captured, tmp_path):
    """CreateContainer's placed and refused lines come once the event loop
    runs again (after the transport wrote the answer), in order, each once."""
    import asyncio

    from nri_gpushare.config import parse_config
    from nri_gpushare.daemon.main import build_service
    from nri_gpushare.daemon.nri_handler import GpuShareHandler
    from nri_gpushare.nri.api import nri
    from nri_gpushare.nri.stub import PluginError
    from tests.unit.test_daemon import INVENTORY, state, views

    config = parse_config(
        {"kmod": "off", "use_nvml": False, "inventory": INVENTORY, **state(tmp_path)}
    )
    handler = GpuShareHandler(await build_service(config, None))

    def decided() -> list[dict[str, str]]:
        lines = [t.split("decisions: ", 1)[1] for t in captured()[0] if "decisions: " in t]
        return [parse_logfmt(line) for line in lines]

    for memory, cid in (("1Gi", "ok"), ("99Gi", "big")):
        pod, container = views(
            nri.PodSandbox(id="p", name="p", annotations={P + "gpu-memory": memory}),
            nri.Container(id=cid, name="main"),
        )
        before = len(decided())
        try:
            await handler.create_container(pod, container)
        except PluginError:
            pass
        assert len(decided()) == before  # not yet: the answer is being sent
        await asyncio.sleep(0)
        assert len(decided()) == before + 1
    decided = [
        parse_logfmt(t.split("decisions: ", 1)[1]) for t in captured()[0] if "decision=" in t
    ]
    assert [(d["decision"], d["container"]) for d in decided] == [
        ("placed", "ok"),
        ("refused", "big"),
    ]
