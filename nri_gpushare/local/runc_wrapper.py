"""`gpushare-runc`: a drop-in runc that gives containers started by ctr,
nerdctl or docker (which never reach NRI) their GPU share.

This is the reference implementation.  What a node runs as gpushare-runc is
the compiled front (``front/``, ``gpushare-front``): it does the common
create and delete itself (the daemon reads and edits the bundle: the local
API's ``runc-create``) and execs this program, with the same arguments and
``$GPUSHARE_RUNC`` set to the runc it found, for ``exec`` and every odd case.

Install it as the runtime binary (containerd: the runc runtime's
``BinaryName``; docker: ``--add-runtime``/``default-runtime``), or as ``runc``
ahead of the real one on PATH.  The real runc is ``$GPUSHARE_RUNC``, else the
first ``runc`` on PATH that is not this program, else /usr/sbin/runc or
/usr/bin/runc.

Every subcommand but create, delete and exec is the real runc: ``os.execv``
with the arguments untouched, decided from the arguments alone (no socket,
no file read), so ``state``, ``start``, ``kill``, ``ps`` ... cost one Python
start.
``run`` and ``restore`` are passed through as well: containerd's shims never
use ``run`` (they create, then start), and a restored checkpoint is not
placed again.  (argv[0] becomes the real runc's path: runc re-executes
itself through /proc/self/exe, not argv[0].)

``exec --process FILE``: a process exec'd into the container (``ctr task
exec``, ``docker exec``) is described by its caller from containerd's (or
docker's) copy of the spec, which never saw what create wrote into
config.json.  When the container carries ``gpushare.io/assigned`` in its
bundle's config.json (found through ``runc state``), the variables create
injected (`INJECTED_ENV`, `INJECTED_PREFIX`) are copied from config.json
into FILE, so the exec'd process is held to the share as the first one is
(without them the interposer cannot find its quota).  A failure to do so is
said in the runc log and the process is exec'd as it was asked.

``create``: read the bundle's config.json, ask the daemon (``create``,
via "runc").  A refusal fails the create (``gpushare: <why>`` on stderr and,
when runc was given ``--log``, as an error entry in that log, which is where
containerd's shim takes the message it shows: "OCI runtime create failed:
gpushare: ...") and leaves config.json alone.  No share (plan null): exec the
real runc untouched.  A share: write the plan into config.json (devices with
their cgroup rules, env, mounts, annotations; a new file renamed over the old
one), then run the real runc create **as a child** rather than exec it, for
two reasons: (1) after it succeeds the container's first process exists in
its new cgroup, and its pid (from ``--pid-file``, else ``runc state``) is sent
as ``start`` so the daemon binds the registration to that cgroup; (2) when it
fails, the share is released at once instead of staying booked for a
container that does not exist.  The child gets the same arguments,
environment, stdio and inherited file descriptors (``--console-socket``,
``--preserve-fds``), and the signals the wrapper gets are passed on to it.

``delete``: run the real runc delete as a child; when it succeeds, send
``release`` (problems are only told) and exit with runc's status.

Daemon unreachable at create: a container that asks for no share by its
environment or annotations is created as if the wrapper were not there
(its containerd labels cannot be read without the daemon, which is said in
the runc log); one that asks for one is refused with a message saying so.

The socket is ``$GPUSHARE_API_SOCKET``, else
`nri_gpushare.local.client.DEFAULT_SOCKET`.  Only the standard library and
`nri_gpushare.local` are imported: `runc_args` (the command line) and
`real_runc` for every call, the client and `oci` only for create, delete and
exec.
"""

from __future__ import annotations

import os
import sys

from nri_gpushare.local.real_runc import exec_runc, find_runc, run_runc, tell
from nri_gpushare.local.runc_args import (
    CREATE_BOOL,
    CREATE_VALUE,
    DELETE_BOOL,
    EXEC_BOOL,
    EXEC_VALUE,
    parse_command,
    parse_globals,
)

TYPE_CHECKING = False  # typing is not imported: it costs a container start milliseconds
if TYPE_CHECKING:
    from nri_gpushare.local.protocol import Reply, Request


# Copies, not imports (`local` imports the standard library only, and this
# runs in every container start); tests/unit/test_local_constants.py pins each
# to its original.
SOCKET_ENV = "GPUSHARE_API_SOCKET"  # nri_gpushare.local.hook.SOCKET_ENV
# What asks for a share, for when the daemon cannot be asked: our keys
# (nri_gpushare.names.KEY_PREFIX, less names.ASSIGNED, which records what a
# container was given) and the request variables
# (nri_gpushare.share.request.sources.REQUEST_ENV, the opt-out CGPU_DISABLE
# aside).  Broader than what the daemon honours (any ALIYUN_COM_GPU_* or
# GPUSHARE_* variable), so that a container is never started unguarded by
# mistake.
KEY_PREFIX = "gpushare.io/"
ASSIGNED = "gpushare.io/assigned"
REQUEST_ENV_PREFIXES = ("ALIYUN_COM_GPU_", "GPUSHARE_")
REQUEST_ENV_NAMES = ("EGPU",)

START_DAEMON = "start it (`systemctl start nri-gpushare`, or `nri-gpushare run --config FILE`)"


def share_hints(env: dict[str, str], annotations: dict[str, str]) -> list[str]:
    """What in a container's env and annotations may ask for a share (names
    only, quoted short: the container chose them)."""
    found = [
        f"annotation {k[:64]!r}" for k in annotations if k.startswith(KEY_PREFIX) and k != ASSIGNED
    ]
    found += [
        f"environment {k[:64]!r}"
        for k, v in env.items()
        if (k in REQUEST_ENV_NAMES or k.startswith(REQUEST_ENV_PREFIXES)) and v.strip()
    ]
    return sorted(found)


class _Wrapper:
    """One create or delete: the arguments, the real runc and where to tell things."""

    def __init__(self, argv: list[str], options: dict[str, str], at: int, real: str) -> None:
        self.argv = argv
        self.globals = argv[1 : 1 + at]  # runc's global options, as given
        self.root = options.get("root", "")
        log = options.get("log", "")
        self.log = (log, options.get("log-format", "text")) if log else None
        self.real = real
        self.socket = os.environ.get(SOCKET_ENV) or ""

    def error(self, message: str) -> None:
        tell(message, "error", self.log)

    def warn(self, message: str) -> None:
        # On success runc's stderr is the container's: warnings go to the log when there is one.
        tell(message, "warning", self.log, stderr=self.log is None)

    def run(self) -> int:
        """The real runc's exit status, run as a child with our arguments."""
        try:
            return run_runc(self.real, self.argv)
        except OSError as e:
            self.error(f"cannot run {self.real}: {e.strerror or e}")
            return 127

    def ask(self, request: Request) -> Reply:
        from nri_gpushare.local.client import DEFAULT_SOCKET, ask

        return ask(request, self.socket or DEFAULT_SOCKET)

    def release(self, namespace: str, cid: str) -> None:
        from nri_gpushare.local.client import Unavailable
        from nri_gpushare.local.protocol import ProtocolError, Request

        try:
            reply = self.ask(Request("release", namespace, cid))
        except (Unavailable, ProtocolError) as e:
            self.warn(f"could not release container {cid}'s GPU share: {e}")
            return
        if not reply.ok:
            self.warn(f"could not release container {cid}'s GPU share: {reply.error}")

    def create(self, args: list[str]) -> int:
        from nri_gpushare.local import oci
        from nri_gpushare.local.client import Unavailable
        from nri_gpushare.local.protocol import ProtocolError, Request

        parsed = parse_command(args, CREATE_VALUE, CREATE_BOOL)
        if parsed is None:
            self.error(f"cannot tell the container ID from `create {' '.join(args)[:300]}`")
            return 1
        options, arguments = parsed
        if "help" in options or len(arguments) != 1:
            return exec_runc(self.real, self.argv)  # runc prints its help or its complaint
        cid = arguments[0]
        bundle = os.path.abspath(options.get("bundle") or ".")
        try:
            config = oci.read_config(bundle)
            info = oci.bundle_info(config)
        except oci.OciError as e:
            self.error(str(e))
            return 1
        namespace = oci.namespace_of(bundle, cid, self.root)
        request = Request(
            "create",
            namespace,
            cid,
            via="runc",
            bundle=bundle,
            cgroups_path=info.cgroups_path,
            env=info.env,
            annotations=info.annotations,
        )
        try:
            reply = self.ask(request)
        except Unavailable as e:
            hints = share_hints(info.env, info.annotations)
            if not hints:
                self.warn(
                    f"{e}; container {cid} asks for no GPU share by its environment or "
                    "annotations and is created without one (its containerd labels are "
                    "not known without the daemon)"
                )
                return exec_runc(self.real, self.argv)
            shown = ", ".join(hints[:4]) + (", ..." if len(hints) > 4 else "")
            self.error(
                f"{e}; container {cid} asks for a GPU share ({shown}) and is not created "
                f"without the daemon: {START_DAEMON}, or start the container without the "
                "request (its containerd labels are not known without the daemon either)"
            )
            return 1
        except ProtocolError as e:
            if not share_hints(info.env, info.annotations):
                # e.g. an ID runc takes and the API does not: it asks for nothing we can see
                self.warn(f"container {cid} created without asking for a GPU share: {e}")
                return exec_runc(self.real, self.argv)
            self.error(f"cannot ask the nri-gpushare daemon about container {cid}: {e}")
            return 1
        if not reply.ok:
            self.error(reply.error or f"the nri-gpushare daemon refused container {cid}")
            return 1
        if reply.plan is None:
            return exec_runc(self.real, self.argv)
        try:
            oci.write_config(bundle, oci.apply_plan(config, reply.plan))
        except (oci.OciError, oci.PlanError, OSError) as e:
            self.error(f"cannot give container {cid} its GPU share in {bundle}/config.json: {e}")
            self.release(namespace, cid)
            return 1
        code = self.run()
        if code != 0:
            self.release(namespace, cid)
            return code
        self.bind(namespace, cid, options.get("pid-file", ""))
        return 0

    def bind(self, namespace: str, cid: str, pid_file: str) -> None:
        """Tell the daemon the created container's pid (``start``)."""
        from nri_gpushare.local import oci
        from nri_gpushare.local.client import Unavailable
        from nri_gpushare.local.protocol import ProtocolError, Request

        try:
            pid = oci.read_pid_file(pid_file) if pid_file else self.state_pid(cid)
            reply = self.ask(Request("start", namespace, cid, pid=pid))
        except (oci.OciError, Unavailable, ProtocolError) as e:
            self.warn(f"container {cid}'s GPU share is not bound to its cgroup: {e}")
            return
        if not reply.ok:
            self.warn(f"container {cid}'s GPU share is not bound to its cgroup: {reply.error}")

    def state(self, cid: str) -> dict[str, object]:
        """``runc state``'s JSON ({} when it does not answer)."""
        import json
        import subprocess

        command = [self.real, *self.globals, "state", cid]
        try:
            done = subprocess.run(command, capture_output=True, timeout=30, check=False)
            state = json.loads(done.stdout) if done.returncode == 0 else {}
        except (OSError, ValueError, subprocess.TimeoutExpired):
            state = {}
        return state if isinstance(state, dict) else {}

    def state_pid(self, cid: str) -> int:
        """The container's pid from ``runc state`` (when create had no --pid-file)."""
        from nri_gpushare.local.oci import OciError

        pid = self.state(cid).get("pid")
        if type(pid) is not int or pid <= 0:
            raise OciError("runc state did not tell the container's pid")
        return pid

    def delete(self, args: list[str]) -> int:
        parsed = parse_command(args, frozenset(), DELETE_BOOL)
        if parsed is None or "help" in parsed[0] or len(parsed[1]) != 1:
            return exec_runc(self.real, self.argv)
        cid = parsed[1][0]
        code = self.run()
        if code == 0:
            from nri_gpushare.local.oci import namespace_from_root

            self.release(namespace_from_root(self.root), cid)
        return code


# The variables create injects (nri_gpushare.share.plan's and
# share.interposer's), copied as above and pinned.
INJECTED_ENV = ("NVIDIA_VISIBLE_DEVICES", "LD_PRELOAD")
INJECTED_PREFIX = "GPUSHARE_"


def share_env(config: dict[str, object]) -> dict[str, str]:
    """The variables create injected, from a bundle's config.json; {} when
    the container holds no share."""
    annotations = config.get("annotations")
    if not isinstance(annotations, dict) or ASSIGNED not in annotations:
        return {}
    process = config.get("process")
    env = process.get("env") if isinstance(process, dict) else None
    out = {}
    for entry in env if isinstance(env, list) else []:
        if isinstance(entry, str):
            key, _, value = entry.partition("=")
            if key in INJECTED_ENV or key.startswith(INJECTED_PREFIX):
                out[key] = value
    return out


def _with_share_env(wrapper: _Wrapper, args: list[str]) -> None:
    """Give the process of ``exec --process FILE`` the share's variables."""
    import json

    from nri_gpushare.local import oci

    parsed = parse_command(args, EXEC_VALUE, EXEC_BOOL)
    if parsed is None or len(parsed[1]) < 1 or not parsed[0].get("process"):
        return  # runc reads the process from its arguments: nothing to edit
    options, arguments = parsed
    cid, path = arguments[0], options["process"]
    try:
        bundle = wrapper.state(cid).get("bundle")
        if not isinstance(bundle, str):
            raise oci.OciError("runc state did not tell the bundle")
        wanted = share_env(oci.read_config(bundle))
        if not wanted:
            return
        with open(path, "rb") as f:
            process = json.loads(f.read(oci.MAX_CONFIG + 1))
        env = process.get("env") if isinstance(process, dict) else None
        if not isinstance(env, list):
            env = []
        kept = [e for e in env if not (isinstance(e, str) and e.partition("=")[0] in wanted)]
        process["env"] = kept + [f"{k}={v}" for k, v in wanted.items()]
        data = json.dumps(process, separators=(",", ":")).encode()
        tmp = f"{path}.gpushare-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except (OSError, ValueError, oci.OciError) as e:
        wrapper.warn(f"exec into container {cid}: the GPU share's variables not given: {e}")


def main(argv: list[str] | None = None) -> int:
    """gpushare-runc with `argv` (sys.argv: the program, then runc's arguments)."""
    argv = sys.argv if argv is None else argv
    args = argv[1:]
    options, at = parse_globals(args)
    command = args[at] if at < len(args) else ""
    real = find_runc(argv[0] if argv else "")
    if command not in ("create", "delete", "exec") or options.keys() & {"help", "version"}:
        return exec_runc(real, argv)
    if real is None:
        return exec_runc(real, argv)  # says so
    wrapper = _Wrapper(argv, options, at, real)
    try:
        if command == "exec":
            try:
                _with_share_env(wrapper, args[at + 1 :])
            except Exception as e:  # the exec itself must still happen
                wrapper.warn(f"exec: the GPU share's variables not given: {type(e).__name__}")
            return exec_runc(real, argv)
        if command == "create":
            return wrapper.create(args[at + 1 :])
        return wrapper.delete(args[at + 1 :])
    except Exception as e:  # never a traceback in runc's error message
        wrapper.error(f"{command}: unexpected error: {type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
