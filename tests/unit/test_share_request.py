"""Parsing and validating share requests (nothing is placed here)."""

import pytest

from nri_gpushare.share.model import STANDALONE_SOURCES, ContainerInfo, NodePolicy, ShareRefused
from nri_gpushare.share.request import parse_request
from tests.fakes import GiB, MiB, make_gpus

GPUS = make_gpus(4)
# Every source may ask (as for containers started by hand): these tests are about
# what each source says; test_share_sources.py is about which sources may ask.
POLICY = NodePolicy(pod_sources=STANDALONE_SOURCES)
P = "gpushare.io/"
EGPU_EXAMPLE = "POLICY=0,ONLINE=0,TYPE=DOCKER:PGPU=0,MEM=3276,WEIGHT=10:PGPU=1,MEM=3276,WEIGHT=10"


def ctr(name="train", pod=None, annotations=None, labels=None, env=None):
    return ContainerInfo(
        id=f"id-{name}",
        name=name,
        pod_name="p1",
        pod_namespace="default",
        pod_uid="uid-1",
        pod_annotations=pod or {},
        annotations=annotations or {},
        labels=labels or {},
        env=env or {},
    )


def parse(policy=POLICY, gpus=GPUS, **kw):
    return parse_request(ctr(**kw), gpus, policy)


def refused(**kw) -> ShareRefused:
    with pytest.raises(ShareRefused) as info:
        parse(**kw)
    return info.value


# -- gpu-memory --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2Gi", 2 * GiB),
        ("3276Mi", 3276 * MiB),
        ("512M", 512 * 10**6),
        ("2", 2 * GiB),
        ("1.5Gi", 3 * GiB // 2),
        ("0.5", GiB // 2),
        ("2GiB", 2 * GiB),
        ("2G", 2 * 10**9),
        ("1Ki", 1024),
        ("8k", 8000),
        ("1Ti", 1 << 40),
        (" 4Gi ", 4 * GiB),
    ],
)
def test_memory_units(text, expected):
    req = parse(pod={P + "gpu-memory": text})
    assert req.memory_bytes == (expected,)


@pytest.mark.parametrize("text", ["2X", "-1", "", "abc", "2 Gi B", "2B", "0.1", "1e3", "2gi"])
def test_memory_bad_values_name_key_value_and_units(text):
    e = refused(pod={P + "gpu-memory": text})
    assert e.key == P + "gpu-memory"
    assert f"pod annotation gpushare.io/gpu-memory={text}" in str(e)
    assert e.reason == "invalid"


def test_memory_bad_unit_message_lists_units():
    e = refused(pod={P + "gpu-memory": "2GB2"})
    assert "Ki Mi Gi Ti binary, K M G T decimal, a bare number is GiB" in str(e)
    assert str(e).startswith("gpushare: container 'train' (pod default/p1): ")


def test_memory_list_cannot_contain_zero():
    e = refused(pod={P + "gpu-memory": "2Gi,0"})
    assert "more than 0 bytes" in str(e)


def test_short_list_repeats_last_value():
    req = parse(pod={P + "gpu-memory": "3Gi,1Gi", P + "gpu-count": "4"})
    assert req.memory_bytes == (3 * GiB, GiB, GiB, GiB)
    assert req.core_percent == (0, 0, 0, 0)
    assert req.devices is None


def test_count_defaults_to_longest_list():
    req = parse(pod={P + "gpu-memory": "2Gi", P + "gpu-core": "30,50,20"})
    assert req.memory_bytes == (2 * GiB,) * 3
    assert req.core_percent == (30, 50, 20)
    assert parse(pod={P + "gpu-memory": "2Gi"}).count == 1


def test_list_longer_than_count_is_an_error():
    e = refused(pod={P + "gpu-memory": "1Gi,2Gi,3Gi", P + "gpu-count": "2"})
    assert "gives 3 values for 2 GPUs" in str(e)
    assert e.key == P + "gpu-memory"


def test_count_beyond_node():
    e = refused(pod={P + "gpu-memory": "1Gi", P + "gpu-count": "5"})
    assert "asks for 5 GPUs but this node has 4" in str(e)
    assert e.key == P + "gpu-count"


@pytest.mark.parametrize("text", ["0", "-1", "two", ""])
def test_bad_count(text):
    e = refused(pod={P + "gpu-memory": "1Gi", P + "gpu-count": text})
    assert f"gpushare.io/gpu-count={text}" in str(e)


# -- gpu-core --------------------------------------------------------------------------


def test_core_110_is_refused_with_the_rule():
    e = refused(pod={P + "gpu-memory": "1Gi", P + "gpu-core": "110"})
    assert "gpushare.io/gpu-core=110: must be a multiple of 5 between 5 and 100" in str(e)
    assert e.key == P + "gpu-core"


@pytest.mark.parametrize("text", ["0", "3", "101", "12", "x", "30,7"])
def test_core_bad_values(text):
    e = refused(pod={P + "gpu-memory": "1Gi", P + "gpu-core": text})
    assert "multiple of 5 between 5 and 100" in str(e)


def test_core_values():
    req = parse(pod={P + "gpu-memory": "1Gi", P + "gpu-core": "5"})
    assert req.core_percent == (5,)
    req = parse(pod={P + "gpu-memory": "1Gi", P + "gpu-core": "100"})
    assert req.core_percent == (100,)


# -- devices ---------------------------------------------------------------------------


def test_devices_by_index_and_uuid():
    req = parse(pod={P + "gpu-memory": "1Gi", P + "gpu-devices": f"2,{GPUS[0].uuid}"})
    assert req.devices == (2, 0)
    assert req.count == 2


def test_devices_uuid_case_insensitive():
    req = parse(pod={P + "gpu-memory": "1Gi", P + "gpu-devices": GPUS[3].uuid.lower()})
    assert req.devices == (3,)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("7", "no GPU 7 on this node"),
        ("GPU-nope", "gpu-devices=GPU-nope: must be an index or a UUID"),
        ("0,GPU-nope", "'GPU-nope' must be an index or a UUID"),
        ("1,1", "listed twice"),
        ("1,,2", "empty value"),
    ],
)
def test_bad_devices(text, fragment):
    e = refused(pod={P + "gpu-memory": "1Gi", P + "gpu-devices": text})
    assert fragment in str(e)
    assert e.key == P + "gpu-devices"


def test_unknown_device_lists_known_gpus():
    e = refused(pod={P + "gpu-memory": "1Gi", P + "gpu-devices": "9"})
    assert f"0 ({GPUS[0].uuid})" in str(e)


def test_count_and_devices_must_agree():
    e = refused(pod={P + "gpu-memory": "1Gi", P + "gpu-devices": "0,1", P + "gpu-count": "3"})
    assert "does not match" in str(e)
    ok = parse(pod={P + "gpu-memory": "1Gi", P + "gpu-devices": "0,1", P + "gpu-count": "2"})
    assert ok.devices == (0, 1)


# -- enumerations ------------------------------------------------------------------------


def test_enumerations_and_defaults():
    req = parse(pod={P + "gpu-memory": "1Gi"})
    assert (req.priority, req.placement, req.isolation) == ("normal", "binpack", "full")
    req = parse(
        policy=NodePolicy(default_placement="spread"),
        pod={P + "gpu-memory": "1Gi", P + "priority": "High", P + "isolation": "none"},
    )
    assert (req.priority, req.placement, req.isolation) == ("high", "spread", "none")
    assert parse(pod={P + "gpu-memory": "1", P + "placement": "binpack"}).placement == "binpack"


@pytest.mark.parametrize(
    ("key", "allowed"),
    [
        ("priority", "normal, high"),
        ("placement", "binpack, spread"),
        ("isolation", "full, memory, none"),
    ],
)
def test_bad_enumerations(key, allowed):
    e = refused(pod={P + "gpu-memory": "1Gi", P + key: "bogus"})
    assert f"gpushare.io/{key}=bogus: must be one of {allowed}" in str(e)


def test_memory_isolation_forbids_core():
    e = refused(pod={P + "gpu-memory": "1Gi", P + "gpu-core": "30", P + "isolation": "memory"})
    assert "cannot be used with" in str(e) and e.key == P + "gpu-core"
    assert parse(pod={P + "gpu-memory": "1Gi", P + "isolation": "memory"}).isolation == "memory"


def test_high_priority_forbidden_by_node():
    e = refused(
        policy=NodePolicy(max_high_priority_per_gpu=0),
        pod={P + "gpu-memory": "1Gi", P + "priority": "high"},
    )
    assert "allows no high-priority containers" in str(e)


# -- keys ---------------------------------------------------------------------------------


def test_unknown_pod_key():
    e = refused(pod={P + "gpu-mem": "1Gi"})
    assert "pod annotation gpushare.io/gpu-mem: not a known key" in str(e)
    assert e.key == P + "gpu-mem"


def test_unknown_per_container_key():
    e = refused(pod={P + "container.train.memory": "1Gi"})
    assert "gpushare.io/container.<name>.<key>" in str(e)


def test_unknown_container_annotation_key():
    e = refused(annotations={P + "gpu-cores": "10"})
    assert "container annotation gpushare.io/gpu-cores: not a known key" in str(e)


def test_unknown_label_key_is_ignored_with_a_warning(caplog):
    # containerd merges the image's labels in: an image's own gpushare.io/ label
    # is not a request and must not stop the container.
    req = parse(pod={P + "gpu-memory": "1Gi"}, labels={P + "maintainer": "x", P + "gpu-cores": "1"})
    assert req.memory_bytes == (GiB,)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("container label gpushare.io/maintainer" in w and "ignored" in w for w in warnings)
    assert any("container label gpushare.io/gpu-cores" in w for w in warnings)
    assert parse(labels={P + "maintainer": "x"}) is None  # no request: not managed


def test_foreign_and_own_output_keys_are_ignored():
    req = parse(
        pod={"other.io/x": "1", P + "gpu-memory": "1Gi", P + "assigned": "{}"},
        annotations={P + "assigned": "{}", P + "container.train.gpu-memory": "1Gi"},
    )
    assert req.memory_bytes == (GiB,)


# -- who is managed -----------------------------------------------------------------------


def test_no_request_is_not_managed():
    assert parse() is None
    assert parse(pod={"unrelated": "x"}, env={"PATH": "/bin"}) is None


def test_pod_wide_keys_apply_to_every_container_except_opted_out():
    pod = {P + "gpu-memory": "2Gi", P + "container.sidecar.gpu-memory": "0"}
    assert parse(name="train", pod=pod).memory_bytes == (2 * GiB,)
    assert parse(name="sidecar", pod=pod) is None


def test_per_container_key_beats_pod_key():
    pod = {P + "gpu-memory": "2Gi", P + "gpu-core": "50", P + "container.train.gpu-memory": "4Gi"}
    req = parse(pod=pod)
    assert req.memory_bytes == (4 * GiB,)
    assert req.core_percent == (50,)
    assert req.keys["memory"] == P + "container.train.gpu-memory"
    assert req.keys["core"] == P + "gpu-core"


def test_pod_annotation_beats_container_label():
    req = parse(pod={P + "gpu-memory": "2Gi"}, labels={P + "gpu-memory": "3Gi"})
    assert req.memory_bytes == (2 * GiB,)


def test_container_label_alone_works():
    req = parse(labels={P + "gpu-memory": "3Gi", P + "gpu-core": "20"})
    assert (req.memory_bytes, req.core_percent) == ((3 * GiB,), (20,))
    req = parse(annotations={P + "gpu-memory": "1Gi"})
    assert req.memory_bytes == (GiB,)


def test_label_and_container_annotation_disagree():
    e = refused(annotations={P + "gpu-memory": "1Gi"}, labels={P + "gpu-memory": "2Gi"})
    assert "container annotation gpushare.io/gpu-memory=1Gi" in str(e)
    assert "container label gpushare.io/gpu-memory=2Gi" in str(e)
    assert e.reason == "conflict"


def test_label_and_container_annotation_agree():
    req = parse(annotations={P + "gpu-memory": "1024Mi"}, labels={P + "gpu-memory": "1Gi"})
    assert req.memory_bytes == (GiB,)


def test_per_container_core_without_memory_is_an_error():
    e = refused(pod={P + "container.train.gpu-core": "30"})
    assert "add gpushare.io/container.train.gpu-memory" in str(e)
    assert e.key == P + "container.train.gpu-memory"
    e = refused(labels={P + "gpu-count": "2"})
    assert "add gpushare.io/gpu-memory" in str(e)


def test_pod_wide_core_without_memory_does_not_apply():
    assert parse(pod={P + "gpu-core": "30", P + "container.other.gpu-memory": "1Gi"}) is None
    assert parse(pod={P + "priority": "high"}) is None


# -- cGPU environment ---------------------------------------------------------------------


def test_cgpu_short_list_on_four_gpus():
    req = parse(env={"ALIYUN_COM_GPU_MEM_CONTAINER": "3,1"})
    assert req.memory_bytes == (3 * GiB, GiB, GiB, GiB)
    assert req.devices is None
    assert req.keys["memory"] == "ALIYUN_COM_GPU_MEM_CONTAINER"


def test_cgpu_single_value_covers_every_gpu():
    assert parse(env={"ALIYUN_COM_GPU_MEM_CONTAINER": "3"}).memory_bytes == (3 * GiB,) * 4


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"ALIYUN_COM_GPU_MEM_CONTAINER": "0"},
        {"ALIYUN_COM_GPU_MEM_CONTAINER": ""},
        {"ALIYUN_COM_GPU_MEM_CONTAINER": "3", "CGPU_DISABLE": "true"},
        {"ALIYUN_COM_GPU_SCHD_WEIGHT": "4", "ALIYUN_COM_GPU_HIGH_PRIO": "1"},
    ],
)
def test_cgpu_not_managed(env):
    assert parse(env=env) is None


def test_cgpu_disable_false_keeps_sharing():
    env = {"ALIYUN_COM_GPU_MEM_CONTAINER": "3", "CGPU_DISABLE": "false"}
    assert parse(env=env).memory_bytes == (3 * GiB,) * 4


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"ALIYUN_COM_GPU_MEM_CONTAINER": "2Gi"}, "use whole GiB per GPU"),
        ({"ALIYUN_COM_GPU_MEM_CONTAINER": "3,0"}, "0 opts out"),
        ({"ALIYUN_COM_GPU_MEM_CONTAINER": "1,1,1,1,1"}, "gives 5 values for 4 GPUs"),
        ({"CGPU_DISABLE": "maybe"}, "CGPU_DISABLE=maybe: must be true or false"),
        (
            {"ALIYUN_COM_GPU_MEM_CONTAINER": "1", "ALIYUN_COM_GPU_SCHD_WEIGHT": "17"},
            "ALIYUN_COM_GPU_SCHD_WEIGHT=17: must be a whole number between 1 and 16",
        ),
        (
            {"ALIYUN_COM_GPU_MEM_CONTAINER": "1", "ALIYUN_COM_GPU_HIGH_PRIO": "2"},
            "ALIYUN_COM_GPU_HIGH_PRIO=2: must be 1 (high) or 0 (normal)",
        ),
        (
            {"ALIYUN_COM_GPU_MEM_CONTAINER": "1", "ALIYUN_COM_GPU_VISIBLE_DEVICES": "5"},
            "ALIYUN_COM_GPU_VISIBLE_DEVICES=5: no GPU 5",
        ),
        (
            {"ALIYUN_COM_GPU_MEM_CONTAINER": "1", "ALIYUN_COM_GPU_MEM_DEV": "big"},
            "ALIYUN_COM_GPU_MEM_DEV=big: must be the GPU's memory in whole GiB",
        ),
    ],
)
def test_cgpu_bad_values(env, fragment):
    e = refused(env=env)
    assert fragment in str(e)


def test_cgpu_visible_devices_weight_priority():
    req = parse(
        env={
            "ALIYUN_COM_GPU_MEM_CONTAINER": "6",
            "ALIYUN_COM_GPU_VISIBLE_DEVICES": f"1,{GPUS[3].uuid}",
            "ALIYUN_COM_GPU_SCHD_WEIGHT": "4",
            "ALIYUN_COM_GPU_HIGH_PRIO": "1",
            "ALIYUN_COM_GPU_MEM_DEV": "32",
        }
    )
    assert req.devices == (1, 3)
    assert req.memory_bytes == (6 * GiB, 6 * GiB)
    assert req.core_percent == (25, 25)  # 4 of max_inst 16
    assert req.priority == "high"
    assert req.memory_dev_bytes == 32 * GiB


@pytest.mark.parametrize(
    ("weight", "max_inst", "core"),
    [
        ("1", 16, 0),
        ("2", 16, 10),
        ("3", 16, 15),
        ("8", 16, 50),
        ("16", 16, 100),
        ("2", 25, 5),
        ("5", 10, 50),
    ],
)
def test_cgpu_weight_mapping(weight, max_inst, core):
    req = parse(
        policy=NodePolicy(max_inst=max_inst, pod_sources=STANDALONE_SOURCES),
        env={"ALIYUN_COM_GPU_MEM_CONTAINER": "1", "ALIYUN_COM_GPU_SCHD_WEIGHT": weight},
    )
    assert req.core_percent == (core,) * 4


def test_nvidia_visible_devices_is_the_cgpu_fallback():
    env = {"ALIYUN_COM_GPU_MEM_CONTAINER": "2", "NVIDIA_VISIBLE_DEVICES": "2"}
    assert parse(env=env).devices == (2,)
    env["NVIDIA_VISIBLE_DEVICES"] = "all"
    assert parse(env=env).count == 4
    env["ALIYUN_COM_GPU_VISIBLE_DEVICES"] = "1"
    assert parse(env=env).devices == (1,)


def test_annotation_and_environment_disagree():
    e = refused(pod={P + "gpu-memory": "2Gi"}, env={"ALIYUN_COM_GPU_MEM_CONTAINER": "3"})
    assert "pod annotation gpushare.io/gpu-memory=2Gi" in str(e)
    assert "environment ALIYUN_COM_GPU_MEM_CONTAINER=3" in str(e)
    assert e.reason == "conflict"


def test_annotation_and_environment_agree():
    req = parse(pod={P + "gpu-memory": "3072Mi"}, env={"ALIYUN_COM_GPU_MEM_CONTAINER": "3"})
    assert req.memory_bytes == (3 * GiB,)  # the annotation's default count: one GPU


def test_opt_out_conflicts_with_annotation_request():
    e = refused(labels={P + "gpu-memory": "1Gi"}, env={"CGPU_DISABLE": "true"})
    assert "CGPU_DISABLE=true" in str(e) and e.reason == "conflict"


def test_environment_fills_attributes_annotations_leave_open():
    req = parse(
        pod={P + "gpu-memory": "3Gi"},
        env={"ALIYUN_COM_GPU_MEM_CONTAINER": "3", "ALIYUN_COM_GPU_HIGH_PRIO": "1"},
    )
    assert req.priority == "high"


def test_priority_conflict():
    e = refused(
        pod={P + "gpu-memory": "3Gi", P + "priority": "normal"},
        env={"ALIYUN_COM_GPU_MEM_CONTAINER": "3", "ALIYUN_COM_GPU_HIGH_PRIO": "1"},
    )
    assert "ALIYUN_COM_GPU_HIGH_PRIO=1" in str(e)


# -- eGPU ------------------------------------------------------------------------------------


def test_egpu_example():
    req = parse(env={"EGPU": EGPU_EXAMPLE, "NVIDIA_VISIBLE_DEVICES": "0,1"})
    assert req.devices == (0, 1)
    assert req.memory_bytes == (3276 * MiB, 3276 * MiB)
    assert req.core_percent == (10, 10)
    assert req.keys["memory"] == "EGPU"


def test_egpu_without_header_and_weight():
    req = parse(env={"EGPU": "PGPU=2,MEM=1024:PGPU=0,MEM=2048,WEIGHT=50"})
    assert req.devices == (2, 0)
    assert req.memory_bytes == (1024 * MiB, 2048 * MiB)
    assert req.core_percent == (0, 50)
    assert parse(env={"EGPU": "PGPU=1,MEM=1024"}).core_percent == (0,)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("PGPU=0,MEM=8192,WEIGHT=110", "WEIGHT=110: must be a percentage between 1 and 100"),
        ("PGPU=0,MEM=0", "MEM=0: must be a whole number of MiB"),
        ("PGPU=0", "needs PGPU=<GPU index> and MEM=<MiB>"),
        ("POLICY=0", "EGPU has no GPU block"),
        ("PGPU=9,MEM=1", "PGPU=9: no GPU 9"),
        ("PGPU=GPU-x,MEM=1", "PGPU=GPU-x: must be an index of a GPU"),
        ("PGPU=0,MEM=1:PGPU=0,MEM=2", "a GPU appears in two blocks (GPU 0)"),
        ("PGPU=0,MEM=1,SPEED=3", "EGPU block 1: unknown field SPEED"),
        ("PGPU=0,MEM", "'MEM' is not NAME=VALUE"),
        ("POLICY=0:PGPU=0,MEM=1:PGPU=1", "EGPU block 3: needs PGPU"),
    ],
)
def test_egpu_bad(text, fragment):
    e = refused(env={"EGPU": text})
    assert fragment in str(e)
    assert e.key == "EGPU"


def test_egpu_and_cgpu_must_agree():
    e = refused(env={"EGPU": "PGPU=0,MEM=1024", "ALIYUN_COM_GPU_MEM_CONTAINER": "2"})
    assert e.reason == "conflict"
    ok = parse(
        env={
            "EGPU": "PGPU=0,MEM=2048",
            "ALIYUN_COM_GPU_MEM_CONTAINER": "2",
            "ALIYUN_COM_GPU_VISIBLE_DEVICES": "0",
        }
    )
    assert ok.devices == (0,)


def test_egpu_and_annotation_disagree():
    e = refused(pod={P + "gpu-core": "20", P + "gpu-memory": "3276Mi"}, env={"EGPU": EGPU_EXAMPLE})
    assert "pod annotation gpushare.io/gpu-core=20" in str(e)
    assert "EGPU WEIGHT=10,10" in str(e)


def test_no_gpus():
    e = refused(gpus=[], pod={P + "gpu-memory": "1Gi"})
    assert "this node has no GPUs" in str(e)


def test_describe():
    req = parse(pod={P + "gpu-memory": "2Gi,1Gi", P + "gpu-core": "30", P + "priority": "high"})
    assert req.describe() == "gpu-memory 2048Mi,1024Mi, gpu-core 30,30, priority high"


@pytest.mark.parametrize("key", ["gpu-core", "gpu-count", "gpu-devices"])
def test_non_ascii_digits_are_a_clear_refusal(key):
    e = refused(pod={P + "gpu-memory": "1Gi", P + key: "²"})
    assert P + key in str(e)


# -- values nobody checked (issue 8): any length, any characters ------------------

LONG = "1" * 5000  # beyond Python's int() limit of 4,301 digits
HUGE = 3 << 20  # a 3 MB value: quoting it whole would exceed ttrpc's 4 MiB message


@pytest.mark.parametrize(
    ("kw", "key", "fragment"),
    [
        ({"pod": {P + "gpu-memory": "1Gi", P + "gpu-core": LONG}}, P + "gpu-core", "multiple of 5"),
        ({"pod": {P + "gpu-memory": "1Gi", P + "gpu-count": LONG}}, P + "gpu-count", "whole"),
        ({"pod": {P + "gpu-memory": LONG}}, P + "gpu-memory", "longer than 64 characters"),
        ({"pod": {P + "gpu-memory": "1" * 10**6}}, P + "gpu-memory", "longer than 64"),
        ({"pod": {P + "gpu-memory": "1Gi", P + "gpu-devices": LONG}}, P + "gpu-devices", "UUID"),
        (
            {"pod": {P + "gpu-memory": "1Gi", P + "gpu-devices": "0" * 19}},
            P + "gpu-devices",
            "UUID",
        ),
        (
            {"env": {"ALIYUN_COM_GPU_MEM_CONTAINER": LONG}},
            "ALIYUN_COM_GPU_MEM_CONTAINER",
            "whole number, at least 0, of at most 18 digits",
        ),
        (
            {"env": {"ALIYUN_COM_GPU_MEM_CONTAINER": "1", "ALIYUN_COM_GPU_MEM_DEV": LONG}},
            "ALIYUN_COM_GPU_MEM_DEV",
            "whole GiB",
        ),
        (
            {"env": {"ALIYUN_COM_GPU_MEM_CONTAINER": "1", "ALIYUN_COM_GPU_SCHD_WEIGHT": LONG}},
            "ALIYUN_COM_GPU_SCHD_WEIGHT",
            "between 1 and",
        ),
        ({"env": {"EGPU": f"PGPU=0,MEM={LONG}"}}, "EGPU", "whole number of MiB"),
        ({"env": {"EGPU": f"PGPU={LONG},MEM=1"}}, "EGPU", "must be an index of a GPU"),
        ({"env": {"EGPU": f"PGPU=0,MEM=1,WEIGHT={LONG}"}}, "EGPU", "percentage"),
    ],
)
def test_long_numbers_are_refused_with_what_is_allowed(kw, key, fragment):
    e = refused(**kw)
    assert e.key == key and e.reason == "invalid"
    assert fragment in str(e)
    assert "(5000 characters)" in str(e) or "(1000000 characters)" in str(e) or "0" * 19 in str(e)
    assert len(str(e)) < 600


def test_whole_numbers_up_to_18_digits_are_read():
    assert parse(pod={P + "gpu-memory": "1Gi", P + "gpu-devices": "0" * 18}).devices == (0,)
    e = refused(pod={P + "gpu-memory": "1Gi", P + "gpu-count": "9" * 18})
    assert e.reason == "capacity"  # read as a number, then too many GPUs


@pytest.mark.parametrize(
    "kw",
    [
        {"pod": {P + "gpu-memory": "x" * HUGE}},
        {"pod": {P + "gpu-memory": "1Gi", P + "gpu-core": "x" * HUGE}},
        {"pod": {P + "gpu-memory": "1Gi", P + "gpu-devices": "x" * HUGE}},
        {"pod": {P + "gpu-memory": "1Gi", P + "priority": "x" * HUGE}},
        {"pod": {P + "gpu-memory": "1Gi," * (HUGE // 16) + "1Gi"}},  # sizes, too many
        {"pod": {P + "gpu-memory": "1Gi", P + "x" * HUGE: "1"}},
        {"pod": {P + "gpu-memory": "1Gi", P + "container." + "x" * HUGE: "1"}},
        {"annotations": {P + "x" * HUGE: "1"}},
        {"labels": {P + "gpu-memory": "x" * HUGE}},
        {"env": {"CGPU_DISABLE": "x" * HUGE}},
        {"env": {"ALIYUN_COM_GPU_MEM_CONTAINER": "x" * HUGE}},
        {"env": {"ALIYUN_COM_GPU_MEM_CONTAINER": "1", "NVIDIA_VISIBLE_DEVICES": "x" * HUGE}},
        {"env": {"ALIYUN_COM_GPU_MEM_CONTAINER": "1", "ALIYUN_COM_GPU_SCHD_WEIGHT": "x" * HUGE}},
        {"env": {"ALIYUN_COM_GPU_MEM_CONTAINER": "1", "ALIYUN_COM_GPU_HIGH_PRIO": "x" * HUGE}},
        {"env": {"ALIYUN_COM_GPU_MEM_CONTAINER": "1", "ALIYUN_COM_GPU_MEM_DEV": "x" * HUGE}},
        {"env": {"EGPU": "PGPU=0,MEM=1," + "x" * HUGE}},
        {"env": {"EGPU": "PGPU=0,MEM=1," + "X" * HUGE + "=1"}},
        {"env": {"EGPU": "PGPU=0,MEM=" + "x" * HUGE}},
    ],
)
def test_a_refusal_quotes_a_huge_value_short_and_once(kw):
    e = refused(**kw)
    assert len(str(e)) < 1000, str(e)[:2000]
    assert str(e).count(" characters)") <= 1, str(e)
    assert e.key is not None and e.key[:64] in str(e)


def test_a_list_names_the_bad_item_and_quotes_the_value_once():
    e = refused(pod={P + "gpu-memory": "2X"})
    assert str(e).count("2X") == 1  # the cite only: "gpu-memory=2X: not a memory size"
    e = refused(pod={P + "gpu-memory": "1Gi,2X"})
    assert "gpu-memory=1Gi,2X: '2X' is not a memory size" in str(e)
    e = refused(pod={P + "gpu-memory": "1Gi", P + "gpu-core": "10,7"})
    assert "gpu-core=10,7: '7' must be a multiple of 5" in str(e)
    e = refused(env={"ALIYUN_COM_GPU_MEM_CONTAINER": "x"})
    assert str(e).count("x:") == 1 and "'x'" not in str(e)


def test_a_quoted_value_shows_control_characters_escaped():
    e = refused(pod={P + "gpu-memory": "2\x00Gi\n"})
    assert "gpu-memory=2\\x00Gi\\n:" in str(e) and "\n" not in str(e)


@pytest.mark.parametrize("text", ["\uff12Gi", "\u0663", "1\uff10Gi", "\u00b2Gi"])
def test_non_ascii_digits_are_not_a_size(text):
    e = refused(pod={P + "gpu-memory": text})
    assert f"gpu-memory={text}: not a memory size; use e.g. 2Gi" in str(e)
