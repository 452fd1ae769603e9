"""The real kernel-module client: gpushare.ko through /proc/gpushare.

Every request is one write to /proc/gpushare/inst_ctl in the grammar of
kmod/README.md; the registry is read back from the same file.  The module's
errno answers become the client interface's exceptions (`refusals`), its
files plain values (`readings`), a runtime's cgroup name the path the module
resolves (`cgroup`).  Every call blocks until the
kernel answers: the plugin runs this client off its event loop, under a
timeout (`nri_gpushare.host.kmod_worker`); the CLI and the tests call it directly.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence
from pathlib import Path

from nri_gpushare.kmod import abi
from nri_gpushare.kmod.cgroup import cgroup2_mounts, cgroup_v2_path
from nri_gpushare.kmod.live_quota import LiveQuota
from nri_gpushare.kmod.readings import GpuState, MemInfo, parse_meminfo
from nri_gpushare.kmod.refusals import (
    explain_invalid,
    explain_overcommit,
    explain_undeclared,
    refusal,
)
from nri_gpushare.names import PROC_ROOT
from nri_gpushare.share.kernel import (
    GpuDeclaration,
    GpuQuota,
    GpusNotDeclared,
    KmodError,
    ModuleNotLoaded,
    NotRegistered,
    Registration,
)
from nri_gpushare.units import format_bytes

_NUMBER = re.compile(r"0|[1-9][0-9]{0,19}")
"""A number as the module writes it: decimal, at most 20 digits (u64)."""


def _read(path: Path) -> str:
    """A file of the module's tree (ASCII); a byte that is not UTF-8 is
    read as U+FFFD, which no value check takes."""
    return path.read_text(errors="replace")


class ProcfsKernelModule:
    """KernelModuleClient for the real gpushare.ko (see kmod/README.md)."""

    def __init__(
        self,
        root: str | os.PathLike[str] = PROC_ROOT,
        *,
        mountinfo: str | os.PathLike[str] = "/proc/self/mountinfo",
    ) -> None:
        self.root = Path(root)
        self.mountinfo = mountinfo

    # -- KernelModuleClient -----------------------------------------------------------

    def loaded(self) -> bool:
        return (self.root / "inst_ctl").is_file()

    def declare_gpus(self, gpus: Sequence[GpuDeclaration]) -> None:
        for gpu in gpus:
            what = f"declaring GPU {gpu.index} ({format_bytes(gpu.memory_bytes)}) to gpushare.ko"
            try:
                self._control(f"gpu {gpu.index} {gpu.memory_bytes}")
            except OSError as e:
                hints = {
                    errno.EINVAL: f"the index must be 0..{abi.MAX_GPUS - 1} and the memory > 0",
                    errno.ENOSPC: "its containers already hold more memory than that",
                }
                raise self._error(e, what, hints) from e

    def register(self, registration: Registration) -> None:
        cid = registration.container_id
        spec = ",".join(
            f"{q.gpu_index}:{q.memory_bytes}:{q.core_percent}:{int(q.high_priority)}"
            for q in registration.quotas
        )
        what = f"registering container {cid} with gpushare.ko ({describe(registration)})"
        try:
            self._control(f"add {cid} {spec}")
        except OSError as e:
            hints = {
                errno.EEXIST: "it is already registered; unregister it first",
                errno.EINVAL: explain_invalid(registration),
                errno.ENXIO: explain_undeclared(registration, self._declared()),
                errno.ENOSPC: explain_overcommit(registration, self.gpu_state),
            }
            raise self._error(e, what, hints) from e

    def bind_cgroup(self, container_id: str, cgroup_path: str) -> None:
        what = f"binding container {container_id} to cgroup {cgroup_path}"
        try:
            path = cgroup_v2_path(cgroup_path, cgroup2_mounts(self.mountinfo))
        except ValueError as e:
            raise KmodError(f"{what}: {e}", errno.EINVAL) from None
        self._bind(container_id, path, what)

    def unbind_cgroup(self, container_id: str) -> None:
        self._bind(container_id, "0", f"unbinding container {container_id} from its cgroup")

    def unregister(self, container_id: str) -> None:
        try:
            self._control(f"del {container_id}")
        except OSError as e:
            hints = {errno.ENOENT: "it is not registered", errno.EINVAL: "not a valid container ID"}
            raise self._error(
                e, f"unregistering container {container_id} from gpushare.ko", hints
            ) from e

    def registrations(self) -> list[Registration]:
        regs = []
        for words in self._dump():
            if words[0] != "add":
                continue
            quotas = []
            for item in words[2].split(",") if len(words) == 3 else [""]:
                fields = item.split(":")
                if len(fields) != 4 or not all(_NUMBER.fullmatch(x) for x in fields):
                    raise self._unexpected(words)
                gpu, mem, weight, prio = (int(x) for x in fields)
                quotas.append(GpuQuota(gpu, mem, weight, bool(prio)))
            regs.append(Registration(words[1], tuple(quotas)))
        return regs

    def update_quota(self, container_id: str, quota: GpuQuota) -> None:
        LiveQuota(self.root, self.upgrading, self._not_loaded).update(container_id, quota)

    # -- more of the module's state -----------------------------------------------------

    def gpus(self) -> list[GpuDeclaration]:
        return [
            GpuDeclaration(self._word(w, 1), self._word(w, 2))
            for w in self._dump()
            if w[0] == "gpu"
        ]

    def bindings(self) -> dict[str, int]:
        """Container ID -> the cgroup v2 id it is bound to (bound ones only)."""
        return {w[1]: self._word(w, 2) for w in self._dump() if w[0] == "bind"}

    def gpu_state(self, index: int) -> GpuState:
        d = self.root / str(index)
        names = (
            "total_memsize",
            "free_memsize",
            "free_weight",
            "nr_inst",
            "max_inst",
            "policy",
            "prio_ratio",
        )
        what = f"reading GPU {index}'s state"
        try:
            values = [self._number(_read(d / n), d / n, what) for n in names]
        except FileNotFoundError:
            if not self.loaded():
                raise self._not_loaded() from None
            raise GpusNotDeclared(f"GPU {index} is not declared to gpushare.ko") from None
        return GpuState(index, *values)

    def default_memsize(self) -> int:
        path = self.root / "default_memsize"
        try:
            text = _read(path)
        except FileNotFoundError:
            if not self.loaded():
                raise self._not_loaded() from None
            raise KmodError(
                f"{path} is missing (module and plugin versions differ?)", errno.EPROTO
            ) from None
        return self._number(text, path, "reading the default memsize")

    def meminfo(self, gpu: int, container_id: str) -> MemInfo:
        """A registered container's memory on one of its GPUs: free bytes,
        the bytes each of its processes holds, and (`used`) what they hold
        together.  memsize is read before and after meminfo, again if it
        changed meanwhile, so `used` is memsize - free of one moment.
        Root only (a container's directory is 0500).  NotRegistered when
        the container has no quota on that GPU, ModuleNotLoaded."""
        d = self.root / str(gpu) / container_id
        what = f"reading the memory of container {container_id} on GPU {gpu}"
        if not abi.valid_id(container_id):
            raise KmodError(f"{what}: not a valid container ID", errno.EINVAL)
        try:
            for _ in range(100):
                memsize = self._number(_read(d / "memsize"), d / "memsize", what)
                text = _read(d / "meminfo")
                if self._number(_read(d / "memsize"), d / "memsize", what) == memsize:
                    break
            else:
                raise KmodError(f"{what}: its memsize keeps changing", errno.EAGAIN)
        except FileNotFoundError:
            if not self.loaded():
                raise self._not_loaded() from None
            raise NotRegistered(
                f"{what}: it is not registered there (or GPU {gpu} is not declared)"
            ) from None
        except OSError as e:
            # A container deleted while its files were read: EIO or ENOENT.
            if e.errno in (errno.EIO, errno.ENOENT):
                raise NotRegistered(f"{what}: it was unregistered meanwhile") from e
            raise self._error(e, what, {}) from e
        try:
            return parse_meminfo(text, memsize)
        except ValueError as e:
            raise KmodError(
                f"{what}: unexpected {d / 'meminfo'}: {e} (module and plugin versions differ?)",
                errno.EPROTO,
            ) from None

    def gputime(self, gpu: int, container_id: str) -> int | None:
        """Nanoseconds of GPU time the compute scheduler charged a registered
        container on one GPU (/proc/gpushare/<gpu>/<id>/gputime; it only
        grows while the container stays registered).  None from a module
        that does not measure it (no such file: an older module).  Root only.
        NotRegistered when the container has no quota on that GPU,
        ModuleNotLoaded."""
        d = self.root / str(gpu) / container_id
        what = f"reading the GPU time of container {container_id} on GPU {gpu}"
        if not abi.valid_id(container_id):
            raise KmodError(f"{what}: not a valid container ID", errno.EINVAL)
        absent = NotRegistered(f"{what}: it is not registered there (or GPU {gpu} is not declared)")
        try:
            text = self._read_newer(d, "gputime", absent)
        except OSError as e:
            if e.errno in (errno.EIO, errno.ENOENT):
                raise NotRegistered(f"{what}: it was unregistered meanwhile") from e
            raise self._error(e, what, {}) from e
        return None if text is None else self._number(text, d / "gputime", what)

    def slice_us(self, gpu: int) -> int | None:
        """A GPU's scheduling slice in microseconds; None from a module
        without a compute scheduler (no such file)."""
        d = self.root / str(gpu)
        absent = GpusNotDeclared(f"GPU {gpu} is not declared to gpushare.ko")
        if (text := self._read_newer(d, "slice_us", absent)) is None:
            return None
        return self._number(text, d / "slice_us", f"reading the slice of GPU {gpu}")

    def drain_us(self, gpu: int) -> int | None:
        """How long past its slice a holder's drain may go on (its heartbeats,
        ABI 4), microseconds; None from a module without it (no such file)."""
        return self._gpu_number(gpu, "drain_us", f"reading the drain bound of GPU {gpu}")

    def forced_ends(self, gpu: int) -> int | None:
        """Slices of a GPU ended by force since it was declared (a counter);
        None from a module that does not count them (no such file)."""
        return self._gpu_number(gpu, "forced_ends", f"reading GPU {gpu}'s forced ends")

    def _gpu_number(self, gpu: int, name: str, what: str) -> int | None:
        d = self.root / str(gpu)
        absent = GpusNotDeclared(f"GPU {gpu} is not declared to gpushare.ko")
        if (text := self._read_newer(d, name, absent)) is None:
            return None
        return self._number(text, d / name, what)

    def _read_newer(self, d: Path, name: str, absent: KmodError) -> str | None:
        """A file only newer modules have: None when `d` is there without it,
        `absent` when `d` is not (ModuleNotLoaded when the module is not)."""
        try:
            return _read(d / name)
        except FileNotFoundError:
            if not self.loaded():
                raise self._not_loaded() from None
            if d.is_dir():
                return None
            raise absent from None

    def orphaned_memory(self, gpu: int) -> int:
        """Bytes still reserved on a GPU by processes of deleted containers."""
        path = self.root / str(gpu) / abi.ORPHANED
        try:
            return self._number(_read(path), path, f"reading GPU {gpu}'s orphaned memory")
        except FileNotFoundError:
            if not self.loaded():
                raise self._not_loaded() from None
            raise GpusNotDeclared(f"GPU {gpu} is not declared to gpushare.ko") from None

    # -- internals --------------------------------------------------------------------

    def _bind(self, container_id: str, target: str, what: str) -> None:
        try:
            self._control(f"bind {container_id} {target}")
        except OSError as e:
            hints = {
                errno.ENOENT: "the container is not registered",
                errno.ESRCH: f"cgroup {target} does not exist (yet): bind once the container's"
                " cgroup exists (after the runtime created it, e.g. at"
                " StartContainer)",
                errno.EBUSY: f"cgroup {target} is already bound to another container",
                errno.EINVAL: "a container cannot be bound to the root cgroup (it would"
                " claim every process on the node)",
            }
            raise self._error(e, what, hints) from e

    def _control(self, command: str) -> None:
        """One inst_ctl command; OSError carries the module's errno."""
        path = self.root / "inst_ctl"
        data = (command + "\n").encode()

        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise self._not_loaded() from None
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def _dump(self) -> list[list[str]]:
        path = self.root / "inst_ctl"
        try:
            text = _read(path)
        except FileNotFoundError:
            raise self._not_loaded() from None
        except OSError as e:
            raise self._error(e, f"reading {path}", {}) from e
        return [line.split() for line in text.splitlines() if line.strip()]

    def _unexpected(self, words: list[str]) -> KmodError:
        return KmodError(
            f"unexpected line in {self.root / 'inst_ctl'}: {' '.join(words)[:200]!r} "
            f"(module and plugin versions differ?)",
            errno.EPROTO,
        )

    def _word(self, words: list[str], i: int) -> int:
        """Word i of an inst_ctl dump line, a number."""
        if i >= len(words) or not _NUMBER.fullmatch(words[i]):
            raise self._unexpected(words)
        return int(words[i])

    @staticmethod
    def _number(text: str, path: Path, what: str) -> int:
        """A file holding one decimal number >= 0 (and a newline)."""
        if not _NUMBER.fullmatch(text.removesuffix("\n")):
            raise KmodError(
                f"{what}: unexpected {path}: {text[:40]!r} (module and plugin versions differ?)",
                errno.EPROTO,
            )
        return int(text)

    def upgrading(self) -> bool:
        """Whether an upgrade has frozen the module (its upgrade file's header
        says `exported` or `importing`); False when it cannot tell."""
        try:
            with open(self.root / "upgrade", errors="replace") as f:
                words = f.readline().split()
        except OSError:
            return False
        return len(words) == 4 and words[3] != "live"

    def _error(self, e: OSError, what: str, hints: dict[int, str]) -> KmodError:
        return refusal(e, what, hints, self.upgrading)

    def _declared(self) -> set[int]:
        """The declared GPUs' indexes (none when the registry cannot be read)."""
        try:
            return {g.index for g in self.gpus()}
        except KmodError:
            return set()

    def _not_loaded(self) -> ModuleNotLoaded:
        return ModuleNotLoaded(
            f"gpushare.ko is not loaded ({self.root} does not exist): load it with"
            " `modprobe gpushare` (or `insmod kmod/gpushare.ko`), or run the plugin"
            " without the kernel module"
        )


def meminfo(gpu: int, container_id: str, root: str | os.PathLike[str] = PROC_ROOT) -> MemInfo:
    """A registered container's memory on one of its GPUs (see
    ProcfsKernelModule.meminfo): free bytes, bytes per process, `used`."""
    return ProcfsKernelModule(root).meminfo(gpu, container_id)


def describe(registration: Registration) -> str:
    return (
        ", ".join(
            f"GPU {q.gpu_index}: {format_bytes(q.memory_bytes)}, {q.core_percent}% compute"
            + (", high priority" if q.high_priority else "")
            for q in registration.quotas
        )
        or "no GPU"
    )
