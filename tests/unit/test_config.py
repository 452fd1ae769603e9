import pytest

from nri_gpushare.config import ConfigError, load_config, parse_config, parse_quantity

UUID0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
UUID1 = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def test_defaults():
    config = parse_config({})
    assert config.socket == "/var/run/nri/nri.sock"
    assert config.plugin_index == "10"
    assert config.kmod == "optional"
    assert config.inventory == ()


def test_bare_off_in_yaml_means_off(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text("kmod: off\n")
    assert load_config(path).kmod == "off"
    path.write_text("kmod: on\n")
    with pytest.raises(ConfigError, match="kmod: True is not one of"):
        load_config(path)


def test_full_config():
    config = parse_config(
        {
            "nri": {"socket": "/tmp/nri.sock", "plugin_index": 5},
            "kmod": "off",
            "placement": "spread",
            "memory_reserve": "512Mi",
            "max_inst": 25,
            "inventory": [
                {"index": 1, "uuid": UUID1, "name": "B", "memory": "16Gi"},
                {"index": 0, "uuid": UUID0, "memory": 32, "minor": 3},
            ],
        }
    )
    assert config.plugin_index == "05"
    assert config.memory_reserve_bytes == 512 << 20
    assert [g.index for g in config.inventory] == [0, 1]
    assert config.inventory[0].memory_bytes == 32 << 30
    assert config.inventory[0].minor == 3
    assert config.inventory[1].minor == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2Gi", 2 << 30),
        ("3276Mi", 3276 << 20),
        ("512M", 512 * 10**6),
        (4, 4 << 30),
        ("1Ki", 1024),
        ("1.5Gi", 3 << 29),
    ],
)
def test_quantity(value, expected):
    assert parse_quantity(value) == expected


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"bogus": 1}, "bogus: unknown key"),
        ({"nri": {"sockett": "x"}}, "nri.sockett: unknown key"),
        ({"nri": {"plugin_index": "1"}}, "nri.plugin_index: '1' must be exactly two digits"),
        ({"kmod": "maybe"}, "kmod: 'maybe' is not one of required, optional, off"),
        ({"max_inst": 26}, "max_inst: 26 is outside 1..25"),
        ({"max_inst": True}, "max_inst: expected int"),
        ({"max_high_priority_per_gpu": -1}, "max_high_priority_per_gpu: -1 is outside 0..25"),
        ({"inventory": [{"index": 16, "uuid": UUID0, "memory": 1}]}, "index: 16 is outside 0..15"),
        ({"memory_reserve": "lots"}, "memory_reserve: 'lots' is not a memory size"),
        ({"inventory": [{"index": 0, "uuid": "nope", "memory": "1Gi"}]}, "inventory[0].uuid"),
        ({"inventory": [{"index": 0, "uuid": UUID0}]}, "inventory[0].memory: missing"),
        (
            {
                "inventory": [
                    {"index": 0, "uuid": UUID0, "memory": 1},
                    {"index": 0, "uuid": UUID1, "memory": 1},
                ]
            },
            "duplicate index 0",
        ),
        ({"inventory": {"index": 0}}, "inventory: expected list"),
        ({"nri": {"request_timeout": 0}}, "nri.request_timeout: 0 is outside 0.1..600"),
        ({"nri": {"registration_timeout": "5s"}}, "nri.registration_timeout: expected int"),
        ({"state_dir": "relative/dir"}, "state_dir: 'relative/dir' must be an absolute path"),
        ({"unserved": "ignore"}, "unserved: 'ignore' is not one of warn, deny"),
        ({"sources": {"pods": {"env": "yes"}}}, "sources.pods.env: expected bool"),
        ({"sources": {"pods": {"namespaces": ["Bad_NS"]}}}, "'Bad_NS' is not a Kubernetes"),
        ({"sources": {"standalone": {"namespaces": []}}}, "sources.standalone.namespaces: unknown"),
        ({"sources": {"kubernetes": {}}}, "sources.kubernetes: unknown key"),
        ([1, 2], "expected a mapping"),
        ({"interposer": {"libary": "/x.so"}}, "interposer.libary: unknown key"),
        (
            {"interposer": {"library": "lib.so"}},
            "interposer.library: 'lib.so' must be an absolute path",
        ),
        ({"interposer": {"library": "/a b/l.so"}}, "must not contain whitespace or ':'"),
        ({"interposer": {"container_path": "/x:y.so"}}, "interposer.container_path: '/x:y.so'"),
        ({"interposer": {"container_path": "/usr/../l.so"}}, "without //, . or .."),
        ({"interposer": {"container_path": "/usr/lib/"}}, "must be a plain path to a file"),
        ({"interposer": {"container_path": "/etc/ld.so.preload"}}, "cannot hold the library"),
        ({"interposer": {"container_path": "/proc/self/l.so"}}, "cannot hold the library"),
        (
            {"interposer": {"preload": "LD_PRELOAD"}},
            "'LD_PRELOAD' is not one of ld.so.preload, env",
        ),
        (
            {"interposer": {"missing": "ignore"}},
            "interposer.missing: 'ignore' is not one of refuse",
        ),
        ({"interposer": {"allow_managed": "yes"}}, "interposer.allow_managed: expected bool"),
        ({"interposer": None}, "interposer: expected dict"),
        ({"nvml_memory_limits": "on"}, "nvml_memory_limits: 'on' is not one of auto, off"),
    ],
)
def test_bad_values_name_the_key(data, fragment):
    with pytest.raises(ConfigError) as info:
        parse_config(data, "node.yaml")
    assert str(info.value).startswith("node.yaml: ")
    assert fragment in str(info.value)


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nri: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_runtime_timeouts():
    assert (parse_config({}).request_timeout, parse_config({}).registration_timeout) == (2, 5)
    config = parse_config({"nri": {"request_timeout": 0.5, "registration_timeout": 10}})
    assert (config.request_timeout, config.registration_timeout) == (0.5, 10.0)


def test_huge_yaml_integer_is_a_config_error(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text("max_inst: " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match="max_inst|not valid"):
        load_config(path)


def test_sources_defaults_and_overrides():
    defaults = parse_config({})
    assert (defaults.pod_sources.annotations, defaults.pod_sources.labels) == (True, False)
    assert defaults.pod_sources.env is False and defaults.pod_sources.namespaces == ()
    assert defaults.standalone_sources.labels and defaults.standalone_sources.env
    assert defaults.state_dir == "/var/lib/nri-gpushare" and defaults.unserved == "deny"
    assert parse_config({"unserved": "warn"}).unserved == "warn"  # fail open, only reported
    config = parse_config({"sources": {"pods": {"env": True, "namespaces": ["ml"]}}})
    assert config.pod_sources.env and config.pod_sources.namespaces == ("ml",)


def test_shipped_example_config_loads():
    from pathlib import Path

    example = Path(__file__).parents[2] / "config" / "gpushare.yaml"
    config = load_config(example)
    assert config.inventory[0].memory_bytes == 80 << 30


def test_interposer_and_nvml_defaults_and_overrides(tmp_path):
    config = parse_config({})
    assert config.interposer.library == "/usr/lib/nri-gpushare/libgpushare.so"
    assert config.interposer.container_path == "/usr/lib/gpushare/libgpushare.so"
    assert (config.interposer.preload, config.interposer.missing) == ("ld.so.preload", "refuse")
    assert config.interposer.allow_managed is False and config.nvml_memory_limits == "auto"
    config = parse_config(
        {
            "interposer": {
                "library": "/opt/gs/libgpushare.so",
                "container_path": "/opt/gpushare/lib.so",
                "preload": "env",
                "missing": "warn",
                "allow_managed": True,
            },
            "nvml_memory_limits": "off",
        }
    )
    assert config.interposer.library == "/opt/gs/libgpushare.so"
    assert config.interposer.container_path == "/opt/gpushare/lib.so"
    assert (config.interposer.preload, config.interposer.missing) == ("env", "warn")
    assert config.interposer.allow_managed and config.nvml_memory_limits == "off"
    path = tmp_path / "node.yaml"
    path.write_text("nvml_memory_limits: off\n")  # YAML 1.1 reads a bare off as false
    assert load_config(path).nvml_memory_limits == "off"
