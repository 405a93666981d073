"""Mosquitto configurations for a field test: central's broker, and a site broker bridged to it.

A site runs its own broker; its nodes connect to it, and it connects to central's broker
over the WAN with a Mosquitto bridge (the site broker is the bridge's client, so the WAN link
is that one TCP connection). When the WAN is cut the site's nodes keep talking to their broker;
what crosses the bridge, and which way:

===========================================  =========  =======================================
topic (under ``edgesched/v1/``)              direction  why
===========================================  =========  =======================================
``central/#`` (the heartbeat)                in         central → the site's nodes (their lease)
``node/#`` (retained status, telemetry)      out        the site's nodes → central (liveness)
``doc/#`` (every document's y-sync frames)   both       a node's document goes out, central's
                                                        answers and the policy document come in
===========================================  =========  =======================================

Directives, and why each is set so:

* ``bridge_protocol_version mqttv311`` with ``cleansession false``: Mosquitto 2.0.11's MQTT v5
  bridge connects with a session expiry of 0 and has no directive to change it, so its session
  at central's broker ends with the connection and every QoS 1 frame central publishes during
  a WAN cut is dropped (measured: 0 of 1 arrived). A v3.1.1 bridge with ``cleansession
  false`` keeps its session at both ends: frames queue (up to ``max_queued_messages``) and
  flow when the WAN returns. Nothing is lost by v3.1.1 across the bridge: the sync protocol
  carries its framing (epoch, sender, chunking, CRC) in the payload and uses no v5 message
  properties; nodes and central still speak v5 to their own broker.
* ``try_private true``: the bridge tells central's broker it is a bridge, so messages are
  not echoed back to the broker they came from (with ``both`` on two sites, a frame from site 1
  reaches central and site 2 once each, never loops: measured) and retained flags propagate.
* QoS 1 on every bridged topic: a message crosses at the lower of its own QoS and the bridge's,
  so the heartbeat (QoS 0) and telemetry stay QoS 0 and the y-sync frames stay QoS 1.
* ``keepalive_interval 5`` (Mosquitto's minimum): the bridge's view of a dead WAN comes after
  about 1.5 × 5 s; central's broker drops the bridge after the same.
* ``restart_timeout 1 2``: after a failure the bridge reconnects within 1-2 s (the default,
  5 s growing to 30 s with jitter, would dominate the heal time).
* ``notifications true`` on ``edgesched/v1/site/<site>/bridge``: ``1`` (retained) while the
  bridge is up, and the bridge's last will ``0`` at central's broker when it drops: how central
  *could* learn that a whole site went dark (central does not subscribe to it today; a WAN cut
  leaves the site's nodes' retained ``online`` status in place at central).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from edgesched.sync.security import queue_settings
from edgesched.sync.topics import site_bridge_topic
from edgesched.sync.wire import TOPIC_ROOT

#: (pattern, direction, qos) of the bridge, relative to the site broker (``in``: from central).
BRIDGE_TOPICS: tuple[tuple[str, str, int], ...] = (
    (f"{TOPIC_ROOT}/central/#", "in", 1),
    (f"{TOPIC_ROOT}/node/#", "out", 1),
    (f"{TOPIC_ROOT}/doc/#", "both", 1),
)


def broker_config(
    listeners: Sequence[tuple[str, int]],
    *,
    persistence_dir: Path | None = None,
    bridge: tuple[str, str, int] | None = None,
) -> str:
    """A ``mosquitto.conf``: anonymous listeners (the harness's lab network), persistence on
    or off, logs to stderr, and optionally a bridge ``(site id, central host, central port)``."""
    lines = [f"listener {port} {host}" for host, port in listeners]
    lines += ["allow_anonymous true", "log_dest stderr", *queue_settings()]
    if os.geteuid() == 0:
        lines.append("user root")  # the state dirs are root's; don't drop to `mosquitto`
    if persistence_dir is None:
        lines.append("persistence false")
    else:
        lines += ["persistence true", f"persistence_location {persistence_dir}/"]
    if bridge is not None:
        site, host, port = bridge
        lines += [
            "",
            f"connection {site}",
            f"address {host}:{port}",
            f"remote_clientid {site}",
            f"local_clientid {site}.local",
            "cleansession false",
            "bridge_protocol_version mqttv311",
            "try_private true",
            "notifications true",
            f"notification_topic {site_bridge_topic(site)}",
            "keepalive_interval 5",
            "restart_timeout 1 2",
            "start_type automatic",
        ]
        lines += [f"topic {pattern} {way} {qos}" for pattern, way, qos in BRIDGE_TOPICS]
    return "\n".join(lines) + "\n"
