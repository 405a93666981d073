"""The tests' three-member NATS cluster: moved to :mod:`edgesched.fieldtest.natscluster` (one
implementation, also the field-test runner's ``--broker nats``); re-exported here for the
tests and benchmarks that import ``natscluster``."""

from __future__ import annotations

from edgesched.fieldtest.natscluster import (
    NS_CLIENT_PORT,
    NS_CLUSTER_PORT,
    NS_HTTP_PORT,
    NS_MQTT_PORT,
    STREAM_REPLICAS,
    Member,
    NatsCluster,
    build_members,
    in_clients,
    loopback_cluster,
    mqtt_round_trip,
    nats_binary,
    nats_config,
    netns_cluster,
    netns_unavailable,
    start_all,
)

__all__ = [
    "NS_CLIENT_PORT",
    "NS_CLUSTER_PORT",
    "NS_HTTP_PORT",
    "NS_MQTT_PORT",
    "STREAM_REPLICAS",
    "Member",
    "NatsCluster",
    "build_members",
    "in_clients",
    "loopback_cluster",
    "mqtt_round_trip",
    "nats_binary",
    "nats_config",
    "netns_cluster",
    "netns_unavailable",
    "start_all",
]
