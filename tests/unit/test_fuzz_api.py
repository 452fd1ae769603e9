"""Bad input to the NRI request decoders (nri_gpushare.nri.api.lite), the bytes a
runtime sends to every plugin call.

Structure-aware: valid requests of every kind (built with the betterproto
classes, Kubernetes-like contents) are parsed into a field tree, mutated
(a field's value replaced by random bytes, invalid UTF-8 or long unicode, a
varint set to any 64-bit value, a field duplicated, dropped, given another
wire type or an unknown number, wrapped in deep nesting, a length written as
an overlong varint or declared huge) and serialized again, then fed to
every decoder; also arbitrary bytes.  Property: each decoder returns a view
or raises DecodeError with a message, and so does reading every attribute of
the view and every lazily parsed `message()`; an unmutated request decodes to
what was encoded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union

from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.nri.api import lite, nri
from nri_gpushare.nri.wire import pb
from nri_gpushare.nri.wire.errors import DecodeError
from tests.unit.test_fuzz_common import fuzz, overlong_varint, refused_only

Tree = list[tuple[int, int, Union[int, bytes, "Tree"]]]

DECODERS: dict[str, Callable[[bytes], Any]] = {
    "create": lite.decode_create_container_request,
    "stop": lite.decode_stop_container_request,
    "synchronize": lite.decode_synchronize_request,
    "configure": lite.decode_configure_request,
    "state": lite.decode_state_change,
    "update": lite.decode_update_container_request,
    "update_pod": lite.decode_update_pod_sandbox_request,
    "validate": lite.decode_validate_adjustment_request,
    "pod_container": lite.decode_pod_container_request,
    "pod": lite.decode_pod_request,
    "pod_sandbox": lite.decode_pod_sandbox,
    "container": lite.decode_container,
}


def _pod(i: int) -> nri.PodSandbox:
    return nri.PodSandbox(
        id=f"pod{i}" * 8,
        name=f"web-{i}",
        uid="0b6c7f1e-1c6b-4c55-8f0e-3b5f6a7d8e9f",
        namespace="default",
        labels={f"app.kubernetes.io/l{j}": "v" * j for j in range(10)},
        annotations={"gpushare.io/gpu-memory": "1Gi", "kubernetes.io/config.seen": "now"},
        linux=nri.LinuxPodSandbox(cgroups_path=f"kubepods-pod{i}.slice"),
    )


def _container(i: int) -> nri.Container:
    return nri.Container(
        id=f"c{i}" * 16,
        pod_sandbox_id=f"pod{i}" * 8,
        name="main",
        state=nri.ContainerState.CONTAINER_RUNNING,
        labels={"io.kubernetes.container.name": "main"},
        annotations={"gpushare.io/gpu-core": "50", "ünïcode": "ß\u0663"},
        args=["/bin/sh", "-c", "sleep 1d"],
        env=[f"VAR{j}=value{j}" for j in range(30)] + ["NVIDIA_VISIBLE_DEVICES=0"],
        mounts=[nri.Mount(destination=f"/m{j}", type="bind", source="/s") for j in range(12)],
        linux=nri.LinuxContainer(
            cgroups_path=f"kubepods-pod{i}.slice:cri-containerd:c{i}",
            resources=nri.LinuxResources(
                memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=1 << 30))
            ),
            devices=[nri.LinuxDevice(path="/dev/nvidia0", type="c", major=195, minor=0)],
        ),
        pid=4242,
        created_at=-1,
        user=nri.User(uid=1000, gid=1000, additional_gids=[1, 2, 3]),
    )


def _resources() -> nri.LinuxResources:
    return nri.LinuxResources(
        memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=-5)),
        unified={"memory.high": "max"},
        pids=nri.LinuxPids(limit=100),
    )


PAYLOAD = (Path(__file__).parent / "data" / "create_container_request.bin").read_bytes()
SEEDS: dict[str, bytes] = {
    "create": PAYLOAD,
    "stop": bytes(nri.StopContainerRequest(pod=_pod(1), container=_container(1))),
    "synchronize": bytes(
        nri.SynchronizeRequest(
            pods=[_pod(1), _pod(2)], containers=[_container(1), _container(2)], more=True
        )
    ),
    "configure": bytes(
        nri.ConfigureRequest(
            config="{}",
            runtime_name="containerd",
            runtime_version="1.7.24",
            registration_timeout=5000,
            request_timeout=2000,
            nri_version="v0.8.0",
        )
    ),
    "state": bytes(
        nri.StateChangeEvent(event=nri.Event.START_CONTAINER, pod=_pod(3), container=_container(3))
    ),
    "update": bytes(
        nri.UpdateContainerRequest(
            pod=_pod(4), container=_container(4), linux_resources=_resources()
        )
    ),
    "update_pod": bytes(
        nri.UpdatePodSandboxRequest(
            pod=_pod(5), overhead_linux_resources=_resources(), linux_resources=_resources()
        )
    ),
    "validate": bytes(
        nri.ValidateContainerAdjustmentRequest(
            pod=_pod(6),
            container=_container(6),
            adjust=nri.ContainerAdjustment(annotations={"a": "b"}),
            plugins=[nri.PluginInstance(name="gpushare", index="10")],
        )
    ),
}


def parse(data: bytes, depth: int = 0) -> Tree | None:
    """`data` as a field tree (length-delimited values that parse as a
    message become subtrees), or None when it is not a message."""
    tree: Tree = []
    try:
        pos = 0
        while pos < len(data):
            key, pos = pb.read_varint(data, pos, "seed")
            number, wire = key >> 3, key & 7
            if number == 0 or wire not in (pb.VARINT, pb.LEN):
                return None
            if wire == pb.VARINT:
                value, pos = pb.read_varint(data, pos, "seed")
                tree.append((number, wire, value))
                continue
            size, pos = pb.read_varint(data, pos, "seed")
            raw = data[pos : pos + size]
            if len(raw) != size:
                return None
            pos += size
            sub = parse(raw, depth + 1) if raw and depth < 8 else None
            tree.append((number, wire, raw if sub is None else sub))
    except DecodeError:
        return None
    return tree


def _varint(value: int, overlong: int) -> bytes:
    """A varint padded with up to `overlong` redundant bytes, at most 10 in all."""
    return overlong_varint(value, min(overlong, 10 - len(pb.uvarint(value))))


def serialize(tree: Tree, overlong: int = 0) -> bytes:
    out = bytearray()
    for number, wire, value in tree:
        out += _varint(number << 3 | wire, overlong)
        if isinstance(value, int):
            out += _varint(value, overlong)
        else:
            raw = value if isinstance(value, bytes) else serialize(value, overlong)
            out += _varint(len(raw), overlong) + raw
    return bytes(out)


def _slots(tree: Tree) -> list[tuple[Tree, int]]:
    """Every (list, index) of a field in the tree, depth first."""
    found: list[tuple[Tree, int]] = []
    for i, (_, _, value) in enumerate(tree):
        found.append((tree, i))
        if isinstance(value, list):
            found += _slots(value)
    return found


def _nest(depth: int) -> bytes:
    inner = b""
    for _ in range(depth):
        inner = pb.len_field(1, inner) if inner else pb.len_field(1, b"\x08\x01")
    return inner


MUTATIONS = [
    "bytes",
    "utf8",
    "unicode",
    "varint",
    "duplicate",
    "drop",
    "wiretype",
    "unknown",
    "nest",
    "huge",
    "overlong",
    "truncate",
]


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(sorted(SEEDS)))
    tree = parse(SEEDS[kind])
    assert tree is not None
    overlong = 0
    for _ in range(draw(st.integers(1, 3))):
        slots = _slots(tree)
        where, i = slots[draw(st.integers(0, len(slots) - 1))]
        number, wire, value = where[i]
        how = draw(st.sampled_from(MUTATIONS))
        if how == "bytes":
            where[i] = (number, pb.LEN, draw(st.binary(max_size=40)))
        elif how == "utf8":
            where[i] = (number, pb.LEN, draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])))
        elif how == "unicode":
            text = draw(st.text(min_size=1, max_size=300))
            where[i] = (number, pb.LEN, text.encode())
        elif how == "varint":
            where[i] = (number, pb.VARINT, draw(st.integers(0, 2**64 - 1)))
        elif how == "duplicate":
            where.insert(i, where[i])
        elif how == "drop":
            del where[i]
        elif how == "wiretype":
            where[i] = (number, pb.VARINT if wire == pb.LEN else pb.LEN, b"" if wire else 1)
        elif how == "unknown":
            where.insert(i, (draw(st.integers(1, 2**29 - 1)), pb.LEN, b"\x00\x01"))
        elif how == "nest":
            where[i] = (number, pb.LEN, _nest(draw(st.sampled_from([50, 500, 3000]))))
        elif how == "huge":
            where[i] = (number, pb.LEN, b"")
            data = serialize(tree)
            return kind, data[:-1] + pb.uvarint(draw(st.integers(1 << 31, 2**64 - 1)))
        elif how == "overlong":
            overlong = draw(st.integers(1, 9))
        else:
            data = serialize(tree, overlong)
            return kind, data[: draw(st.integers(0, max(0, len(data) - 1)))]
    return kind, serialize(tree, overlong)


def read_all(view: Any, depth: int = 0) -> None:
    """Read every attribute of a view, recursively, and parse every lazy message."""
    assert depth < 10
    if isinstance(view, list | tuple):
        for item in view:
            read_all(item, depth + 1)
        return
    if isinstance(view, dict):
        for k, v in view.items():
            assert isinstance(k, str) and isinstance(v, str)
        return
    if view is None or isinstance(view, str | bytes | int | bool):
        return
    names = (
        [f.name for f in dataclasses.fields(view)]
        if dataclasses.is_dataclass(view)
        else list(getattr(view, "_fields", ()))
    )
    for name in names:
        if not name.startswith("_"):
            # A lazy view decodes (and checks) a field at its first read.
            read_all(refused_only(DecodeError, getattr, view, name), depth + 1)
    for name in dir(view):
        if name == "message" or (name.endswith("_message") and not name.startswith("_")):
            refused_only(DecodeError, getattr(view, name))


def plain(view: Any) -> Any:
    """A view as plain data: its fields and parsed messages, not raw bytes."""
    if isinstance(view, list | tuple):
        return [plain(v) for v in view]
    if not dataclasses.is_dataclass(view) and not hasattr(view, "_fields"):
        return view
    names = (
        [f.name for f in dataclasses.fields(view)]
        if dataclasses.is_dataclass(view)
        else list(view._fields)
    )
    out = {n: plain(getattr(view, n)) for n in names if not n.startswith("_")}
    for name in dir(view):
        if name == "message" or (name.endswith("_message") and not name.startswith("_")):
            out[name] = getattr(view, name)()
    return {k: v for k, v in out.items() if not isinstance(v, bytes)}


def decode_everything(data: bytes) -> int:
    """Feed `data` to every decoder; the number that accepted it."""
    accepted = 0
    for decode in DECODERS.values():
        view = refused_only(DecodeError, decode, data)
        if view is not None:
            accepted += 1
            read_all(view)
    return accepted


def test_seeds_decode_whole() -> None:
    for kind, data in SEEDS.items():
        view = DECODERS[kind](data)
        read_all(view)
        tree = parse(data)
        assert tree is not None and serialize(tree) == data, kind
    view = lite.decode_synchronize_request(SEEDS["synchronize"])
    assert [p.message() for p in view.pods] == [_pod(1), _pod(2)]
    assert [c.message() for c in view.containers] == [_container(1), _container(2)]


@fuzz(400)
@given(mutated())
def test_mutated_requests_raise_only_decode_error(case: tuple[str, bytes]) -> None:
    decode_everything(case[1])


@fuzz(300)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_decode_error(data: bytes) -> None:
    decode_everything(data)


@fuzz(50)
@given(st.sampled_from(sorted(SEEDS)), st.integers(1, 9))
def test_overlong_varints_decode_like_canonical(kind: str, extra: int) -> None:
    tree = parse(SEEDS[kind])
    assert tree is not None
    assert plain(DECODERS[kind](serialize(tree, extra))) == plain(DECODERS[kind](SEEDS[kind]))
