"""The steps of `nri-gpushare kmod-upgrade` (see `nri_gpushare.ops.kmod_upgrade`
for the procedure): export, save, unload, load, import, verify, and the
rollback; each step a rerun resumes, against a `Host` (the machine, or a fake
in the unit tests).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nri_gpushare.ops.kmod_upgrade_state import (
    FALLBACK,
    MODULE,
    AnotherUpgrade,
    ModuleState,
    UpgradeError,
    check_private,
    load_saved,
    save_state,
    set_aside,
)

if TYPE_CHECKING:
    from nri_gpushare.ops.kmod_upgrade import Host

EXIT_OK = 0
EXIT_REFUSED = 1  # nothing changed: the module is busy or not in a state to upgrade
EXIT_FAILED = 2  # the upgrade did not complete; the message says what to do


@dataclass
class Upgrade:
    host: Host
    state_file: Path
    module: Path | None = None  # None: what `modprobe gpushare` loads
    log: Callable[[str], object] | None = None  # told each progress line

    def say(self, message: str) -> None:
        if self.log is not None:
            self.log(message)

    def run(self) -> tuple[int, str]:
        try:
            with self._exclusive():
                return self._run()
        except AnotherUpgrade as e:
            return EXIT_REFUSED, str(e)
        except UpgradeError as e:
            return EXIT_FAILED, str(e)
        except OSError as e:  # not root, the state directory full or read-only, ...
            where = f" ({e.filename})" if e.filename else ""
            return EXIT_FAILED, f"{e.strerror or e}{where}. {self._where_things_are()}"

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One upgrade at a time: a second one's export would answer "again:
        nothing", and its rmmod could unload the first one's new module while
        that waits for its state.  Checks the state directory before anything."""
        directory = self.state_file.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_private(directory, directory=True)
        lock = directory / f"{self.state_file.name}.lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AnotherUpgrade(
                    f"another nri-gpushare kmod-upgrade is running (it holds {lock}):"
                    " nothing was done; wait for it to finish"
                ) from None
            yield
        finally:
            os.close(fd)

    def _where_things_are(self) -> str:
        """Where the state is now, and how to go on, after an unexpected failure."""
        try:
            text = self.host.read_state()
        except (OSError, UpgradeError):
            text = None
        state = ModuleState.parse(text).state if text else "not loaded"
        saved = self.state_file.exists()
        if state == "live":
            return f"{MODULE} runs on ({state}); nothing was lost."
        if state == "exported":
            return (
                f"{MODULE} is frozen (exported) and still holds every registration: fix the"
                " cause and run `nri-gpushare kmod-upgrade` again, or write 'abort' to"
                " /proc/gpushare/upgrade to run it on."
            )
        if saved:
            return (
                f"{MODULE} is {state}; the state is saved in {self.state_file}: fix the cause"
                " and run `nri-gpushare kmod-upgrade` again."
            )
        return f"{MODULE} is {state}; no saved state."

    def _run(self) -> tuple[int, str]:
        text = self.host.read_state()
        saved = self._saved()
        if text is None:
            if saved is None:
                return EXIT_REFUSED, f"{MODULE} is not loaded: nothing to upgrade"
            self.say(f"{MODULE} is not loaded: resuming with {self.state_file}")
            return self._install(saved, "")
        current = ModuleState.parse(text)
        if current.state == "importing":
            if saved is None:
                return EXIT_FAILED, (
                    f"{MODULE} {current.version} waits for an upgrade's state but there is none"
                    f" in {self.state_file}: write 'abort' to /proc/gpushare/upgrade to run it"
                    " empty (its containers must then be registered again)"
                )
            self.say(f"{MODULE} {current.version} waits for the state: importing {self.state_file}")
            return self._import(saved, current.version, "")
        if current.state == "live" and saved is not None:
            if current.containers() and set(current.of("add")) == set(saved.of("add")):
                # Killed after the import, before its check: finish that.
                self.say(f"{MODULE} {current.version} holds the saved state: verifying")
                return self._verify(saved, "")
            if current.containers():
                return EXIT_REFUSED, (
                    f"{self.state_file} holds the state of an unfinished upgrade, but {MODULE}"
                    f" {current.version} runs with {len(current.containers())} containers"
                    f" registered: compare them, then remove {self.state_file} and run again"
                )
            self.say(f"{MODULE} {current.version} runs empty: importing {self.state_file}")
            return self._import(saved, current.version, "")
        if current.state == "live":
            refusal = self._export()
            if refusal:
                return EXIT_REFUSED, refusal
        # Exported (now or by an interrupted run): the state read now is final.
        final = self._read()
        if final.state != "exported":
            raise UpgradeError(f"{MODULE} is {final.state} after the export; run again")
        save_state(self.state_file, final, self.host.boot_id())
        self.say(
            f"saved the state of {MODULE} {final.version} ({len(final.containers())}"
            f" containers) to {self.state_file}"
        )
        try:
            self.host.unload()
        except OSError as e:
            return self._abort_export(final, e)
        return self._install(final, final.version)

    # -- steps ---------------------------------------------------------------------

    def _saved(self) -> ModuleState | None:
        """The saved state of an unfinished upgrade of this boot; an older one is set aside."""
        if self.state_file.parent.exists():
            check_private(self.state_file.parent, directory=True)
        if not self.state_file.exists():
            return None
        check_private(self.state_file, directory=False)
        boot, state = load_saved(self.state_file)
        if boot != self.host.boot_id():
            moved = set_aside(self.state_file, "stale")
            self.say(f"{self.state_file} was saved before a reboot: set aside as {moved}")
            return None
        return state

    def _read(self) -> ModuleState:
        text = self.host.read_state()
        if text is None:
            raise UpgradeError(f"{MODULE} is no longer loaded")
        return ModuleState.parse(text)

    def _export(self) -> str:
        """'' once exported, else why it was refused (nothing changed)."""
        try:
            self.host.write_state("export")
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise UpgradeError(
                    f"{MODULE} refused the export: {os.strerror(e.errno or 0)}"
                ) from e
            held = self.host.holders()
            who = (
                ", ".join(f"PID {pid} ({comm})" for pid, comm in held)
                if held
                else "a process (none holds it now: try again)"
            )
            return (
                f"refusing to upgrade {MODULE}: /dev/gpushare is open, held by {who}; an open"
                " file's memory ledger and compute scheduling live in the running module and"
                " cannot move to another. Nothing was changed. Wait until these processes end"
                f" (or stop them), then run `nri-gpushare kmod-upgrade` again. {FALLBACK}"
            )
        self.say(f"exported {MODULE}: registry frozen")
        return ""

    def _abort_export(self, state: ModuleState, e: OSError) -> tuple[int, str]:
        why = os.strerror(e.errno or 0)
        try:
            self.host.write_state("abort")
        except OSError as e2:
            return EXIT_FAILED, (
                f"rmmod {MODULE} failed ({why}) and the export could not be undone"
                f" ({os.strerror(e2.errno or 0)}); the state is saved in {self.state_file}."
                f" Write 'abort' to /proc/gpushare/upgrade to run {MODULE} {state.version} on"
            )
        set_aside(self.state_file, "aborted")
        return EXIT_FAILED, (
            f"rmmod {MODULE} failed ({why}, reference count {self.host.refcount()}): the export"
            f" was undone and {MODULE} {state.version} runs on unchanged; run again"
        )

    def _install(self, state: ModuleState, old: str) -> tuple[int, str]:
        """Load the new module and import; on failure roll back to modprobe's."""
        what = str(self.module) if self.module else f"modprobe {MODULE}"
        try:
            self.host.load(self.module)
        except OSError as e:
            return self._rollback(state, f"loading {what} failed: {e.strerror or e}")
        new = self._read()
        return self._import(state, new.version, old)

    def _import(self, state: ModuleState, version: str, old: str) -> tuple[int, str]:
        try:
            self.host.write_state(state.text())
        except OSError as e:
            return self._rollback(
                state,
                f"{MODULE} {version} refused the state: {os.strerror(e.errno or 0)}"
                " (see dmesg for the line)",
            )
        return self._verify(state, old)

    def _verify(self, saved: ModuleState, old: str) -> tuple[int, str]:
        for _ in range(3):  # a container registered meanwhile changes both: read again
            new = self._read()
            refs = self.host.refcount()
            if self._read() == new:
                break
        problems = []
        if new.state != "live":
            problems.append(f"the module is {new.state}, not live")
        adds = set(new.of("add"))
        for verb in ("gpu", "set", "add"):
            missing = [line for line in saved.of(verb) if line not in new.lines]
            problems += [f"missing after the import: {line}" for line in missing]
        # GPU time only grows: a container's process may use the GPU at once.
        now = {tuple(line.split()[1:3]): int(line.split()[3]) for line in new.of("gputime")}
        for line in saved.of("gputime"):
            _, cid, gpu, ns = line.split()
            if now.get((cid, gpu), -1) < int(ns):
                problems.append(f"GPU time not carried over: {line}")
        # One reference per registration; more while a container's process has
        # /dev/gpushare open, which it may do as soon as the module is live.
        if refs is None or refs < len(adds):
            problems.append(f"reference count {refs}, but {len(adds)} containers are registered")
        if problems:
            raise UpgradeError(
                f"the import into {MODULE} {new.version} does not match {self.state_file}: "
                + "; ".join(problems)
                + f". The saved state stays in {self.state_file}; compare it with"
                " /proc/gpushare/upgrade"
            )
        unbound = [line for line in saved.of("bind") if line not in new.lines]
        done = set_aside(self.state_file, "imported")
        n = len(saved.containers())
        message = (
            f"upgraded {MODULE} {old or '(unloaded)'} -> {new.version}: {n} container"
            f"{'s' if n != 1 else ''}, {len(saved.of('bind')) - len(unbound)} bindings,"
            f" {len(saved.of('gpu'))} GPU{'s' if len(saved.of('gpu')) != 1 else ''}"
            " with their settings carried over"
            f" (reference count {refs}); the state is kept in {done}"
        )
        if unbound:
            message += (
                "\nnot bound again (their cgroups were removed meanwhile: those containers"
                " ended):\n" + "\n".join(f"  {line}" for line in unbound)
            )
        return EXIT_OK, message

    def _rollback(self, state: ModuleState, why: str) -> tuple[int, str]:
        """Load `modprobe gpushare`'s module and import the state into it."""
        manual = (
            f"The saved state is in {self.state_file}. To restore it by hand: `modprobe"
            f" {MODULE} await_import=1` (or `insmod <path> await_import=1`), then `tail -n +2"
            f" {self.state_file} | dd of=/proc/gpushare/upgrade bs=1M iflag=fullblock` (one"
            " write: the module refuses a state in pieces), or run `nri-gpushare kmod-upgrade`"
            " again."
        )
        self.say(f"{why}: rolling back to modprobe's {MODULE}")
        try:
            if self.host.read_state() is not None:
                self.host.unload()
            self.host.load(None)
            back = self._read()
            self.host.write_state(state.text())
        except (OSError, UpgradeError) as e:
            reason = e.strerror if isinstance(e, OSError) else str(e)
            return EXIT_FAILED, f"{why}; the rollback failed too ({reason}). {manual}"
        code, message = self._verify(state, "")
        return EXIT_FAILED, (
            f"{why}; rolled back: {MODULE} {back.version} (modprobe's) holds the state again"
            f" ({message})"
        )
