"""nri_gpushare.k8s.dra.kubeapi against the test API server (HTTPS, bearer
token, strict validation of what is written): the calls, `publish`'s
create / replace / nothing / delete-strays / retry, and failures that say
what happened."""

from __future__ import annotations

import asyncio
import copy
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nri_gpushare.k8s.dra import DRIVER, ClaimError
from nri_gpushare.k8s.dra import kubeapi as kubeapi_module
from nri_gpushare.k8s.dra.kubeapi import RBAC_RULES, Conflict, KubeApi, KubeApiError
from nri_gpushare.k8s.dra.slices import SliceGpu, node_slice
from nri_gpushare.k8s.events import Settings
from tests.k8s.apiserver import ApiServer, make_cert

GiB = 1 << 30
NODE = "node-a"


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("cert"))


@pytest.fixture
def server(tmp_path: Path, cert: tuple[Path, Path]) -> Iterator[ApiServer]:
    api = ApiServer(tmp_path).start(cert)
    yield api
    api.stop()


def wanted(memory_held: int = 0, node: str = NODE, generation: int = 1) -> dict[str, Any]:
    gpus = [
        SliceGpu(i, f"GPU-{i}", "H100", 80 * GiB, "580.65.06", True, memory_held) for i in (0, 1)
    ]
    return node_slice(node, gpus, memory_reserve_bytes=0, max_inst=8, generation=generation)


def other(name: str, node: str = NODE, driver: str = DRIVER) -> dict[str, Any]:
    obj = wanted(node=node)
    obj["metadata"]["name"] = name
    obj["spec"]["driver"] = driver
    return obj


def test_publish_creates_then_writes_only_on_change(server: ApiServer) -> None:
    api = KubeApi(server.settings())
    created = api.publish(NODE, wanted())
    assert created["metadata"]["uid"] and server.writes[("POST", "resourceslices")] == 1
    assert api.publish(NODE, wanted(generation=5)) == created  # same devices: no write
    assert sum(server.writes.values()) == 1
    changed = api.publish(NODE, wanted(memory_held=4 * GiB))
    assert server.writes[("PUT", "resourceslices")] == 1
    assert changed["spec"]["pool"]["generation"] == 2  # above the one there
    assert changed["metadata"]["uid"] == created["metadata"]["uid"]
    assert changed["spec"]["devices"][0]["capacity"]["memory"]["value"] == "76Gi"
    assert list(server.slices) == [created["metadata"]["name"]]


def test_publish_deletes_only_this_nodes_strays(server: ApiServer) -> None:
    api = KubeApi(server.settings())
    for obj in (
        other("stray-1"),
        other("stray-2"),
        other("b", node="node-b"),
        other("x", driver="x.io"),
    ):
        api.create_slice(obj)
    api.publish(NODE, wanted())
    assert sorted(server.slices) == ["b", "node-a-gpushare.io", "x"]
    list_request = next(t for m, t in server.requests if m == "GET")
    assert "fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Dgpushare.io" in list_request


def test_publish_retries_once_on_conflict(server: ApiServer) -> None:
    api = KubeApi(server.settings())
    api.publish(NODE, wanted())
    server.fail[("PUT", "resourceslices")] = [409]
    api.publish(NODE, wanted(memory_held=GiB))
    assert server.writes[("PUT", "resourceslices")] == 1
    server.fail[("PUT", "resourceslices")] = [409, 409]
    with pytest.raises(Conflict) as caught:
        api.publish(NODE, wanted(memory_held=2 * GiB))
    assert caught.value.status == 409 and "409" in str(caught.value)
    # Someone else's write between our list and our PUT: a real conflict.
    name = wanted()["metadata"]["name"]
    stale = copy.deepcopy(server.slices[name])
    server.slices[name] = server._stamp(copy.deepcopy(stale), stale)
    with pytest.raises(Conflict, match="has been modified"):
        api.replace_slice(stale)


def test_a_malformed_slice_is_refused_by_the_strict_server(server: ApiServer) -> None:
    bad = wanted()
    bad["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"]["stepp"] = "1"
    with pytest.raises(KubeApiError, match="422.*invalid") as caught:
        KubeApi(server.settings()).create_slice(bad)
    assert caught.value.status == 422


def test_the_test_server_names_lists_and_refuses_as_the_real_one(server: ApiServer) -> None:
    api = KubeApi(server.settings())
    obj = wanted()
    obj["metadata"] = {"generateName": "node-a-gpushare.io-"}
    made = api.create_slice(obj)
    name = made["metadata"]["name"]
    assert name.startswith("node-a-gpushare.io-") and len(name) > len("node-a-gpushare.io-")
    assert made["metadata"]["creationTimestamp"].endswith("Z")
    assert api.request("GET", f"{kubeapi_module.PREFIX}/resourceslices/{name}") == made
    with pytest.raises(KubeApiError, match="400.*field label not supported") as caught:
        api.request("GET", f"{kubeapi_module.PREFIX}/resourceslices?fieldSelector=spec.x%3Dy")
    assert caught.value.status == 400
    with pytest.raises(Conflict, match="already exists"):
        api.create_slice(made | {"metadata": {"name": name}})
    api.delete_slice(name)
    api.delete_slice(name)  # gone already: fine
    assert server.slices == {} and server.writes[("DELETE", "resourceslices")] == 1


def test_get_claim(server: ApiServer) -> None:
    api = KubeApi(server.settings())
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team-a", "name": "c"},
        "spec": {},
    }
    server.put_claim(claim)
    got = api.get_claim("team-a", "c")
    assert got["metadata"]["uid"] and got["kind"] == "ResourceClaim"
    with pytest.raises(ClaimError, match="^claim team-a/d not found$"):
        api.get_claim("team-a", "d")
    server.fail[("GET", "resourceclaims")] = [403]
    with pytest.raises(ClaimError, match="claim team-a/c: .*403.*RBAC"):
        api.get_claim("team-a", "c")


def test_the_token_is_read_on_every_call(server: ApiServer) -> None:
    settings = server.settings(token="old-token")
    api = KubeApi(settings)
    with pytest.raises(KubeApiError, match="401.*expired, or the pod") as caught:
        api.list_slices(NODE)
    assert caught.value.status == 401
    Path(settings.token_file).write_text(server.token)  # the kubelet rotated it
    assert api.list_slices(NODE) == []
    Path(settings.token_file).write_text("")
    with pytest.raises(KubeApiError, match="not a service account token"):
        api.list_slices(NODE)


def test_every_call_is_in_rbac_rules(server: ApiServer) -> None:
    api = KubeApi(server.settings())
    api.create_slice(other("stray"))
    api.publish(NODE, wanted())
    api.publish(NODE, wanted(memory_held=GiB))
    with pytest.raises(ClaimError):
        api.get_claim("ns", "c")
    granted = {(r, v) for _, r, verbs in RBAC_RULES for v in verbs}
    used = server.verbs()
    assert used == granted, "RBAC_RULES is exactly what the module uses"


@pytest.mark.parametrize("node", ["a,spec.driver=x", "A", "", "a=b", "a" * 254])
def test_a_node_name_that_would_change_the_selector_is_refused(
    server: ApiServer, node: str
) -> None:
    with pytest.raises(KubeApiError, match="is not a node or driver name"):
        KubeApi(server.settings()).list_slices(node)
    assert server.requests == []


def test_an_answer_too_large_is_refused(server: ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    api = KubeApi(server.settings())
    api.publish(NODE, wanted())
    monkeypatch.setattr(kubeapi_module, "MAX_RESPONSE", 1000)
    with pytest.raises(KubeApiError, match="over 1000 bytes"):
        api.list_slices(NODE)


def test_a_silent_server_times_out(tmp_path: Path, cert: tuple[Path, Path]) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    token = tmp_path / "token"
    token.write_text("t")
    api = KubeApi(Settings(f"https://127.0.0.1:{port}", str(token), str(cert[0]), NODE), 0.5)
    try:
        with pytest.raises(KubeApiError, match="no answer from .* within 0.5 s"):
            api.list_slices(NODE)
    finally:
        listener.close()


@pytest.mark.parametrize("server_url", ["http://127.0.0.1:1", "https://h:x", "https://h/p"])
def test_a_bad_server_address_is_refused(tmp_path: Path, server_url: str) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    api = KubeApi(Settings(server_url, str(token), "/nonexistent", NODE))
    with pytest.raises(KubeApiError, match="is not https://host:port|has a bad port"):
        api.list_slices(NODE)


def test_another_ca_fails_tls(server: ApiServer, tmp_path: Path) -> None:
    other_cert, _ = make_cert(tmp_path, "other")
    settings = server.settings()
    api = KubeApi(Settings(settings.server, settings.token_file, str(other_cert), NODE))
    with pytest.raises(KubeApiError, match="TLS .* the cluster's CA"):
        api.list_slices(NODE)
    assert server.requests == []


async def test_calls_run_in_threads_side_by_side(server: ApiServer) -> None:
    api = KubeApi(server.settings())
    await asyncio.gather(*(asyncio.to_thread(api.list_slices, NODE) for _ in range(8)))
    assert len(server.requests) == 8 and threading.active_count() >= 1


def test_an_answer_trickled_byte_by_byte_is_cut_at_the_timeout(
    cert: tuple[Path, Path],
) -> None:
    """Each read gets an answer in time; the whole answer does not (the
    hostile review's finding 6: the thread was held as long as it trickled)."""
    import ssl

    from nri_gpushare.k8s import apicall

    cert_key = cert
    sent = [0]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*cert_key)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        with context.wrap_socket(conn, server_side=True) as tls:
            tls.recv(65536)
            tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while not stop.wait(0.05):
                try:
                    tls.sendall(b"x")
                    sent[0] += 1
                except OSError:
                    return

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    server = f"https://127.0.0.1:{listener.getsockname()[1]}"
    try:
        with pytest.raises(apicall.CallError, match="within 1 s"):
            apicall.call(
                server,
                str(cert_key[0]),
                "GET",
                "/x",
                token=lambda: "t",
                timeout=1.0,
                max_response=1 << 20,
            )
    finally:
        stop.set()
        listener.close()
    assert sent[0] < 100000  # given up long before the answer's end
