"""Which sources may ask for a share: the node's `sources` policy per path."""

import pytest

from nri_gpushare.share.model import (
    STANDALONE_SOURCES,
    ContainerInfo,
    NodePolicy,
    ShareRefused,
    SourcePolicy,
)
from nri_gpushare.share.request import ignored, parse_request
from tests.fakes import GiB, make_gpus

GPUS = make_gpus(2)
P = "gpushare.io/"
IMAGE_ENV = {"ALIYUN_COM_GPU_MEM_CONTAINER": "8"}
IMAGE_LABEL = {P + "gpu-memory": "4Gi"}


def pod(pod_annotations=None, labels=None, env=None, namespace="default") -> ContainerInfo:
    return ContainerInfo(
        id="c",
        name="main",
        pod_name="p",
        pod_namespace=namespace,
        pod_uid="u",
        pod_annotations=pod_annotations or {},
        labels=labels or {},
        env=env or {},
    )


def by_hand(labels=None, env=None) -> ContainerInfo:
    return ContainerInfo(id="c", name="main", labels=labels or {}, env=env or {})


def test_pods_ask_through_annotations_only_by_default():
    policy = NodePolicy()
    assert parse_request(pod(env=IMAGE_ENV), GPUS, policy) is None
    assert parse_request(pod(labels=IMAGE_LABEL), GPUS, policy) is None
    assert parse_request(pod({P + "gpu-memory": "1Gi"}), GPUS, policy).memory_bytes == (GiB,)
    assert ignored(pod(env=IMAGE_ENV, labels=IMAGE_LABEL), policy.pod_sources) == [
        "container label gpushare.io/gpu-memory",
        "environment ALIYUN_COM_GPU_MEM_CONTAINER",
    ]


def test_hidden_sources_cannot_break_a_request():
    """What a source may not say cannot conflict with or refuse a pod's request."""
    c = pod({P + "gpu-memory": "1Gi"}, labels={P + "gpu-memory": "9Gi"}, env={"EGPU": "junk"})
    assert parse_request(c, GPUS, NodePolicy()).memory_bytes == (GiB,)


def test_containers_started_by_hand_use_labels_and_env():
    policy = NodePolicy()
    assert parse_request(by_hand(env=IMAGE_ENV), GPUS, policy).memory_bytes == (8 * GiB,) * 2
    assert parse_request(by_hand(labels=IMAGE_LABEL), GPUS, policy).memory_bytes == (4 * GiB,)
    assert ignored(by_hand(env=IMAGE_ENV, labels=IMAGE_LABEL), policy.standalone_sources) == []


@pytest.mark.parametrize("image", [{"env": IMAGE_ENV}, {"labels": IMAGE_LABEL}])
def test_opted_in_image_sources_lose_to_a_pods_opt_out(image):
    policy = NodePolicy(pod_sources=STANDALONE_SOURCES)
    assert parse_request(pod(**image), GPUS, policy) is not None
    for key in (P + "gpu-memory", P + "container.main.gpu-memory"):
        assert parse_request(pod({key: "0"}, **image), GPUS, policy) is None


def test_no_annotations_at_all():
    policy = NodePolicy(pod_sources=SourcePolicy(annotations=False, env=True))
    assert parse_request(pod({P + "gpu-memory": "1Gi"}), GPUS, policy) is None
    assert parse_request(pod(env=IMAGE_ENV), GPUS, policy) is not None


def test_namespace_allow_list():
    policy = NodePolicy(pod_sources=SourcePolicy(namespaces=("ml", "gpu-team")))
    ask = {P + "gpu-memory": "1Gi"}
    assert parse_request(pod(ask, namespace="ml"), GPUS, policy) is not None
    assert parse_request(pod(namespace="web"), GPUS, policy) is None  # asks nothing: fine
    with pytest.raises(ShareRefused) as info:
        parse_request(pod(ask, namespace="web"), GPUS, policy)
    assert info.value.reason == "forbidden"
    assert "namespace 'web' may not ask for GPU shares" in str(info.value)
    assert "allowed: ml, gpu-team" in str(info.value)
    # The allow-list is for pods; containers started by hand have no namespace.
    assert parse_request(by_hand(labels=IMAGE_LABEL), GPUS, policy) is not None
