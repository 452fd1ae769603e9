"""Unix sockets with the right mode from the moment they exist, and the
blocking client of the daemon's status socket (for the commands).

A socket is mode 0660 from the moment it exists; its directory is created
0750, and one already there is used only when it is the daemon's own and
nobody else can write it (or they could swap the socket).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

from nri_gpushare.config import ConfigError, load_config

SOCKET_MODE = 0o660
DIRECTORY_MODE = 0o750


class UnixServer:
    """A unix-socket server whose socket has its final mode from the moment
    it exists, in a directory checked as `_prepare_directory` says.
    Subclasses set `MODE` and `KEY` (the config key, for messages) and serve
    connections in `_serve`."""

    MODE = SOCKET_MODE
    KEY = "status_socket"

    def __init__(self, path: str) -> None:
        self.path = path
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Listen on `path`; ConfigError (saying what to do) when it cannot."""
        try:
            _prepare_directory(Path(self.path).parent)
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            sock = bind_socket(self.path, self.MODE)
        except ConfigError as e:
            raise ConfigError(f"{self.KEY} {self.path}: {e}") from None
        except OSError as e:
            where = f" ({e.filename})" if e.filename else ""
            raise ConfigError(
                f"{self.KEY} {self.path}: cannot create it: {e.strerror}{where}"
            ) from e
        self._server = await asyncio.start_unix_server(self._serve, sock=sock)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _prepare_directory(directory: Path) -> None:
    """Create `directory` 0750, or check the one there (never changing it)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(directory, DIRECTORY_MODE)
    except FileExistsError:
        pass
    else:
        os.chmod(directory, DIRECTORY_MODE)  # exactly: the umask may have taken more
        return
    st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{directory} is not a directory")
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"directory {directory} is owned by uid {st.st_uid}, not by this daemon "
            f"(uid {os.geteuid()}); use a directory of the daemon's own"
        )
    if st.st_mode & 0o022:
        raise ConfigError(
            f"directory {directory} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"use one only the daemon can write (e.g. chmod {DIRECTORY_MODE:04o} it)"
        )


def bind_socket(path: str, mode: int = SOCKET_MODE) -> socket.socket:
    """A unix socket bound to `path` with `mode`, not yet listening."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # bind() creates the file with the umask's mode: take away what 0660 does
        # not give (for this instant the umask is the process's, hence no await).
        old = os.umask(0o777 & ~mode)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, mode)  # exactly, before listen() lets anyone connect
    except BaseException:
        sock.close()
        raise
    return sock


def status_socket(config: str | None, default: str) -> str:
    """The socket to ask: the config's `status_socket` when a config is
    given (ConfigError when it cannot be read), else `default`."""
    if not config:
        return default
    return load_config(config).status_socket


def unreachable(path: str, exc: Exception) -> str:
    """What to tell a person whom `query_status` failed."""
    reason = getattr(exc, "strerror", None) or exc
    return f"cannot reach the plugin at {path}: {reason} (is `nri-gpushare run` running?)"


def query_status(path: str, timeout: float = 5.0) -> dict[str, Any]:
    """Fetch the running plugin's status (blocking; for the CLI)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    document = json.loads(b"".join(chunks))
    if not isinstance(document, dict):
        raise ValueError("the status reply is not a JSON object")
    return document
