"""`nri-gpushare kmod-upgrade` (nri_gpushare.ops.kmod_upgrade) against a fake module:
every step's failure, and a kill at every step followed by a rerun, leaves
the state in the module or in the saved file (never nowhere) and a message
that says what to do."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from nri_gpushare.ops import kmod_upgrade as up
from nri_gpushare.ops import kmod_upgrade_state as saved
from nri_gpushare.ops import kmod_upgrade_steps as steps
from nri_gpushare.share.kernel import (
    GpuQuota,
    KmodError,
    ModuleNotLoaded,
    Registration,
    UpgradeInProgress,
)
from nri_gpushare.share.kmod_link import KernelLink
from nri_gpushare.share.model import ContainerInfo
from tests.fakes import FakeKernelModule, GiB, Inline, done, make_gpus

OLD, NEW, PROBED = Path("/old.ko"), Path("/new.ko"), None
LINES = (
    "set default_memsize 0",
    "gpu 0 100",
    "set 0 max_inst 5",
    "set 0 policy 3",
    "set 0 prio_ratio 80",
    "set 0 slice_us 10000",
    "set 0 drain_us 100000",
    "add a 0:10:30:0",
    "add b 0:20:0:1",
    "bind a 7",
    "bind b 8",
    "gputime a 0 5",
    "gputime b 0 0",
)


class Killed(BaseException):
    """kill -9 of the tool: nothing after it runs."""


class FakeHost:
    """gpushare.ko as the upgrade file shows it, with faults to inject."""

    def __init__(self) -> None:
        self.loaded = True
        self.version = "0.1.0"
        self.state = "live"
        self.lines: list[str] = list(LINES)
        self.open_files: list[tuple[int, str]] = []
        self.versions: dict[Path | None, str] = {NEW: "0.2.0", PROBED: "0.1.5", OLD: "0.1.0"}
        self.fail: dict[str, int] = {}  # step -> errno
        self.kill_at = ""
        self.boot = "boot-1"
        self.drop_on_import: set[str] = set()
        self.calls: list[str] = []

    def _step(self, name: str) -> None:
        self.calls.append(name)
        if self.kill_at == name:
            self.kill_at = ""
            raise Killed(name)
        if name in self.fail:
            raise OSError(self.fail[name], f"injected {name}")

    def text(self) -> str:
        return "\n".join([f"gpushare-upgrade 1 {self.version} {self.state}", *self.lines]) + "\n"

    def adds(self) -> int:
        return sum(line.startswith("add ") for line in self.lines)

    def read_state(self) -> str | None:
        return self.text() if self.loaded else None

    def write_state(self, text: str) -> None:
        assert self.loaded
        word = text.strip()
        if word == "export":
            self._step("export")
            if self.open_files:
                raise OSError(errno.EBUSY, "busy")
            if self.state == "importing":
                raise OSError(errno.EBUSY, "busy")
            self.state = "exported"
        elif word == "abort":
            self._step("abort")
            self.state = "live"
        else:
            self._step("import")
            if self.state == "exported" or (self.state == "live" and self.adds()):
                raise OSError(errno.EBUSY, "busy")
            state = saved.ModuleState.parse(text)
            assert state.state == "exported", "only an exported state is taken"
            self.lines = [line for line in state.lines if line not in self.drop_on_import]
            self.state = "live"

    def unload(self) -> None:
        self._step("unload")
        if self.state == "live" and self.adds():
            raise OSError(errno.EAGAIN, "in use")
        self.loaded = False
        self.lines = []

    def load(self, module: Path | None) -> None:
        self._step(f"load {module}")
        if self.loaded:
            raise OSError(errno.EEXIST, "exists")
        self.loaded = True
        self.version = self.versions[module]
        self.state = "importing"
        self.lines = []

    def refcount(self) -> int | None:
        if not self.loaded:
            return None
        return self.adds() + len(self.open_files) if self.state == "live" else 0

    def holders(self) -> list[tuple[int, str]]:
        return list(self.open_files)

    def boot_id(self) -> str:
        return self.boot


def run(host: FakeHost, tmp_path: Path, module: Path | None = NEW) -> tuple[int, str]:
    return steps.Upgrade(host, tmp_path / saved.STATE_FILE, module=module).run()


def saved_lines(tmp_path: Path) -> tuple[str, ...] | None:
    path = tmp_path / saved.STATE_FILE
    return saved.load_saved(path)[1].lines if path.exists() else None


def test_upgrade_moves_the_whole_state(tmp_path: Path) -> None:
    host = FakeHost()
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_OK, message
    assert message.startswith("upgraded gpushare 0.1.0 -> 0.2.0: 2 containers, 2 bindings")
    assert (host.version, host.state, tuple(host.lines)) == ("0.2.0", "live", LINES)
    assert host.calls == ["export", "unload", "load /new.ko", "import"]
    assert not (tmp_path / saved.STATE_FILE).exists()
    [kept] = tmp_path.glob(f"{saved.STATE_FILE}.imported-*")
    assert saved.load_saved(kept) == ("boot-1", saved.ModuleState("0.1.0", "exported", LINES))


def test_refused_while_the_device_is_open_changes_nothing(tmp_path: Path) -> None:
    host = FakeHost()
    host.open_files = [(4242, "python3")]
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_REFUSED
    assert "/dev/gpushare is open, held by PID 4242 (python3)" in message
    assert "Nothing was changed" in message and "nri-gpushare uninstall" in message
    assert (host.version, host.state, tuple(host.lines)) == ("0.1.0", "live", LINES)
    assert [p.name for p in tmp_path.iterdir()] == [f"{saved.STATE_FILE}.lock"], "no state saved"


def test_not_loaded_and_nothing_saved(tmp_path: Path) -> None:
    host = FakeHost()
    host.loaded = False
    assert run(host, tmp_path) == (steps.EXIT_REFUSED, "gpushare is not loaded: nothing to upgrade")


def test_new_module_fails_to_load_rolls_back(tmp_path: Path) -> None:
    host = FakeHost()
    host.fail["load /new.ko"] = errno.ENOEXEC
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_FAILED
    assert "loading /new.ko failed" in message and "rolled back" in message
    assert (host.version, tuple(host.lines)) == ("0.1.5", LINES)


def test_everything_fails_leaves_the_file_and_instructions(tmp_path: Path) -> None:
    host = FakeHost()
    host.fail["load /new.ko"] = errno.ENOEXEC
    host.fail["load None"] = errno.ENOENT
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_FAILED and not host.loaded
    assert "the rollback failed too" in message
    assert f"tail -n +2 {tmp_path / saved.STATE_FILE} | dd of=/proc/gpushare/upgrade" in message
    assert saved_lines(tmp_path) == LINES
    # Once the cause is fixed, a rerun finishes the job.
    del host.fail["load /new.ko"], host.fail["load None"]
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_OK, message
    assert (host.version, tuple(host.lines)) == ("0.2.0", LINES)


def test_import_refused_rolls_back(tmp_path: Path) -> None:
    host = FakeHost()
    host.fail["import"] = errno.EINVAL
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_FAILED
    assert "gpushare 0.2.0 refused the state: Invalid argument" in message
    # The fault stays: the rollback's import is refused too; the file stays.
    assert "the rollback failed too" in message and saved_lines(tmp_path) == LINES


def test_rmmod_refused_undoes_the_export(tmp_path: Path) -> None:
    host = FakeHost()
    host.fail["unload"] = errno.EAGAIN
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_FAILED and "the export was undone" in message
    assert (host.version, host.state, tuple(host.lines)) == ("0.1.0", "live", LINES)
    assert not (tmp_path / saved.STATE_FILE).exists()
    assert len(list(tmp_path.glob(f"{saved.STATE_FILE}.aborted-*"))) == 1


def test_a_mismatch_after_the_import_keeps_the_file(tmp_path: Path) -> None:
    host = FakeHost()
    host.drop_on_import = {"set 0 policy 3"}
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_FAILED
    assert "missing after the import: set 0 policy 3" in message
    assert saved_lines(tmp_path) == LINES


def test_a_binding_whose_cgroup_went_is_reported(tmp_path: Path) -> None:
    host = FakeHost()
    host.drop_on_import = {"bind b 8"}
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_OK, message
    assert "1 bindings" in message and "not bound again" in message and "  bind b 8" in message


@pytest.mark.parametrize(
    "step", ["export", "unload", "load /new.ko", "import", "save", "after-save"]
)
def test_killed_at_any_step_a_rerun_finishes(
    tmp_path: Path, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = FakeHost()
    if step in ("save", "after-save"):
        real = saved.save_state

        def save(path: Path, state: saved.ModuleState, boot: str) -> None:
            if step == "after-save":
                real(path, state, boot)
            monkeypatch.setattr(steps, "save_state", real)
            raise Killed(step)

        monkeypatch.setattr(steps, "save_state", save)
    else:
        host.kill_at = step
    with pytest.raises(Killed):
        run(host, tmp_path)
    # Nothing is lost: the module or the saved file holds every line.
    assert tuple(host.lines) == LINES or saved_lines(tmp_path) == LINES
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_OK, message
    assert (host.version, host.state, tuple(host.lines)) == ("0.2.0", "live", LINES)


def test_a_state_saved_before_a_reboot_is_never_imported(tmp_path: Path) -> None:
    host = FakeHost()
    host.fail["load /new.ko"] = errno.ENOEXEC
    host.fail["load None"] = errno.ENOENT
    run(host, tmp_path)
    assert saved_lines(tmp_path) == LINES
    host.boot = "boot-2"  # rebooted: containers and cgroups are gone
    host.fail.clear()
    host.load(PROBED)  # modules-load.d at boot
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_FAILED and "there is none" in message and "'abort'" in message
    assert host.lines == []
    assert len(list(tmp_path.glob(f"{saved.STATE_FILE}.stale-*"))) == 1


def test_unfinished_state_and_a_busy_module_refuses(tmp_path: Path) -> None:
    host = FakeHost()
    saved.save_state(
        tmp_path / saved.STATE_FILE, saved.ModuleState("0.0.9", "exported", ("gpu 0 1",)), "boot-1"
    )
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_REFUSED and "unfinished upgrade" in message
    assert tuple(host.lines) == LINES and host.state == "live"


def test_state_parsing_refuses_other_formats() -> None:
    with pytest.raises(saved.UpgradeError, match="format 2"):
        saved.ModuleState.parse("gpushare-upgrade 2 0.3.0 exported\n")
    with pytest.raises(saved.UpgradeError, match="not a gpushare state"):
        saved.ModuleState.parse("gpu 0 1\n")


def test_the_cli_registers_the_command() -> None:
    from nri_gpushare.cli.main import build_parser

    args = build_parser().parse_args(["kmod-upgrade", "--module", "/x.ko", "--state-dir", "/s"])
    assert args.func is up.main and args.module == Path("/x.ko") and args.state_dir == Path("/s")


# -- the daemon's link while the module is upgraded ----------------------------------

REG = Registration("c1", (GpuQuota(0, GiB, 30),))


def link_with(fake: FakeKernelModule) -> KernelLink:
    link = KernelLink(make_gpus(1), "required", Inline(fake))
    assert done(link.ready())
    fake.regs["c1"] = REG
    link.registered.add("c1")
    return link


@pytest.mark.parametrize("error", [UpgradeInProgress("frozen"), ModuleNotLoaded("away")])
def test_a_release_during_the_upgrade_lands_afterwards(error: KmodError) -> None:
    fake = FakeKernelModule()
    link = link_with(fake)
    fake.fail_next["unregister"] = error
    done(link.release("c1"))
    assert "c1" in fake.regs, "the module refused: still registered there (and handed over)"
    assert done(link.ready())
    assert "c1" not in fake.regs, "unregistered once the (new) module answers"
    assert done(link.ready()) and [c for c in fake.calls if c[0] == "unregister"] == [
        ("unregister", "c1"),
        ("unregister", "c1"),
    ]


@pytest.mark.parametrize("error", [UpgradeInProgress("frozen"), ModuleNotLoaded("away")])
def test_a_bind_during_the_upgrade_lands_afterwards(error: KmodError) -> None:
    fake = FakeKernelModule()
    link = link_with(fake)
    fake.fail_next["bind_cgroup"] = error
    done(link.bind(ContainerInfo("c1", "c", cgroups_path="/k8s.io/c1")))  # not refused
    assert fake.cgroups == {}
    assert done(link.ready())
    assert fake.cgroups == {"c1": "/k8s.io/c1"}


def test_a_held_up_bind_of_a_released_container_is_dropped() -> None:
    fake = FakeKernelModule()
    link = link_with(fake)
    fake.fail_next["bind_cgroup"] = UpgradeInProgress("frozen")
    done(link.bind(ContainerInfo("c1", "c", cgroups_path="/k8s.io/c1")))
    done(link.release("c1"))
    assert done(link.ready()) and fake.cgroups == {} and fake.regs == {}


def test_catch_up_lands_held_up_work_without_a_container_event() -> None:
    """The daemon's sampler calls catch_up() every few seconds, so a release
    held up by an upgrade lands without waiting for the next CreateContainer."""
    fake = FakeKernelModule()
    link = link_with(fake)
    fake.fail_next["unregister"] = UpgradeInProgress("frozen")
    done(link.release("c1"))
    assert "c1" in fake.regs
    calls = len(fake.calls)
    done(link.catch_up())
    assert "c1" not in fake.regs
    done(link.catch_up())  # nothing held up: no call at all
    assert [c for c in fake.calls[calls:] if c[0] != "loaded"] == [("unregister", "c1")]


async def test_the_daemon_sampler_catches_up(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from nri_gpushare.daemon import main as daemon

    seen: list[str] = []

    class Link:
        async def catch_up(self) -> None:
            seen.append("catch_up")

    class Service:
        link = Link()

        async def sample_compute(self) -> None:
            seen.append("sample")
            raise asyncio.CancelledError  # end the loop after one pass

    with pytest.raises(asyncio.CancelledError):
        await daemon.sample_compute(Service(), every=0)  # type: ignore[arg-type]
    assert seen == ["catch_up", "sample"]


def test_gpus_refused_by_a_frozen_module_say_so() -> None:
    fake = FakeKernelModule()
    fake.fail_next["declare_gpus"] = UpgradeInProgress("frozen")
    link = KernelLink(make_gpus(1), "required", Inline(fake))
    assert not done(link.ready())
    assert link.problem == "is being upgraded (nri-gpushare kmod-upgrade)"
    assert done(link.ready()) and link.loaded


@pytest.mark.parametrize("state", ["exported", "importing", "live", None])
def test_the_client_tells_an_upgrade_from_other_ebusy(
    tmp_path: Path, state: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nri_gpushare.kmod import procfs

    (tmp_path / "inst_ctl").write_text("")
    if state is not None:
        (tmp_path / "upgrade").write_text(f"gpushare-upgrade 1 0.1.0 {state}\ngpu 0 1\n")

    def busy(fd: int, data: bytes) -> int:
        raise OSError(errno.EBUSY, "busy")

    monkeypatch.setattr(procfs.os, "write", busy)
    client = procfs.ProcfsKernelModule(tmp_path)
    with pytest.raises(KmodError) as raised:
        client.bind_cgroup("c1", "/k8s.io/c1")
    frozen = state in ("exported", "importing")
    assert isinstance(raised.value, UpgradeInProgress) == frozen
    assert ("gpushare.ko is being upgraded" in str(raised.value)) == frozen
    assert raised.value.errno == errno.EBUSY


def test_an_unusable_state_dir_is_found_before_the_export(tmp_path: Path) -> None:
    host = FakeHost()
    blocked = tmp_path / "file"
    blocked.write_text("")
    code, message = steps.Upgrade(host, blocked / "sub" / saved.STATE_FILE, module=NEW).run()
    assert code == steps.EXIT_FAILED and "runs on (live); nothing was lost" in message
    assert host.calls == [] and host.state == "live" and tuple(host.lines) == LINES
    code, message = run(host, tmp_path)  # a writable one: goes
    assert code == steps.EXIT_OK, message


def test_a_state_dir_that_breaks_after_the_export_leaves_the_module_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = FakeHost()

    def full(path: Path, state: saved.ModuleState, boot: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(steps, "save_state", full)
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_FAILED
    assert "frozen (exported) and still holds every registration" in message
    assert host.state == "exported" and tuple(host.lines) == LINES and host.loaded
    monkeypatch.undo()
    code, message = run(host, tmp_path)  # fixed: carries on
    assert code == steps.EXIT_OK, message


def test_a_second_upgrade_at_the_same_time_is_refused(tmp_path: Path) -> None:
    host = FakeHost()
    inner: list[tuple[int, str]] = []
    real = host.write_state

    def export_then_second(text: str) -> None:
        real(text)
        if text == "export" and not inner:
            inner.append(run(host, tmp_path))  # another admin's run, meanwhile

    host.write_state = export_then_second  # type: ignore[method-assign]
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_OK, message
    assert inner[0][0] == steps.EXIT_REFUSED and "another nri-gpushare kmod-upgrade" in inner[0][1]
    assert (host.version, host.state, tuple(host.lines)) == ("0.2.0", "live", LINES)


def test_killed_after_the_import_a_rerun_finishes(tmp_path: Path) -> None:
    host = FakeHost()
    real = host.write_state

    def write_then_die(text: str) -> None:
        real(text)
        if text.startswith(saved.MAGIC):
            raise Killed("after the import")

    host.write_state = write_then_die  # type: ignore[method-assign]
    with pytest.raises(Killed):
        run(host, tmp_path)
    assert (host.state, tuple(host.lines)) == ("live", LINES) and saved_lines(tmp_path) == LINES
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_OK, message
    assert not (tmp_path / saved.STATE_FILE).exists()
    assert len(list(tmp_path.glob(f"{saved.STATE_FILE}.imported-*"))) == 1


@pytest.mark.parametrize("how", ["file 0666", "file 0620", "symlink", "dir 0777", "dir 0775"])
def test_a_state_another_user_could_have_written_is_never_imported(
    tmp_path: Path, how: str
) -> None:
    host = FakeHost()
    host.fail["load /new.ko"] = errno.ENOEXEC
    host.fail["load None"] = errno.ENOENT
    run(host, tmp_path)  # leaves the module unloaded and the state saved
    path = tmp_path / saved.STATE_FILE
    assert saved_lines(tmp_path) == LINES and not host.loaded
    host.fail.clear()
    what, _, mode = how.partition(" ")
    if what == "file":
        path.chmod(int(mode, 8))
    elif what == "dir":
        tmp_path.chmod(int(mode, 8))
    else:
        planted = tmp_path / "elsewhere"
        path.rename(planted)
        path.symlink_to(planted)
    host.calls.clear()
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_FAILED and "another user could have written it" in message
    assert host.calls == [] and not host.loaded, "nothing loaded, nothing imported"
    tmp_path.chmod(0o700)


def test_a_writable_state_dir_is_refused_before_the_export(tmp_path: Path) -> None:
    host = FakeHost()
    tmp_path.chmod(0o777)
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_FAILED and "another user could have written it" in message
    assert host.calls == [] and host.state == "live"
    tmp_path.chmod(0o700)


def test_the_state_dir_is_created_private(tmp_path: Path) -> None:
    host = FakeHost()
    code, message = steps.Upgrade(host, tmp_path / "new" / saved.STATE_FILE, module=NEW).run()
    assert code == steps.EXIT_OK, message
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700


def test_a_device_opened_right_after_the_import_is_no_failure(tmp_path: Path) -> None:
    host = FakeHost()
    real = host.write_state

    def import_then_open(text: str) -> None:
        real(text)
        if text.startswith(saved.MAGIC):  # a CUDA program starts at once
            host.open_files.append((4242, "python3"))

    host.write_state = import_then_open  # type: ignore[method-assign]
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_OK, message
    assert host.refcount() == len([line for line in LINES if line.startswith("add ")]) + 1


def test_a_reference_missing_after_the_import_is_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = FakeHost()
    real = host.refcount
    monkeypatch.setattr(host, "refcount", lambda: (real() or 1) - 1)
    code, message = run(host, tmp_path)
    assert code == steps.EXIT_FAILED and "reference count 1, but 2 containers" in message
    assert saved_lines(tmp_path) == LINES, "the saved state stays"
