"""The plugin's side of NRI v0.12 (containerd 2.3; v0.10/v0.11 are containerd
2.2), which no runtime on these machines speaks, byte for byte against
upstream's schema: pkg/api/api.proto of github.com/containerd/nri v0.12.2.

tests/unit/data/nri_v0_12_2.json holds what was taken from that file (it is
not in the repository, nor in any Debian release yet):
- `requests`: what a containerd 2.3 sends the plugin, each written in
  protobuf text format and encoded by `protoc --encode` with upstream's file;
- `replies`: what the plugin must send where it is fixed, encoded the same way;
- `fields`: the fields (number, name, type, message type, label) upstream's
  file gives every message the plugin sends (`replies` and `sent`), and every
  message inside those.

The real daemon (`GpuShareHandler`, kmod off) behind the real stub is driven
over a socket through a containerd 2.3 session: it must register, answer
Configure, a split Synchronize, CreateContainer, the per-event RPCs of v0.12
and StopContainer exactly as upstream's encoding has them, and its
CreateContainer reply must decode with upstream's numbers and types alone
(every byte accounted for) and set none of the fields containerd 2.2+'s
default validator can be told to reject (OCI hooks, namespaces, sysctls,
seccomp).  Our schema may leave out fields upstream has (a field the plugin
never reads is skipped), never add one to what it sends.

To redo the data file from upstream's api.proto (e.g. of a later release):
    .venv/bin/python -m tests.unit.test_nri_upstream PATH/TO/api.proto
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from nri_gpushare.config import parse_config
from nri_gpushare.daemon.main import build_service
from nri_gpushare.daemon.nri_handler import GpuShareHandler
from nri_gpushare.nri.stub import Stub
from nri_gpushare.nri.wire import PLUGIN_CONN, RUNTIME_CONN, Code, MuxConnection, TtrpcError
from tests.unit.test_schema_conformance import OURS, PROTOC, Schema, _compile

DATA = Path(__file__).parent / "data" / "nri_v0_12_2.json"
_data = json.loads(DATA.read_text())
REQUESTS: dict[str, dict[str, str]] = _data["requests"]
REPLIES: dict[str, dict[str, str]] = _data["replies"]
SENT: dict[str, list[list[Any]]] = _data.get("fields", {})
PACKAGE = "nri.pkg.api.v1alpha1"
PLUGIN = f"{PACKAGE}.Plugin"
UUID = "GPU-00000000-1111-2222-3333-444444444444"
VALIDATED = {"hooks", "namespaces", "sysctl", "seccomp_policy"}
"""ContainerAdjustment fields the default validator of NRI v0.10+ can reject."""

# -- upstream's encoding, read with upstream's field table alone ------------------------

VARINT_TYPES = {"TYPE_INT32", "TYPE_INT64", "TYPE_UINT32", "TYPE_UINT64", "TYPE_BOOL", "TYPE_ENUM"}
LEN_TYPES = {"TYPE_STRING", "TYPE_BYTES", "TYPE_MESSAGE"}


def _varint(raw: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = raw[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def decode(raw: bytes, message: str, fields: dict[str, list[list[Any]]]) -> dict[str, Any]:
    """`raw` as a `message` of upstream's schema: {field name: [values]},
    maps as dicts; fails on any field or wire type upstream does not give it."""
    table = {f[0]: f for f in fields[message]}
    out: dict[str, Any] = {}
    at = 0
    while at < len(raw):
        key, at = _varint(raw, at)
        number, wire = key >> 3, key & 7
        assert number in table, f"{message} has no field {number} upstream"
        _, name, type_, type_name, _label = table[number]
        if wire == 0:
            assert type_ in VARINT_TYPES, f"{message}.{name} is {type_}, sent as a varint"
            value, at = _varint(raw, at)
        else:
            assert wire == 2 and type_ in LEN_TYPES, f"{message}.{name}: wire type {wire}"
            size, at = _varint(raw, at)
            value, at = raw[at : at + size], at + size
            assert len(value) == size, f"{message}.{name} is cut short"
            if type_ == "TYPE_STRING":
                value = value.decode()
            elif type_ == "TYPE_MESSAGE":
                value = decode(value, type_name, fields)
        if type_name.endswith("Entry"):  # a map's entry
            out.setdefault(name, {})[value.get("key", [""])[0]] = value.get("value", [""])[0]
        else:
            out.setdefault(name, []).append(value)
    return out


# -- a containerd 2.3 on the other end of the socket ------------------------------------


class Runtime:
    """Serves RegisterPlugin (keeping its raw request) and calls the plugin."""

    def __init__(self) -> None:
        self.registered: asyncio.Queue[tuple[MuxConnection, bytes]] = asyncio.Queue()
        self.connections: list[MuxConnection] = []

    async def serve(self, path: str) -> asyncio.AbstractServer:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = MuxConnection(reader, writer)
            self.connections.append(conn)

            async def runtime_service(service: str, method: str, payload: bytes) -> bytes:
                if method != "RegisterPlugin":
                    raise TtrpcError(Code.UNIMPLEMENTED, method)
                await self.registered.put((conn, payload))
                return b""

            conn.serve(RUNTIME_CONN, runtime_service)

        return await asyncio.start_unix_server(accept, path=path)


async def call(conn: MuxConnection, method: str, request: str) -> bytes:
    payload = bytes.fromhex(REQUESTS[request]["hex"])
    return await conn.client(PLUGIN_CONN).call(PLUGIN, method, payload, timeout=5)


@asynccontextmanager
async def session(tmp_path: Path) -> AsyncIterator[tuple[GpuShareHandler, MuxConnection, bytes]]:
    """The daemon's handler on a stub registered with a containerd 2.3."""
    library = tmp_path / "libgpushare.so"
    library.write_bytes(b"\x7fELF stand-in")
    config = parse_config(
        {
            "kmod": "off",
            "use_nvml": False,
            "inventory": [{"index": 0, "uuid": UUID, "memory": "16Gi"}],
            "state_dir": str(tmp_path / "state"),
            "interposer": {"library": str(library)},
            "unserved": "warn",  # the vectors' pids are made up: never signal them
            "containerd": {"socket": ""},
        }
    )
    handler = GpuShareHandler(await build_service(config, None))
    runtime = Runtime()
    path = str(tmp_path / "nri.sock")
    server = await runtime.serve(path)
    stub = Stub(handler, name="gpushare", index="10", socket_path=path)
    handler.request_timeout = lambda: stub.request_timeout
    task = asyncio.create_task(stub.run())
    try:
        conn, registration = await asyncio.wait_for(runtime.registered.get(), 5)
        yield handler, conn, registration
    finally:
        await stub.stop()
        await asyncio.wait_for(task, 5)
        server.close()


def reply(name: str) -> bytes:
    return bytes.fromhex(REPLIES[name]["hex"])


async def test_a_containerd_2_3_session(tmp_path: Path) -> None:
    async with session(tmp_path) as (handler, conn, registration):
        assert registration == reply("RegisterPluginRequest")
        assert await call(conn, "Configure", "ConfigureRequest") == reply("ConfigureResponse")

        assert await call(conn, "Synchronize", "SynchronizeRequest.more") == reply(
            "SynchronizeResponse.more"
        )
        assert await call(conn, "Synchronize", "SynchronizeRequest.last") == b""
        assert list(handler.service.unserved) == ["ctr-0"]  # asked while we were away

        created = await call(conn, "CreateContainer", "CreateContainerRequest")
        adjust = decode(created, f".{PACKAGE}.CreateContainerResponse", SENT)["adjust"][0]
        assert not VALIDATED & (set(adjust) | set(adjust["linux"][0]))
        assert set(adjust) == {"annotations", "mounts", "env", "linux"}
        assert json.loads(adjust["annotations"]["gpushare.io/assigned"])["gpus"][0]["uuid"] == UUID
        env = {kv["key"][0]: kv["value"][0] for kv in adjust["env"]}
        assert (
            env["GPUSHARE_MEMORY_LIMIT"] == str(1 << 30) and env["NVIDIA_VISIBLE_DEVICES"] == UUID
        )
        devices = [
            (d["path"][0], d["major"][0], d.get("minor", [0])[0])
            for d in adjust["linux"][0]["devices"]
        ]
        assert devices == [("/dev/nvidiactl", 195, 255), ("/dev/nvidia0", 195, 0)]
        assert [m["destination"][0] for m in adjust["mounts"]] == [
            "/usr/lib/gpushare/libgpushare.so",
            "/etc/ld.so.preload",
        ]
        assert set(handler.service.allocations) == {"ctr-1"}

        for method in ("StartContainer", "PostStartContainer"):  # v0.12's own RPCs
            assert await call(conn, method, f"{method}Request") == b""
        assert await call(conn, "StopContainer", "StopContainerRequest") == reply(
            "StopContainerResponse"
        )
        assert await call(conn, "RemoveContainer", "RemoveContainerRequest") == b""
        assert handler.service.allocations == {}
        with pytest.raises(TtrpcError) as unhandled:  # the runtime falls back to StateChange
            await call(conn, "RunPodSandbox", "RunPodSandboxRequest")
        assert unhandled.value.code == Code.UNIMPLEMENTED


def test_the_plugin_sends_no_field_upstream_lacks(tmp_path: Path) -> None:
    ours = Schema(_compile(OURS, tmp_path))
    problems = []
    for full, upstream in SENT.items():
        name = full.removeprefix(f".{PACKAGE}.")
        if name not in ours.messages:
            problems.append(f"no message {name}")
            continue
        theirs = {f[0]: f for f in upstream}
        for f in ours.messages[name].field:
            want = theirs.get(f.number)
            got = [f.number, f.name, f.type.name, f.type_name, f.label.name]
            if want != got:
                problems.append(f"{name}: ours {got}, upstream {want}")
    assert not problems, "\n".join(problems)


# -- the data file, made from upstream's api.proto --------------------------------------


def regenerate(upstream: Path) -> None:
    """Encode the texts of DATA with `upstream` and redo its field table."""
    from betterproto.lib.google.protobuf import FileDescriptorSet

    data = json.loads(DATA.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "upstream.pb"
        subprocess.run(
            [PROTOC, f"-I{upstream.parent}", f"--descriptor_set_out={out}", upstream.name],
            check=True,
        )
        (fd,) = FileDescriptorSet().parse(out.read_bytes()).file
    messages: dict[str, Any] = {}

    def add(prefix: str, message: Any) -> None:
        messages[f"{prefix}.{message.name}"] = message
        for nested in message.nested_type:
            add(f"{prefix}.{message.name}", nested)

    for message in fd.message_type:
        add(f".{fd.package}", message)
    fields: dict[str, list[list[Any]]] = {}

    def reach(name: str) -> None:
        if name in fields:
            return
        fields[name] = [
            [f.number, f.name, f.type.name, f.type_name, f.label.name] for f in messages[name].field
        ]
        for f in messages[name].field:
            if f.type_name in messages:
                reach(f.type_name)

    for name in data["sent"]:
        reach(f".{fd.package}.{name}")
    for section in ("replies", "requests"):
        for entry in data[section].values():
            if section == "replies":
                reach(f".{fd.package}.{entry['type']}")
            encoded = subprocess.run(
                [
                    PROTOC,
                    f"-I{upstream.parent}",
                    f"--encode={fd.package}.{entry['type']}",
                    upstream.name,
                ],
                input=entry["text"].encode(),
                capture_output=True,
                check=True,
            ).stdout
            entry["hex"] = encoded.hex()
    data["fields"] = dict(sorted(fields.items()))
    text = json.dumps(data, indent=1)
    # One line per field: [number, name, type, message type, label].
    text = re.sub(
        r"\[\n\s*([^\[\]{}]*?)\n\s*\]", lambda m: "[" + re.sub(r",\n\s*", ", ", m[1]) + "]", text
    )
    DATA.write_text(text + "\n")


if __name__ == "__main__":
    regenerate(Path(sys.argv[1]))
