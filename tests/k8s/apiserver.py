"""A test API server: HTTPS on 127.0.0.1 with a self-signed certificate,
objects in memory, the parts of resource.k8s.io/v1 the DRA driver uses.

- ResourceSlices (cluster-scoped): list (fieldSelector spec.nodeName,
  spec.driver, pool.name... as the real one: other fields are a 400),
  GET, POST (name or generateName; 409 when the name is taken), PUT (409
  when metadata.resourceVersion is not the stored one), DELETE;
- ResourceClaims (namespaced): GET; tests put them with `put_claim`;
- every request needs ``Authorization: Bearer <token>`` (401 otherwise);
- written objects get uid, resourceVersion (one counter for all, as etcd's
  revision) and creationTimestamp; with `validate` set (a Kubernetes
  version), each written body is checked strictly with kubernetes_validate
  first and a malformed one is answered 422;
- `writes` counts writes per (verb, resource); `fail` queues answers for
  the next requests of a (verb, resource), to provoke errors.
"""

from __future__ import annotations

import json
import secrets
import shutil
import ssl
import subprocess
import threading
import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import kubernetes_validate  # type: ignore[import-untyped]

from nri_gpushare.k8s.events import Settings
from tests.prereqs import missing

PREFIX = "/apis/resource.k8s.io/v1"
SLICE_FIELDS = {
    "spec.nodeName": ("spec", "nodeName"),
    "spec.driver": ("spec", "driver"),
    "spec.pool.name": ("spec", "pool", "name"),
    "metadata.name": ("metadata", "name"),
}


def make_cert(directory: Path, name: str = "apiserver") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (needs openssl)."""
    if shutil.which("openssl") is None:
        missing("openssl is needed to make a test certificate")
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def _field(obj: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = obj
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


class ApiServer:
    """The server's state; `start` serves it, `stop` ends it."""

    def __init__(self, directory: Path, token: str = "test-token", validate: str | None = "1.34"):
        self.directory = directory
        self.token = token
        self.validate = validate
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: Counter[tuple[str, str]] = Counter()
        self.requests: list[tuple[str, str]] = []
        self.fail: defaultdict[tuple[str, str], list[int]] = defaultdict(list)
        self.url = ""
        self.ca = Path()
        self._revision = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- for tests -------------------------------------------------------------

    def settings(self, node: str = "node-a", token: str | None = None) -> Settings:
        token_file = self.directory / "token"
        token_file.write_text((self.token if token is None else token) + "\n")
        return Settings(self.url, str(token_file), str(self.ca), node)

    def put_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        """Store (create or replace) a ResourceClaim as the API server would."""
        with self._lock:
            meta = claim["metadata"]
            old = self.claims.get((meta["namespace"], meta["name"]))
            stored = self._stamp(json.loads(json.dumps(claim)), old)
            self.claims[(meta["namespace"], meta["name"])] = stored
            return stored

    def _stamp(self, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        self._revision += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self._revision)
        if old is None:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
        return obj

    # -- serving ---------------------------------------------------------------

    def start(self, cert_key: tuple[Path, Path] | None = None) -> ApiServer:
        """Serve, with `cert_key` (from `make_cert`) or a new certificate."""
        cert, key = cert_key or make_cert(self.directory)
        self.ca = cert
        state = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, answer = state.handle(
                    self.command, self.path, self.headers.get("Authorization", ""), body
                )
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{server.server_address[1]}"
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def verbs(self) -> set[tuple[str, str]]:
        """(resource, RBAC verb) of every request served so far."""
        found = set()
        for method, target in self.requests:
            path = urlsplit(target).path.removeprefix(PREFIX).strip("/").split("/")
            named = len(path) in (2, 4)
            resource = path[2] if path[0] == "namespaces" else path[0]
            verb = {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(method)
            found.add((resource, verb or ("get" if named else "list")))
        return found

    def handle(self, method: str, target: str, auth: str, body: bytes) -> tuple[int, Any]:
        url = urlsplit(target)
        self.requests.append((method, target))
        if auth != f"Bearer {self.token}":
            return _status(401, "Unauthorized")
        parts = [unquote(p) for p in url.path.removeprefix(PREFIX).strip("/").split("/")]
        if not url.path.startswith(PREFIX + "/") or not parts[0]:
            return _status(404, f"the server could not find the requested resource {url.path}")
        resource = parts[2 if parts[0] == "namespaces" else 0]
        queued = self.fail.get((method, resource))
        if queued:
            return _status(queued.pop(0), f"injected {method} {resource} failure")
        try:
            obj = json.loads(body) if body else None
        except ValueError:
            return _status(400, "body is not JSON")
        with self._lock:
            if resource == "resourceslices" and parts[0] == "resourceslices":
                name = parts[1] if len(parts) > 1 else ""
                return self._slices(method, name, parse_qs(url.query), obj)
            if resource == "resourceclaims" and len(parts) == 4 and method == "GET":
                found = self.claims.get((parts[1], parts[3]))
                if found is None:
                    return _status(404, f'resourceclaims.resource.k8s.io "{parts[3]}" not found')
                return 200, found
        return _status(405, f"{method} {url.path} is not served by the test API server")

    def _slices(
        self, method: str, name: str, query: dict[str, list[str]], obj: Any
    ) -> tuple[int, Any]:
        if method == "GET" and not name:
            wanted: list[tuple[tuple[str, ...], str]] = []
            for selector in query.get("fieldSelector", []):
                for term in filter(None, selector.split(",")):
                    key, _, value = term.replace("==", "=").partition("=")
                    if key not in SLICE_FIELDS:
                        return _status(400, f'field label not supported: "{key}"')
                    wanted.append((SLICE_FIELDS[key], value))
            items = [
                s
                for s in self.slices.values()
                if all(_field(s, path) == value for path, value in wanted)
            ]
            return 200, {
                "kind": "ResourceSliceList",
                "apiVersion": "resource.k8s.io/v1",
                "metadata": {"resourceVersion": str(self._revision)},
                "items": items,
            }
        if method == "GET":
            found = self.slices.get(name)
            return (200, found) if found else _status(404, f'"{name}" not found')
        if method == "DELETE":
            if self.slices.pop(name, None) is None:
                return _status(404, f'resourceslices "{name}" not found')
            self.writes[("DELETE", "resourceslices")] += 1
            return 200, {"kind": "Status", "status": "Success"}
        if not isinstance(obj, dict) or obj.get("kind") != "ResourceSlice":
            return _status(400, "not a ResourceSlice")
        problem = self._invalid(obj)
        if problem:
            return _status(422, problem)
        meta = obj.setdefault("metadata", {})
        if method == "POST":
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
            if meta.get("name") in self.slices:
                return _status(409, f'resourceslices "{meta.get("name")}" already exists')
            if not meta.get("name"):
                return _status(422, "metadata.name or generateName is required")
            self.writes[("POST", "resourceslices")] += 1
            self.slices[meta["name"]] = self._stamp(obj, None)
            return 201, self.slices[meta["name"]]
        if method == "PUT":
            old = self.slices.get(name)
            if old is None:
                return _status(404, f'resourceslices "{name}" not found')
            if meta.get("name") != name:
                return _status(400, "the name in the body is not the one in the path")
            if meta.get("resourceVersion") != old["metadata"]["resourceVersion"]:
                return _status(
                    409,
                    f'Operation cannot be fulfilled on resourceslices "{name}": the object '
                    "has been modified; please apply your changes to the latest version",
                )
            self.writes[("PUT", "resourceslices")] += 1
            self.slices[name] = self._stamp(obj, old)
            return 200, self.slices[name]
        return _status(405, f"{method} not allowed")

    def _invalid(self, obj: dict[str, Any]) -> str:
        if self.validate is None:
            return ""
        try:
            kubernetes_validate.validate(obj, self.validate, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return f"ResourceSlice is invalid: {exc}"
        return ""


def _status(code: int, message: str) -> tuple[int, dict[str, Any]]:
    return code, {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "code": code,
    }
