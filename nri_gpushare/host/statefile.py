"""The daemon's state file: its record of allocations, ``<state_dir>/allocations.json``.

Only the daemon may write it, so recovery can trust it where it cannot trust
anything a container carries: the directory is created mode 0700 and the file
0600, and both are refused (treated as absent, with an error) unless they are
owned by the daemon's user and writable by no one else.  The directory is
opened once and every file operation goes through that descriptor, so
swapping the path (or a parent) for a symlink later redirects nothing; a
lock on it keeps a second daemon out.

The records are a journal (`nri_gpushare.share.records`): a change is one
appended write; a snapshot replaces the file atomically (a fresh temporary
file, random name, created exclusively, renamed over the old one), so a
reader (a restarted daemon) sees the old records or the new ones; a write cut
short leaves at most a torn last line, which the reader skips.  There is no
fsync: the records only matter while their containers live,
and a crash of the machine that could lose unsynced data also ends every
container.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "allocations.json"
MAX_BYTES = 64 << 20  # far more than 16 GPUs x 25 containers need


def replace_file(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Replace `name` in the directory open as `dir_fd` with `data`, mode
    exactly `mode`, atomically: a fresh temporary file (random name, created
    exclusively, never through a link) renamed over it.  Raises OSError."""
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # exactly, whatever the umask
            f.write(data)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


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
        self._dir_fd: int | None = None
        self._journal_fd: int | None = None  # the records, open for appending

    def prepare(self) -> None:
        """Create the directory (0700) or check the one there, open and lock it;
        StateDirError if it is unusable or another daemon holds it."""
        try:
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(self.directory, 0o700)
            except FileExistsError:
                pass
            fd = os.open(
                self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            )
        except OSError as e:
            raise StateDirError(
                f"state_dir {self.directory}: cannot use it: {e.strerror} "
                f"(it must be a directory, not a symlink)"
            ) from e
        why = _unsafe(os.fstat(fd))
        if not why:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                why = "in use by another nri-gpushare daemon"
        if why:
            os.close(fd)
            raise StateDirError(
                f"state_dir {self.directory}: {why}; it must be this daemon's own "
                f"(e.g. chown root: and chmod 0700 it)"
            )
        self.close()
        self._dir_fd = fd

    def close(self) -> None:
        """Release the directory (and its lock)."""
        self._close_journal()
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def _dir(self) -> int:
        """The directory's descriptor, opened on first use (OSError if unusable)."""
        if self._dir_fd is None:
            try:
                self.prepare()
            except StateDirError as e:
                raise OSError(f"state_dir unusable: {e}") from e
        assert self._dir_fd is not None
        return self._dir_fd

    def load(self, name: str = FILE_NAME) -> str | None:
        """The records' text (`name`: another file of the directory); None
        when there are none or they cannot be trusted."""
        path = self.directory / name
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=self._dir())
        except FileNotFoundError:
            return None
        except OSError as e:
            log.error("state file %s cannot be read (%s): ignored", path, e)
            return None
        try:
            # Checked before os.fdopen, which raises for a directory.
            st = os.fstat(fd)
            why = _unsafe(st)
            if not stat.S_ISREG(st.st_mode):
                why = "not a regular file"
            elif st.st_size > MAX_BYTES:
                why = f"{st.st_size} bytes, more than records can be"
            if why:
                log.error("state file %s is %s: not trusted, ignored", path, why)
                return None
            f = os.fdopen(fd, "rb")
            fd = -1  # f closes it
            with f:
                data = f.read(MAX_BYTES + 1)
        except OSError as e:
            log.error("state file %s cannot be read (%s): ignored", path, e)
            return None
        finally:
            if fd >= 0:
                os.close(fd)
        try:
            return data.decode()
        except UnicodeDecodeError:
            log.error("state file %s is not UTF-8: ignored", path)
            return None

    def replace(self, text: str, name: str = FILE_NAME) -> None:
        """Replace the records (`name`: another file of the directory)
        atomically; raises OSError."""
        replace_file(self._dir(), name, text.encode(), 0o600)
        if name == FILE_NAME:
            self._close_journal()  # it wrote to the file just replaced

    def append(self, text: str) -> None:
        """Add whole lines at the end of the records (one write); raises OSError."""
        if self._journal_fd is None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            self._journal_fd = os.open(FILE_NAME, flags, 0o600, dir_fd=self._dir())
        data = text.encode()
        if os.write(self._journal_fd, data) != len(data):
            raise OSError(f"short write to {self.path} (disk full?)")

    def _close_journal(self) -> None:
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None


CLAIMS_FILE = "claims.json"


class ClaimFile:
    """The prepared DRA claims (a `ClaimStore`): one more file in the
    directory `state` holds, replaced whole at each change."""

    def __init__(self, state: StateFile, name: str = CLAIMS_FILE) -> None:
        self.state = state
        self.name = name

    def load(self) -> str | None:
        return self.state.load(self.name)

    def replace(self, text: str) -> None:
        self.state.replace(text, self.name)
