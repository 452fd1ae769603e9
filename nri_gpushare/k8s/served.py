"""What the kubelet plugins (the device plugin and the DRA driver) share
about the sockets they serve: which file is ours, and closing a server
without cutting its streams short or removing another process's socket."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable

from grpclib.server import Server

log = logging.getLogger(__name__)

STOP_GRACE = 2.0
"""Seconds streams and requests get to end cleanly before a server is closed."""

Identity = tuple[int, int, int]


def identity(path: str) -> Identity | None:
    """What tells one file at `path` from a later one; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


async def close_server(
    server: Server,
    path: str,
    started: Identity | None,
    streams: Callable[[], int] | None = None,
) -> None:
    """Close `server` (served on `path`, whose file was `started`): its
    `streams` (ended by the caller) get `STOP_GRACE` to finish, and the
    socket file is removed only while it is still the one it served on."""
    if streams is not None:
        deadline = time.monotonic() + STOP_GRACE
        while streams() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the ended streams' trailers go out
    server.close()
    try:
        await asyncio.wait_for(server.wait_closed(), STOP_GRACE)
    except TimeoutError:
        log.warning("%s: requests still running after %.0f s", path, STOP_GRACE)
    if identity(path) == started:
        unlink(path)
