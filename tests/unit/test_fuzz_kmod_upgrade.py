"""Bad input to `nri-gpushare kmod-upgrade`'s reading of module states
(nri_gpushare.ops.kmod_upgrade): the text of /proc/gpushare/upgrade and the
state file it saved (<state-dir>/kmod-upgrade.state), cut, garbled or
replaced, non-UTF-8 included.

Properties: ModuleState.parse and load_saved give a state or raise
UpgradeError (the command turns it into a message and exit status; any
other exception would be a traceback mid-upgrade); a parsed state's
accessors (of, containers, text) never raise, and text() parses back to
the same state.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.ops.kmod_upgrade_state import COMMENT, ModuleState, UpgradeError, load_saved
from tests.unit.test_fuzz_common import fuzz, refused_only, text_with_odd_unicode

STATE = (
    "gpushare-upgrade 1 0.1.0 exported\n"
    "set default_memsize 0\n"
    "gpu 0 17179869184\n"
    "set 0 max_inst 16\n"
    "add c1 0:4294967296:30:0\n"
    "bind c1 5123\n"
    "gputime c1 0 5000000\n"
    "end\n"
)


@st.composite
def states(draw: st.DrawFn) -> bytes:
    data = bytearray(STATE.encode())
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(data)))
        kind = draw(st.integers(0, 3))
        if kind == 0:
            del data[i:]
        elif kind == 1 and data:
            data[min(i, len(data) - 1)] = draw(st.integers(0, 255))
        elif kind == 2:
            data[i:i] = draw(st.sampled_from([b"\n", b"add\n", b"add \n", b" ", b"\x00", b"\xff"]))
        else:
            data[i:i] = draw(text_with_odd_unicode(20)).encode("utf-8", "surrogatepass")
    return bytes(data)


def check(state: ModuleState) -> None:
    assert isinstance(state.containers(), list)
    for verb in ("add", "gpu", "bind", "end", ""):
        assert isinstance(state.of(verb), list)
    assert ModuleState.parse(state.text()) == state


@fuzz(300)
@given(st.one_of(states(), st.binary(max_size=100)))
def test_module_state(data: bytes) -> None:
    state = refused_only(UpgradeError, ModuleState.parse, data.decode(errors="replace"))
    if state is not None:
        check(state)


@fuzz(150)
@given(
    st.sampled_from([f"{COMMENT} boot_id=0f3c\n".encode(), b"# other\n", b"", b"\xff\n"]),
    st.one_of(states(), st.binary(max_size=60)),
)
def test_saved_state_file(head: bytes, body: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(os.path.join(d, "kmod-upgrade.state"))
        path.write_bytes(head + body)
        saved = refused_only(UpgradeError, load_saved, path)
        if saved is not None:
            assert isinstance(saved[0], str)
            check(saved[1])
