"""The local API's ops for the compiled front: the daemon reads the bundle
(runc-create) or the OCI state (hook) itself, asks as the Python programs
ask, and writes the share into config.json; every odd bundle or state is a
refusal with reason "bundle" that leaves nothing reserved."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from nri_gpushare.daemon import local_bundle
from nri_gpushare.daemon.local_api import LocalApiHandler
from nri_gpushare.local import oci, protocol
from nri_gpushare.local.protocol import ProtocolError, Reply, Request
from tests.unit.test_local_api import GiB, Labels, make

P = "gpushare.io/"
CONFIG = {
    "process": {"env": ["PATH=/bin"], "args": ["sh"]},
    "annotations": {P + "gpu-memory": "2Gi"},
    "linux": {"cgroupsPath": "/default/c1"},
}


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    b = tmp_path / "io.containerd.runtime.v2.task" / "default" / "c1"
    b.mkdir(parents=True)
    (b / "config.json").write_text(json.dumps(CONFIG))
    (b / "config.json").chmod(0o640)
    return b


async def handler(labels=None):
    svc, kmod = await make(gpus=1)
    return svc, LocalApiHandler(svc, Labels(labels or {("default", "c1"): {}}))


def runc_create(bundle: Path | str, cid: str = "c1", root: str = "/run/containerd/runc/default"):
    # Through the wire, as the front sends it.
    line = json.dumps({"v": 1, "op": "runc-create", "id": cid, "bundle": str(bundle), "root": root})
    return protocol.decode_request(line.encode())


def hook_request(action: str, state: bytes | str) -> Request:
    text = state.decode("utf-8", "surrogateescape") if isinstance(state, bytes) else state
    return Request("hook", "", "", via="cdi", hook=action, state=text)  # type: ignore[arg-type]


def state(bundle: Path, cid: str = "c1", pid: int = 4242) -> str:
    return json.dumps({"ociVersion": "1.0.2", "id": cid, "pid": pid, "bundle": str(bundle)})


async def test_runc_create_places_and_writes_the_share_into_config_json(bundle):
    svc, h = await handler()
    reply = await h(runc_create(bundle))
    assert reply.ok and reply.plan is not None and reply.namespace == "default", reply.error
    config = json.loads((bundle / "config.json").read_text())
    assert P + "assigned" in config["annotations"]
    assert f"GPUSHARE_MEMORY_LIMIT={2 * GiB}" in config["process"]["env"]
    assert stat.S_IMODE((bundle / "config.json").stat().st_mode) == 0o640
    assert sorted(os.listdir(bundle)) == ["config.json"]
    alloc = svc.allocations["c1"]
    assert (alloc.origin, alloc.namespace) == ("runc", "default")
    # The reply reaches the front over the wire: namespace included.
    again = protocol.decode_reply(protocol.encode_reply(reply))
    assert again.namespace == "default" and again.plan == reply.plan


async def test_runc_create_without_a_request_leaves_config_json_alone(bundle):
    (bundle / "config.json").write_text(json.dumps(dict(CONFIG, annotations={})))
    before = (bundle / "config.json").read_bytes()
    svc, h = await handler()
    reply = await h(runc_create(bundle))
    assert reply.ok and reply.plan is None and reply.namespace == "default"
    assert (bundle / "config.json").read_bytes() == before and not svc.allocations


async def test_a_refusal_is_the_create_refusal(bundle):
    (bundle / "config.json").write_text(
        json.dumps(dict(CONFIG, annotations={P + "gpu-memory": "99Gi"}))
    )
    svc, h = await handler()
    reply = await h(runc_create(bundle))
    assert not reply.ok and reply.reason == "capacity" and reply.error.startswith("gpushare:")
    assert not svc.allocations


@pytest.mark.parametrize("what", ["symlink", "fifo", "directory", "missing", "huge", "garbage"])
async def test_an_odd_config_json_is_left_to_the_python_wrapper(bundle, tmp_path, what):
    path = bundle / "config.json"
    path.unlink()
    if what == "symlink":  # never followed by the daemon (the wrapper follows it, as runc)
        (tmp_path / "real.json").write_text(json.dumps(CONFIG))
        path.symlink_to(tmp_path / "real.json")
    elif what == "fifo":
        os.mkfifo(path)  # would block a reader that waits for a writer
    elif what == "directory":
        path.mkdir()
    elif what == "huge":
        with open(path, "wb") as f:
            f.truncate(oci.MAX_CONFIG + 1)
    elif what == "garbage":
        path.write_bytes(b'{"process": {"env": "x"}}')
    svc, h = await handler()
    reply = await h(runc_create(bundle))
    assert not reply.ok and reply.reason == "bundle", reply
    assert reply.error.startswith("gpushare: ")
    assert not svc.allocations


@pytest.mark.parametrize("bundle_path", ["relative/b", "", "/b\0x"])
def test_a_runc_create_needs_an_absolute_bundle(bundle_path):
    with pytest.raises(ProtocolError):
        runc_create(bundle_path)


async def test_a_bundle_given_with_dots_is_read_where_it_is(bundle):
    svc, h = await handler()
    reply = await h(runc_create(f"{bundle}/../c1/."))
    assert reply.ok and reply.namespace == "default", reply.error
    assert svc.allocations["c1"].namespace == "default"


async def test_a_plan_that_cannot_be_written_is_released(bundle):
    odd = dict(CONFIG, linux={"cgroupsPath": "/default/c1", "resources": "x"})
    (bundle / "config.json").write_text(json.dumps(odd))
    svc, h = await handler()
    reply = await h(runc_create(bundle))
    assert not reply.ok and reply.reason == "bundle" and "linux.resources" in reply.error
    assert not svc.allocations
    assert json.loads((bundle / "config.json").read_text()) == odd


async def test_a_share_its_front_never_learned_of_is_released(bundle):
    svc, h = await handler()
    request = runc_create(bundle)
    reply = await h(request)
    assert svc.allocations
    await h.undelivered(request, reply)
    assert not svc.allocations


async def test_the_create_runtime_hook_places_and_binds_and_poststop_releases(bundle):
    svc, h = await handler()
    reply = await h(hook_request("create-runtime", state(bundle)))
    assert reply.ok, reply.error
    alloc = svc.allocations["c1"]
    assert (alloc.origin, alloc.namespace) == ("cdi", "default")
    assert json.loads((bundle / "config.json").read_text()) == CONFIG  # nothing written
    await h.undelivered(hook_request("create-runtime", state(bundle)), reply)
    assert not svc.allocations
    assert (await h(hook_request("create-runtime", state(bundle)))).ok
    released = await h(hook_request("poststop", state(bundle)))
    assert released.ok and released.released is True and not svc.allocations


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        '{"id": "c1", "bundle": "relative"}',
        '{"id": "c1", "bundle": "/b", "pid": -1}',
        '{"id": "", "bundle": "/b"}',
        '{"id": "c1", "bundle": "/b", "annotations": {"a": 1}}',
        '{"id": "c1", "bundle": "/b\udcff"}',  # a lone surrogate (bytes that were not UTF-8)
        "[" * 100000 + "]" * 100000,
        '{"id": "' + "x" * 200 + '", "bundle": "/b"}',  # not a containerd name
    ],
    ids=["garbage", "array", "relative", "pid", "no-id", "annotation", "surrogate", "deep", "id"],
)
async def test_a_bad_state_is_refused_for_the_python_hook(bundle, text):
    svc, h = await handler()
    for action in ("create-runtime", "poststop"):
        reply = await h(hook_request(action, text))
        assert not reply.ok and reply.reason == "bundle", reply
        assert reply.error.startswith(f"gpushare: {action} hook: ")
    assert not svc.allocations


def test_the_hook_op_on_the_wire():
    line = json.dumps({"v": 1, "op": "hook", "hook": "poststop", "state": "{}"}).encode()
    assert protocol.decode_request(line) == hook_request("poststop", "{}")
    for bad in ({"hook": "prestart", "state": "{}"}, {"hook": "poststop", "state": ""},
                {"hook": "poststop", "state": 1}):  # fmt: skip
        with pytest.raises(ProtocolError):
            protocol.decode_request(json.dumps({"v": 1, "op": "hook", **bad}).encode())
    with pytest.raises(ProtocolError):
        protocol.decode_request(
            json.dumps(
                {"v": 1, "op": "hook", "hook": "poststop", "state": "x" * (4 << 20 + 1)}
            ).encode()
        )
    assert Reply(True, namespace="ns") == protocol.decode_reply(
        protocol.encode_reply(Reply(True, namespace="ns"))
    )


async def test_a_config_json_too_big_to_parse_on_the_loop_is_left_to_the_python_wrapper(bundle):
    # Valid, asking for a share, but past what the daemon parses (its parse
    # holds the event loop): the Python wrapper reads it in its own process.
    padding = ["x"] * ((local_bundle.MAX_CONFIG // 4) + 1)
    (bundle / "config.json").write_text(json.dumps(dict(CONFIG, padding=padding)))
    assert local_bundle.MAX_CONFIG < (bundle / "config.json").stat().st_size < oci.MAX_CONFIG
    svc, h = await handler()
    reply = await h(runc_create(bundle))
    assert not reply.ok and reply.reason == "bundle", reply
    assert f"more than {local_bundle.MAX_CONFIG} bytes" in reply.error
    assert not svc.allocations


async def test_the_share_is_written_into_the_directory_read_not_where_the_path_now_leads(
    bundle, tmp_path
):
    # Whoever can write the bundle's parent swaps the bundle for a symlink to
    # another directory while the daemon asks: its config.json stays alone.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text('{"kept": true}')
    moved = bundle.with_name("moved")
    svc, h = await handler()

    async def ask(request: Request) -> Reply:
        if request.op == "create":
            bundle.rename(moved)
            bundle.symlink_to(elsewhere)
        return await h(request)

    reply = await local_bundle.runc_create(runc_create(bundle), ask)
    assert reply.ok and reply.plan is not None, reply.error
    assert json.loads((elsewhere / "config.json").read_text()) == {"kept": True}
    assert sorted(os.listdir(elsewhere)) == ["config.json"]
    assert P + "assigned" in json.loads((moved / "config.json").read_text())["annotations"]
