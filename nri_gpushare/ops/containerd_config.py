"""The part of `enable` / `disable` that touches the node: the containerd
binary that parses a config (`containerd --config FILE config dump`), and the
config file itself, replaced safely (backup, temp file beside it, fsync,
rename).  What to change in it is `nri_gpushare.ops.containerd_plan`'s.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nri_gpushare.ops.containerd_nri import ConfigEditError, NoTempFileError


@dataclass(frozen=True)
class ContainerdBinary:
    """A containerd binary, which parses configs for enable (`config dump`)."""

    path: str
    version: str  # "1.7.24~ds1"
    major: int

    @property
    def config_version(self) -> int:
        """The config version this containerd writes: 2 (1.x) or 3 (2.x)."""
        return 2 if self.major < 2 else 3

    @classmethod
    def find(cls, name: str) -> ContainerdBinary:
        path = shutil.which(name)
        if path is None:
            where = "on PATH" if os.sep not in name else "there"
            raise ConfigEditError(
                f"containerd binary {name!r} not found {where}: enable asks containerd to "
                "parse the result; pass --containerd /path/to/containerd"
            )
        out = _run([path, "--version"], f"{path} --version")
        match = re.search(r"\sv?(\d+)\.(\d+)\S*", out)
        if match is None:
            raise ConfigEditError(f"{path} --version: cannot read a version in {out.strip()!r}")
        return cls(path, match.group(0).strip(), int(match.group(1)))

    def dump(self, config: Path, label: str = "") -> dict[str, Any]:
        """containerd's effective config for `config` (imports merged, defaults filled in)."""
        out = _run(
            [self.path, "--config", str(config), "config", "dump"],
            f"containerd {self.version} cannot parse {label or config}",
        )
        try:
            return tomllib.loads(out)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigEditError(f"cannot read `containerd config dump`: {exc}") from None


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigEditError(f"{what}: {exc}") from None
    if done.returncode != 0:
        err = "\n".join(line for line in done.stderr.strip().splitlines()[-5:])
        raise ConfigEditError(f"{what}:\n{err or f'exit status {done.returncode}'}")
    return done.stdout


# -- files -------------------------------------------------------------------


class ConfigFile:
    """The config file: read it, validate a new text beside it, replace it safely."""

    def __init__(self, path: str) -> None:
        self.given = Path(path)
        self.path = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
        self.data: bytes | None = None

    def read(self) -> str | None:
        """The file's text; None if it does not exist.  ConfigEditError naming it."""
        try:
            return self._read()
        except ConfigEditError as exc:
            raise ConfigEditError(f"{self.path}: {exc}") from exc

    def _read(self) -> str | None:
        try:
            if not stat.S_ISREG(self.path.stat().st_mode):  # a FIFO would block the read
                raise ConfigEditError("not a regular file")
            self.data = self.path.read_bytes()
        except FileNotFoundError:
            if self.path.parent.is_dir():
                return None
            raise ConfigEditError(
                f"{self.path.parent} does not exist: is containerd installed? "
                "(create the directory to have enable write a new config there)"
            ) from None
        except OSError as exc:
            raise ConfigEditError(f"cannot read it: {exc.strerror}") from exc
        if self.data.startswith(b"\xef\xbb\xbf"):
            raise ConfigEditError(
                "it starts with a UTF-8 byte order mark, which containerd 2.x refuses to "
                f"parse: remove it (sed -i '1s/^\\xEF\\xBB\\xBF//' {self.path}) and run again"
            )
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigEditError("not UTF-8 text") from exc

    @property
    def imports_from(self) -> Path:
        """Where containerd resolves the config's relative `imports`: beside
        the path it is given (a link's directory, not its target's)."""
        return self.given.parent

    def temp(self, text: str, directory: Path | None = None) -> Path:
        """`text` in a hidden file beside the config (or in `directory`).

        The name does not end in .toml, so no `imports` glob picks it up.
        """
        directory = directory or self.path.parent
        try:
            fd, name = tempfile.mkstemp(
                prefix=f".{self.path.name}.", suffix=".nri-gpushare.tmp", dir=directory
            )
        except OSError as exc:
            raise NoTempFileError(
                f"cannot write a temporary file in {directory}: {exc.strerror}"
            ) from exc
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
        except OSError as exc:
            os.unlink(name)
            raise ConfigEditError(f"cannot write {name}: {exc.strerror}") from exc
        return Path(name)

    def backup(self) -> Path:
        """Copy the current file beside it, timestamped, with its mode and owner."""
        assert self.data is not None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        st = self.path.stat()
        for n in range(100):
            suffix = f".nri-gpushare-{stamp}" + (f".{n}" if n else "") + ".bak"
            target = self.path.with_name(self.path.name + suffix)
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, st.st_mode & 0o7777)
            except FileExistsError:
                continue
            except OSError as exc:
                raise ConfigEditError(f"cannot write the backup {target}: {exc.strerror}") from exc
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(self.data)
                    out.flush()
                    os.fchmod(out.fileno(), st.st_mode & 0o7777)
                    _chown(out.fileno(), st.st_uid, st.st_gid)
                    os.fsync(out.fileno())
            except OSError as exc:  # a full disk: no partial backup stays
                target.unlink(missing_ok=True)
                raise ConfigEditError(f"cannot write the backup {target}: {exc.strerror}") from exc
            return target
        raise ConfigEditError("too many backups this second")

    def replace(self, temp: Path) -> Path | None:
        """Move `temp` over the file (backup first); returns the backup."""
        self._unchanged_since_read()
        backup = None
        if self.data is not None:
            backup = self.backup()
            st = self.path.stat()
            os.chmod(temp, st.st_mode & 0o7777)
            _chown_path(temp, st.st_uid, st.st_gid)
        else:
            os.chmod(temp, 0o644)
        os.replace(temp, self.path)
        _fsync_dir(self.path.parent)
        return backup

    def remove(self) -> Path:
        self._unchanged_since_read()
        backup = self.backup()
        self.path.unlink()
        _fsync_dir(self.path.parent)
        return backup

    def _unchanged_since_read(self) -> None:
        try:
            now: bytes | None = self.path.read_bytes()
        except FileNotFoundError:
            now = None
        if now != self.data:
            raise ConfigEditError("it changed while enable was editing it; run it again")


def _chown(fd: int, uid: int, gid: int) -> None:
    try:
        os.fchown(fd, uid, gid)
    except PermissionError:
        pass  # not root: the file is ours anyway


def _chown_path(path: Path, uid: int, gid: int) -> None:
    try:
        os.chown(path, uid, gid)
    except PermissionError:
        pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
