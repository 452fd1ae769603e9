"""The request prefilter (`may_ask`, `may_ask_raw`) is sound: a container it
says cannot ask is one the full parser finds no request in and does not
refuse, whatever its labels, annotations, environment and pod say.  The
handler skips decoding such containers in Synchronize and CreateContainer,
so a wrong "no" would leave a share unserved or unrefused."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nri_gpushare.daemon.nri_views import container_info
from nri_gpushare.nri.api import lite, nri
from nri_gpushare.share.model import ContainerInfo, NodePolicy, ShareRefused, SourcePolicy
from nri_gpushare.share.request import MARKERS, _parse, may_ask, may_ask_raw, parse_request
from nri_gpushare.share.request.keys import KEYS
from nri_gpushare.share.request.sources import REQUEST_ENV
from tests.fakes import GiB, make_gpus

GPUS = make_gpus(2, 16 * GiB)
OPEN = SourcePolicy(annotations=True, labels=True, env=True, kubelet=True)
POLICIES = (
    NodePolicy(),  # pods: annotations only
    NodePolicy(pod_sources=OPEN, standalone_sources=OPEN),
    NodePolicy(pod_sources=SourcePolicy(annotations=False, env=True)),
)

P = "gpushare.io/"
UTF8 = st.characters(blacklist_categories=("Cs",))  # protobuf strings are UTF-8
# Keys near the real ones: a one-character change must not slip past the prefilter.
near_keys = st.sampled_from(
    [
        *(P + k for k in KEYS),
        P + "kubelet.gpu-memory",
        P + "container.main.gpu-memory",
        P + "assigned",
        P + "unknown-key",
        "gpushare.io",
        "gpushare.iogpu-memory",
        "GPUSHARE.IO/gpu-memory",
        "gpushare.io.gpu-memory",
        "x-" + P + "gpu-memory",
        "io.kubernetes.pod.name",
        "app",
    ]
)
keys = st.one_of(near_keys, st.text(UTF8, max_size=20))
values = st.one_of(
    st.sampled_from(["1Gi", "0", "30", "high", "memory", "all", "0,1", "true", "3", "bad"]),
    st.sampled_from([m + "x" for m in MARKERS]),  # markers in values: a harmless "maybe"
    st.text(UTF8, max_size=12),
)
env_names = st.one_of(
    st.sampled_from(
        [
            *REQUEST_ENV,
            "NVIDIA_VISIBLE_DEVICES",
            "ALIYUN_COM_GPU",
            "aliyun_com_gpu_mem_container",
            "EGP",
            "XEGPU",
            "CGPU",
            "PATH",
        ]
    ),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="="), max_size=12),
)
env_values = st.one_of(
    st.sampled_from(["3", "0", "1", "true", "false", "PGPU=0,MEM=1024", "0,1", "x"]),
    st.text(UTF8, max_size=12),
)
maps = st.dictionaries(keys, values, max_size=4)


@st.composite
def containers(draw: st.DrawFn) -> tuple[nri.PodSandbox, nri.Container]:
    in_pod = draw(st.booleans())
    pod = nri.PodSandbox(
        id="p1",
        name="train" if in_pod else "",
        namespace="ml",
        uid="u1",
        labels=draw(maps),
        annotations=draw(maps),
    )
    env = draw(st.lists(st.tuples(env_names, env_values), max_size=5))
    container = nri.Container(
        id="c1",
        pod_sandbox_id="p1",
        name=draw(st.sampled_from(["main", "side", ""])),
        labels=draw(maps),
        annotations=draw(maps),
        env=[f"{k}={v}" for k, v in env],
    )
    return pod, container


def parsed(c: ContainerInfo) -> list[str]:
    """What the full parser (no shortcut) says under each policy."""
    out = []
    for policy in POLICIES:
        try:
            req = _parse(c, GPUS, policy)
        except ShareRefused as e:
            out.append(f"refused: {e.reason}")
        else:
            out.append("none" if req is None else req.describe())
    return out


@settings(max_examples=400, deadline=None)
@given(containers())
def test_a_container_the_prefilter_passes_over_asks_for_nothing(sample) -> None:
    pod_msg, ctr_msg = sample
    pod_raw, ctr_raw = bytes(pod_msg), bytes(ctr_msg)
    pod, ctr = lite.decode_pod_sandbox(pod_raw), lite.decode_container(ctr_raw)
    info = container_info(pod if pod_msg.name else None, ctr)
    if pod_msg.name:
        raw_says = may_ask_raw(ctr_raw, pod_raw)
    else:  # outside Kubernetes there is no pod to read
        raw_says = may_ask_raw(ctr_raw)
    if not raw_says:
        assert not may_ask(info)
    if not may_ask(info):
        assert parsed(info) == ["none"] * len(POLICIES)
        assert all(parse_request(info, GPUS, p) is None for p in POLICIES)


def test_the_prefilter_sees_every_source() -> None:
    """Not vacuous: each kind of request is a "maybe", on bytes and decoded."""
    asking = [
        (nri.PodSandbox(id="p", name="x", annotations={P + "gpu-memory": "1Gi"}), nri.Container()),
        (nri.PodSandbox(id="p", name="x"), nri.Container(labels={P + "gpu-memory": "1Gi"})),
        (
            nri.PodSandbox(id="p", name="x"),
            nri.Container(annotations={P + "kubelet.gpu-memory": "a"}),
        ),
        (nri.PodSandbox(id="p", name="x"), nri.Container(env=["ALIYUN_COM_GPU_MEM_CONTAINER=3"])),
        (nri.PodSandbox(id="p", name="x"), nri.Container(env=["EGPU=PGPU=0,MEM=1024"])),
        (nri.PodSandbox(id="p", name="x"), nri.Container(env=["CGPU_DISABLE=true"])),
    ]
    for pod_msg, ctr_msg in asking:
        pod_raw, ctr_raw = bytes(pod_msg), bytes(ctr_msg)
        assert may_ask_raw(ctr_raw, pod_raw)
        info = container_info(lite.decode_pod_sandbox(pod_raw), lite.decode_container(ctr_raw))
        assert may_ask(info)
    plain = nri.Container(labels={"app": "web"}, env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"])
    assert not may_ask_raw(bytes(plain), bytes(nri.PodSandbox(name="x")))
    # The full parser does find these requests (the property above is not about nothing).
    info = ContainerInfo(id="c", name="m", pod_name="x", pod_annotations={P + "gpu-memory": "1Gi"})
    assert parsed(info)[0].startswith("gpu-memory ")
