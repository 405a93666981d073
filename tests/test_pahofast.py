"""paho's v5 properties with shared tables behave as paho's own: decoding, packing, checks."""
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt import _packet
from paho.mqtt.enums import MQTTProtocolVersion
from paho.mqtt.exception import MQTTException
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgesched.sync import pahofast
from edgesched.sync.pahofast import SharedTableProperties

_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\0"), max_size=20)

#: Every property a PUBLISH may carry, with values paho accepts.
PUBLISH_PROPERTIES: dict[str, st.SearchStrategy[Any]] = {
    "PayloadFormatIndicator": st.integers(0, 1),
    "MessageExpiryInterval": st.integers(0, 2**32 - 1),
    "ContentType": _text,
    "ResponseTopic": _text.filter(bool),
    "CorrelationData": st.binary(max_size=20),
    "SubscriptionIdentifier": st.lists(st.integers(1, 268_435_455), min_size=1, max_size=3),
    "TopicAlias": st.integers(1, 65535),
    "UserProperty": st.lists(st.tuples(_text, _text), min_size=1, max_size=3),
}


def _publish_packet(props: bytes, topic: bytes = b"edgesched/v1/x", payload: bytes = b"p") -> bytes:
    """A PUBLISH's variable header and payload (after the fixed header), QoS 1, mid 7."""
    return struct.pack("!H", len(topic)) + topic + struct.pack("!H", 7) + props + payload


def _filled(cls: type[Properties], values: dict[str, Any]) -> Properties:
    props = cls(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(props, name, value)
    return props


def test_install_makes_paho_decode_with_shared_tables() -> None:
    assert pahofast.install() and pahofast.install()  # idempotent
    assert getattr(_packet, "Properties") is SharedTableProperties  # noqa: B009
    packed = _filled(Properties, {"UserProperty": [("k", "v")]}).pack()
    decoded = _packet.decode_publish(0x32, _publish_packet(packed), MQTTProtocolVersion.MQTTv5)
    assert type(decoded.properties) is SharedTableProperties
    assert decoded.properties.json() == {"UserProperty": [("k", "v")]}
    assert decoded.payload == b"p" and decoded.topic == b"edgesched/v1/x" and decoded.mid == 7


@given(st.fixed_dictionaries({}, optional=PUBLISH_PROPERTIES))
def test_shared_tables_pack_and_unpack_as_paho_does(values: dict[str, Any]) -> None:
    theirs, ours = _filled(Properties, values), _filled(SharedTableProperties, values)
    assert ours.pack() == theirs.pack()
    for packed in (theirs.pack(), ours.pack()):
        a, b = Properties(PacketTypes.PUBLISH), SharedTableProperties(PacketTypes.PUBLISH)
        assert a.unpack(packed)[1] == b.unpack(packed)[1] == len(packed)
        assert b.json() == a.json() and str(b) == str(a)


def test_each_instance_keeps_its_own_values_and_the_tables_stay_paho_s() -> None:
    one, two = (
        SharedTableProperties(PacketTypes.PUBLISH),
        SharedTableProperties(PacketTypes.PUBLISH),
    )
    one.UserProperty = ("a", "1")
    one.UserProperty = ("b", "2")  # (a property allowed many times accumulates)
    assert one.json() == {"UserProperty": [("a", "1"), ("b", "2")]} and two.json() == {}
    fresh = Properties(PacketTypes.PUBLISH)
    assert (one.types, one.names, one.properties) == (fresh.types, fresh.names, fresh.properties)


def test_paho_s_checks_still_refuse_what_they_refused() -> None:
    props = SharedTableProperties(PacketTypes.PUBLISH)
    with pytest.raises(MQTTException, match="Property name must be one of"):
        props.NoSuchProperty = 1
    with pytest.raises(MQTTException, match="does not apply to packet type"):
        props.SessionExpiryInterval = 5  # a CONNECT/CONNACK property
    with pytest.raises(MQTTException, match="1-65535"):
        props.TopicAlias = 0


def _outcome(cls: type[Properties], data: bytes) -> tuple[object, ...]:
    props = cls(PacketTypes.PUBLISH)
    try:
        _, length = props.unpack(data)
    except Exception as exc:
        return ("raised", type(exc), str(exc))
    return ("decoded", length, props.json())


@given(st.binary(max_size=40))
def test_any_bytes_decode_or_fail_exactly_as_with_paho_s_class(data: bytes) -> None:
    assert _outcome(SharedTableProperties, data) == _outcome(Properties, data)
