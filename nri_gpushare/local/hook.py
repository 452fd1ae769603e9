"""`nri-gpushare hook create-runtime|poststop`: the OCI hooks the CDI spec lists.

The runtime (runc, crun) runs them with the container's OCI state on stdin and
the bundle as working directory.  They ask the daemon over its local API
(`nri_gpushare.local`), so a container given an NVIDIA GPU through our CDI
spec (``--device gpushare.io/gpu=...``) gets its share whatever started it:
ctr, nerdctl, docker, podman.

- ``create-runtime`` (createRuntime: the container's namespaces and cgroup
  exist, its program has not run): send ``create`` with the bundle's env,
  annotations, cgroups path and the GPUs CDI injected (their minors).  The
  daemon places and registers the share and binds it to the container's
  cgroup (through the state's pid).  Nothing comes back to apply: runc has
  read config.json already, so env and mounts can no longer change here.  A
  refusal fails the container (exit 1, the daemon's message on stderr, which
  runc shows the user); so does a daemon that cannot be reached: a GPU handed
  out by our spec must not run unguarded.
- ``poststop``: send ``release``.  Always exits 0 (a failing poststop hook
  makes ``nerdctl rm`` and ``podman rm`` fail); problems go to stderr.

Standard library and `nri_gpushare.local` only: this runs in every container
start.  This is the reference implementation: the compiled front
(``front/``, ``gpushare-front hook ...``, what `nri-gpushare cdi generate`
names when it is installed) sends the state to the daemon (the ``hook`` op)
and runs this program, with the same arguments and stdin, for every case it
does not handle itself.
"""

from __future__ import annotations

import os
import sys
from typing import Literal

from nri_gpushare.local.client import DEFAULT_SOCKET, DEFAULT_TIMEOUT, Unavailable, ask
from nri_gpushare.local.oci import (
    MAX_STATE,
    BundleInfo,
    OciError,
    State,
    bundle_info,
    namespace_of,
    parse_state,
    read_config,
)
from nri_gpushare.local.protocol import ProtocolError, Request

SOCKET_ENV = "GPUSHARE_API_SOCKET"
Action = Literal["create-runtime", "poststop"]
ACTIONS: tuple[Action, ...] = ("create-runtime", "poststop")

USAGE = """\
usage: nri-gpushare hook {{create-runtime|poststop}} [--socket PATH] [--timeout SECONDS]

The OCI hooks of the nri-gpushare CDI spec; the container runtime runs them
with the container's OCI state on stdin.  Not for running by hand.

  create-runtime     ask the daemon to place and register the container's GPU
                     share (exit 1 when it refuses or cannot be reached)
  poststop           ask the daemon to release it (always exits 0)

  --socket PATH      the daemon's local API socket (default: $GPUSHARE_API_SOCKET,
                     else {socket})
  --timeout SECONDS  how long to wait for the daemon (default {timeout:g})
"""

START_DAEMON = (
    "start it (`systemctl start nri-gpushare`, or `nri-gpushare run --config FILE`) "
    "and create the container again"
)


class _Usage(Exception):
    pass


def _say(message: str) -> None:
    """``gpushare: message`` on stderr (the daemon's refusals come prefixed already)."""
    text = message if message.startswith("gpushare:") else f"gpushare: {message}"
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: nothing else to tell
        pass


def parse_args(argv: list[str]) -> tuple[Action, str, float]:
    """(action, socket, timeout) from the hook's arguments; _Usage when they are wrong."""
    action: Action | None = None
    socket, timeout = os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET, DEFAULT_TIMEOUT
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name in ("--socket", "--timeout"):
            if not eq:
                if not args:
                    raise _Usage(f"{name} needs a value")
                value = args.pop(0)
            if name == "--socket":
                if not value:
                    raise _Usage("--socket: empty path")
                socket = value
            else:
                try:
                    timeout = float(value)
                except ValueError:
                    timeout = -1.0
                if not 0 < timeout <= 3600:
                    raise _Usage(f"--timeout {value[:40]!r}: not a number of seconds in (0, 3600]")
        elif arg in ACTIONS and action is None:
            action = next(a for a in ACTIONS if a == arg)
        else:
            raise _Usage(f"unexpected argument {arg[:80]!r}")
    if action is None:
        raise _Usage("which hook? create-runtime or poststop")
    return action, socket, timeout


def read_state() -> State:
    """The OCI state on stdin."""
    stdin = sys.stdin
    if stdin is None:
        raise OciError("no OCI state: stdin is closed")
    if stdin.isatty():
        raise OciError("expects the OCI state on stdin (the runtime runs this hook)")
    data = stdin.buffer.read(MAX_STATE + 1)
    return parse_state(data)


def create_request(state: State, info: BundleInfo) -> Request:
    """The createRuntime hook's `create`, from the OCI state and its bundle's
    config.json (what this program sends, and the daemon's `hook` op builds)."""
    return Request(
        "create",
        namespace_of(state.bundle, state.id),
        state.id,
        via="cdi",
        bundle=state.bundle,
        pid=state.pid,
        cgroups_path=info.cgroups_path,
        env=info.env,
        annotations=info.annotations,
        gpu_minors=info.gpu_minors or None,
    )


def create_runtime(state: State, socket: str, timeout: float) -> int:
    """The createRuntime hook; its exit status."""
    request = create_request(state, bundle_info(read_config(state.bundle)))
    try:
        reply = ask(request, socket, timeout)
    except Unavailable as e:
        _say(
            f"the nri-gpushare daemon is not running or not answering ({e}); this container "
            f"was given a GPU through its CDI spec and is not started unguarded: {START_DAEMON}"
        )
        return 1
    if not reply.ok:
        _say(reply.error or f"the nri-gpushare daemon refused the container ({reply.reason})")
        return 1
    return 0


def poststop(state: State, socket: str, timeout: float) -> None:
    """The poststop hook: release the container's share (problems only told)."""
    try:
        reply = ask(
            Request("release", namespace_of(state.bundle, state.id), state.id), socket, timeout
        )
    except Unavailable as e:
        _say(f"could not release container {state.id}'s GPU share: {e}")
        return
    if not reply.ok:
        _say(f"could not release container {state.id}'s GPU share: {reply.error or reply.reason}")


def main(argv: list[str] | None = None) -> int:
    """`nri-gpushare hook ...` (argv: what follows ``hook``); the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        sys.stdout.write(USAGE.format(socket=DEFAULT_SOCKET, timeout=DEFAULT_TIMEOUT))
        return 0
    # A usage error in a poststop hook must not fail the delete; any other
    # must fail the container (a broken spec must not let a GPU run unguarded).
    stopping = [a for a in argv if not a.startswith("-")][:1] == ["poststop"]
    try:
        action, socket, timeout = parse_args(argv)
    except _Usage as e:
        _say(f"hook: {e}")
        sys.stderr.write(USAGE.format(socket=DEFAULT_SOCKET, timeout=DEFAULT_TIMEOUT))
        return 0 if stopping else 2
    try:
        state = read_state()
        if action == "poststop":
            poststop(state, socket, timeout)
            return 0
        return create_runtime(state, socket, timeout)
    except (OciError, ProtocolError) as e:
        _say(f"{action} hook: {e}")
    except Exception as e:  # never a traceback into the runtime's error message
        _say(f"{action} hook: unexpected error: {type(e).__name__}: {e}")
    return 0 if action == "poststop" else 1
