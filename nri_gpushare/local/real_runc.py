"""The real runc, for gpushare-runc: finding it, becoming it (exec), running
it as a child, and writing to its log in runc's own format.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported: it costs a container start milliseconds
if TYPE_CHECKING:
    from typing import Literal

RUNC_ENV = "GPUSHARE_RUNC"
FALLBACK_RUNC = ("/usr/sbin/runc", "/usr/bin/runc")


def _same_file(a: os.stat_result, path: str) -> bool:
    try:
        b = os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def find_runc(self_path: str) -> str | None:
    """The real runc: $GPUSHARE_RUNC, else the first executable `runc` on PATH
    that is not `self_path` (this program), else /usr/sbin/runc, /usr/bin/runc."""
    chosen = os.environ.get(RUNC_ENV)
    if chosen:
        return chosen
    try:
        me: os.stat_result | None = os.stat(self_path) if "/" in self_path else None
    except OSError:
        me = None
    directories = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    candidates = [os.path.join(d, "runc") for d in directories] + list(FALLBACK_RUNC)
    for path in candidates:
        if not os.path.isfile(path) or not os.access(path, os.X_OK):
            continue
        if me is not None and _same_file(me, path):
            continue
        return path
    return None


def tell(
    message: str,
    level: Literal["error", "warning"],
    log: tuple[str, str] | None,
    *,
    stderr: bool = True,
) -> None:
    """``gpushare: message`` on stderr and, with runc's --log, in that log in
    runc's format (json: what containerd's shim reads the failure from).  The
    daemon's refusals come prefixed already."""
    text = message if message.startswith("gpushare:") else f"gpushare: {message}"
    if stderr:
        try:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
    if not log or not log[0]:
        return
    import json
    import time

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if log[1] == "json":
        line = json.dumps({"level": level, "msg": text, "time": now})
    else:
        line = f"time={json.dumps(now)} level={level} msg={json.dumps(text)}"
    try:
        fd = os.open(log[0], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def exec_runc(real: str | None, argv: list[str]) -> int:
    """Become the real runc with argv[1:] untouched (returns only on failure)."""
    if real is None:
        sys.stderr.write(
            f"gpushare: no real runc found (not on PATH, not in {' or '.join(FALLBACK_RUNC)}); "
            f"set {RUNC_ENV}\n"
        )
        return 127
    import signal

    # Python ignores these; an exec'd program would inherit that.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    try:
        os.execv(real, [real, *argv[1:]])
    except OSError as e:
        sys.stderr.write(f"gpushare: cannot run {real}: {e.strerror or e}\n")
    return 127


def run_runc(real: str, argv: list[str]) -> int:
    """Run the real runc with argv[1:] as a child (stdio, environment and
    inheritable descriptors shared; our signals passed on); its exit status
    (128 + N when killed by signal N)."""
    import signal

    child = os.posix_spawn(
        real, [real, *argv[1:]], os.environ, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ)
    )

    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(child, signum)
        except OSError:
            pass

    passed = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    before = {s: signal.signal(s, forward) for s in passed}
    try:
        _, status = os.waitpid(child, 0)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code
