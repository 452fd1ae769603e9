"""Bad input from containerd's side: the events the reconciler subscribes to
(anyone with containerd's socket can Publish any topic, type and payload:
nri_gpushare.host.containerd.client.decode_envelope and the reconciler's
timestamps) and the durations `enable` reads from containerd's config
(nri_gpushare.ops.containerd_nri.parse_go_duration).

Properties: decode_envelope never raises and fills a container ID, PID and
exit status only from a payload of the topic's own type; epoch gives a
float or None for any timestamp; parse_go_duration a float or None.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import betterproto.lib.google.protobuf as pb
from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.host.containerd.client import (
    CONTAINER_DELETE,
    TASK_DELETE,
    TASK_EXIT,
    Event,
    decode_envelope,
)
from nri_gpushare.host.containerd.generated.containerd import events as ev
from nri_gpushare.host.containerd.generated.containerd.services.events import v1 as events
from nri_gpushare.host.containerd.verdicts import epoch
from nri_gpushare.ops.containerd_nri import parse_go_duration
from tests.unit.test_fuzz_common import fuzz, text_with_odd_unicode

TYPES = {
    TASK_EXIT: "containerd.events.TaskExit",
    TASK_DELETE: "containerd.events.TaskDelete",
    CONTAINER_DELETE: "containerd.events.ContainerDelete",
}
VALID = [
    bytes(ev.TaskExit(container_id="c1", id="c1", pid=4242, exit_status=137)),
    bytes(ev.TaskDelete(container_id="c1", pid=7, exit_status=0)),
    bytes(ev.ContainerDelete(id="c1")),
]


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=80))
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(data)))
        kind = draw(st.integers(0, 2))
        if kind == 0:
            del data[i:]
        elif kind == 1 and data:
            data[min(i, len(data) - 1)] = draw(st.integers(0, 255))
        else:
            data[i:i] = draw(st.sampled_from([b"\xff" * 11, b"\x0a\xff\xff\xff\x0f", b"\x78"]))
    return bytes(data)


@fuzz(400)
@given(
    st.one_of(st.sampled_from(list(TYPES)), text_with_odd_unicode(20)),
    st.one_of(
        st.sampled_from(list(TYPES.values())).map(lambda t: "types.containerd.io/" + t),
        st.sampled_from(list(TYPES.values())),
        text_with_odd_unicode(30),
    ),
    payloads(),
    text_with_odd_unicode(10),
)
def test_event_envelopes(topic: str, type_url: str, payload: bytes, namespace: str) -> None:
    envelope = events.Envelope(
        timestamp=datetime(2026, 1, 1, tzinfo=UTC),
        namespace=namespace,
        topic=topic,
        event=pb.Any(type_url=type_url, value=payload),
    )
    event = decode_envelope(envelope)
    assert isinstance(event, Event) and event.topic == topic
    if TYPES.get(topic) != type_url.rsplit("/", 1)[-1]:
        # Another topic's payload type (or an unknown topic): nothing read from it.
        assert event == Event(namespace, topic, timestamp=event.timestamp)
    assert event.pid is None or isinstance(event.pid, int)
    assert event.exit_status is None or isinstance(event.exit_status, int)


@fuzz(200)
@given(
    st.one_of(
        st.datetimes(timezones=st.just(UTC)),
        st.datetimes(),
        st.builds(
            lambda d, h: d.replace(tzinfo=timezone(timedelta(hours=h))),
            st.datetimes(),
            st.integers(-23, 23),
        ),
        st.none(),
        st.integers(),
        text_with_odd_unicode(10),
    )
)
def test_event_timestamps(stamp: object) -> None:
    t = epoch(stamp)
    assert t is None or isinstance(t, float)


@fuzz(300)
@given(
    st.one_of(
        text_with_odd_unicode(20),
        st.sampled_from(["1m30s", "1.5s", "500ms", "0", "+0", "-1s", "1e3s", ".s", "1..5s"]),
        st.lists(
            st.tuples(
                st.integers(0, 10**30),
                st.sampled_from(["ns", "us", "µs", "ms", "s", "m", "h", "d"]),
            ),
            max_size=4,
        ).map(lambda parts: "".join(f"{n}{u}" for n, u in parts)),
    )
)
def test_go_durations(text: str) -> None:
    seconds = parse_go_duration(text)
    assert seconds is None or (isinstance(seconds, float) and seconds >= 0)


def test_a_payload_betterproto_half_parses_gives_the_topic_only() -> None:
    # b"#": field 4 with the (group) wire type 3; betterproto leaves exit_status None
    # instead of raising (found by the property above in CI).
    envelope = events.Envelope(
        timestamp=datetime(2026, 1, 1, tzinfo=UTC),
        namespace="k8s.io",
        topic="/tasks/exit",
        event=pb.Any(type_url="types.containerd.io/containerd.events.TaskExit", value=b"#"),
    )
    assert decode_envelope(envelope) == Event("k8s.io", "/tasks/exit", timestamp=envelope.timestamp)
