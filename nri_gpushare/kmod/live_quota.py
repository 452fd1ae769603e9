"""A registered container's quota on one GPU, changed live through its files
/proc/gpushare/<gpu>/<id>/{memsize,weight,highprio}.

The three files are written one at a time, so a change of several is made
all or nothing here: memsize first (the one the module most often refuses:
EBUSY below what the container's processes hold, ENOSPC without room), then
weight (ENOSPC), then highprio; when a later write is refused, the earlier
ones are written back before the refusal is raised.  A value that does not
change is not written.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

from nri_gpushare.kmod import abi
from nri_gpushare.kmod.refusals import refusal
from nri_gpushare.share.kernel import (
    GpuQuota,
    KmodError,
    MemoryHeld,
    ModuleNotLoaded,
    NotRegistered,
)
from nri_gpushare.units import format_bytes

log = logging.getLogger(__name__)


class LiveQuota:
    """`update` for the module whose tree is `root`; `upgrading()` tells an
    upgrade's EBUSY from a memsize below what is held; `not_loaded()` is the
    error for a module that is not there."""

    def __init__(
        self,
        root: Path,
        upgrading: Callable[[], bool],
        not_loaded: Callable[[], ModuleNotLoaded],
    ) -> None:
        self.root = root
        self.upgrading = upgrading
        self.not_loaded = not_loaded

    def update(self, container_id: str, quota: GpuQuota) -> None:
        gpu = quota.gpu_index
        d = self.root / str(gpu) / container_id
        what = f"changing the quota of container {container_id} on GPU {gpu}"
        if not abi.valid_id(container_id):
            raise KmodError(f"{what}: not a valid container ID", errno.EINVAL)
        wanted = {
            "memsize": quota.memory_bytes,
            "weight": quota.core_percent,
            "highprio": int(quota.high_priority),
        }
        written: list[tuple[str, int]] = []  # (file, its value before)
        try:
            for name, value in wanted.items():
                before = self._read(d, name, what)
                if before != value:
                    self._write(d, name, value, what)
                    written.append((name, before))
        except BaseException:
            for name, before in reversed(written):
                try:
                    self._write(d, name, before, f"{what} (undoing)")
                except KmodError as e:
                    log.error("%s: %s could not be written back: %s", what, name, e)
            raise

    def _read(self, d: Path, name: str, what: str) -> int:
        try:
            text = (d / name).read_text(errors="replace")
        except FileNotFoundError:
            raise self._absent(d, what) from None
        except OSError as e:
            raise refusal(
                e, what, {errno.EIO: "it was unregistered meanwhile"}, self.upgrading
            ) from e
        value = text.removesuffix("\n")
        if not value.isascii() or not value.isdigit() or len(value) > 20:
            raise KmodError(
                f"{what}: unexpected {d / name}: {text[:40]!r} (module and plugin versions "
                f"differ?)",
                errno.EPROTO,
            )
        return int(value)

    def _write(self, d: Path, name: str, value: int, what: str) -> None:
        path = d / name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise self._absent(d, what) from None
        except OSError as e:
            raise refusal(e, what, {}, self.upgrading) from e
        try:
            os.write(fd, f"{value}\n".encode())
        except OSError as e:
            if e.errno == errno.EBUSY and name == "memsize" and not self.upgrading():
                raise self._held(d, value, what) from e
            hints = {
                errno.ENOSPC: f"GPU {d.parent.name} has no room for {name} {value}",
                errno.EINVAL: f"the module refused {name} {value} as invalid",
                errno.EIO: "it was unregistered meanwhile",
            }
            raise refusal(e, what, hints, self.upgrading) from e
        finally:
            os.close(fd)

    def _held(self, d: Path, value: int, what: str) -> MemoryHeld:
        gpu = int(d.parent.name)
        try:
            held = self._read(d, "memused", what)
        except KmodError:
            held = value + 1  # at least more than asked: the module said so
            amount = "more than that"
        else:
            amount = format_bytes(held)
        return MemoryHeld(
            f"{what}: its processes hold {amount} on GPU {gpu}; memsize cannot go below "
            f"that ({format_bytes(value)} asked)",
            gpu,
            held,
        )

    def _absent(self, d: Path, what: str) -> KmodError:
        if not (self.root / "inst_ctl").is_file():
            return self.not_loaded()
        return NotRegistered(f"{what}: it is not registered on GPU {d.parent.name}")
