"""The CUDA interposer (libgpushare.so) in a container: whether a share gets
it, and what is injected for it.

A share with isolation full or memory gets the node's library bind-mounted
read-only at `InterposerPolicy.container_path`, and every process of the
container loads it:

- preload ld.so.preload (default): a one-line file the daemon writes in its
  state directory (the container path) is bind-mounted read-only over the
  container's /etc/ld.so.preload.  The dynamic loader reads that file for
  every dynamically linked program whatever its environment, so a program
  that clears its environment (env -i, a sanitising launcher) still loads
  the interposer.  The image's own /etc/ld.so.preload, if it has one, is
  hidden by the mount.
- preload env: LD_PRELOAD only (put in front of what the container's
  environment already has).  The image's /etc/ld.so.preload stays; a program
  that clears its environment runs without the interposer.

Neither reaches a statically linked program, or one that talks to
/dev/nvidia* itself; and glibc skips a preload entry it cannot load (with a
message on stderr) instead of failing.  See docs/security.md.

The mount's source is the library the configured path resolves to when the
container is created (`os.path.realpath`, looked up again whenever the file
the path leads to changes: another inode, or the same one renamed, which
changes its ctime): the node installer keeps each
version at /usr/lib/nri-gpushare/<version>/libgpushare.so and swaps the
configured symlink to a new one, so a container's spec names the exact
version it got, and an upgrade never changes a file a container has mounted.

Isolation none gets nothing.  Whether the library is on the node is asked
at each create through `LibraryCheck` (the daemon wires in the host's,
`nri_gpushare.host.devices.library_problem`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

from nri_gpushare.share.model import ETC_LD_SO_PRELOAD, InterposerPolicy, Mount

MOUNT_OPTIONS = ("rbind", "ro", "nosuid", "nodev")


class LibraryCheck(Protocol):
    def __call__(self, path: str) -> str:
        """Why the file at `path` cannot serve as the interposer ("" when it can)."""


_RESOLVED: dict[str, tuple[tuple[int, int, int], str]] = {}


def resolved(path: str) -> str:
    """`os.path.realpath(path)`, from one stat while the file it leads to is
    the same (device, inode, ctime) as when it was last resolved."""
    try:
        st = os.stat(path)
    except OSError:
        return os.path.realpath(path)
    key = (st.st_dev, st.st_ino, st.st_ctime_ns)
    known = _RESOLVED.get(path)
    if known is not None and known[0] == key:
        return known[1]
    real = os.path.realpath(path)
    if len(_RESOLVED) > 16:  # one configured library; a few in tests
        _RESOLVED.clear()
    _RESOLVED[path] = (key, real)
    return real


def wants_interposer(isolation: str) -> bool:
    """Whether a share with this isolation is given the interposer."""
    return isolation in ("full", "memory")


def preload_file_text(policy: InterposerPolicy) -> str:
    """The content of the file mounted at /etc/ld.so.preload."""
    return policy.container_path + "\n"


def interposer_injection(
    policy: InterposerPolicy, env: Mapping[str, str]
) -> tuple[tuple[Mount, ...], dict[str, str]]:
    """Mounts and environment that load the interposer; `env`: the
    container's own environment (kept behind ours in LD_PRELOAD).  The
    library's mount source is the file its configured path resolves to now."""
    library = resolved(policy.library)
    mounts = [Mount(library, policy.container_path, options=MOUNT_OPTIONS)]
    injected: dict[str, str] = {}
    if policy.preload == "ld.so.preload":
        if not policy.preload_file:
            raise ValueError("interposer preload ld.so.preload without the host's preload file")
        mounts.append(Mount(policy.preload_file, ETC_LD_SO_PRELOAD, options=MOUNT_OPTIONS))
    else:
        theirs = env.get("LD_PRELOAD", "")
        injected["LD_PRELOAD"] = policy.container_path + (f":{theirs}" if theirs else "")
    if policy.allow_managed:
        injected["GPUSHARE_ALLOW_MANAGED"] = "1"
    return tuple(mounts), injected


def missing_message(policy: InterposerPolicy, who: str, problem: str) -> str:
    """The refusal when the library is not usable on the node."""
    return (
        f"gpushare: cannot create {who}: isolation full|memory needs the CUDA interposer, "
        f"and {policy.library} {problem} on this node; install libgpushare.so there "
        f"(or set interposer.library in the node config), or ask for "
        f"gpushare.io/isolation: none, or set interposer.missing: warn to run such "
        f"shares without it"
    )
