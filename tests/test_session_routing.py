"""The session's message routing: a dictionary lookup for plain routes and a document's
sync filter, the same answer as matching every channel's routes in order."""

from __future__ import annotations

import aiomqtt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync.session import Channel, Endpoint, Listener, MqttSession

LEVELS = st.sampled_from(["edgesched", "v1", "doc", "node-a", "node-b", "sync", "a", "b"])
ROUTE_LEVEL = st.one_of(LEVELS, st.just("+"))


class Probe(Listener):
    def __init__(self, name: str, routes: tuple[str, ...]) -> None:
        self.name = name
        self.routes: tuple[str, ...] = routes
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = ()

    def handle(self, topic: str, payload: bytes) -> None:  # pragma: no cover - not called
        raise AssertionError(topic)


def route_st() -> st.SearchStrategy[str]:
    plain = st.lists(ROUTE_LEVEL, min_size=1, max_size=5).map("/".join)
    hashed = st.lists(ROUTE_LEVEL, min_size=0, max_size=4).map(lambda ls: "/".join([*ls, "#"]))
    return st.one_of(plain, plain, hashed)


@given(
    st.lists(st.lists(route_st(), min_size=1, max_size=3), min_size=1, max_size=12),
    st.lists(st.lists(LEVELS, min_size=1, max_size=6).map("/".join), min_size=1, max_size=20),
)
def test_routing_matches_the_linear_scan(
    channel_routes: list[list[str]], topics: list[str]
) -> None:
    session = MqttSession(Endpoint("127.0.0.1", 1883, "probe"))
    probes = [Probe(f"c{i}", tuple(routes)) for i, routes in enumerate(channel_routes)]
    for probe in probes:
        session.add(probe)
    for name in topics:
        topic = aiomqtt.Topic(name)
        want: Channel | None = next(
            (p for p in probes if any(topic.matches(r) for r in p.routes)), None
        )
        assert session.route(topic) is want


def test_thousands_of_document_channels_route_by_lookup() -> None:
    session = MqttSession(Endpoint("127.0.0.1", 1883, "probe"))
    first = Probe("heartbeat", ("edgesched/v1/central/+/heartbeat",))
    session.add(first)
    peers = [Probe(f"n{i}", (f"edgesched/v1/doc/node-n{i}/sync/+",)) for i in range(5000)]
    for probe in peers:
        session.add(probe)
    catch_all = Probe("wildcard", ("edgesched/v1/doc/+/sync/+",))
    session.add(catch_all)
    assert session.route(aiomqtt.Topic("edgesched/v1/doc/node-n4321/sync/n4321")) is peers[4321]
    assert session.route(aiomqtt.Topic("edgesched/v1/doc/node-zz/sync/zz")) is catch_all
    assert session.route(aiomqtt.Topic("edgesched/v1/central/c1/heartbeat")) is first
    assert session.route(aiomqtt.Topic("edgesched/v1/other")) is None


@given(
    st.lists(ROUTE_LEVEL, min_size=0, max_size=4),
    st.booleans(),
    st.lists(st.lists(LEVELS, min_size=1, max_size=6).map("/".join), min_size=1, max_size=20),
)
def test_shared_and_hashed_routes_match_as_aiomqtt_does(
    levels: list[str], hashed: bool, topics: list[str]
) -> None:
    """``$share/<group>/`` is dropped from a route, ``#`` takes the rest (its parent level
    included), as ``aiomqtt.Topic.matches`` has it."""
    route = "/".join(["$share", "g", *levels, *(["#"] if hashed else [])])
    session = MqttSession(Endpoint("127.0.0.1", 1883, "probe"))
    probe = Probe("shared", (route,))
    session.add(probe)
    for name in topics:
        topic = aiomqtt.Topic(name)
        assert (session.route(topic) is probe) == topic.matches(route), (route, name)


def test_a_route_aiomqtt_cannot_match_is_refused_when_added() -> None:
    session = MqttSession(Endpoint("127.0.0.1", 1883, "probe"))
    with pytest.raises(ValueError):
        session.add(Probe("bad", ("edgesched/v1/node/a+/status",)))
