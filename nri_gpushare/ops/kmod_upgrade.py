"""`nri-gpushare kmod-upgrade`: replace the loaded gpushare.ko by another version
without unregistering any container (kmod/README.md, "Upgrading the module").

The module hands its state over through /proc/gpushare/upgrade: `export`
freezes its registry and lets rmmod go with containers registered (refused
while any /dev/gpushare file is open: a live ledger cannot move to another
module); reading the file then gives the final state; the new version is
loaded with `await_import=1` (frozen, empty) and takes the state in one
all-or-nothing write.  The steps, each of which a rerun resumes:

1. export the old module (refused, nothing changed, while files are open),
2. read its state and save it to `<state-dir>/kmod-upgrade.state` (temp file,
   fsync, rename, fsync of the directory) before anything is unloaded,
3. rmmod the old module, load the new one waiting for the state,
4. import the saved state and verify it: registrations, settings, GPU time,
   bindings and the reference count as saved.

A failure after step 2 rolls back as well as it can (the module `modprobe
gpushare` gives, with the same state) and always leaves the state file and a
message saying what to do.  A rerun after an interruption (kill -9, a crash)
carries on from the module's state (`exported`, not loaded, `importing`)
with the saved file.  A state saved before a reboot is stale (its containers
and cgroups are gone) and is never imported.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import os
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

MODULE = "gpushare"
STATE_FILE = "kmod-upgrade.state"
MAGIC = "gpushare-upgrade"
FORMAT = 1
COMMENT = "# nri-gpushare kmod-upgrade"

EXIT_OK = 0
EXIT_REFUSED = 1  # nothing changed: the module is busy or not in a state to upgrade
EXIT_FAILED = 2  # the upgrade did not complete; the message says what to do

FALLBACK = (
    "The fallback: drain the node's GPU work (stop the GPU containers, or wait until no"
    " process uses a GPU), `nri-gpushare uninstall`, load the new module"
    " (`modprobe gpushare` or `insmod <path>`), then start the containers again."
)


class UpgradeError(Exception):
    """A step failed; the message is for a person."""


class AnotherUpgrade(UpgradeError):
    """Another `nri-gpushare kmod-upgrade` runs: nothing was done."""


@dataclass(frozen=True)
class ModuleState:
    """The text of /proc/gpushare/upgrade, split."""

    version: str
    state: str  # live | exported | importing
    lines: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> ModuleState:
        first, _, rest = text.partition("\n")
        words = first.split()
        if len(words) != 4 or words[0] != MAGIC:
            raise UpgradeError(f"not a gpushare state (its first line is {first[:80]!r})")
        if words[1] != str(FORMAT):
            raise UpgradeError(
                f"state format {words[1]} is not one this tool knows ({FORMAT}): use the"
                " nri-gpushare that matches the module"
            )
        return cls(words[2], words[3], tuple(line for line in rest.splitlines() if line))

    def text(self) -> str:
        return "\n".join([f"{MAGIC} {FORMAT} {self.version} {self.state}", *self.lines]) + "\n"

    def of(self, verb: str) -> list[str]:
        return [line for line in self.lines if line.split(" ", 1)[0] == verb]

    def containers(self) -> list[str]:
        return [words[1] for words in (line.split() for line in self.of("add")) if len(words) > 1]


class Host(Protocol):
    """What the upgrade needs of the machine (a fake stands in for it in unit tests)."""

    def read_state(self) -> str | None:
        """/proc/gpushare/upgrade's text; None when the module is not loaded."""

    def write_state(self, text: str) -> None:
        """One write(2) to /proc/gpushare/upgrade (OSError with the kernel's errno)."""

    def unload(self) -> None:
        """rmmod gpushare (OSError)."""

    def load(self, module: Path | None) -> None:
        """Load `module` (modprobe's gpushare when None) with await_import=1 (OSError)."""

    def refcount(self) -> int | None:
        """The module's reference count; None when not loaded."""

    def holders(self) -> list[tuple[int, str]]:
        """(pid, command) of the processes that hold /dev/gpushare open."""

    def boot_id(self) -> str: ...


class SystemHost:
    """The real machine: procfs, sysfs, finit_module(2) and modprobe."""

    def __init__(self, kmod_root: str | os.PathLike[str] = "/proc/gpushare") -> None:
        self.root = Path(kmod_root)

    def read_state(self) -> str | None:
        try:
            return (self.root / "upgrade").read_text()
        except FileNotFoundError:
            if self.root.exists():
                raise UpgradeError(
                    f"{self.root} has no upgrade file: the loaded gpushare predates"
                    f" hot upgrades. {FALLBACK}"
                ) from None
            return None

    def write_state(self, text: str) -> None:
        fd = os.open(self.root / "upgrade", os.O_WRONLY)
        try:
            data = text.encode()
            if os.write(fd, data) != len(data):
                raise OSError(errno.EIO, "short write")
        finally:
            os.close(fd)

    def unload(self) -> None:
        from nri_gpushare.ops.kmod_admin import delete_module

        delete_module(MODULE)

    def load(self, module: Path | None) -> None:
        if module is None:
            done = subprocess.run(
                ["modprobe", MODULE, "await_import=1"], capture_output=True, text=True
            )
            if done.returncode:
                raise OSError(errno.EIO, (done.stderr or done.stdout).strip() or "modprobe failed")
            return
        number = {"x86_64": 313, "aarch64": 273}[os.uname().machine]
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(module, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.syscall(number, fd, b"await_import=1", 0) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), str(module))
        finally:
            os.close(fd)

    def refcount(self) -> int | None:
        from nri_gpushare.ops.kmod_admin import module_refcount

        return module_refcount(MODULE)

    def holders(self) -> list[tuple[int, str]]:
        from nri_gpushare.ops.kmod_admin import device_number, holders

        rdev = device_number()
        return holders(rdev) if rdev is not None else []

    def boot_id(self) -> str:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


# -- the saved state ---------------------------------------------------------------


def check_private(path: Path, directory: bool) -> None:
    """Refuse a state file or directory that another user could have written: the
    saved state is imported into the kernel as it is (registrations, quotas,
    bindings), so only a file of this user, in a directory only this user (or
    root) can change, is trusted."""
    st = os.stat(path) if directory else os.lstat(path)
    kind = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    owners = {0, os.geteuid()} if directory else {os.geteuid()}
    if not kind or st.st_uid not in owners or st.st_mode & 0o022:
        what = "directory" if directory else "regular file"
        raise UpgradeError(
            f"refusing {path}: the upgrade's state must be a {what} owned by uid"
            f" {os.geteuid()} and writable by nobody else (it has uid {st.st_uid}, mode"
            f" {stat.filemode(st.st_mode)}); another user could have written it. Check it,"
            " fix its owner and mode (or use another --state-dir), then run again"
        )


def save_state(path: Path, state: ModuleState, boot_id: str) -> None:
    """Write the state durably: a temp file, fsync, rename, fsync of the directory."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private(path.parent, directory=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileExistsError:  # left by a killed run with this PID
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o600)
    try:
        os.write(fd, f"{COMMENT} boot_id={boot_id}\n{state.text()}".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load_saved(path: Path) -> tuple[str, ModuleState]:
    """(boot id, state) of a saved file."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise UpgradeError(f"{path} is not a state this tool saved (not UTF-8)") from None
    first, _, rest = text.partition("\n")
    if not first.startswith(COMMENT + " boot_id="):
        raise UpgradeError(f"{path} is not a state this tool saved")
    return first.split("=", 1)[1], ModuleState.parse(rest)


def set_aside(path: Path, why: str) -> Path:
    """Rename a saved state that must not be imported (kept for a person to read)."""
    target = path.with_name(f"{path.name}.{why}-{time.strftime('%Y%m%dT%H%M%S')}")
    os.rename(path, target)
    return target


# -- the upgrade -------------------------------------------------------------------


@dataclass
class Upgrade:
    host: Host
    state_file: Path
    module: Path | None = None  # None: what `modprobe gpushare` loads
    log: Any = None  # a callable(str) for progress lines

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
    def _exclusive(self) -> Any:
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
                ) from None
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


# -- the command ----------------------------------------------------------------------


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "kmod-upgrade",
        help="replace the loaded gpushare.ko by another version, keeping every registration",
    )
    parser.add_argument(
        "--module", type=Path, help="the new gpushare.ko (default: what modprobe gpushare loads)"
    )
    parser.add_argument("--kmod-root", default="/proc/gpushare")
    parser.add_argument("--state-dir", type=Path, default=Path("/var/lib/nri-gpushare"))
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    upgrade = Upgrade(
        SystemHost(args.kmod_root),
        args.state_dir / STATE_FILE,
        module=args.module,
        log=lambda line: print(f"nri-gpushare kmod-upgrade: {line}"),
    )
    code, message = upgrade.run()
    print(message, file=sys.stderr if code else sys.stdout)
    return code
