"""Bad input on the paths of containers NRI never sees (ctr, nerdctl, docker):
the local API's messages (nri_gpushare.local.protocol), the OCI state a hook
reads on stdin and a bundle's config.json (nri_gpushare.local.oci, read by
the runc wrapper, the CDI hooks and the daemon), runc's command line as the
wrapper parses it, and the hooks' own arguments.

Inputs: arbitrary bytes, arbitrary JSON, valid messages and configs with one
field replaced by any JSON value, deep nesting, huge numbers.  Properties:
only the documented exception (ProtocolError, OciError, PlanError, the
hook's usage error); what decodes encodes back to the same thing; a GPU
minor comes only from a /dev/nvidia<N> character node of major 195.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.local import hook, oci, protocol, runc_wrapper
from tests.unit.test_fuzz_common import fuzz, refused_only, text_with_odd_unicode

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text_with_odd_unicode(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(text_with_odd_unicode(12), inner, max_size=4)
    ),
    max_leaves=12,
)

VALID_REQUESTS: list[dict[str, Any]] = [
    {
        "v": 1,
        "op": "create",
        "namespace": "default",
        "id": "c1",
        "via": "runc",
        "bundle": "/run/b",
        "pid": 0,
        "cgroups_path": "/default/c1",
        "env": {"EGPU": "1"},
        "annotations": {"gpushare.io/gpu-memory": "1Gi"},
        "gpu_minors": [0, 1],
    },
    {"v": 1, "op": "start", "namespace": "moby", "id": "c2", "pid": 42},
    {"v": 1, "op": "release", "namespace": "", "id": "c3"},
    {"v": 1, "op": "resize", "namespace": "", "id": "ns/pod/main", "memory": "2Gi", "core": "30"},
]
VALID_REPLIES: list[dict[str, Any]] = [
    {"ok": True, "plan": {"env": {"A": "1"}}},
    {"ok": False, "error": "no room", "reason": "capacity"},
    {"ok": True, "released": True},
    {"ok": True, "resized": {"container_id": "c1", "changed": True, "gpus": []}},
]
CONFIG: dict[str, Any] = {
    "ociVersion": "1.1.0",
    "process": {"env": ["PATH=/bin", "EGPU=1", "X"]},
    "annotations": {"gpushare.io/assigned": "x"},
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
    "linux": {
        "cgroupsPath": "/default/c1",
        "devices": [
            {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
            {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        ],
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
    },
}
PLAN: dict[str, Any] = {
    "devices": [{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}],
    "mounts": [{"destination": "/usr/lib/x", "source": "/host/x", "options": ["ro", "bind"]}],
    "env": {"GPUSHARE_X": "1"},
    "annotations": {"gpushare.io/assigned": "y"},
    "remove_annotations": ["gone"],
}


@st.composite
def replaced(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of base with one value, at any depth, replaced by any JSON,
    or a key added."""
    obj: Any = json.loads(json.dumps(base))
    node = obj
    while True:
        if isinstance(node, dict) and node:
            key = draw(st.sampled_from(sorted(node)))
        elif isinstance(node, list) and node:
            key = draw(st.integers(0, len(node) - 1))
        else:
            break
        if not isinstance(node[key], dict | list) or draw(st.booleans()):
            node[key] = draw(JSON)
            return obj  # type: ignore[no-any-return]
        node = node[key]
    if isinstance(node, dict):
        node[draw(text_with_odd_unicode(10))] = draw(JSON)
    return obj  # type: ignore[no-any-return]


def as_bytes(obj: object) -> bytes:
    return json.dumps(obj).encode()


hostile_bytes = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [
            b"[" * 100_000,
            b'{"a":' * 50_000,
            b"1" * 5000,
            b'{"v": 1e400}',
            b'{"v": NaN}',
            b"\xff\xfe{}",
            b'{"v":1,"op":"create","id":"' + b"a" * (5 << 20) + b'"}',
        ]
    ),
)


@fuzz(300)
@given(
    st.one_of(
        hostile_bytes,
        JSON.map(as_bytes),
        st.sampled_from(VALID_REQUESTS).flatmap(replaced).map(as_bytes),
    )
)
def test_local_request_decoder(data: bytes) -> None:
    r = refused_only(protocol.ProtocolError, protocol.decode_request, data)
    if r is not None:
        assert r.op in protocol.OPS and r.id and 0 <= r.pid < 1 << 31
        assert r.gpu_minors is None or 0 < len(r.gpu_minors) <= 64
        assert protocol.decode_request(protocol.encode_request(r)) == r


@fuzz(200)
@given(
    st.one_of(
        hostile_bytes,
        JSON.map(as_bytes),
        st.sampled_from(VALID_REPLIES).flatmap(replaced).map(as_bytes),
    )
)
def test_local_reply_decoder(data: bytes) -> None:
    r = refused_only(protocol.ProtocolError, protocol.decode_reply, data)
    if r is not None:
        assert r.plan is None or isinstance(r.plan, dict)
        assert protocol.decode_reply(protocol.encode_reply(r)) == r


@fuzz(200)
@given(
    st.one_of(
        hostile_bytes,
        JSON.map(as_bytes),
        replaced(
            {"ociVersion": "1.1.0", "id": "c", "pid": 7, "bundle": "/b", "annotations": {}}
        ).map(as_bytes),
    )
)
def test_oci_state_parser(data: bytes) -> None:
    """A hook's stdin (parse_state, what hook.read_state returns)."""
    s = refused_only(oci.OciError, oci.parse_state, data)
    if s is not None:
        assert s.id and s.bundle.startswith("/") and 0 <= s.pid < 1 << 31
        assert all(isinstance(v, str) for v in s.annotations.values())


def minors_expected(config: dict[str, Any]) -> set[object]:
    linux = config.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    out: set[object] = set()
    for d in devices if isinstance(devices, list) else []:
        if (
            isinstance(d, dict)
            and d.get("type") == "c"
            and d.get("major") == 195
            and type(d.get("major")) is int
            and isinstance(d.get("path"), str)
            and d["path"].startswith("/dev/nvidia")
            and d["path"][11:].isascii()
            and d["path"][11:].isdigit()
        ):
            out.add(d.get("minor"))
    return out


@fuzz(300)
@given(st.one_of(hostile_bytes, JSON.map(as_bytes), replaced(CONFIG).map(as_bytes)))
def test_config_json_reading(data: bytes) -> None:
    """config.json as the daemon, the wrapper and the hooks read it:
    load_config, bundle_info (env, annotations, cgroupsPath, GPU minors) and
    the wrapper's share_env."""
    config = refused_only(oci.OciError, oci.load_config, data)
    if config is None:
        return
    assert isinstance(runc_wrapper.share_env(config), dict)
    process = config.get("process")
    if isinstance(process, dict) and isinstance(process.get("env"), list):
        env = refused_only(oci.OciError, oci.parse_env, process["env"])
        assert env is None or all("=" not in k for k in env)
    info = refused_only(oci.OciError, oci.bundle_info, config)
    if info is not None:
        assert set(info.gpu_minors) <= minors_expected(config)
        assert len(set(info.gpu_minors)) == len(info.gpu_minors)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in info.env.items())
        hints = runc_wrapper.share_hints(info.env, info.annotations)
        assert all(len(h) < 100 for h in hints)


@fuzz(300)
@given(
    st.one_of(JSON, replaced(CONFIG)),
    st.one_of(st.just(PLAN), replaced(PLAN), JSON),
)
def test_apply_plan(config: Any, plan: Any) -> None:
    """A plan put into a (possibly odd) config.json: the documented errors
    only; what is written back reads back the same."""
    if not isinstance(config, dict):
        config = {"x": config}
    try:
        out = oci.apply_plan(config, plan)
    except (oci.OciError, oci.PlanError) as e:
        assert str(e)
        return
    data = refused_only(oci.OciError, oci.dump_config, out)
    if data is not None:
        assert oci.load_config(data) == json.loads(data)


@fuzz(300)
@given(text_with_odd_unicode(60), text_with_odd_unicode(20))
def test_namespaces_from_paths(bundle: str, cid: str) -> None:
    for text in (
        bundle,
        f"/run/containerd/{oci.CONTAINERD_TASKS}/{bundle}/{cid}",
    ):
        ns = oci.namespace_of(text, cid)
        assert ns == "" or (ns.isascii() and len(ns) <= 76 and "/" not in ns), ns
        root_ns = oci.namespace_from_root(text)
        assert root_ns == "" or (root_ns.isascii() and "/" not in root_ns), root_ns


@fuzz(100)
@given(st.one_of(st.binary(max_size=80), st.integers(-(2**40), 2**40).map(lambda n: b"%d\n" % n)))
def test_pid_file(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "pid")
        with open(path, "wb") as f:
            f.write(data)
        pid = refused_only(oci.OciError, oci.read_pid_file, path)
        assert pid is None or 0 < pid < 1 << 31


ARGS = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "create",
                "delete",
                "exec",
                "run",
                "--root",
                "/run/runc/k8s.io",
                "--bundle",
                "-b",
                "--pid-file",
                "--",
                "-",
                "--log=x",
                "--systemd-cgroup",
                "--force",
                "-f",
                "--new-flag",
                "c1",
            ]
        ),
        text_with_odd_unicode(12),
    ),
    max_size=10,
)


@fuzz(300)
@given(ARGS)
def test_runc_command_line(args: list[str]) -> None:
    """runc's argv as the wrapper reads it: never an exception, the
    subcommand's index in range, the container ID one argument or none."""
    options, at = runc_wrapper.parse_globals(args)
    assert 0 <= at <= len(args) and all(isinstance(v, str) for v in options.values())
    for values, bools in (
        (runc_wrapper.CREATE_VALUE, runc_wrapper.CREATE_BOOL),
        (frozenset(), runc_wrapper.DELETE_BOOL),
    ):
        parsed = runc_wrapper.parse_command(args[at + 1 :], values, bools)
        assert parsed is None or all(isinstance(a, str) for a in parsed[1])


@fuzz(200)
@given(ARGS)
def test_hook_arguments(argv: list[str]) -> None:
    try:
        action, socket, timeout = hook.parse_args(argv)
    except hook._Usage as e:
        assert str(e) and len(str(e)) < 200
        return
    assert action in hook.ACTIONS and socket and 0 < timeout <= 3600


@fuzz(60)
@given(st.sampled_from(["file", "fifo", "dir", "symlink", "none"]), st.binary(max_size=200))
def test_read_config(kind: str, data: bytes) -> None:
    """<bundle>/config.json as found: a JSON object or OciError (a FIFO
    must not block, a directory must not raise IsADirectoryError)."""
    with tempfile.TemporaryDirectory() as bundle:
        path = oci.config_path(bundle)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "dir":
            os.mkdir(path)
        elif kind == "symlink":
            os.symlink("/nonexistent/config.json", path)
        elif kind == "file":
            with open(path, "wb") as f:
                f.write(data)
        config = refused_only(oci.OciError, oci.read_config, bundle)
        assert config is None or isinstance(config, dict)
