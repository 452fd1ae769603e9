"""The cyclic garbage collector paused while a Synchronize is handled.

A Synchronize of a big node makes a few objects per pod and container (its
view, what the plugin keeps of it), nearly all of which live on, and none in
a cycle; each collection meanwhile walks all of them again: a tenth of the
plugin's CPU for 20,000 containers. Pauses may overlap (a new connection's
Synchronize while an old one's ends): the collector runs again when the last
one ends, and only if it ran before the first.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0
_resume = False


@contextmanager
def collection_paused() -> Iterator[None]:
    global _depth, _resume
    if _depth == 0:
        _resume = gc.isenabled()
        gc.disable()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _resume:
            gc.enable()
