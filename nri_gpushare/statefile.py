"""The daemon's state file: its record of allocations, ``<state_dir>/allocations.json``.

Only the daemon may write it, so recovery can trust it where it cannot trust
anything a container carries: the directory is created mode 0700 and the file
0600, and both are refused (treated as absent, with an error) unless they are
owned by the daemon's user and writable by no one else.

Writes are atomic: the new text goes to a temporary file in the same directory
that then replaces the old one, so a reader (a restarted daemon) sees the old
records or the new ones, never a mix.  There is no fsync: the records only
matter while their containers live, and a crash of the machine that could lose
unsynced data also ends every container.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "allocations.json"
MAX_BYTES = 64 << 20  # far more than 16 GPUs x 25 containers need


class StateDirError(Exception):
    """The state directory cannot be used; the message says why and what to do."""


def _unsafe(st: os.stat_result) -> str:
    """Why a file or directory with this stat cannot be trusted ("" if it can)."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this daemon (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


class StateFile:
    """Allocation records in `directory` (an `AllocationStore`)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / FILE_NAME

    def prepare(self) -> None:
        """Create the directory (0700) or check the one there; StateDirError if unusable."""
        try:
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(self.directory, 0o700)
            except FileExistsError:
                pass
            st = os.lstat(self.directory)
        except OSError as e:
            raise StateDirError(f"state_dir {self.directory}: cannot create: {e.strerror}") from e
        if not stat.S_ISDIR(st.st_mode):
            raise StateDirError(f"state_dir {self.directory}: not a directory")
        if why := _unsafe(st):
            raise StateDirError(
                f"state_dir {self.directory}: {why}; it must be the daemon's own "
                f"(e.g. chown root: and chmod 0700 it)"
            )

    def load(self) -> str | None:
        """The records' text; None when there are none or they cannot be trusted."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            log.error("state file %s cannot be read (%s): ignored", self.path, e.strerror)
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            why = _unsafe(st)
            if not stat.S_ISREG(st.st_mode):
                why = "not a regular file"
            elif st.st_size > MAX_BYTES:
                why = f"{st.st_size} bytes, more than records can be"
            if why:
                log.error("state file %s is %s: not trusted, ignored", self.path, why)
                return None
            data = f.read(MAX_BYTES + 1)
        try:
            return data.decode()
        except UnicodeDecodeError:
            log.error("state file %s is not UTF-8: ignored", self.path)
            return None

    def save(self, text: str) -> None:
        """Replace the records atomically; raises OSError."""
        tmp = self.directory / f".{FILE_NAME}.{os.getpid()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o600)  # a leftover temporary file may have had another
                f.write(text.encode())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
