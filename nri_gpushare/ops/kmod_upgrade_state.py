"""The state `nri-gpushare kmod-upgrade` moves from one gpushare.ko to the
next: the text of /proc/gpushare/upgrade (`ModuleState`), and its copy saved
durably before anything is unloaded (`save_state`, `load_saved`), trusted
only when no other user could have written it (`check_private`).
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

MODULE = "gpushare"
STATE_FILE = "kmod-upgrade.state"
MAGIC = "gpushare-upgrade"
FORMAT = 1
COMMENT = "# nri-gpushare kmod-upgrade"

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
    except UnicodeDecodeError as e:
        raise UpgradeError(f"{path} is not a state this tool saved (not UTF-8)") from e
    first, _, rest = text.partition("\n")
    if not first.startswith(COMMENT + " boot_id="):
        raise UpgradeError(f"{path} is not a state this tool saved")
    return first.split("=", 1)[1], ModuleState.parse(rest)


def set_aside(path: Path, why: str) -> Path:
    """Rename a saved state that must not be imported (kept for a person to read)."""
    target = path.with_name(f"{path.name}.{why}-{time.strftime('%Y%m%dT%H%M%S')}")
    os.rename(path, target)
    return target
