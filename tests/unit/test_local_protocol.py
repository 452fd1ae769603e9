"""The local API's messages byte for byte, what they refuse, and the client."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from nri_gpushare.local.client import Unavailable, ask
from nri_gpushare.local.protocol import (
    MAX_ENTRIES,
    MAX_MESSAGE,
    MAX_TEXT,
    ProtocolError,
    Reply,
    Request,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)
from tests.unit.fake_local_daemon import fake_daemon, short_dir

CREATE = Request(
    "create",
    "default",
    "c1",
    via="runc",
    bundle="/run/containerd/io.containerd.runtime.v2.task/default/c1",
    pid=0,
    cgroups_path="/default/c1",
    env={"PATH": "/bin", "ALIYUN_COM_GPU_MEM_CONTAINER": "2"},
    annotations={"gpushare.io/gpu-memory": "2Gi"},
    gpu_minors=(0, 3),
)
CREATE_LINE = (
    b'{"annotations":{"gpushare.io/gpu-memory":"2Gi"},'
    b'"bundle":"/run/containerd/io.containerd.runtime.v2.task/default/c1",'
    b'"cgroups_path":"/default/c1",'
    b'"env":{"ALIYUN_COM_GPU_MEM_CONTAINER":"2","PATH":"/bin"},'
    b'"gpu_minors":[0,3],"id":"c1","namespace":"default","op":"create","pid":0,'
    b'"v":1,"via":"runc"}\n'
)


# -- encoding, byte for byte ---------------------------------------------------


def test_create_request_bytes():
    assert encode_request(CREATE) == CREATE_LINE
    assert decode_request(CREATE_LINE) == CREATE


def test_create_without_minors_sends_null():
    r = Request("create", "", "c1", via="cdi", pid=77)
    line = encode_request(r)
    assert line == (
        b'{"annotations":{},"bundle":"","cgroups_path":"","env":{},"gpu_minors":null,'
        b'"id":"c1","namespace":"","op":"create","pid":77,"v":1,"via":"cdi"}\n'
    )
    assert decode_request(line) == r


def test_start_and_release_bytes():
    start = Request("start", "k8s.io", "abc", pid=4242)
    release = Request("release", "moby", "abc")
    assert encode_request(start) == (
        b'{"id":"abc","namespace":"k8s.io","op":"start","pid":4242,"v":1}\n'
    )
    assert encode_request(release) == b'{"id":"abc","namespace":"moby","op":"release","v":1}\n'
    assert decode_request(encode_request(start)) == start
    assert decode_request(encode_request(release)) == release


def test_release_drops_create_fields():
    noisy = Request("release", "ns", "c", via="runc", pid=5, env={"A": "B"}, gpu_minors=(1,))
    assert encode_request(noisy) == b'{"id":"c","namespace":"ns","op":"release","v":1}\n'


def test_non_ascii_is_escaped():
    r = Request("create", "", "c", env={"GREETING": "h\u00e9llo \u2603 \U0001f600"})
    line = encode_request(r)
    assert b'"env":{"GREETING":"h\\u00e9llo \\u2603 \\ud83d\\ude00"}' in line
    assert line.isascii()
    assert decode_request(line).env == {"GREETING": "h\u00e9llo \u2603 \U0001f600"}


def test_reply_bytes():
    assert encode_reply(Reply(True)) == b'{"ok":true,"plan":null}\n'
    assert encode_reply(Reply(True, plan=None)) == b'{"ok":true,"plan":null}\n'
    assert encode_reply(Reply(True, released=True)) == b'{"ok":true,"released":true}\n'
    assert encode_reply(Reply(True, released=False)) == b'{"ok":true,"released":false}\n'
    plan = {"env": {"B": "2", "A": "1"}, "devices": []}
    assert encode_reply(Reply(True, plan=plan)) == (
        b'{"ok":true,"plan":{"devices":[],"env":{"A":"1","B":"2"}}}\n'
    )
    assert encode_reply(Reply.refused("GPU 0 lacks 2 GiB", "capacity")) == (
        b'{"error":"GPU 0 lacks 2 GiB","ok":false,"reason":"capacity"}\n'
    )


def test_replies_round_trip():
    for reply in (
        Reply(True),
        Reply(True, plan={"env": {"A": "1"}}),
        Reply(True, released=True),
        Reply.refused("no", "invalid"),
    ):
        decoded = decode_reply(encode_reply(reply))
        assert decoded.ok == reply.ok and decoded.error == reply.error
        assert decoded.plan == reply.plan and decoded.released == reply.released


def test_decode_accepts_no_newline_and_missing_optional_fields():
    r = decode_request(b'{"v":1,"op":"create","id":"c1"}')
    assert r == Request("create", "", "c1")
    assert decode_reply(b'{"ok":true}') == Reply(True)


# -- hostile requests ------------------------------------------------------------


def _request(**fields):
    obj = {"v": 1, "op": "create", "namespace": "default", "id": "c1"}
    obj.update(fields)
    import json

    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    "data, says",
    [
        (b"", "not JSON"),
        (b"hello", "not JSON"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b'{"v":1,"op":"create","id":"c\xff"}', "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'"text"', "not a JSON object"),
        (b"null", "not a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "nested too deeply"),
        (b" " * (MAX_MESSAGE + 1), "more than"),
    ],
)
def test_request_not_a_message(data, says):
    with pytest.raises(ProtocolError, match=says):
        decode_request(data)


@pytest.mark.parametrize(
    "version", [None, 0, 2, -1, "1", 1.0, True, [1], {"v": 1}, 10**30], ids=repr
)
def test_request_bad_version(version):
    data = _request(v=version) if version is not None else b'{"op":"create","id":"c1"}'
    with pytest.raises(ProtocolError, match="protocol version"):
        decode_request(data)


@pytest.mark.parametrize("op", ["delete", "", "CREATE", None, 1, ["create"], {"create": 1}])
def test_request_bad_op(op):
    with pytest.raises(ProtocolError, match="op "):
        decode_request(_request(op=op))


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-x",
        ".x",
        "a/b",
        "../etc",
        "a b",
        "a\nb",
        "a\0b",
        "x" * 129,
        "\u00e4",
        "c1\u0660",
        5,
        None,
        ["c1"],
    ],
    ids=repr,
)
def test_request_bad_id(name):
    with pytest.raises(ProtocolError, match="id"):
        decode_request(_request(id=name))


@pytest.mark.parametrize("name", ["-x", "a/b", "a\0b", "x" * 129, 5, ["ns"]], ids=repr)
def test_request_bad_namespace(name):
    with pytest.raises(ProtocolError, match="namespace"):
        decode_request(_request(namespace=name))


def test_request_good_names():
    for name in ("a", "k8s.io", "moby", "c1_x-y+z.0", "A" * 128, "0" * 64):
        assert decode_request(_request(id=name, namespace=name)).id == name


@pytest.mark.parametrize("pid", [-1, 1 << 31, 10**40, True, "5", 1.5, None, [1]], ids=repr)
def test_request_bad_pid(pid):
    with pytest.raises(ProtocolError, match="pid"):
        decode_request(_request(pid=pid))


def test_request_pid_with_too_many_digits():
    data = b'{"v":1,"op":"start","id":"c","pid":' + b"9" * 5000 + b"}"
    with pytest.raises(ProtocolError):
        decode_request(data)


def test_request_nan_and_infinity_are_not_numbers():
    for value in (b"NaN", b"Infinity", b"-Infinity", b"1e400"):
        with pytest.raises(ProtocolError, match="pid"):
            decode_request(b'{"v":1,"op":"start","id":"c","pid":' + value + b"}")


def test_start_needs_a_pid():
    with pytest.raises(ProtocolError, match="pid: missing"):
        decode_request(b'{"v":1,"op":"start","id":"c"}')


@pytest.mark.parametrize("via", ["docker", "CDI", 1, None, ["cdi"]], ids=repr)
def test_request_bad_via(via):
    with pytest.raises(ProtocolError, match="via"):
        decode_request(_request(via=via))


@pytest.mark.parametrize(
    "minors",
    [[], [-1], [1 << 20], [True], [0.0], ["0"], "0", 0, {"0": 0}, list(range(65))],
    ids=repr,
)
def test_request_bad_minors(minors):
    with pytest.raises(ProtocolError, match="gpu_minors"):
        decode_request(_request(gpu_minors=minors))


@pytest.mark.parametrize(
    "env",
    [
        [],
        "",
        0,
        False,
        "A=B",
        ["A=B"],
        {"A": 1},
        {"A": None},
        {"A": ["B"]},
        {"A": "x" * (MAX_TEXT + 1)},
        {"x" * (MAX_TEXT + 1): "B"},
        {f"K{i}": "v" for i in range(MAX_ENTRIES + 1)},
    ],
    ids=lambda v: repr(v)[:40],
)
def test_request_bad_env(env):
    with pytest.raises(ProtocolError, match="env"):
        decode_request(_request(env=env))


def test_request_bad_annotations():
    with pytest.raises(ProtocolError, match="annotations"):
        decode_request(_request(annotations=["gpushare.io/gpu-memory=1"]))


def test_request_empty_mappings_may_be_null():
    r = decode_request(_request(env=None, annotations={}))
    assert r.env == {} and r.annotations == {}


@pytest.mark.parametrize(
    "field, value",
    [
        ("bundle", "/run/x\0y"),
        ("bundle", 5),
        ("bundle", "/" + "b" * MAX_TEXT),
        ("cgroups_path", ["/a"]),
        ("cgroups_path", "a\0"),
    ],
    ids=repr,
)
def test_request_bad_text(field, value):
    with pytest.raises(ProtocolError, match=field):
        decode_request(_request(**{field: value}))


def test_request_at_the_limits_is_accepted():
    env = {f"K{i}": "v" for i in range(MAX_ENTRIES)}
    env["K0"] = "x" * MAX_TEXT
    r = decode_request(_request(env=env))
    assert len(r.env) == MAX_ENTRIES


# -- the client's side: what the daemon would refuse is refused before sending ----


@pytest.mark.parametrize(
    "request_, says",
    [
        (Request("create", "default", ""), "id: missing"),
        (Request("create", "default", "a/b"), "not a containerd name"),
        (Request("delete", "default", "c1"), "op 'delete'"),
        (Request("start", "default", "c1"), "pid: missing"),
        (Request("start", "default", "c1", pid=-5), "pid"),
        (Request("create", "", "c1", via="podman"), "via"),
        (Request("create", "", "c1", gpu_minors=()), "gpu_minors"),
        (Request("create", "", "c1", env={f"K{i}": "" for i in range(5000)}), "env"),
        (Request("create", "", "c1", env={"K": "v" * (MAX_TEXT + 1)}), "env: 'K'"),
        (Request("create", "", "c1", annotations={1: "x"}), "annotations"),  # type: ignore[dict-item]
        (Request("create", "", "c1", bundle="/a\0"), "bundle"),
    ],
    ids=lambda v: repr(v)[:50] if isinstance(v, str) else v.op,
)
def test_encode_refuses_what_decode_would(request_, says):
    with pytest.raises(ProtocolError, match=says):
        encode_request(request_)


def test_encode_refuses_a_message_over_the_limit():
    env = {f"K{i}": "v" * MAX_TEXT for i in range(MAX_MESSAGE // MAX_TEXT + 1)}
    with pytest.raises(ProtocolError, match="more than"):
        encode_request(Request("create", "", "c1", env=env))


# -- hostile replies -----------------------------------------------------------------


@pytest.mark.parametrize(
    "data, says",
    [
        (b"", "not JSON"),
        (b"OK\n", "not JSON"),
        (b"[true]", "not a JSON object"),
        (b"[" * 100_000, "nested too deeply"),
        (b"{}", "ok"),
        (b'{"ok":"true"}', "ok"),
        (b'{"ok":1}', "ok"),
        (b'{"ok":null}', "ok"),
        (b'{"ok":true,"plan":[]}', "plan"),
        (b'{"ok":true,"plan":"x"}', "plan"),
        (b'{"ok":true,"released":"yes"}', "released"),
        (b'{"ok":true,"released":1}', "released"),
        (b'{"ok":false,"error":5}', "error"),
        (b'{"ok":false,"error":"a\\u0000b"}', "error"),
        (b'{"ok":false,"error":"x","reason":["capacity"]}', "reason"),
        (b'{"ok":false,"error":"' + b"e" * (MAX_TEXT + 1) + b'"}', "error"),
        (b" " * (MAX_MESSAGE + 1), "more than"),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_reply_not_a_reply(data, says):
    with pytest.raises(ProtocolError, match=says):
        decode_reply(data)


# -- the client -------------------------------------------------------------------------


def test_ask_sends_the_line_and_reads_the_reply():
    with fake_daemon({"create": Reply(True, plan={"env": {"A": "1"}})}) as daemon:
        reply = ask(CREATE, daemon.path, timeout=10)
    assert reply == Reply(True, plan={"env": {"A": "1"}})
    assert daemon.raw == [CREATE_LINE]


def test_ask_refusal_is_a_reply():
    with fake_daemon({"create": Reply.refused("no GPU has 9 GiB", "capacity")}) as daemon:
        reply = ask(CREATE, daemon.path)
    assert not reply.ok and reply.error == "no GPU has 9 GiB" and reply.reason == "capacity"


def test_ask_without_daemon_is_unavailable():
    with short_dir() as d:
        with pytest.raises(Unavailable, match="is it running"):
            ask(CREATE, os.path.join(d, "missing.sock"))


def test_ask_refuses_a_bad_request_before_connecting():
    with fake_daemon() as daemon:
        with pytest.raises(ProtocolError):
            ask(Request("create", "", "bad/id"), daemon.path)
    assert daemon.connections == 0


def _serve_once(path: str, behave) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def run() -> None:
        with server:
            conn, _ = server.accept()
            with conn:
                behave(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_ask_daemon_closing_without_answer_is_unavailable():
    with short_dir() as d:
        path = os.path.join(d, "api.sock")
        thread = _serve_once(path, lambda conn: conn.recv(1 << 20))
        with pytest.raises(Unavailable, match="closed without answering"):
            ask(CREATE, path)
        thread.join(5)


def test_ask_nonsense_answer_is_a_protocol_error():
    with short_dir() as d:
        path = os.path.join(d, "api.sock")
        thread = _serve_once(
            path, lambda conn: (conn.recv(1 << 20), conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n"))
        )
        with pytest.raises(ProtocolError, match="not JSON"):
            ask(CREATE, path)
        thread.join(5)


def test_ask_endless_answer_is_a_protocol_error():
    def flood(conn: socket.socket) -> None:
        try:
            while True:
                conn.sendall(b"x" * 65536)
        except OSError:
            pass

    with short_dir() as d:
        path = os.path.join(d, "api.sock")
        thread = _serve_once(path, flood)
        with pytest.raises(ProtocolError, match="too long"):
            ask(CREATE, path)
        thread.join(5)


def test_ask_timeout_bounds_the_whole_answer():
    """A daemon that trickles its answer a byte at a time does not hold the
    client past its timeout (it would, if each read had the full timeout)."""
    stop = threading.Event()

    def trickle(conn: socket.socket) -> None:
        for byte in b'{"ok":true,"plan":null}\n':
            if stop.wait(0.1):
                return
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return

    with short_dir() as d:
        path = os.path.join(d, "api.sock")
        thread = _serve_once(path, trickle)
        with pytest.raises(Unavailable, match="did not answer in 0.3 s"):
            ask(CREATE, path, timeout=0.3)
        stop.set()
        thread.join(5)


def test_ask_silent_daemon_times_out():
    with short_dir() as d:
        path = os.path.join(d, "api.sock")
        release = threading.Event()
        thread = _serve_once(path, lambda conn: release.wait(10))
        with pytest.raises(Unavailable, match="did not answer"):
            ask(CREATE, path, timeout=0.2)
        release.set()
        thread.join(5)
