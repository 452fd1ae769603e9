"""A fake of the daemon's local API for the hook and gpushare-runc tests: a
unix-socket server in a thread that records what it is asked and answers
canned replies (`protocol.encode_reply`).

The compiled front's ops (``runc-create``, ``hook``) are answered by the
daemon's own code for them (`nri_gpushare.daemon.local_bundle`: the bundle
read and edited for real), which asks the canned answers; `requests` records
what that code asked (as the Python programs would have asked it), `outer`
the front's own requests."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from nri_gpushare.daemon import local_bundle
from nri_gpushare.local.protocol import (
    ProtocolError,
    Reply,
    Request,
    decode_request,
    encode_reply,
)

Answer = Reply | bytes | Callable[[Request], Reply | bytes]

PLAN = {
    "devices": [
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "mode": 0o666},
        {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "mode": 0o666},
    ],
    "env": {"NVIDIA_VISIBLE_DEVICES": "GPU-b", "GPUSHARE_MEMORY_LIMIT": "2147483648"},
    "mounts": [
        {
            "destination": "/etc/ld.so.preload",
            "type": "bind",
            "source": "/var/lib/nri-gpushare/ld.so.preload",
            "options": ["rbind", "ro"],
        }
    ],
    "annotations": {"gpushare.io/assigned": "gpu1:2Gi"},
    "remove_annotations": ["gpushare.io/stale"],
}


class FakeDaemon:
    """Serves `path`; `answers[op]` is what it says to each op (default: ok,
    no plan; released true)."""

    def __init__(self, path: str, answers: dict[str, Answer] | None = None) -> None:
        self.path = path
        self.answers: dict[str, Answer] = {
            "create": Reply(True, plan=None),
            "start": Reply(True),
            "release": Reply(True, released=True),
        }
        self.answers.update(answers or {})
        self.requests: list[Request] = []
        self.outer: list[Request] = []
        self.raw: list[bytes] = []
        self.connections = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(16)
        self._sock.settimeout(0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def ops(self) -> list[str]:
        return [r.op for r in self.requests]

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(10)
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                self.raw.append(data)
                try:
                    request = decode_request(data)
                except ProtocolError as e:
                    conn.sendall(encode_reply(Reply.refused(str(e), "protocol")))
                    continue
                if request.op in ("runc-create", "hook"):
                    self.outer.append(request)
                    try:
                        answer = asyncio.run(self._front_op(request))
                    except _Raw as raw:
                        answer = raw.data
                else:
                    answer = self._answer(request)
                try:
                    conn.sendall(answer if isinstance(answer, bytes) else encode_reply(answer))
                except OSError:  # the client gave up waiting
                    pass

    def _answer(self, request: Request) -> Reply | bytes:
        self.requests.append(request)
        answer = self.answers[request.op]
        return answer(request) if callable(answer) else answer

    async def _front_op(self, request: Request) -> Reply:
        async def ask(inner: Request) -> Reply:
            answer = self._answer(inner)
            if isinstance(answer, bytes):
                raise _Raw(answer)  # what a daemon answering nonsense would send
            return answer

        if request.op == "hook":
            return await local_bundle.hook(request, ask)
        return await local_bundle.runc_create(request, ask)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


class _Raw(Exception):
    def __init__(self, data: bytes) -> None:
        self.data = data


@contextmanager
def short_dir() -> Iterator[str]:
    """A directory with a path short enough for a unix socket (pytest's tmp_path may not be)."""
    path = tempfile.mkdtemp(prefix="gs-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def fake_daemon(answers: dict[str, Answer] | None = None) -> Iterator[FakeDaemon]:
    with short_dir() as d:
        daemon = FakeDaemon(os.path.join(d, "api.sock"), answers)
        try:
            yield daemon
        finally:
            daemon.close()
