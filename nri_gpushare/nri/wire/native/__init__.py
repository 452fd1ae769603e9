"""The native scanner: libnriscan.so (this folder's Makefile builds it next
to this module, so that it is package data), loaded with ctypes.

`Scanner` walks the top level of many messages of one buffer in one call,
with `pb_index.index`'s rules (see nriscan.h); `library()` is None when the
library is missing or does not load (logged once, at info), or when
NRI_GPUSHARE_NATIVE=0: callers then read the Python way, which stays the
reference (the tests compare the two).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

PATH = Path(__file__).with_name("libnriscan.so")
ABI = 1
"""nriscan.h's NRISCAN_ABI: the structures below are that version's."""
ENV = "NRI_GPUSHARE_NATIVE"
"""Set to "0", the Python reader is used even where the library loads."""

# A row's status (nriscan.h): anything but OK means "read it the Python way".
OK, BAD_SPAN, MALFORMED, SUB_MALFORMED, SUB_REPEATED = range(5)


class _Msg(ctypes.Structure):
    _fields_ = [
        ("types", ctypes.POINTER(ctypes.c_int8)),
        ("ntypes", ctypes.c_int32),
        ("want", ctypes.POINTER(ctypes.c_int32)),
        ("nwant", ctypes.c_int32),
    ]


class _Plan(ctypes.Structure):
    _fields_ = [
        ("top", _Msg),
        ("sub_field", ctypes.c_int32),
        ("sub", _Msg),
        ("markers", ctypes.c_char_p),
        ("marker_len", ctypes.POINTER(ctypes.c_int32)),
        ("ncoarse", ctypes.c_int32),
        ("nraw", ctypes.c_int32),
    ]


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, or None (then said once, at info)."""
    if os.environ.get(ENV) == "0":
        log.info("native scanner off (%s=0): Synchronize is read in Python", ENV)
        return None
    try:
        lib = ctypes.CDLL(str(PATH))
        scan, abi = lib.nriscan_scan, lib.nriscan_abi
    except (OSError, AttributeError) as exc:
        log.info("native scanner not loaded (%s): Synchronize is read in Python", exc)
        return None
    abi.restype, abi.argtypes = ctypes.c_int, []
    if abi() != ABI:
        log.info(
            "native scanner not loaded (%s is ABI %d, not %d: a stale build):"
            " Synchronize is read in Python",
            PATH,
            abi(),
            ABI,
        )
        return None
    scan.restype = ctypes.c_int
    scan.argtypes = [
        ctypes.c_char_p,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.POINTER(_Plan),
        ctypes.c_void_p,
    ]
    return lib


def _ints(values: Sequence[int]) -> ctypes.Array[ctypes.c_int32]:
    return (ctypes.c_int32 * max(1, len(values)))(*values)


class Scanner:
    """One message type's plan: its expected wire types (field number ->
    wire type) and wanted fields, a sub message field with its own, and
    the marker texts: a message "asks" when it holds a coarse one and a
    raw one (the caller's texts, as `may_ask` searches them)."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        types: Mapping[int, int],
        want: Sequence[int],
        coarse: Sequence[bytes],
        raw: Sequence[bytes],
        sub_field: int = 0,
        sub_types: Mapping[int, int] | None = None,
        sub_want: Sequence[int] = (),
    ) -> None:
        self._scan = lib.nriscan_scan
        self.width = 2 + 2 * (len(want) + len(sub_want))
        markers = [*coarse, *raw]
        self._keep = (  # what the plan points to lives as long as it
            self._types(types),
            _ints(want),
            self._types(sub_types or {}),
            _ints(sub_want),
            b"".join(markers),
            _ints([len(m) for m in markers]),
        )
        t, w, st, sw, text, lens = self._keep
        self._plan = _Plan(
            _Msg(t, len(t), w, len(want)),
            sub_field,
            _Msg(st, len(st), sw, len(sub_want)),
            text,
            lens,
            len(coarse),
            len(raw),
        )

    @staticmethod
    def _types(types: Mapping[int, int]) -> ctypes.Array[ctypes.c_int8]:
        table = [-1] * (max(types, default=0) + 1)
        for number, wire_type in types.items():
            table[number] = wire_type
        return (ctypes.c_int8 * len(table))(*table)

    def scan(self, buf: bytes, spans: array[int]) -> array[int] | None:
        """The rows of the messages buf[spans[2i]:spans[2i + 1]], `width`
        int64s each (nriscan.h); None if the library refuses the plan."""
        n = len(spans) // 2
        out = array("q", bytes(8 * self.width * n))
        done = self._scan(
            buf, len(buf), spans.buffer_info()[0], n, ctypes.byref(self._plan), out.buffer_info()[0]
        )
        return out if done == 0 else None
