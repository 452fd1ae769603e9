"""Hot upgrade of gpushare.ko (/proc/gpushare/upgrade and `nri-gpushare
kmod-upgrade`) inside the guest: version N (the suite's module) hands its
registry, quotas, bindings, settings and GPU time over to version N+1 (the
same source built with another GPUSHARE_VERSION, $GPUSHARE_KO_NEXT) without
unregistering anything; refused, changing nothing, while /dev/gpushare is
open; export undone by abort; resumed after an interruption; hostile states
refused whole; and export, abort and import racing commands, setting writes
and opens of the device (no oops: the guest panics on one)."""

from __future__ import annotations

import collections
import errno
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
from nri_gpushare.ops.kmod_upgrade_state import STATE_FILE, ModuleState, save_state
from tests.guest.kmod_race_support import (
    delete_module,
    finit_module,
    fork,
    mark,
    names,
    need_two_cpus,
    seconds,
    wait_all,
)
from tests.guest.kmod_support import (
    CTL,
    DEV,
    KO,
    ROOT,
    Agent,
    MakeContainer,
    ctl,
    errno_of,
    in_child,
    load,
    loaded,
    ok,
    read,
    refcount,
    registered,
    snapshot,
    unload,
    value,
    write,
)

NEXT = Path(os.environ.get("GPUSHARE_KO_NEXT", ""))
NEXT_VERSION = os.environ.get("GPUSHARE_NEXT_VERSION", "")
UPGRADE = ROOT / "upgrade"
GIB = 1 << 30
A, B, C, D = "a" * 64, "b-1", "c.2", "d_3"


def need_next() -> None:
    assert NEXT.is_file() and NEXT_VERSION, "GPUSHARE_KO_NEXT / _NEXT_VERSION not set"


def header() -> list[str]:
    return read(UPGRADE).splitlines()[0].split()


def kmod_upgrade(state_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, as an operator runs it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "nri_gpushare.cli.main",
            "kmod-upgrade",
            "--state-dir",
            str(state_dir),
        ]
        + list(extra),
        capture_output=True,
        text=True,
        timeout=300,
    )


def gpu_settings(gpu: int) -> dict[str, int]:
    names_ = ("max_inst", "policy", "prio_ratio", "slice_us", "drain_us")
    names_ += ("total_memsize", "free_memsize")
    return {n: value(ROOT / str(gpu) / n) for n in names_ + ("free_weight", "nr_inst")}


def container_files(cid: str, gpu: int) -> dict[str, str]:
    d = ROOT / str(gpu) / cid
    return {n: read(d / n) for n in ("id", "memsize", "weight", "highprio", "cgroup", "gputime")}


def use_gpu(cg: Path, gpu: int, ns: int) -> int:
    """A process in cg takes a slice of `gpu` and reports `ns` of work; its gputime after."""

    def go() -> int:
        fd = os.open(DEV, os.O_RDWR)
        try:
            abi.sched(fd, abi.SCHED_ACQUIRE, gpu)
            abi.sched(fd, abi.SCHED_RELEASE, gpu, ns)
        finally:
            os.close(fd)
        return 0

    in_child(go, cgroup=cg)
    return int(read(ROOT / str(gpu) / cg.name.removeprefix("gs-") / "gputime"))


def quota_seen(cg: Path) -> list[list[int]]:
    """What a process in cg gets from QUERY: [gpu, memsize, weight, highprio] per GPU."""

    def go() -> list[list[int]]:
        result = abi.query()
        assert result is not None, "QUERY found no registration"
        return [
            [q.gpu_index, q.memory_bytes, q.core_percent, int(q.high_priority)]
            for q in result.quotas
        ]

    return in_child(go, cgroup=cg)  # type: ignore[return-value]


def snap() -> dict[str, bytes]:
    """snapshot() without the upgrade file (whose header names the module's state)."""
    return {k: v for k, v in snapshot().items() if k != str(UPGRADE)}


def state_now() -> ModuleState:
    return ModuleState.parse(read(UPGRADE))


def populate(container: MakeContainer) -> dict[str, Path]:
    """Two GPUs with non-default settings, four containers (three bound)."""
    ok("gpu 0 17179869184")
    ok("gpu 1 8589934592")
    assert write(ROOT / "default_memsize", f"{GIB}\n") == 0
    for path, val in (
        ("0/policy", 3),
        ("0/max_inst", 5),
        ("1/slice_us", 2000),
        ("1/prio_ratio", 50),
        ("1/drain_us", 5000),
    ):
        assert write(ROOT / path, f"{val}\n") == 0, path
    cgs = {
        A: container(A, f"0:{4 * GIB}:30:0,1:{GIB}:10:1"),
        B: container(B, f"0:{2 * GIB}:20:1"),
        C: container(C, "1:0"),  # default_memsize
    }
    ok(f"add {D} 0:{GIB}")  # never bound
    return cgs


@pytest.fixture(autouse=True)
def unfrozen(kmod: None) -> Iterator[None]:
    """After a failure too: the module live again and these tests' containers gone,
    so that the kmod fixture's own checks report the failure, not its leftovers."""
    yield
    if loaded():
        write(UPGRADE, "abort")
        cleanup(A, B, C, D, "e", "r")


def cleanup(*cids: str) -> None:
    for cid in cids:
        ctl(f"del {cid}")


# -- the upgrade, end to end --------------------------------------------------------


def test_upgrade_keeps_every_registration(container: MakeContainer, tmp_path: Path) -> None:
    need_next()
    cgs = populate(container)
    before_time = use_gpu(cgs[A], 0, 5_000_000)
    assert before_time > 0
    with Agent.spawn(cgroup=cgs[B]) as agent:  # a ledger used and given back before
        fd = agent.open()
        assert fd >= 0 and agent.reserve(fd, 0, GIB)[0] == 0 and agent.close(fd) == 0
    old_version = read(ROOT / "version").strip()
    dump = read(CTL)
    settings = {g: gpu_settings(g) for g in (0, 1)}
    files = {
        (cid, g): container_files(cid, g) for cid, g in ((A, 0), (A, 1), (B, 0), (C, 1), (D, 0))
    }
    default = read(ROOT / "default_memsize")
    quotas = {cid: quota_seen(cg) for cid, cg in cgs.items()}
    assert refcount() == 4 and NEXT_VERSION != old_version

    done = kmod_upgrade(tmp_path, "--module", str(NEXT))
    assert done.returncode == 0, done.stderr + done.stdout
    assert (
        f"upgraded gpushare {old_version} -> {NEXT_VERSION}: 4 containers, 3 bindings"
        in done.stdout
    )

    assert read(ROOT / "version").strip() == NEXT_VERSION
    assert header()[2:] == [NEXT_VERSION, "live"]
    assert read(CTL) == dump
    assert {g: gpu_settings(g) for g in (0, 1)} == settings
    assert {k: container_files(*k) for k in files} == files
    assert read(ROOT / "default_memsize") == default
    assert refcount() == 4, "one module reference per registration"
    assert {cid: quota_seen(cg) for cid, cg in cgs.items()} == quotas
    with Agent.spawn(cgroup=cgs[A]) as agent:  # the ledger of the new module, same quota
        fd = agent.open()
        assert fd >= 0
        assert agent.reserve(fd, 0, 4 * GIB) == (0, (4 * GIB, 4 * GIB, 4 * GIB))
        assert agent.reserve(fd, 0, 1)[0] == errno.EDQUOT
        assert agent.close(fd) == 0
    assert use_gpu(cgs[A], 0, 1_000_000) > before_time, "GPU time counts on from where it was"
    saved = list(tmp_path.glob(f"{STATE_FILE}.imported-*"))
    assert len(saved) == 1 and not (tmp_path / STATE_FILE).exists()

    ok(f"del {A}")
    assert refcount() == 3
    cleanup(B, C, D)
    assert refcount() == 0 and registered() == []
    assert unload() == 0, "rmmod of the new version"
    load()


def test_upgrade_refused_while_the_device_is_open(container: MakeContainer, tmp_path: Path) -> None:
    need_next()
    cgs = populate(container)
    with Agent.spawn(cgroup=cgs[A]) as agent:
        fd = agent.open()
        assert fd >= 0 and agent.reserve(fd, 0, GIB)[0] == 0
        before = snap()
        refused = kmod_upgrade(tmp_path, "--module", str(NEXT))
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"/dev/gpushare is open, held by PID {agent.pid} (" in refused.stderr
        assert (
            "Nothing was changed" in refused.stderr and "nri-gpushare uninstall" in refused.stderr
        )
        assert header()[3] == "live" and snap() == before
        assert not (tmp_path / STATE_FILE).exists()
        assert ctl(f"add e 1:{GIB}") == 0 and ctl("del e") == 0  # still live
        agent.close(fd)
    assert refcount() == 4
    cleanup(A, B, C, D)


def test_export_freezes_and_abort_undoes_it(container: MakeContainer) -> None:
    cgs = populate(container)
    before = snap()
    assert write(UPGRADE, "export\n") == 0
    assert header()[3] == "exported" and refcount() == 0, "registrations no longer pin it"
    assert write(UPGRADE, "export") == 0, "again: nothing"
    assert ctl(f"add e 1:{GIB}") == errno.EBUSY
    assert ctl(f"del {A}") == errno.EBUSY
    assert ctl(f"bind {D} /{cgs[A].name}") == errno.EBUSY
    settings = {
        ROOT / "default_memsize": "1",
        **{ROOT / "0" / n: v for n, v in (("policy", "1"), ("max_inst", "24"))},
        **{ROOT / "0" / n: v for n, v in (("prio_ratio", "50"), ("slice_us", "2000"))},
        ROOT / "0" / "drain_us": "5000",
        **{ROOT / "0" / A / n: v for n, v in (("weight", "5"), ("highprio", "1"))},
        ROOT / "0" / A / "memsize": str(GIB + 1),
    }
    for path, text in settings.items():  # every writable file
        assert write(path, text) == errno.EBUSY, path
    assert errno_of(lambda: os.close(os.open(DEV, os.O_RDWR))) == errno.EBUSY
    assert in_child(lambda: errno_of(abi.query), cgroup=cgs[A]) == errno.EBUSY
    assert snap() == before
    assert write(UPGRADE, "abort\n") == 0
    assert header()[3] == "live" and refcount() == 4 and snap() == before
    assert write(UPGRADE, "abort") == 0 and refcount() == 4, "again: nothing"
    assert ctl(f"add e 1:{GIB}") == 0 and ctl("del e") == 0
    assert quota_seen(cgs[B]) == [[0, 2 * GIB, 20, 1]]
    cleanup(A, B, C, D)


def test_rerun_resumes_an_interrupted_upgrade(container: MakeContainer, tmp_path: Path) -> None:
    """Interrupted after the export, and after the rmmod (the state saved before)."""
    need_next()
    populate(container)
    dump = read(CTL)
    assert write(UPGRADE, "export") == 0  # killed right after its export
    done = kmod_upgrade(tmp_path, "--module", str(NEXT))
    assert done.returncode == 0, done.stderr + done.stdout
    assert read(CTL) == dump and refcount() == 4 and header()[2] == NEXT_VERSION

    # Back to N the same way, killed after the rmmod: the saved state carries it.
    assert write(UPGRADE, "export") == 0
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    save_state(tmp_path / STATE_FILE, state_now(), boot)
    assert unload() == 0 and not loaded()
    done = kmod_upgrade(tmp_path, "--module", str(KO))
    assert done.returncode == 0, done.stderr + done.stdout
    assert "upgraded gpushare (unloaded) -> " in done.stdout
    assert read(CTL) == dump and refcount() == 4 and header()[2] != NEXT_VERSION

    # Killed after loading the new version (waiting for the state).
    assert write(UPGRADE, "export") == 0
    save_state(tmp_path / STATE_FILE, state_now(), boot)
    assert unload() == 0 and finit_module(NEXT, "await_import=1") == 0
    assert header()[3] == "importing" and ctl("gpu 2 1") == errno.EBUSY
    done = kmod_upgrade(tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    assert read(CTL) == dump and refcount() == 4 and header()[2:] == [NEXT_VERSION, "live"]
    cleanup(A, B, C, D)


def test_import_takes_a_state_whole_or_not_at_all(
    container: MakeContainer, cgroups: Callable[[str], Path]
) -> None:
    need_next()
    cgs = populate(container)
    gone = cgroups("gs-gone")
    ok(f"add e 1:{GIB}")
    ok("bind e /gs-gone")
    assert write(UPGRADE, "export") == 0
    state = state_now()
    assert f"bind e {os.stat(gone).st_ino}" in state.lines
    gone.rmdir()  # the cgroup goes while the module is replaced
    assert unload() == 0 and finit_module(NEXT, "await_import=1") == 0
    fresh = snap()

    good = state.text()
    assert good.endswith("\nend\n")
    body = good[: -len("end\n")]

    def plus(line: str) -> str:
        return body + line + "end\n"

    bad = [
        good.replace(" exported\n", " live\n", 1),  # not a final state
        good.replace("gpushare-upgrade 1 ", "gpushare-upgrade 2 ", 1),
        plus("del e\n"),
        plus("gpu 0 1\n"),  # declared twice
        plus(f"add {A} 0:1\n"),  # twice
        plus("bind e /gs-x\n"),  # by path
        plus("set 0 policy 9\n"),
        plus("gputime nobody 0 1\n"),
        plus("\n\n"),
        good.replace(f"add {B} 0:{2 * GIB}:20:1", f"add {B} 0:{20 * GIB}:20:1"),  # over-commits
        good + "x" * 100,
        good.replace("\n", "\0", 1),
        plus("set 0 max_inst 1\n"),  # below its containers
        # Not whole: what a write() of a state's first piece carries (tail
        # and cat write a larger file in pieces), cut at a line's end or
        # inside a number ("add A 0:1073741824" -> "add A 0:10").
        body,
        body[: body.index(f"add {A} ")] + f"add {A} 0:10",
        good + "end\n",
        plus(f"add {C} 0:1\n"),
        plus("set 0 policy 3\n" * 4096),  # E2BIG: over 4096 lines
        plus(f"add {'x' * 400_000} 0:1\n"),  # one huge line
        plus(f"add {C}/x 0:1\n"),  # odd characters in an ID
        plus("bind e 18446744073709551616\n"),
    ]
    for text in bad:
        err = write(UPGRADE, text)
        refusals = (
            errno.EINVAL,
            errno.EPROTO,
            errno.ENOSPC,
            errno.EEXIST,
            errno.ENOENT,
            errno.E2BIG,
        )
        assert err in refusals, (
            err,
            text[-40:],
        )
        assert snap() == fresh, "a refused state leaves nothing behind"
        assert header()[3] == "importing" and refcount() == 0
    assert write(UPGRADE, "x" * (512 * 1024 + 1)) == errno.EINVAL
    # A state in two write()s on one open file: neither piece is taken.
    fd = os.open(UPGRADE, os.O_WRONLY)
    try:
        cut = body.index("\nadd ") + 1
        for piece in (good[:cut], good[cut:]):
            assert errno_of(lambda piece=piece: os.write(fd, piece.encode())) == errno.EINVAL
    finally:
        os.close(fd)
    assert snap() == fresh and header()[3] == "importing" and refcount() == 0

    assert write(UPGRADE, good) == 0
    assert header()[3] == "live" and refcount() == 5
    assert read(ROOT / "1" / "e" / "cgroup") == "0\n", "its cgroup is gone: left unbound"
    assert [line for line in state_now().lines if line.startswith("bind ")] == [
        line for line in state.lines if line.startswith("bind ") and not line.startswith("bind e ")
    ]
    assert write(UPGRADE, good) == errno.EBUSY, "only into an empty registry"
    assert quota_seen(cgs[C]) == [[1, GIB, 0, 0]]
    cleanup(A, B, C, D, "e")
    # A live, empty module takes a state too (the daemon loaded it meanwhile),
    # but not while a file is open: its ledger is not in the state.
    fd = os.open(DEV, os.O_RDWR)
    try:
        assert write(UPGRADE, good) == errno.EBUSY and header()[3] == "live"
    finally:
        os.close(fd)
    assert write(UPGRADE, good) == 0 and refcount() == 5
    cleanup(A, B, C, D, "e")


def test_upgrade_file_is_root_only() -> None:
    from tests.guest.kmod_support import NOBODY

    assert oct(UPGRADE.stat().st_mode & 0o777) == "0o600"
    assert in_child(lambda: errno_of(lambda: read(UPGRADE)), uid=NOBODY) == errno.EACCES
    assert in_child(lambda: write(UPGRADE, "export"), uid=NOBODY) == errno.EACCES
    assert header()[:2] == ["gpushare-upgrade", "1"] and header()[3] == "live"


# -- races ---------------------------------------------------------------------------


def without_r(dump: str) -> str:
    """A registry dump without the racing processes' container "r"."""
    return "".join(
        line for line in dump.splitlines(True) if not line.startswith(("add r ", "bind r "))
    )


def test_race_export_abort_against_commands_and_opens(container: MakeContainer) -> None:
    """export/abort cycles against inst_ctl commands, setting writes, opens of
    the device and readers; afterwards every registration pins the module again."""
    need_two_cpus()
    cgs = populate(container)
    deadline = time.monotonic() + seconds("GPUSHARE_RACE_S", 6)
    mark("upgrade race: export/abort")

    def flipper() -> int:
        seen: collections.Counter[int] = collections.Counter()
        while time.monotonic() < deadline:
            seen[write(UPGRADE, "export")] += 1
            read(UPGRADE)
            seen[write(UPGRADE, "abort")] += 1
        print("flipper", names(seen), file=sys.stderr)
        return 0 if set(seen) <= {0, errno.EBUSY} else 1

    def commands() -> int:
        seen: collections.Counter[int] = collections.Counter()
        while time.monotonic() < deadline:
            seen[ctl(f"add r 1:{GIB}")] += 1
            seen[ctl("del r")] += 1
            seen[write(ROOT / "0" / "policy", "3")] += 1
        print("commands", names(seen), file=sys.stderr)
        return 0 if set(seen) <= {0, errno.EBUSY, errno.EEXIST, errno.ENOENT} else 1

    def opener() -> int:
        while time.monotonic() < deadline:
            try:
                os.close(os.open(DEV, os.O_RDWR))
            except OSError as e:
                assert e.errno == errno.EBUSY, e
        return 0

    def tenant() -> int:
        os.sched_yield()
        while time.monotonic() < deadline:
            try:
                fd = os.open(DEV, os.O_RDWR)
            except OSError as e:
                assert e.errno == errno.EBUSY, e
                continue
            try:
                abi.mem(fd, abi.MEM_RESERVE, 0, 4096)
            finally:
                os.close(fd)
        return 0

    def in_cg(fn: Callable[[], int], cg: Path) -> Callable[[], int]:
        def go() -> int:
            (cg / "cgroup.procs").write_text("0\n")
            return fn()

        return go

    pids = [fork(flipper), fork(commands), fork(opener), fork(in_cg(tenant, cgs[A]))]
    assert wait_all(pids) == [0, 0, 0, 0]
    assert write(UPGRADE, "abort") == 0
    ctl("del r")
    assert sorted(registered()) == sorted([A, B, C, D]) and refcount() == 4
    cleanup(A, B, C, D)


def test_refused_opens_never_hold_an_export_off(container: MakeContainer) -> None:
    """/dev/gpushare is 0666: a user outside every container opening it in a
    loop is refused (ENOENT, or EBUSY while frozen) and must never be counted
    as an open file, not even for the moment the refusal takes, or any user
    could keep every export refused (EBUSY) and so block upgrades."""
    from tests.guest.kmod_support import NOBODY

    need_two_cpus()
    populate(container)  # registrations make the opener's lookup longer
    deadline = time.monotonic() + seconds("GPUSHARE_RACE_S", 6)
    mark("upgrade race: export against refused opens")

    def hammer() -> int:
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        seen: collections.Counter[int] = collections.Counter()
        while time.monotonic() < deadline:
            seen[errno_of(lambda: os.close(os.open(DEV, os.O_RDWR)))] += 1
        print("refused opener", names(seen), file=sys.stderr)
        return 0 if set(seen) <= {errno.ENOENT, errno.EBUSY} else 1

    pids = [fork(hammer) for _ in range(3)]
    exports: collections.Counter[int] = collections.Counter()
    try:
        while time.monotonic() < deadline or sum(exports.values()) < 50:
            exports[write(UPGRADE, "export")] += 1
            assert write(UPGRADE, "abort") == 0
    finally:
        assert wait_all(pids) == [0, 0, 0]
    print("exports against refused opens:", names(exports), file=sys.stderr)
    assert set(exports) == {0}, names(exports)
    assert header()[3] == "live" and refcount() == 4
    cleanup(A, B, C, D)


def test_race_replace_against_commands_and_opens(container: MakeContainer, tmp_path: Path) -> None:
    """Whole upgrades N -> N+1 -> N ... while other processes write commands,
    settings and the upgrade file, and open the device; the registry survives each."""
    need_next()
    need_two_cpus()
    cgs = populate(container)
    dump = without_r(read(CTL))
    stop = tmp_path / "stop"

    def noise() -> int:
        seen: collections.Counter[int] = collections.Counter()
        while not stop.exists():
            seen[ctl(f"add r 1:{GIB}")] += 1
            seen[ctl("del r")] += 1
            seen[write(ROOT / "1" / "slice_us", "2000")] += 1
            seen[write(UPGRADE, "gpushare-upgrade 1 0.0.0 exported\nnop\n")] += 1
            seen[errno_of(lambda: os.close(os.open(DEV, os.O_RDWR)))] += 1
        print("noise", names(seen), file=sys.stderr)
        return 0

    mark("upgrade race: replace")
    pid = fork(noise)
    rounds = 0
    deadline = time.monotonic() + seconds("GPUSHARE_RACE_S", 6)
    try:
        while time.monotonic() < deadline or rounds < 2:
            ko = NEXT if rounds % 2 == 0 else KO
            for _ in range(1000):  # the noise may hold a reference for a moment
                if write(UPGRADE, "export") == 0:
                    break
            state = state_now()
            assert state.state == "exported"
            for _ in range(1000):
                if delete_module("gpushare") == 0:
                    break
            assert not loaded()
            assert finit_module(ko, "await_import=1") == 0
            assert write(UPGRADE, state.text()) == 0
            rounds += 1
            assert without_r(read(CTL)) == dump, rounds
    finally:
        stop.touch()
        assert wait_all([pid]) == [0]
    ctl("del r")
    assert refcount() == 4 and quota_seen(cgs[B]) == [[0, 2 * GIB, 20, 1]]
    cleanup(A, B, C, D)


def test_race_rmmod_against_abort() -> None:
    """An exported module lets rmmod go; an `abort` racing that rmmod either
    wins (the registrations pin the module again, rmmod is refused) or finds
    the module going (ENODEV/ENOENT/EIO) and takes no reference: never a module
    freed under its references (the kernel would BUG on the refcount)."""
    need_two_cpus()
    deadline = time.monotonic() + seconds("GPUSHARE_RACE_S", 6)
    outcomes: collections.Counter[str] = collections.Counter()
    mark("upgrade race: rmmod against abort")
    rounds = 0
    while time.monotonic() < deadline or rounds < 4:
        rounds += 1
        if not loaded():
            load()
        if not registered():
            ok(f"gpu 0 {16 * GIB}")
            for cid in (A, B, C):
                ok(f"add {cid} 0:{GIB}")
        assert write(UPGRADE, "export") == 0 and refcount() == 0
        pid = fork(lambda: write(UPGRADE, "abort"))
        gone = delete_module("gpushare")
        [aborted] = wait_all([pid])
        if gone == 0:
            # ENODEV: its write found the module going; ENOENT: it opened
            # no file; EIO: it opened the file, whose removal then came
            # before its write (procfs answers EIO).  Never a reference.
            assert not loaded() and aborted in (errno.ENODEV, errno.ENOENT, errno.EIO), aborted
            outcomes["unloaded"] += 1
        else:
            assert gone in (errno.EAGAIN, errno.EBUSY, errno.EWOULDBLOCK), os.strerror(gone)
            assert aborted == 0 and header()[3] == "live" and refcount() == 3
            outcomes["aborted first"] += 1
    print("rmmod against abort:", dict(outcomes), file=sys.stderr)
    if not loaded():
        load()
    cleanup(A, B, C)
