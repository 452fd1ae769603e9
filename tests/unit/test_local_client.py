"""The local API's blocking client (gpushare-runc's and the hooks' Python
programs): a daemon too busy to accept at once is waited for, not taken for
one that is not running."""

from __future__ import annotations

import socket
import threading
import time

from nri_gpushare.local.client import Unavailable, ask
from nri_gpushare.local.protocol import Request


def test_a_full_listen_backlog_is_waited_out(tmp_path) -> None:
    path = str(tmp_path / "api.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(0)
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    filler.connect(path)  # the backlog is full: the next connect gets EAGAIN
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(path)
        full = False
    except BlockingIOError:
        full = True
    probe.close()
    assert full, "this kernel queued a connection past the backlog"

    def serve() -> None:
        time.sleep(0.2)  # busy, then it accepts the waiting connections
        first, _ = server.accept()
        first.close()  # the filler: it asks nothing
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b'{"ok":true,"released":true}\n')

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        reply = ask(Request("release", "default", "c1"), path, timeout=5)
        assert reply.ok and reply.released is True
    finally:
        filler.close()
        thread.join(5)
        server.close()


def test_a_backlog_never_freed_is_a_timeout(tmp_path) -> None:
    path = str(tmp_path / "api.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(0)
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    filler.connect(path)
    try:
        started = time.monotonic()
        try:
            ask(Request("release", "default", "c1"), path, timeout=0.3)
            raise AssertionError("answered")
        except Unavailable as e:
            assert "did not answer in 0.3 s" in str(e)
        assert time.monotonic() - started < 2
    finally:
        filler.close()
        server.close()
