"""Bad input to the kernel module's client (nri_gpushare.kmod.procfs): what
it reads back from /proc/gpushare (the inst_ctl dump, each GPU's and
container's files, meminfo, the upgrade header) when a module of another
version, or a broken one, writes something else; the mountinfo it reads;
and the cgroup paths a runtime hands it, which it writes into inst_ctl.

The tree is a plain directory standing in for /proc/gpushare, its files
garbled: mutated valid values, random text and bytes (non-UTF-8 too).
Properties: every reader returns a well-formed value or raises KmodError
(never ValueError, IndexError or UnicodeDecodeError); cgroup_v2_path gives
one absolute path with no blank or control character (it becomes a word of
an inst_ctl command) or raises ValueError.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.kmod.cgroup import cgroup2_mounts, cgroup_v2_path, expand_systemd_slice
from nri_gpushare.kmod.procfs import ProcfsKernelModule
from nri_gpushare.kmod.readings import parse_meminfo
from nri_gpushare.share.kernel import KmodError
from tests.unit.test_fuzz_common import fuzz, refused_only, text_with_odd_unicode

CID = "c" * 64
VALID = {
    "inst_ctl": f"gpu 0 17179869184\nadd {CID} 0:1073741824:30:0\nbind {CID} 5123\n",
    "default_memsize": "0\n",
    "upgrade": "gpushare-upgrade 1 0.1.0 live\nend\n",
    "0/total_memsize": "17179869184\n",
    "0/free_memsize": "16106127360\n",
    "0/free_weight": "70\n",
    "0/nr_inst": "1\n",
    "0/max_inst": "16\n",
    "0/policy": "2\n",
    "0/prio_ratio": "80\n",
    "0/slice_us": "10000\n",
    "0/drain_us": "100000\n",
    "0/forced_ends": "0\n",
    "0/orphaned_memsize": "0\n",
    f"0/{CID}/memsize": "1073741824\n",
    f"0/{CID}/meminfo": "Free: 1073737728\nPID: 42 Mem: 4096\n",
    f"0/{CID}/gputime": "5000000\n",
}


def garble(draw: st.DrawFn, text: str) -> bytes:
    kind = draw(st.integers(0, 5))
    data = text.encode()
    if kind == 0:
        return data
    if kind == 1:
        return draw(st.binary(max_size=60))
    if kind == 2:
        return draw(text_with_odd_unicode(60)).encode("utf-8", "surrogatepass")
    if kind == 3:
        i = draw(st.integers(0, len(data)))
        return data[:i]
    if kind == 4:
        i = draw(st.integers(0, max(0, len(data) - 1)))
        word = draw(
            st.sampled_from([b"-1", b"99999999999999999999999", b"x", b" ", b"\n", b":", b"\xff"])
        )
        return data[:i] + word + data[i + 1 :]
    return data + draw(st.sampled_from([b"add x\n", b"gpu\n", b"bind a\n", b"add a 0:1:2\n"]))


@st.composite
def trees(draw: st.DrawFn) -> dict[str, bytes]:
    """Each file valid or garbled (some missing)."""
    out = {}
    for name, text in VALID.items():
        if draw(st.integers(0, 9)) == 0:
            continue
        out[name] = garble(draw, text)
    return out


def read_everything(kmod: ProcfsKernelModule) -> None:
    for call in (
        kmod.loaded,
        kmod.registrations,
        kmod.gpus,
        kmod.bindings,
        lambda: kmod.gpu_state(0),
        kmod.default_memsize,
        lambda: kmod.meminfo(0, CID),
        lambda: kmod.gputime(0, CID),
        lambda: kmod.slice_us(0),
        lambda: kmod.drain_us(0),
        lambda: kmod.forced_ends(0),
        lambda: kmod.orphaned_memory(0),
        kmod.upgrading,
    ):
        result = refused_only(KmodError, call)
        if isinstance(result, list):
            for r in result:
                for q in getattr(r, "quotas", ()):
                    assert q.gpu_index >= 0 and q.memory_bytes >= 0 and q.core_percent >= 0
        elif isinstance(result, int) and not isinstance(result, bool):
            assert result >= 0


@fuzz(150)
@given(trees())
def test_module_state_reading(tree: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "0" / CID).mkdir(parents=True)
        for name, data in tree.items():
            (root / name).write_bytes(data)
        read_everything(ProcfsKernelModule(root, mountinfo=root / "none"))


@fuzz(300)
@given(
    st.one_of(st.just(VALID[f"0/{CID}/meminfo"]), text_with_odd_unicode(80)), st.integers(0, 2**64)
)
def test_meminfo(text: str, memsize: int) -> None:
    info = refused_only(ValueError, parse_meminfo, text, memsize)
    if info is not None:
        assert all(b >= 0 for b in info.processes.values())


PATHS = st.one_of(
    text_with_odd_unicode(60),
    st.builds(
        lambda a, b, c: f"{a}:{b}:{c}",
        st.sampled_from(["", "kubepods.slice", "a-b-c.slice", "-.slice", "a--b.slice", "x"]),
        st.sampled_from(["", "cri-containerd", "docker", "a b"]),
        text_with_odd_unicode(20),
    ),
    st.sampled_from(
        ["/k8s.io/c1", "k8s.io/c1", "/sys/fs/cgroup/k8s.io/c1", "/a b", "/a\nadd x 0:1"]
    ),
)


@fuzz(400)
@given(
    PATHS, st.lists(st.sampled_from(["/sys/fs/cgroup", "/", "/sys/fs/cgroup/unified"]), max_size=2)
)
def test_cgroup_paths(path: str, mounts: list[str]) -> None:
    """A container's cgroups path as the runtime gives it becomes one word of
    `bind <id> <path>`: absolute, and nothing the command's grammar splits on."""
    out = refused_only(ValueError, cgroup_v2_path, path, mounts)
    if out is not None:
        assert out.startswith("/"), out
        assert not any(c.isspace() or not c.isprintable() for c in out), repr(out)


@fuzz(200)
@given(text_with_odd_unicode(40))
def test_systemd_slices(name: str) -> None:
    out = refused_only(ValueError, expand_systemd_slice, name + ".slice")
    assert out is None or out == "" or out.startswith("/")


@fuzz(150)
@given(
    st.lists(
        st.one_of(
            st.just("36 25 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw"),
            st.just("1 2 3 - cgroup2 x"),
            st.just(" - cgroup2"),
            st.just("36 25 0:30 / /a\\040b rw - cgroup2 cgroup2 rw"),
            text_with_odd_unicode(60),
        ),
        max_size=5,
    ).map("\n".join),
    st.binary(max_size=20),
)
def test_mountinfo(text: str, junk: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "mountinfo")
        with open(path, "wb") as f:
            f.write(text.encode("utf-8", "surrogatepass") + junk)
        points = cgroup2_mounts(path)
        assert all(isinstance(p, str) for p in points)
