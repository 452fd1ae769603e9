"""The DRA driver's API server calls: ResourceSlices and ResourceClaims.

Blocking, standard library only (as `nri_gpushare.k8s.events`); callers run
them with ``asyncio.to_thread``.  Credentials are events' `Settings` (in a
pod its service account, on the node the host copy); the token is read again
on every call, so a rotated token is used as soon as the kubelet writes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, urlencode

from nri_gpushare.k8s import apicall
from nri_gpushare.k8s.dra import DRIVER, ClaimError
from nri_gpushare.k8s.dra.slices import dns_subdomain, slice_changed
from nri_gpushare.k8s.events import Settings

GROUP: Final = "resource.k8s.io"
PREFIX: Final = f"/apis/{GROUP}/v1"
MAX_TOKEN: Final = 64 * 1024
MAX_RESPONSE: Final = 8 * 1024 * 1024
"""A larger answer is refused (a node's slices and one claim are far smaller)."""
TIMEOUT: Final = 10.0

RBAC_RULES: Final = (
    (GROUP, "resourceslices", ("list", "create", "update", "delete")),
    (GROUP, "resourceclaims", ("get",)),
)
"""(API group, resource, verbs) this module uses; deploy/dra/rbac.yaml grants them."""


class KubeApiError(Exception):
    """A call that failed; `status` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Conflict(KubeApiError):
    """409: the object changed since it was read (or already exists)."""


class NotFound(KubeApiError):
    """404."""


class KubeApi:
    """resource.k8s.io/v1 calls with `settings`' credentials."""

    def __init__(self, settings: Settings, timeout: float = TIMEOUT) -> None:
        self.settings = settings
        self.timeout = timeout

    def _token(self) -> str:
        path = Path(self.settings.token_file)
        try:
            with path.open("rb") as f:
                data = f.read(MAX_TOKEN + 1)
        except OSError as exc:
            raise KubeApiError(f"cannot read the token {path}: {exc.strerror}") from None
        token = data.decode("utf-8", "replace").strip()
        if len(data) > MAX_TOKEN or not token or not token.isprintable() or " " in token:
            raise KubeApiError(f"{path}: not a service account token")
        return token

    def request(self, method: str, path: str, body: object = None) -> Any:
        """One call; the decoded JSON answer, or a KubeApiError saying why not."""
        settings = self.settings
        where = f"the API server {settings.server}"
        try:
            status, answer = apicall.call(
                settings.server,
                settings.ca_file,
                method,
                path,
                token=self._token,
                body=None if body is None else json.dumps(body).encode(),
                timeout=self.timeout,
                max_response=MAX_RESPONSE,
            )
        except apicall.CallError as exc:
            raise KubeApiError(str(exc)) from None
        what = f"{method} {path.split('?')[0]}"
        if len(answer) > MAX_RESPONSE:
            raise KubeApiError(f"{where}: the answer to {what} is over {MAX_RESPONSE} bytes")
        if not 200 <= status < 300:
            message = f"{where} answered {what} with {status}: {apicall.status_message(answer)}"
            if status == 401:
                message += (
                    f" (the token {settings.token_file} expired, or the pod it belongs to is gone)"
                )
            if status == 403:
                message += " (RBAC: kubectl apply -k deploy/dra)"
            kind = {404: NotFound, 409: Conflict}.get(status, KubeApiError)
            raise kind(message, status)
        try:
            return json.loads(answer) if answer else {}
        except ValueError:
            raise KubeApiError(f"{where} answered {what} with something not JSON") from None

    # -- ResourceClaims --------------------------------------------------------

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim; every failure is a ClaimError (404: not found)."""
        path = f"{PREFIX}/namespaces/{quote(namespace, safe='')}/resourceclaims/"
        try:
            claim = self.request("GET", path + quote(name, safe=""))
        except NotFound:
            raise ClaimError(f"claim {namespace}/{name} not found") from None
        except KubeApiError as exc:
            raise ClaimError(f"claim {namespace}/{name}: {exc}") from None
        if not isinstance(claim, dict):
            raise ClaimError(f"claim {namespace}/{name}: the API server's answer is no object")
        return claim

    def claim_uid(self, namespace: str, name: str) -> str:
        """The UID of claim namespace/name, "" when there is none (404);
        KubeApiError when the API server cannot say."""
        path = f"{PREFIX}/namespaces/{quote(namespace, safe='')}/resourceclaims/"
        try:
            claim = self.request("GET", path + quote(name, safe=""))
        except NotFound:
            return ""
        meta = claim.get("metadata") if isinstance(claim, dict) else None
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if not isinstance(uid, str) or not uid:
            raise KubeApiError(f"claim {namespace}/{name}: the API server's answer has no UID")
        return uid

    # -- ResourceSlices --------------------------------------------------------

    def list_slices(self, node: str, driver: str = DRIVER) -> list[dict[str, Any]]:
        """The slices of `node` and `driver` (field selectors)."""
        for name in (node, driver):
            if not dns_subdomain(name):
                raise KubeApiError(f"{name[:80]!r} is not a node or driver name")
        selector = f"spec.nodeName={node},spec.driver={driver}"
        answer = self.request(
            "GET", f"{PREFIX}/resourceslices?{urlencode({'fieldSelector': selector})}"
        )
        items = answer.get("items") if isinstance(answer, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise KubeApiError(
                f"the API server's list of resourceslices has no items: {answer!r:.200}"
            )
        return items

    def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        return _object(self.request("POST", f"{PREFIX}/resourceslices", obj))

    def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT `obj` (its metadata.resourceVersion guards it: Conflict)."""
        name = obj["metadata"]["name"]
        if not obj["metadata"].get("resourceVersion"):
            raise KubeApiError(f"replacing resourceslice {name}: no metadata.resourceVersion")
        path = f"{PREFIX}/resourceslices/{quote(name, safe='')}"
        return _object(self.request("PUT", path, obj))

    def delete_slice(self, name: str) -> None:
        """Delete; already gone is fine."""
        try:
            self.request("DELETE", f"{PREFIX}/resourceslices/{quote(name, safe='')}")
        except NotFound:
            pass

    def publish(self, node: str, wanted: dict[str, Any]) -> dict[str, Any]:
        """Make `wanted` the one slice of `node` and this driver: create it,
        or replace it when it changed (pool generation raised above the
        one there), and delete any other; once more on a conflict."""
        try:
            return self._publish(node, wanted)
        except Conflict:
            return self._publish(node, wanted)

    def _publish(self, node: str, wanted: dict[str, Any]) -> dict[str, Any]:
        name = wanted["metadata"]["name"]
        current: dict[str, Any] | None = None
        for item in self.list_slices(node, wanted["spec"]["driver"]):
            meta = item.get("metadata")
            if isinstance(meta, dict) and meta.get("name") == name:
                current = item
            elif isinstance(meta, dict) and isinstance(meta.get("name"), str):
                self.delete_slice(meta["name"])
        if current is None:
            return self.create_slice(wanted)
        if not slice_changed(current, wanted):
            return current
        obj = json.loads(json.dumps(wanted))
        obj["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion", "")
        pool = obj["spec"]["pool"]
        pool["generation"] = max(pool["generation"], _generation(current) + 1)
        return self.replace_slice(obj)


def _generation(obj: dict[str, Any]) -> int:
    pool = obj.get("spec", {}).get("pool", {})
    generation = pool.get("generation", 0) if isinstance(pool, dict) else 0
    return generation if isinstance(generation, int) else 0


def _object(answer: Any) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise KubeApiError("the API server's answer is no object")
    return answer
