"""Kubernetes Events about pods, posted with the standard library only.

The NRI plugin posts a Warning event on a pod it had to refuse although the
kubelet admitted it (fragmentation on a multi-GPU node, config
``kubernetes.events``), so that ``kubectl describe pod`` says why.  It is a
plain ``POST /api/v1/namespaces/{ns}/events`` with a service-account token:
no client library for one call.

Where the credentials come from (`Settings.from_environment`):

- in a pod (``$KUBERNETES_SERVICE_HOST`` set): the pod's service account,
  ``/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt}``;
- on the node (the daemon runs under systemd, outside any pod): a copy of the
  DaemonSet pod's credentials in `HOST_DIR` (root only), which the DaemonSet's
  ``credentials`` container keeps current with ``python -m
  nri_gpushare.k8s.events sync-credentials`` (`sync_credentials`).  The token
  is bound to that pod: once the DaemonSet is gone it stops working, and the
  event fails with a message saying so.

Names come from a pod (NRI's pod sandbox), so they are checked against
Kubernetes' own naming rules before they go into a URL.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import re
import socket
import stat
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final
from urllib.parse import quote

from nri_gpushare.k8s import apicall

COMPONENT: Final = "nri-gpushare"
"""source.component and reportingComponent of every event."""
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
HOST_DIR: Final = "/run/nri-gpushare/kubernetes"
"""The node's copy of the DaemonSet pod's credentials: token, ca.crt, server, node."""
MAX_MESSAGE: Final = 1024
"""The API server refuses a longer note (bytes, UTF-8)."""
MAX_REASON: Final = 128
MAX_TOKEN: Final = 64 * 1024
MAX_RESPONSE: Final = 64 * 1024

RBAC_RULES: Final = (("", "events", ("create",)),)
"""(API group, resource, verbs) this module uses: deploy/rbac.yaml grants exactly these."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN_PART = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_UID = re.compile(r"[A-Za-z0-9-]{1,128}")
_REASON = re.compile(r"[A-Za-z][A-Za-z0-9]*")


class EventError(Exception):
    """The event was not posted; the message says what to check."""


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Settings:
    """Where the API server is and how to authenticate to it."""

    server: str
    """``https://host:port``."""
    token_file: str
    ca_file: str
    node: str
    """source.host and reportingInstance: the node's name."""

    @classmethod
    def from_environment(
        cls, env: Mapping[str, str] | None = None, host_dir: str = HOST_DIR
    ) -> Settings:
        """In a pod: its service account; on the node: the copy in `host_dir`."""
        env = os.environ if env is None else env
        host = env.get("KUBERNETES_SERVICE_HOST", "")
        if host:
            port = env.get("KUBERNETES_SERVICE_PORT", "443")
            return cls(
                server=_server_url(host, port),
                token_file=f"{SERVICE_ACCOUNT_DIR}/token",
                ca_file=f"{SERVICE_ACCOUNT_DIR}/ca.crt",
                node=_node_name(env),
            )
        _check_private_dir(Path(host_dir))
        server = _read_small(Path(host_dir, "server"), "the API server's address").strip()
        node = env.get("NODE_NAME", "")
        if not node:
            try:
                node = Path(host_dir, "node").read_text().strip()
            except OSError:
                node = ""
        return cls(
            server=server,
            token_file=f"{host_dir}/token",
            ca_file=f"{host_dir}/ca.crt",
            node=node or socket.gethostname().lower(),
        )


def _check_private_dir(directory: Path) -> None:
    """The daemon sends the token to whatever `server` names: the directory
    must be this user's alone, so that no one else can have written there."""
    try:
        st = directory.lstat()
    except OSError:
        return  # reading its files then fails, saying who writes them
    if not stat.S_ISDIR(st.st_mode):
        raise EventError(f"{directory} is not a directory (a symlink?): remove it")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise EventError(
            f"{directory} must be owned by uid {os.geteuid()} and mode 0700 (it is uid "
            f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): its token and API server "
            "address are not used.  The DaemonSet's 'credentials' container makes it so "
            "when it starts: is its pod running on this node?  If it is, remove the "
            "directory and delete that pod"
        )


def _node_name(env: Mapping[str, str]) -> str:
    return env.get("NODE_NAME", "") or socket.gethostname().lower()


def _server_url(host: str, port: str) -> str:
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass
    return f"https://{host}:{port}"


def _read_small(path: Path, what: str) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_TOKEN + 1)
    except OSError as exc:
        hint = "is the pod's service account token mounted?"
        if not str(path).startswith(SERVICE_ACCOUNT_DIR):
            hint = (
                f"on a node the DaemonSet's 'credentials' container writes {path.parent} "
                "(deploy/daemonset.yaml): is its pod running on this node?"
            )
        raise EventError(f"cannot read {what} from {path}: {exc.strerror}; {hint}") from None
    if len(data) > MAX_TOKEN:
        raise EventError(f"{path}: longer than {MAX_TOKEN} bytes: not {what}")
    return data.decode("utf-8", "replace")


def check_pod(pod: PodRef) -> None:
    """Refuse names that Kubernetes would not have given a pod."""
    if not _DNS_LABEL.fullmatch(pod.namespace):
        raise EventError(f"namespace {pod.namespace[:80]!r} is not a Kubernetes namespace name")
    parts = pod.name.split(".")
    if len(pod.name) > 253 or not all(_DNS_SUBDOMAIN_PART.fullmatch(p) for p in parts):
        raise EventError(f"pod name {pod.name[:80]!r} is not a Kubernetes object name")
    if pod.uid and not _UID.fullmatch(pod.uid):
        raise EventError(f"pod UID {pod.uid[:80]!r} is not a Kubernetes UID")


def _truncate(message: str) -> str:
    data = message.encode()
    if len(data) <= MAX_MESSAGE:
        return message
    return data[: MAX_MESSAGE - 3].decode("utf-8", "ignore") + "..."


def event_body(
    pod: PodRef, reason: str, message: str, node: str, now: datetime
) -> dict[str, object]:
    """A core/v1 Event, shaped as the kubelet's own (count, first/last timestamp).

    eventTime stays unset: with it the API server requires ``action`` too and
    reads the event as an events.k8s.io one."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved: dict[str, str] = {
        "kind": "Pod",
        "apiVersion": "v1",
        "namespace": pod.namespace,
        "name": pod.name,
    }
    if pod.uid:
        involved["uid"] = pod.uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
        "involvedObject": involved,
        "type": "Warning",
        "reason": reason,
        "message": _truncate(message),
        "source": {"component": COMPONENT, "host": node},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": COMPONENT,
        "reportingInstance": node[:128],
    }


def _post(settings: Settings, path: str, body: bytes, timeout: float) -> None:
    """The blocking request; every failure is an EventError saying what to check."""

    def token() -> str:
        text = _read_small(Path(settings.token_file), "the service account token").strip()
        if not text or any(c.isspace() or not c.isprintable() for c in text):
            raise EventError(f"{settings.token_file}: not a service account token")
        return text

    where = f"the API server {settings.server}"
    try:
        status, answer = apicall.call(
            settings.server,
            settings.ca_file,
            "POST",
            path,
            token=token,
            body=body,
            timeout=timeout,
            max_response=MAX_RESPONSE,
        )
    except apicall.CallError as exc:
        raise EventError(str(exc)) from None
    if 200 <= status < 300:
        return
    detail = apicall.status_message(answer)
    if status == 401:
        raise EventError(
            f"{where} rejected the token {settings.token_file} (401 {detail}): expired, or "
            "the DaemonSet pod it belongs to is gone; is the nri-gpushare DaemonSet running "
            "on this node?"
        )
    if status == 403:
        raise EventError(
            f"{where} forbids it (403 {detail}): the service account needs 'create' on "
            "'events' in every namespace (RBAC: kubectl apply -f deploy/rbac.yaml)"
        )
    raise EventError(f"{where} answered {status}: {detail}")


async def post_pod_event(
    pod: PodRef,
    reason: str,
    message: str,
    *,
    timeout: float = 5.0,
    settings: Settings | None = None,
) -> None:
    """Post a Warning event about `pod`; EventError says why it was not posted."""
    check_pod(pod)
    if not _REASON.fullmatch(reason) or len(reason) > MAX_REASON:
        raise EventError(f"event reason {reason[:80]!r} must be CamelCase letters and digits")
    if settings is None:  # a few small files: still, not on the event loop
        settings = await asyncio.to_thread(Settings.from_environment)
    body = event_body(pod, reason, message, settings.node, datetime.now(UTC))
    path = f"/api/v1/namespaces/{quote(pod.namespace, safe='')}/events"
    data = json.dumps(body).encode()
    try:
        await asyncio.wait_for(asyncio.to_thread(_post, settings, path, data, timeout), timeout)
    except TimeoutError:
        raise EventError(
            f"no answer from the API server {settings.server} within {timeout:g} s"
        ) from None


# -- the DaemonSet's credentials container --------------------------------------


def _write_if_changed(directory: Path, name: str, data: bytes) -> bool:
    path = directory / name
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    temp = directory / f".{name}.tmp"
    try:  # a leftover of an interrupted write; never followed if a symlink
        temp.unlink()
    except FileNotFoundError:
        pass
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        os.fchmod(f.fileno(), 0o600)
    os.replace(temp, path)
    return True


def sync_credentials(dest: Path, env: Mapping[str, str], source: Path) -> list[str]:
    """Copy this pod's token and CA, the API server's address and the node's
    name into `dest` (made 0700), each file replaced atomically when it
    changed; returns the names written."""
    if not env.get("KUBERNETES_SERVICE_HOST"):
        raise EventError("not in a pod: $KUBERNETES_SERVICE_HOST is not set")
    settings = Settings.from_environment(env)
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    if dest.is_symlink() or not dest.is_dir():
        raise EventError(f"{dest} is not a directory (a symlink?): remove it")
    os.chmod(dest, 0o700)
    files = {
        "token": _read_small(source / "token", "the service account token").encode(),
        "ca.crt": _read_small(source / "ca.crt", "the cluster CA").encode(),
        "server": f"{settings.server}\n".encode(),
        "node": f"{settings.node}\n".encode(),
    }
    return [name for name, data in files.items() if _write_if_changed(dest, name, data)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nri_gpushare.k8s.events")
    sub = parser.add_subparsers(dest="command", required=True)
    sync = sub.add_parser(
        "sync-credentials",
        help="keep a copy of this pod's service account for the daemon on the node",
    )
    sync.add_argument("--to", default=HOST_DIR, help=f"where (default {HOST_DIR})")
    sync.add_argument("--from", dest="source", default=SERVICE_ACCOUNT_DIR)
    sync.add_argument("--interval", type=float, default=60.0, help="seconds between checks")
    sync.add_argument("--once", action="store_true", help="copy once and exit")
    args = parser.parse_args(argv)
    while True:
        try:
            written = sync_credentials(Path(args.to), os.environ, Path(args.source))
        except (EventError, OSError) as exc:
            print(f"sync-credentials: {exc}", file=sys.stderr, flush=True)
            if args.once:
                return 1
        else:
            if written:
                print(f"sync-credentials: wrote {', '.join(written)} in {args.to}", flush=True)
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
