"""Bad input to share-request parsing: what a pod spec, an image's labels and
ENV, or a hand-started container's annotations say (parse_request and the
sources under it: gpushare.io keys, per-container pod keys, the kubelet's
device-ID annotations, cGPU and eGPU variables, NVIDIA_VISIBLE_DEVICES).

Generated: every real key, plus unknown ones of our prefix, each with a
plausible value (sizes, lists, ranges, UUIDs, enumerations, eGPU blocks)
or a hostile one (odd unicode, NULs, 10,000-digit numbers, 100 kB strings),
on Kubernetes pods and on hand-started containers with every source allowed.
Properties: parse_request returns None or a ShareRequest that is internally
consistent, or raises ShareRefused with a known reason and a message that
quotes values short; nothing else is raised.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.names import KUBELET_ANNOTATIONS
from nri_gpushare.share.model import ContainerInfo, NodePolicy, ShareRefused, SourcePolicy
from nri_gpushare.share.request import KEYS, ShareRequest, ignored, parse_request
from nri_gpushare.units import SizeError, format_bytes, parse_size
from tests.fakes import GiB, make_gpus
from tests.unit.test_fuzz_common import fuzz, text_with_odd_unicode

P = "gpushare.io/"
GPUS = make_gpus(4, 16 * GiB)
ALL = SourcePolicy(annotations=True, labels=True, env=True, kubelet=True)
POLICIES = [
    NodePolicy(max_inst=4),
    NodePolicy(max_inst=25, pod_sources=ALL, max_high_priority_per_gpu=0),
    NodePolicy(pod_sources=SourcePolicy(namespaces=("ok",)), standalone_sources=ALL),
]
REASONS = {"invalid", "conflict", "forbidden", "capacity"}
ENV = [
    "CGPU_DISABLE",
    "ALIYUN_COM_GPU_MEM_CONTAINER",
    "ALIYUN_COM_GPU_VISIBLE_DEVICES",
    "ALIYUN_COM_GPU_SCHD_WEIGHT",
    "ALIYUN_COM_GPU_HIGH_PRIO",
    "ALIYUN_COM_GPU_MEM_DEV",
    "NVIDIA_VISIBLE_DEVICES",
    "EGPU",
]

number = st.one_of(
    st.integers(-3, 130).map(str),
    st.integers(0, 10**30).map(str),
    st.sampled_from(["1e3", "0x10", "٣", "+1", "-0", "00000000000000000001", "9" * 10000]),
)
size = st.builds(
    lambda n, u: n + u,
    st.sampled_from(["0", "1", "1.5", "0.001", "3276", "16", "17", ".5", "1e2", ""]),
    st.sampled_from(["", "Gi", "Mi", "Ki", "Ti", "G", "M", "GB", "MiB", "Pi", "gi", " Gi"]),
)
device = st.one_of(
    st.integers(-1, 5).map(str),
    st.sampled_from([g.uuid for g in GPUS] + ["GPU-unknown", "all", "none", "void", ""]),
)
ranges = st.lists(
    st.one_of(
        st.integers(0, 70000).map(str),
        st.tuples(st.integers(0, 9), st.integers(0, 9)).map(lambda t: f"{t[0]}-{t[1]}"),
    ),
    max_size=6,
).map(",".join)
egpu = st.lists(
    st.builds(
        lambda g, m, w: ",".join(x for x in (g, m, w) if x),
        st.one_of(st.just(""), device.map(lambda d: "PGPU=" + d)),
        st.one_of(st.just(""), number.map(lambda n: "MEM=" + n)),
        st.one_of(st.just(""), number.map(lambda n: "WEIGHT=" + n), st.just("BOGUS=1")),
    ),
    max_size=5,
).map(lambda blocks: ":".join(["POLICY=0,ONLINE=0,TYPE=DOCKER", *blocks]))
plausible = st.one_of(
    number,
    size,
    st.lists(size, min_size=1, max_size=5).map(",".join),
    st.lists(device, min_size=1, max_size=5).map(",".join),
    ranges,
    st.sampled_from(["high", "normal", "HIGH", "binpack", "spread", "full", "memory", "none"]),
    st.sampled_from(["true", "false", "yes", "0", "1", "maybe"]),
    egpu,
)
hostile = st.one_of(
    text_with_odd_unicode(),
    st.integers(1000, 100_000).map(lambda n: "1" * n),
    st.just("Gi," * 5000),
)
value = st.one_of(plausible, plausible, hostile)
key = st.one_of(
    st.sampled_from([P + k for k in KEYS]),
    st.sampled_from([f"{P}container.main.{k}" for k in KEYS]),
    st.sampled_from(list(KUBELET_ANNOTATIONS.values())),
    st.sampled_from([P + "gpu-mem", P + "container.main", P + "container..gpu-memory", P]),
    text_with_odd_unicode(20).map(lambda t: P + t),
)
mapping = st.dictionaries(key, value, max_size=5)
env = st.dictionaries(st.sampled_from(ENV), value, max_size=4)


@st.composite
def containers(draw: st.DrawFn) -> ContainerInfo:
    pod = draw(st.booleans())
    return ContainerInfo(
        id="c" * 64,
        name=draw(st.sampled_from(["main", "sidecar", "", "ma\x00in"])),
        pod_name="web" if pod else "",
        pod_namespace=draw(st.sampled_from(["ok", "default"])) if pod else "",
        pod_uid="u" if pod else "",
        pod_annotations=draw(mapping) if pod else {},
        annotations=draw(mapping),
        labels=draw(mapping),
        env=draw(env),
    )


def check_request(r: ShareRequest) -> None:
    n = r.count
    assert n >= 1 and all(m > 0 for m in r.memory_bytes), r
    assert len(r.core_percent) == n and all(0 <= c <= 100 for c in r.core_percent), r
    if r.devices is not None:
        assert len(r.devices) == n and len(set(r.devices)) == n, r
        assert set(r.devices) <= {g.index for g in GPUS}, r
    assert r.priority in ("normal", "high") and r.placement in ("binpack", "spread"), r
    assert r.isolation in ("full", "memory", "none"), r


@fuzz(600)
@given(containers(), st.sampled_from(POLICIES))
def test_parse_request_refuses_only_with_share_refused(
    c: ContainerInfo, policy: NodePolicy
) -> None:
    try:
        r = parse_request(c, GPUS, policy)
    except ShareRefused as e:
        assert e.reason in REASONS, e.reason
        # Values are quoted at most 64 characters; the message stays short.
        assert str(e) and len(str(e)) < 2000, len(str(e))
        return
    if r is not None:
        check_request(r)
    for policy_sources in (policy.pod_sources, policy.standalone_sources):
        assert isinstance(ignored(c, policy_sources), list)


@st.composite
def near_valid(draw: st.DrawFn) -> ContainerInfo:
    """A valid request (gpu-memory and some other keys), then one key or
    variable set to a generated value."""
    ann = {P + "gpu-memory": draw(st.sampled_from(["1Gi", "512Mi", "2", "1Gi,2Gi", "3G"]))}
    if draw(st.booleans()):
        ann[P + "gpu-core"] = draw(st.sampled_from(["5", "50", "100", "25,50"]))
    if draw(st.booleans()):
        ann[P + "gpu-count"] = draw(st.sampled_from(["1", "2", "4"]))
    where = draw(st.sampled_from(["annotations", "labels", "env"]))
    extra = {draw(st.sampled_from(ENV) if where == "env" else key): draw(value)}
    return ContainerInfo(
        id="d" * 64,
        name="main",
        annotations=ann | (extra if where == "annotations" else {}),
        labels=extra if where == "labels" else {},
        env=extra if where == "env" else {},
    )


@fuzz(400)
@given(near_valid())
def test_near_valid_requests_refuse_only_with_share_refused(c: ContainerInfo) -> None:
    try:
        r = parse_request(c, GPUS, POLICIES[2])
    except ShareRefused as e:
        assert e.reason in REASONS and str(e) and len(str(e)) < 2000, e
        return
    if r is not None:  # None: gpu-memory 0 or CGPU_DISABLE, an opt-out
        check_request(r)


UNITS = {"": 1 << 30, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


@fuzz(300)
@given(
    st.lists(st.tuples(st.integers(1, 4096), st.sampled_from(list(UNITS))), min_size=1, max_size=4),
    st.one_of(st.none(), st.integers(1, 20).map(lambda c: c * 5)),
    st.sampled_from(["annotations", "labels"]),
    env,
)
def test_share_is_never_larger_than_asked(
    sizes: list[tuple[int, str]], core: int | None, where: str, noise: dict[str, str]
) -> None:
    """gpu-memory (a bare number is GiB) and gpu-core as asked, on a hand-started container with
    every source allowed and any cGPU/eGPU variables beside: the request is
    exactly what the keys asked, or refused; never more memory or compute."""
    asked = {P + "gpu-memory": ",".join(f"{n}{u}" for n, u in sizes)}
    if core is not None:
        asked[P + "gpu-core"] = str(core)
    c = ContainerInfo(
        id="e" * 64,
        name="main",
        annotations=asked if where == "annotations" else {},
        labels=asked if where == "labels" else {},
        env=noise,
    )
    try:
        r = parse_request(c, GPUS, POLICIES[2])
    except ShareRefused as e:
        assert e.reason in REASONS, e.reason
        return
    assert r is not None
    assert r.memory_bytes == tuple(n * UNITS[u] for n, u in sizes), r
    assert all(p == (core or 0) for p in r.core_percent) or core is None, r
    if core is None:
        assert all(p <= 100 for p in r.core_percent), r


@fuzz(300)
@given(
    st.one_of(size, number, text_with_odd_unicode(30)),
    st.integers(0, 1 << 52).map(lambda k: k << 10),
)
def test_sizes(text: str, n: int) -> None:
    """parse_size, under every memory value: SizeError only; what
    format_bytes writes of whole KiB reads back as the same bytes (below a
    KiB it writes "<n>B", for people, which no request takes)."""
    try:
        got = parse_size(text)
    except SizeError as e:
        assert str(e) and len(str(e)) < 400
    else:
        assert got >= 0
    assert parse_size(format_bytes(n)) == n
