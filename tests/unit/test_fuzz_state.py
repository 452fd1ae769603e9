"""Bad input to recovery: the daemon's state file (nri_gpushare.host.statefile)
and the allocation records in it (nri_gpushare.share.records), as a crash,
a full disk, a hand edit or another program may leave them: cut at any byte,
bytes flipped, lines repeated or reordered, non-UTF-8, random JSON lines, a
FIFO, a symlink or a file another user may write in their place.

Properties: StateFile.load gives the text or None (never raises for the
content); records.decode never raises, keeps only well-formed allocations,
and from a cut or garbled journal never recovers a share the journal did
not record (each recovered allocation is exactly one that was written, on
GPUs of this node); a snapshot round-trips.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.host.statefile import FILE_NAME, StateFile
from nri_gpushare.share.model import Allocation, GpuShare
from nri_gpushare.share.records import decode, removed, snapshot
from tests.fakes import GiB, make_gpus
from tests.unit.test_fuzz_common import fuzz, text_with_odd_unicode

GPUS = make_gpus(4, 16 * GiB)


@st.composite
def allocations(draw: st.DrawFn) -> Allocation:
    gpus = draw(st.lists(st.sampled_from(GPUS), min_size=1, max_size=3, unique=True))
    origin = draw(st.sampled_from(["", "cdi", "runc"]))
    return Allocation(
        container_id=draw(st.text("abcdef0123456789", min_size=1, max_size=64)),
        name=draw(text_with_odd_unicode(10)),
        pod=draw(st.sampled_from(["", "ns/pod"])),
        shares=tuple(
            GpuShare(g.index, g.uuid, draw(st.integers(1, 16 * GiB)), draw(st.integers(0, 100)))
            for g in gpus
        ),
        priority=draw(st.sampled_from(["normal", "high"])),
        isolation=draw(st.sampled_from(["full", "memory", "none"])),
        interposer=draw(st.booleans()),
        origin=origin,
        namespace="default" if origin else "",
        kubelet=draw(st.sampled_from([{}, {"gpu-memory": "0-3"}])),
    )


@st.composite
def journals(draw: st.DrawFn) -> tuple[str, list[Allocation]]:
    """A journal: a snapshot, then adds and removals appended."""
    allocs = draw(st.lists(allocations(), max_size=4, unique_by=lambda a: a.container_id))
    text = snapshot(allocs[:2])
    for a in allocs[2:]:
        text += snapshot([a]).split("\n", 1)[1]  # its add line only
    if draw(st.booleans()) and allocs:
        text += removed(allocs[0].container_id)
    return text, allocs


def garble(draw: Callable[[st.SearchStrategy[Any]], Any], text: str) -> str:
    data = bytearray(text.encode())
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.integers(0, 5))
        i = draw(st.integers(0, len(data)))
        if kind == 0:
            del data[i:]  # a write cut short
        elif kind == 1 and data:
            data[min(i, len(data) - 1)] = draw(st.integers(0, 255))
        elif kind == 2:
            data[i:i] = draw(st.sampled_from([b"\n", b"\x00", b"{", b'"', b"]", b"\xff"]))
        elif kind == 3:
            lines = data.split(b"\n")
            data = bytearray(b"\n".join(draw(st.permutations(lines))))
        elif kind == 4:
            line = json.dumps(draw(st.sampled_from([{"add": {}}, {"del": 5}, [], {"version": 2}])))
            data[i:i] = line.encode() + b"\n"
        else:
            data += data[: draw(st.integers(0, len(data)))]
    return data.decode(errors="replace")


@fuzz(120)
@given(st.data())
def test_records_decode(data: st.DataObject) -> None:
    text, allocs = data.draw(journals())
    assert decode(text, GPUS) == {
        a.container_id: a for a in allocs if not text.endswith(removed(a.container_id))
    }
    bad = garble(data.draw, text)
    written = {a.container_id: a for a in allocs}
    out = decode(bad, GPUS)
    for cid, a in out.items():
        # Nothing but what was recorded: a flipped byte in a number makes
        # the line invalid JSON, or another valid allocation that was never
        # written -- which must then at least fit the node's GPUs.
        assert a.container_id == cid
        if cid in written and a == written[cid]:
            continue
        for s in a.shares:
            gpu = next(g for g in GPUS if g.uuid == s.uuid)
            assert s.index == gpu.index and 0 < s.memory_bytes and 0 <= s.core_percent <= 100
    if "\n" in text:
        # Cut anywhere: the recovered set is a subset of what was written.
        cut = text[: data.draw(st.integers(0, len(text)))]
        for cid, a in decode(cut, GPUS).items():
            assert a == written[cid]


@fuzz(200)
@given(
    st.one_of(
        st.binary(max_size=300),
        text_with_odd_unicode(200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )
)
def test_records_decode_arbitrary(data: bytes) -> None:
    out = decode(data.decode(errors="replace"), GPUS)
    assert all(isinstance(a, Allocation) for a in out.values())


@fuzz(60)
@given(st.sampled_from(["bytes", "fifo", "symlink", "dir", "others"]), st.binary(max_size=200))
def test_state_file_load(kind: str, data: bytes) -> None:
    """What load() finds in place of the file: its text, or None."""
    with tempfile.TemporaryDirectory() as d:
        state = os.path.join(d, "state")
        path = os.path.join(state, FILE_NAME)
        store = StateFile(state)
        store.prepare()
        try:
            if kind == "fifo":
                os.mkfifo(path, 0o600)
            elif kind == "symlink":
                with open(os.path.join(d, "elsewhere"), "wb") as f:
                    f.write(b'{"version":1}\n')
                os.symlink(os.path.join(d, "elsewhere"), path)
            elif kind == "dir":
                os.mkdir(path)
            else:
                with open(path, "wb") as f:
                    f.write(data)
                if kind == "others":
                    os.chmod(path, 0o666)
            text = store.load()
            if kind in ("fifo", "symlink", "dir", "others"):
                assert text is None, kind
            else:
                try:
                    assert text == data.decode()
                except UnicodeDecodeError:
                    assert text is None
            assert decode(text or "", GPUS) is not None
        finally:
            store.close()
