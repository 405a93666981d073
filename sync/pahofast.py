"""paho-mqtt's receive path made cheaper: MQTT v5 property tables built once, not per packet.

paho 2.x decodes every MQTT v5 PUBLISH into a new :class:`paho.mqtt.properties.Properties`,
whose constructor builds its lookup tables afresh each time (every property's name, its type
and the packets it applies to: ~60 entries and 27 ``list.index`` calls). At central, taking
in ~2,500 messages a second from 10,000 nodes (telemetry, document updates, status), that
constructor was 22% of central's process (py-spy in ``bench/bench_central_scale.py``), more
than the control loop and the documents together.

:class:`SharedTableProperties` is paho's class with those tables built once and shared (paho
only reads them: they are lookup tables), and :func:`install` makes paho's packet decoding
construct it instead. Everything else is paho's own code: parsing, validation on assignment,
packing. ``tests/test_pahofast.py`` decodes and packs packets carrying every kind of property
both ways and compares. :func:`install` changes nothing when paho is not laid out as the
versions this project allows (``paho-mqtt>=2.1,<2.3``) are, and says so.
"""

from __future__ import annotations

import logging
from types import ModuleType

import paho.mqtt.client as paho_client
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

log = logging.getLogger("edgesched.sync.pahofast")

_TABLES = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]  # (paho's, once)


class SharedTableProperties(Properties):
    """:class:`Properties` whose lookup tables are shared by every instance (read only)."""

    def __init__(self, packetType: int) -> None:
        # (object.__setattr__: paho's own __setattr__ checks property names, and these four
        # are its private fields, which it would set the same way)
        object.__setattr__(self, "packetType", packetType)
        object.__setattr__(self, "types", _TABLES.types)
        object.__setattr__(self, "names", _TABLES.names)
        object.__setattr__(self, "properties", _TABLES.properties)


def _paho_modules() -> list[ModuleType]:
    """paho's modules that construct ``Properties`` by their module-level name."""
    modules: list[ModuleType] = [paho_client]
    try:
        from paho.mqtt import _packet  # paho >= 2.2: PUBLISH decoding lives here
    except ImportError:  # pragma: no cover (paho 2.1 decodes in client.py)
        return modules
    return [_packet, *modules]


def install() -> bool:
    """Make paho construct :class:`SharedTableProperties`; True if it now does (idempotent)."""
    done = False
    for module in _paho_modules():
        current = getattr(module, "Properties", None)
        if current is SharedTableProperties:
            done = True
        elif current is Properties:
            setattr(module, "Properties", SharedTableProperties)  # noqa: B010 (module global)
            done = True
    if not done:
        log.warning("paho-mqtt is laid out differently: its v5 properties stay as they are")
    return done
