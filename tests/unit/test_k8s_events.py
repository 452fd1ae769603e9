"""nri_gpushare.k8s.events against a local HTTPS server with a self-signed
certificate: what is posted (method, path, token, JSON body), and that every
failure is an EventError that says what to check."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import stat
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from nri_gpushare.k8s import events
from nri_gpushare.k8s.events import EventError, PodRef, Settings, post_pod_event
from tests.prereqs import missing

POD = PodRef("team-a", "trainer-7d9f8.x", "6b1c9a52-0d3e-4a8e-9a57-0c2f0e0a1b2c")
TOKEN = "eyJhbGciOiJSUzI1NiJ9.test-token"


def make_cert(directory: Path, name: str) -> tuple[Path, Path]:
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


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("certs")
    return {name: make_cert(directory, name) for name in ("server", "other")}


@dataclass
class ApiServer:
    """Answers every POST with `status` and `answer`, recording the requests."""

    status: int = 201
    answer: dict[str, Any] = field(default_factory=lambda: {"kind": "Event"})
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def api(certs: dict[str, tuple[Path, Path]]) -> Iterator[ApiServer]:
    state = ApiServer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = int(self.headers.get("Content-Length", "0"))
            state.requests.append(
                {
                    "method": "POST",
                    "path": self.path,
                    "headers": dict(self.headers),
                    "body": json.loads(self.rfile.read(length)),
                }
            )
            data = json.dumps(state.answer).encode()
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert, key = certs["server"]
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    state.url = f"https://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def settings_for(
    url: str, tmp_path: Path, ca: Path, node: str = "gpu-node-3", token: str = TOKEN
) -> Settings:
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    return Settings(server=url, token_file=str(token_file), ca_file=str(ca), node=node)


async def post(settings: Settings, pod: PodRef = POD, message: str = "no GPU fits") -> None:
    await asyncio.wait_for(
        post_pod_event(pod, "GPUShareFragmented", message, timeout=2.0, settings=settings),
        timeout=30,
    )


async def test_posts_a_core_v1_warning_event(
    api: ApiServer, certs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    await post(settings_for(api.url, tmp_path, certs["server"][0]))
    [request] = api.requests
    assert request["path"] == "/api/v1/namespaces/team-a/events"
    assert request["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert request["headers"]["Content-Type"] == "application/json"
    body = request["body"]
    stamp = body.pop("firstTimestamp")
    assert body.pop("lastTimestamp") == stamp
    assert stamp.endswith("Z") and "T" in stamp
    assert body == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "trainer-7d9f8.x.", "namespace": "team-a"},
        "involvedObject": {
            "kind": "Pod",
            "apiVersion": "v1",
            "namespace": "team-a",
            "name": "trainer-7d9f8.x",
            "uid": POD.uid,
        },
        "type": "Warning",
        "reason": "GPUShareFragmented",
        "message": "no GPU fits",
        "source": {"component": "nri-gpushare", "host": "gpu-node-3"},
        "count": 1,
        "reportingComponent": "nri-gpushare",
        "reportingInstance": "gpu-node-3",
    }


async def test_a_long_message_is_cut_to_what_the_api_server_takes(
    api: ApiServer, certs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    await post(settings_for(api.url, tmp_path, certs["server"][0]), message="é" * 3000)
    message = api.requests[0]["body"]["message"]
    assert len(message.encode()) <= events.MAX_MESSAGE
    assert message.startswith("é" * 500) and message.endswith("...")


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (403, ["403", "RBAC", "deploy/rbac.yaml", "create", "events", "cannot create"]),
        (401, ["401", "rejected the token", "DaemonSet"]),
        (500, ["answered 500", "cannot create"]),
    ],
)
async def test_refusals_say_what_to_check(
    api: ApiServer,
    certs: dict[str, tuple[Path, Path]],
    tmp_path: Path,
    status: int,
    words: list[str],
) -> None:
    api.status = status
    api.answer = {"kind": "Status", "message": 'events is forbidden: cannot create "events"'}
    with pytest.raises(EventError) as caught:
        await post(settings_for(api.url, tmp_path, certs["server"][0]))
    for word in words:
        assert word in str(caught.value)


async def test_another_ca_fails_tls(
    api: ApiServer, certs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    with pytest.raises(EventError, match="TLS .* the cluster's CA"):
        await post(settings_for(api.url, tmp_path, certs["other"][0]))
    assert api.requests == []


async def test_connection_refused(certs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EventError, match="cannot reach the API server .*reachable"):
        await post(settings_for(f"https://127.0.0.1:{port}", tmp_path, certs["server"][0]))


async def test_a_silent_server_times_out(
    certs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    # Listening, never accepting: the connection is queued, TLS never answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        settings = settings_for(url, tmp_path, certs["server"][0])
        with pytest.raises(EventError, match="no answer from the API server .* within 0.3 s"):
            await asyncio.wait_for(
                post_pod_event(POD, "GPUShareFragmented", "m", timeout=0.3, settings=settings),
                timeout=30,
            )


@pytest.mark.parametrize(
    ("pod", "what"),
    [
        (PodRef("../kube-system", "p", ""), "namespace"),
        (PodRef("a/b", "p", ""), "namespace"),
        (PodRef("Team", "p", ""), "namespace"),
        (PodRef("a" * 64, "p", ""), "namespace"),
        (PodRef("", "p", ""), "namespace"),
        (PodRef("ns\n", "p", ""), "namespace"),
        (PodRef("ns", "p/../../x", ""), "pod name"),
        (PodRef("ns", "p%2Fx", ""), "pod name"),
        (PodRef("ns", "p?x=1", ""), "pod name"),
        (PodRef("ns", "a..b", ""), "pod name"),
        (PodRef("ns", "a" * 254, ""), "pod name"),
        (PodRef("ns", "", ""), "pod name"),
        (PodRef("ns", "p", 'x", "kind": "Node'), "pod UID"),
    ],
)
async def test_hostile_names_are_refused_before_any_request(
    api: ApiServer, certs: dict[str, tuple[Path, Path]], tmp_path: Path, pod: PodRef, what: str
) -> None:
    with pytest.raises(EventError, match=f"^{what} "):
        await post(settings_for(api.url, tmp_path, certs["server"][0]), pod=pod)
    assert api.requests == []


@pytest.mark.parametrize("reason", ["", "Bad Reason", "a/b", "X" * 129])
async def test_bad_reasons_are_refused(reason: str, tmp_path: Path) -> None:
    settings = Settings("https://127.0.0.1:1", str(tmp_path / "t"), str(tmp_path / "c"), "n")
    with pytest.raises(EventError, match="reason"):
        await post_pod_event(POD, reason, "m", settings=settings)


async def test_bad_settings_say_which(
    api: ApiServer, certs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    ca = certs["server"][0]
    plain = settings_for(api.url.replace("https", "http"), tmp_path, ca)
    with pytest.raises(EventError, match="not https://host:port"):
        await post(plain)
    no_token = Settings(api.url, str(tmp_path / "absent"), str(ca), "n")
    with pytest.raises(EventError, match="cannot read the service account token"):
        await post(no_token)
    no_ca = Settings(api.url, plain.token_file, str(tmp_path / "absent.crt"), "n")
    with pytest.raises(EventError, match="cannot load the cluster CA"):
        await post(no_ca)
    bad_token = settings_for(api.url, tmp_path, ca, token="two words")
    with pytest.raises(EventError, match="not a service account token"):
        await post(bad_token)
    assert api.requests == []


def test_settings_in_a_pod() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    settings = Settings.from_environment(env | {"NODE_NAME": "node-a"})
    assert settings == Settings(
        server="https://[fd00::1]:6443",
        token_file=f"{events.SERVICE_ACCOUNT_DIR}/token",
        ca_file=f"{events.SERVICE_ACCOUNT_DIR}/ca.crt",
        node="node-a",
    )
    assert Settings.from_environment({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}).server == (
        "https://10.96.0.1:443"
    )


def test_on_a_node_without_the_daemonset_the_error_names_it(tmp_path: Path) -> None:
    with pytest.raises(
        EventError, match=r"'credentials' container writes .*none \(deploy/daemonset.yaml\)"
    ):
        Settings.from_environment({}, host_dir=str(tmp_path / "none"))


async def test_credentials_synced_to_the_node_post_events(
    api: ApiServer, certs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """The DaemonSet's credentials container copies its service account; the
    daemon on the node reads the copy and posts with it."""
    source = tmp_path / "serviceaccount"
    source.mkdir()
    (source / "token").write_text(TOKEN)
    (source / "ca.crt").write_bytes(certs["server"][0].read_bytes())
    port = api.url.rsplit(":", 1)[1]
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    dest = tmp_path / "run" / "kubernetes"
    written = events.sync_credentials(dest, env | {"NODE_NAME": "node-b"}, source)
    assert sorted(written) == ["ca.crt", "node", "server", "token"]
    assert stat.S_IMODE(dest.stat().st_mode) == 0o700
    for name in written:
        assert stat.S_IMODE((dest / name).stat().st_mode) == 0o600
    assert events.sync_credentials(dest, env | {"NODE_NAME": "node-b"}, source) == []
    (source / "token").write_text(TOKEN + "-rotated")
    assert events.sync_credentials(dest, env | {"NODE_NAME": "node-b"}, source) == ["token"]

    settings = Settings.from_environment({}, host_dir=str(dest))
    assert (settings.server, settings.node) == (api.url, "node-b")
    await post(settings)
    assert api.requests[0]["headers"]["Authorization"] == f"Bearer {TOKEN}-rotated"
    assert api.requests[0]["body"]["source"]["host"] == "node-b"


def test_sync_outside_a_pod_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(EventError, match="KUBERNETES_SERVICE_HOST"):
        events.sync_credentials(tmp_path / "d", {}, tmp_path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert events.main(["sync-credentials", "--once", "--to", str(tmp_path / "d")]) == 1
    assert "not in a pod" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


async def test_without_settings_the_pods_service_account_is_used(
    api: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    if Path(events.SERVICE_ACCOUNT_DIR, "token").exists():
        pytest.skip("this test runs outside a pod")  # pragma: no cover
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", api.url.rsplit(":", 1)[1])
    with pytest.raises(EventError, match="service account token .* is the pod's service account"):
        await asyncio.wait_for(post_pod_event(POD, "GPUShareFragmented", "m"), timeout=30)
    assert api.requests == []


def test_a_node_copy_others_could_write_is_not_used(tmp_path: Path) -> None:
    """The token goes to whatever `server` names: a directory group or others
    may write is refused, before anything in it is read."""
    dest = tmp_path / "kubernetes"
    dest.mkdir(mode=0o700)
    (dest / "server").write_text("https://attacker.example:443\n")
    Settings.from_environment({}, host_dir=str(dest))  # private: taken
    for mode in (0o770, 0o707, 0o755):
        dest.chmod(mode)
        with pytest.raises(EventError, match=r"mode 0700 .*mode 0\d\d\d.*not used"):
            Settings.from_environment({}, host_dir=str(dest))
    dest.chmod(0o700)
    link = tmp_path / "link"
    link.symlink_to(dest)
    with pytest.raises(EventError, match="not a directory"):
        Settings.from_environment({}, host_dir=str(link))


def test_sync_follows_no_symlink(tmp_path: Path) -> None:
    source = tmp_path / "serviceaccount"
    source.mkdir()
    (source / "token").write_text(TOKEN)
    (source / "ca.crt").write_text("ca")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "NODE_NAME": "n"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    linked = tmp_path / "linked"
    linked.symlink_to(elsewhere)
    with pytest.raises(EventError, match="not a directory"):
        events.sync_credentials(linked, env, source)
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755 and not list(elsewhere.iterdir())
    # A temp file planted as a symlink is replaced, not written through.
    dest = tmp_path / "dest"
    dest.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (dest / ".token.tmp").symlink_to(victim)
    assert "token" in events.sync_credentials(dest, env, source)
    assert victim.read_text() == "keep"
    assert (dest / "token").read_text() == TOKEN
