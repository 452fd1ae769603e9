"""Bad input to the node's configuration (nri_gpushare.config): YAML text as
an operator may write it (or garble it), and parsed documents with odd keys
and values, the GPU inventory and its sizes among them.

Inputs: arbitrary text, YAML of any shape (non-string keys, dates, binary,
deep nesting, huge numbers), a valid config with one value replaced.
Properties: load_config and parse_config give a Config or raise ConfigError
(never another exception); a Config's inventory is well formed (indexes,
UUIDs and minors unique, memory > 0); parse_quantity refuses with
ValueError only.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.config import Config, ConfigError, load_config, parse_config, parse_quantity
from tests.unit.test_fuzz_common import fuzz, refused_only, text_with_odd_unicode

VALID: dict[str, Any] = {
    "nri": {"plugin_index": 10, "request_timeout": 2},
    "placement": "spread",
    "memory_reserve": "256Mi",
    "max_inst": 8,
    "inventory": [
        {"index": 0, "uuid": "GPU-8f6c0000-0000-0000-0000-000000000000", "memory": "16Gi"},
        {"index": 1, "uuid": "GPU-8f6c0000-0000-0000-0000-000000000001", "memory": 80},
    ],
    "sources": {"pods": {"namespaces": ["ml"], "labels": True}},
    "interposer": {},
    "kubernetes": {"events": False},
}

SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(10**30), 10**30),
    st.floats(),
    text_with_odd_unicode(),
    st.sampled_from(["16Gi", "0", "-1Gi", "1e3", "1.5Gi", "Gi", "9" * 5000, "off", "on"]),
    st.dates(),
    st.binary(max_size=8),
)
KEY = st.one_of(
    st.sampled_from(
        ["nri", "inventory", "memory", "uuid", "index", "minor", "sources", "pods", "x"]
    ),
    text_with_odd_unicode(8),
    st.integers(-2, 2),
    st.none(),
    st.booleans(),
)
DOC = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEY, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def replaced(draw: st.DrawFn) -> Any:
    """VALID with one value (at any depth) replaced by any document."""
    doc: Any = {k: ([dict(i) for i in v] if isinstance(v, list) else v) for k, v in VALID.items()}
    node = doc
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = draw(st.sampled_from(keys)) if keys else None
        if key is None or not isinstance(node[key], dict | list) or draw(st.booleans()):
            if key is None and isinstance(node, dict):
                key = draw(KEY)
            if key is not None:
                node[key] = draw(DOC)
            return doc
        node[key] = dict(node[key]) if isinstance(node[key], dict) else list(node[key])
        node = node[key]


def check(config: Config) -> None:
    gpus = config.inventory
    assert all(g.memory_bytes > 0 for g in gpus)
    for attr in ("index", "uuid", "minor"):
        values = [getattr(g, attr) for g in gpus]
        assert len(set(values)) == len(values), values


@fuzz(400)
@given(st.one_of(DOC, replaced()))
def test_parse_config(data: Any) -> None:
    config = refused_only(ConfigError, parse_config, data, "fuzz.yaml")
    if config is not None:
        check(config)


YAML = st.one_of(
    text_with_odd_unicode(200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=100),
    st.sampled_from(
        [
            "a: " * 3000 + "1",
            "max_inst: " + "9" * 5000,
            "inventory: !!binary aGk=",
            "inventory: &a [*a]",
            "x: &a\n  y: *a\n",
            "? [1, 2]\n: 3\n",
            "1: 2\nnri: {}\n",
            "inventory:\n- {index: 0, uuid: GPU-1, memory: 1Gi, 7: 8}\n",
            "state_dir: 2024-01-01\n",
            "\x00",
            "%YAML 9.9\n---\n",
        ]
    ).map(str.encode),
)


@fuzz(200)
@given(YAML)
def test_load_config(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.yaml")
        with open(path, "wb") as f:
            f.write(data)
        config = refused_only(ConfigError, load_config, path)
        if config is not None:
            check(config)


@fuzz(300)
@given(st.one_of(SCALAR, st.builds(datetime.date, st.integers(1, 9999), st.just(1), st.just(1))))
def test_parse_quantity(value: object) -> None:
    n = refused_only(ValueError, parse_quantity, value)
    assert n is None or (isinstance(n, int) and n >= 0)


def test_load_config_nested_too_deeply() -> None:
    """YAML nested past Python's recursion limit (PyYAML's composer
    recurses): a ConfigError, not a RecursionError (not in the property
    test: each costs about a second)."""
    for text in ("[" * 1200, "- " * 1200 + "1"):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "config.yaml")
            with open(path, "w") as f:
                f.write(text)
            try:
                load_config(path)
            except ConfigError as e:
                assert "nested too deeply" in str(e)
            else:
                raise AssertionError("a config nested 1,200 deep was taken")
