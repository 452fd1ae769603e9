"""One blocking HTTPS request to the API server, standard library only: what
`events` (Warning events) and `dra.kubeapi` (ResourceSlices, ResourceClaims)
share.  Each caller reads its token (`token`, called after the address is
checked) and turns `CallError` into its own error type."""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

USER_AGENT = "nri-gpushare"


class CallError(Exception):
    """No answer: a bad address or CA, TLS, the network, a timeout."""


def status_message(answer: bytes) -> str:
    """The message of a metav1.Status answer (or the answer's text), cut short."""
    try:
        data = json.loads(answer)
        text = str(data.get("message", "")) if isinstance(data, dict) else ""
    except ValueError:
        text = answer.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text[:300] or "no message"


def call(
    server: str,
    ca_file: str,
    method: str,
    path: str,
    *,
    token: Callable[[], str],
    body: bytes | None = None,
    timeout: float,
    max_response: int,
) -> tuple[int, bytes]:
    """(HTTP status, at most `max_response` + 1 bytes of the answer): a
    caller sees a longer answer by its length."""
    url = urlsplit(server)
    if url.scheme != "https" or not url.hostname or url.path not in ("", "/"):
        raise CallError(f"API server {server!r} is not https://host:port")
    try:
        port = url.port or 443
    except ValueError as exc:
        raise CallError(f"API server {server!r} has a bad port") from exc
    headers = {
        "Authorization": f"Bearer {token()}",
        "Accept": "application/json",
        "User-Agent": USER_AGENT,
    }
    if body is not None:
        headers["Content-Type"] = "application/json"
    where = f"the API server {server}"
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise CallError(f"cannot load the cluster CA {ca_file}: {exc}") from None
    conn = http.client.HTTPSConnection(url.hostname, port, timeout=timeout, context=context)
    deadline = time.monotonic() + timeout
    try:
        conn.request(method, path, body=body, headers=headers)
        sock = conn.sock  # getresponse lets go of it when the answer ends the connection
        response = conn.getresponse()
        # `timeout` bounds the whole answer, not each read: a server that
        # trickles it holds this thread no longer.
        chunks: list[bytes] = []
        size = 0
        while size <= max_response:
            left = deadline - time.monotonic()
            if left <= 0 or sock is None:
                raise TimeoutError
            sock.settimeout(left)
            chunk = response.read1(max_response + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return response.status, b"".join(chunks)
    except TimeoutError:
        raise CallError(f"no answer from {where} within {timeout:g} s") from None
    except ssl.SSLError as exc:
        raise CallError(
            f"TLS with {where} failed ({exc.reason or exc}): is {ca_file} the cluster's CA?"
        ) from exc
    except (OSError, http.client.HTTPException) as exc:
        raise CallError(
            f"cannot reach {where}: {exc}; is the address right and the API server "
            "reachable from this node?"
        ) from None
    finally:
        conn.close()
