"""Synchronize's pods and containers read by the native scanner
(`wire.native`): a request's views in one call, each reduced to the few
fields Synchronize reads of most of them, with the views' own rules.

`scan_pods` and `scan_containers` return, per view, a head or None: None
where the view must be read the Python way (the scanner found it malformed,
a string is not UTF-8, a container has more than one `linux`), so that what
is refused, and how, stays the views'. They return None for the whole list
when the library is not there (or the views are not over one `bytes`).
The marker texts are the caller's (`may_ask`'s): this layer knows none.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from nri_gpushare.nri.api import fields as F
from nri_gpushare.nri.api import nri
from nri_gpushare.nri.api.views import (
    _CTR_TYPES,
    _LINUX_TYPES,
    _POD_TYPES,
    ContainerView,
    PodSandboxView,
    _LazyMessage,
)
from nri_gpushare.nri.wire import native

Markers = tuple[bytes, ...]

_P, _C, _L = F.PodSandbox, F.Container, F.LinuxContainer
_STOPPED = nri.ContainerState.CONTAINER_STOPPED.value


class PodHead(NamedTuple):
    id: str
    name: str
    uid: str
    namespace: str
    asks: bool  # holds a coarse and a raw marker


class ContainerHead(NamedTuple):
    id: str
    pod_sandbox_id: str
    name: str
    cgroups_path: str
    pid: int
    running: bool  # state is not CONTAINER_STOPPED
    asks: bool


@functools.cache
def _scanner(kind: str, coarse: Markers, raw: Markers) -> native.Scanner | None:
    lib = native.library()
    if lib is None:
        return None
    if kind == "pod":
        want: tuple[int, ...] = (_P.ID, _P.NAME, _P.UID, _P.NAMESPACE)
        return native.Scanner(lib, _POD_TYPES, want, coarse, raw)
    want = (_C.ID, _C.POD_SANDBOX_ID, _C.NAME, _C.STATE, _C.PID)
    return native.Scanner(
        lib, _CTR_TYPES, want, coarse, raw, _C.LINUX, _LINUX_TYPES, (_L.CGROUPS_PATH,)
    )


def _groups(views: Sequence[_LazyMessage]) -> list[tuple[bytes, Sequence[int]]]:
    """The views' indexes by buffer (the usual request: one), `bytes` only."""
    buf = views[0].buf
    if all(v.buf is buf for v in views):
        return [(buf, range(len(views)))] if type(buf) is bytes else []
    by_buf: dict[int, tuple[bytes, list[int]]] = {}
    for i, v in enumerate(views):
        if type(v.buf) is bytes:
            by_buf.setdefault(id(v.buf), (v.buf, []))[1].append(i)
    return list(by_buf.values())


def _rows(
    kind: str, views: Sequence[_LazyMessage], coarse: Markers, raw: Markers
) -> Iterator[tuple[bytes, Sequence[int], array[int], int]] | None:
    """Per buffer: it, its views' indexes, their rows and the row width."""
    scanner = _scanner(kind, coarse, raw)
    if scanner is None:
        return None
    return _scanned(scanner, views)


def _scanned(
    scanner: native.Scanner, views: Sequence[_LazyMessage]
) -> Iterator[tuple[bytes, Sequence[int], array[int], int]]:
    for buf, which in _groups(views) if views else ():
        spans = array("q")
        for i in which:
            spans.append(views[i].start)
            spans.append(views[i].end)
        rows = scanner.scan(buf, spans)
        if rows is not None:
            yield buf, which, rows, scanner.width


def scan_pods(
    pods: Sequence[PodSandboxView], coarse: Markers, raw: Markers
) -> list[PodHead | None] | None:
    """Each pod's head (None: read the view), or None: read them all."""
    got = _rows("pod", pods, coarse, raw)
    if got is None:
        return None
    heads: list[PodHead | None] = [None] * len(pods)
    for buf, which, rows, width in got:
        for i, row in zip(which, zip(*[iter(rows)] * width, strict=True), strict=True):
            status, asks, ia, ib, na, nb, ua, ub, sa, sb = row
            if status:
                continue  # the view says how it is malformed
            try:
                heads[i] = PodHead(
                    buf[ia:ib].decode(),
                    buf[na:nb].decode(),
                    buf[ua:ub].decode(),
                    buf[sa:sb].decode(),
                    asks != 0,
                )
            except UnicodeDecodeError:
                pass  # read the view: it names the field
    return heads


def scan_containers(
    containers: Sequence[ContainerView], coarse: Markers, raw: Markers
) -> list[ContainerHead | None] | None:
    """Each container's head (None: read the view), or None: read them all."""
    got = _rows("container", containers, coarse, raw)
    if got is None:
        return None
    heads: list[ContainerHead | None] = [None] * len(containers)
    for buf, which, rows, width in got:
        for i, row in zip(which, zip(*[iter(rows)] * width, strict=True), strict=True):
            status, asks, ia, ib, sa, sb, na, nb, state, _, pid, _, ca, cb = row
            if status:
                continue  # the view says how it is malformed
            try:
                heads[i] = ContainerHead(
                    buf[ia:ib].decode(),
                    buf[sa:sb].decode(),
                    buf[na:nb].decode(),
                    buf[ca:cb].decode(),
                    pid & 0xFFFFFFFF,
                    state & 0xFFFFFFFF != _STOPPED,  # an int32: its low 32 bits
                    asks != 0,
                )
            except UnicodeDecodeError:
                pass  # read the view: it names the field
    return heads
