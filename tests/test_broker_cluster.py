"""The clustered broker tier (issue 19): central and edge nodes on a three-server NATS cluster
(its MQTT 3.1.1 gateway over JetStream), each peer connected to a *different* member.

What is checked, as real processes: a task submitted at central runs on a node connected
elsewhere and every replica converges; a node's last will reaches central through another
member; a late subscriber sees the retained statuses; a member dies and its node reconnects
through a surviving one (``MqttSession`` takes one broker address, so the node reaches the
cluster through a proxy that is pointed at a surviving member, as a DNS name or a TCP load
balancer in front of the cluster would be); and (root only) a member partitioned in its
network namespace heals with every document converged. What NATS refuses (MQTT 5, QoS 2, a
``.`` in a topic) and what it loses (the last will of a client whose member died) is pinned
here as measured; docs/brokers.md has the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt
import pytest
from conftest import (
    EdgeNode,
    kill_task_processes,
    until,
    write_central_config,
    write_edge_config,
)
from natscluster import (
    Member,
    NatsCluster,
    loopback_cluster,
    nats_binary,
    netns_cluster,
    netns_unavailable,
)
from paho.mqtt.enums import CallbackAPIVersion

from edgesched.core.task import TaskState
from edgesched.fieldtest.faultproxy import FaultProxy
from edgesched.fieldtest.netns import socket_in
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import TaskReport
from edgesched.sync.session import Endpoint, MqttSession
from edgesched.sync.topics import STATUS_FILTER

pytestmark = pytest.mark.skipif(nats_binary() is None, reason="nats-server is not installed")

DOCS = Path(__file__).resolve().parent.parent / "docs" / "brokers.md"


@pytest.fixture
def nats() -> Iterator[NatsCluster]:
    """Three NATS servers with MQTT on 127.0.0.1, JetStream cluster ready; stopped after."""
    with loopback_cluster() as cluster:
        yield cluster


# --- helpers ---------------------------------------------------------------------------------


@asynccontextmanager
async def nats_fleet(
    tmp_path: Path,
    central_port: int,
    node_ports: Mapping[str, int],
    **central: Any,
) -> AsyncIterator[tuple[EdgeNode, dict[str, EdgeNode]]]:
    """Central and edge nodes as processes speaking MQTT 3.1.1 (``protocol = "3.1.1"``):
    central on ``central_port``, node ``n`` on ``node_ports[n]``; all stopped after.
    The same as conftest's ``central_and_nodes`` but for the protocol key."""
    config, state = write_central_config(tmp_path, central_port, **central)
    with config.open("a") as out:  # [central.mqtt] is the file's last table
        out.write('protocol = "3.1.1"\nreconnect_max_s = 1.0\n')
    main = EdgeNode(config, state, tmp_path / "central.log", tier="central")
    nodes: dict[str, EdgeNode] = {}
    try:
        await asyncio.to_thread(main.start)
        for node_id, port in node_ports.items():
            d = tmp_path / node_id
            d.mkdir()
            cfg, st = write_edge_config(
                d,
                port,
                node_id=node_id,
                lease_s=2.0,
                mqtt={"reconnect_max_s": 1.0, "protocol": "3.1.1"},
            )
            nodes[node_id] = EdgeNode(cfg, st, d / "edge.log")
            await asyncio.to_thread(nodes[node_id].start)
        yield main, nodes
    finally:
        for proc in [main, *nodes.values()]:
            if proc.proc is not None and proc.proc.poll() is None:
                await asyncio.to_thread(proc.kill, signal.SIGTERM)
        for node in nodes.values():
            kill_task_processes(node.state)


def central_nodes(central: EdgeNode) -> dict[str, dict[str, Any]]:
    status, body = central.get("/v1/nodes")
    assert status == 200, body
    return {n["id"]: n for n in body["nodes"]}


def converged(central: EdgeNode, nodes: dict[str, EdgeNode]) -> dict[str, str] | None:
    """Every node's replica at central has the node's own content hash."""
    seen = central_nodes(central)
    hashes = {}
    for node_id, node in nodes.items():
        status, body = node.get("/v1/status")
        assert status == 200, body
        hashes[node_id] = str(body["document"]["content_hash"])
        replica = seen.get(node_id)
        if replica is None or replica["document"]["content_hash"] != hashes[node_id]:
            return None
    return hashes


def status_of(central: EdgeNode, node_id: str) -> str | None:
    node = central_nodes(central).get(node_id)
    return None if node is None else str(node["status"])


def status_and_cause(central: EdgeNode, node_id: str) -> tuple[str, str] | None:
    """A node's status at central and what said so (``status_cause``: will, silent, ...)."""
    node = central_nodes(central).get(node_id)
    return None if node is None else (str(node["status"]), str(node.get("status_cause")))


def submit_at_central(central: EdgeNode, task_id: str, node_id: str) -> None:
    body = {"id": task_id, "command": ["sleep", "120"], "cpu": 0.05, "mem_gib": 0.05}
    body["node"] = node_id
    status, reply = central.request("POST", "/v1/tasks", body)
    assert status == 201, reply
    assert reply["node"] == node_id and reply["state"] == "active", reply


def majority_report(central: EdgeNode, node: EdgeNode) -> str:
    """What central and ``node`` each say about the fleet and their own link, with their
    logs' tails: the evidence a missed step of a partition test leaves."""
    parts = []
    for name, who in (("central", central), ("node", node)):
        try:
            parts.append(f"{name} status: {who.get('/v1/status')[1]}")
            # central's /v1/tasks is a page of its task list, a node's a map by id
            tasks = who.get("/v1/tasks")[1] if who is central else who.tasks()
            parts.append(f"{name} tasks: {tasks}")
        except Exception as exc:  # the evidence is best effort; the timeout is the failure
            parts.append(f"{name} unreachable: {exc!r}")
        parts.append(f"{name} log tail:\n{who.log.read_text()[-3000:]}")
    return "\n".join(parts)


def submit_at_node(node: EdgeNode, task_id: str) -> None:
    body = {"id": task_id, "command": ["sleep", "120"], "cpu": 0.05, "mem_gib": 0.05}
    status, reply = node.request("POST", "/v1/tasks", body)
    assert status == 201, reply


def runs(node: EdgeNode, *task_ids: str) -> bool:
    tasks = node.tasks()
    return all(tasks.get(t, {}).get("state") == "running" for t in task_ids)


def retained(
    host: str, port: int, topic_filter: str, *, wait: float = 3.0, namespace: str | None = None
) -> dict[str, bytes]:
    """What a late subscriber hears at once on ``topic_filter``: the retained messages
    (a fresh clean MQTT 3.1.1 session, ``wait`` seconds)."""
    got: dict[str, bytes] = {}
    subscribed = threading.Event()

    def run() -> mqtt.Client:
        c = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"late-{time.monotonic_ns()}",
            protocol=mqtt.MQTTv311,
            reconnect_on_failure=False,
        )
        c.on_message = lambda _c, _u, m: (
            got.__setitem__(m.topic, bytes(m.payload)) if m.retain else None
        )
        c.on_connect = lambda cl, _u, _f, rc, _p: cl.subscribe(topic_filter, qos=1)
        c.on_subscribe = lambda *_a: subscribed.set()
        c.connect(host, port, keepalive=5)
        c.loop_start()
        return c

    if namespace is None:
        client = run()
    else:
        from edgesched.fieldtest.netns import in_namespace

        client = in_namespace(namespace, run)
    try:
        subscribed.wait(wait)
        time.sleep(wait / 2)
    finally:
        client.disconnect()
        client.loop_stop()
    return got


# --- what NATS refuses -----------------------------------------------------------------------


async def test_nats_mqtt_refuses_v5_qos2_and_dots(nats: NatsCluster) -> None:
    """MQTT 5 is refused at CONNECT; a QoS 2 subscription is granted QoS 1; a QoS 2 publish
    and a topic with a ``.`` or a space close the connection. edgesched's own topics pass:
    node ids and central ids are ``[A-Za-z0-9][A-Za-z0-9_-]*`` (config-checked)."""
    m = nats.members[0]
    v5 = aiomqtt.Client(
        m.mqtt_host, m.mqtt_port, identifier="v5", protocol=aiomqtt.ProtocolVersion.V5
    )
    with pytest.raises(aiomqtt.MqttError):
        async with v5:
            pass

    def client(name: str) -> aiomqtt.Client:
        return aiomqtt.Client(
            m.mqtt_host, m.mqtt_port, identifier=name, protocol=aiomqtt.ProtocolVersion.V311,
            timeout=3,
        )  # fmt: skip

    async with client("qos2-sub") as c:
        granted = await c.subscribe("edgesched/v1/x/#", qos=2)
        assert list(granted) == [1], granted
        await c.publish("edgesched/v1/doc/node-gw-1/sync/gw-1", b"ok", qos=1)  # ours: fine
    for topic, qos in (
        ("edgesched/v1/node/gw.1/status", 1),
        ("edgesched/v1/a b", 1),
        ("edgesched/v1/q2", 2),
    ):
        with pytest.raises(aiomqtt.MqttError):
            async with client(f"bad-{qos}-{len(topic)}") as c:
                await c.publish(topic, b"x", qos=qos)
                await c.publish("edgesched/v1/after", b"x", qos=1)  # never acked
    assert "not supported for MQTT topics" in m.output()
    assert "QoS=2 not supported" in m.output()


def test_docs_config_is_valid() -> None:
    """The three member configs in docs/brokers.md pass ``nats-server -t`` (with the
    documented host names replaced by loopback addresses and store dirs by temporary ones)."""
    text = DOCS.read_text()
    blocks = re.findall(r"```conf\n# (nats\d)\.conf\n(.*?)```", text, re.S)
    assert [name for name, _ in blocks] == ["nats1", "nats2", "nats3"], "docs/brokers.md blocks"
    binary = nats_binary()
    assert binary is not None
    for name, body in blocks:
        with tempfile.TemporaryDirectory() as tmpdir:
            tmp = Path(tmpdir)
            conf = tmp / f"{name}.conf"
            body = re.sub(r"nats(\d)\.example\.net", r"127.0.0.\1", body)
            body = body.replace("/var/lib/nats", str(tmp))
            conf.write_text(body)
            done = subprocess.run([binary, "-t", "-c", str(conf)], capture_output=True, text=True)
            assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"


# --- the fleet on the cluster ----------------------------------------------------------------


async def test_fleet_on_three_members_converges_wills_and_retained(
    nats: NatsCluster, tmp_path: Path
) -> None:
    """Central on nats1, gw-a on nats2, gw-b on nats3 (through a fault proxy): (a) a task
    submitted at central runs on each node, replicas converge; (c) a late subscriber on
    another member sees both retained ``online``; (b) gw-b's link dies silently: nats3
    publishes its retained last will and central (on nats1) reads it offline; healed, it is
    online and converged again."""
    n1, n2, n3 = nats.members
    async with FaultProxy("127.0.0.1", 0, n3.mqtt_host, n3.mqtt_port) as proxy:
        ports = {"gw-a": n2.mqtt_port, "gw-b": proxy.port}
        async with nats_fleet(tmp_path, n1.mqtt_port, ports) as (central, nodes):
            await until(lambda: converged(central, nodes), 30, "central holding both documents")
            await until(
                lambda: all(status_of(central, n) == "online" for n in nodes), 20, "both online"
            )
            for node_id in nodes:
                await asyncio.to_thread(submit_at_central, central, f"{node_id}-c1", node_id)
            for node_id, node in nodes.items():
                task_id = f"{node_id}-c1"
                await until(functools.partial(runs, node, task_id), 20, f"{node_id} runs it")
                ran = await asyncio.to_thread(node.tasks)
                assert ran[task_id]["decided_by"] == "central"
            await until(lambda: converged(central, nodes), 20, "replicas converged")

            late = await asyncio.to_thread(retained, n3.mqtt_host, n3.mqtt_port, STATUS_FILTER)
            assert {t.split("/")[3]: b'"online"' in p for t, p in late.items()} == {
                "gw-a": True,
                "gw-b": True,
            }, late

            t_cut = time.monotonic()
            proxy.blackhole()
            await until(lambda: status_of(central, "gw-b") == "offline", 20, "gw-b's last will")
            will_after = time.monotonic() - t_cut
            late = await asyncio.to_thread(retained, n2.mqtt_host, n2.mqtt_port, STATUS_FILTER)
            assert b'"offline"' in late["edgesched/v1/node/gw-b/status"], late
            await asyncio.to_thread(submit_at_node, nodes["gw-b"], "gw-b-offline")
            await asyncio.to_thread(submit_at_central, central, "gw-a-during", "gw-a")

            proxy.heal()
            await until(lambda: status_of(central, "gw-b") == "online", 20, "gw-b online again")
            await until(lambda: converged(central, nodes), 30, "converged after the heal")
            _, detail = await asyncio.to_thread(central.get, "/v1/nodes/gw-b")
            assert detail["content"]["tasks"]["gw-b-offline"]["state"] == "running"
            _, body = await asyncio.to_thread(central.get, "/v1/status")
            assert body["rejected"]["rejected_senders"] == 0
            print(
                f"gw-b's will read at central {will_after:.1f}s after its link died (keepalive 2 s)"
            )


async def test_member_dies_node_moves_to_a_survivor(nats: NatsCluster, tmp_path: Path) -> None:
    """(d) gw-b reaches the cluster through a proxy pointed at nats3; nats3 is killed
    (SIGKILL) and the proxy pointed at nats2, as a DNS name or load balancer would be: gw-b
    reconnects there, its persistent session (held in JetStream, R3) is found, a task
    submitted at central meanwhile runs on it, every replica converges. nats3's death usually
    takes gw-b's last will with it (not always: docs/brokers.md)."""
    n1, n2, n3 = nats.members
    async with FaultProxy("127.0.0.1", 0, n3.mqtt_host, n3.mqtt_port) as proxy:
        ports = {"gw-a": n2.mqtt_port, "gw-b": proxy.port}
        async with nats_fleet(tmp_path, n1.mqtt_port, ports) as (central, nodes):
            await until(lambda: converged(central, nodes), 30, "central holding both documents")
            await until(
                lambda: all(status_of(central, n) == "online" for n in nodes), 20, "both online"
            )
            gw_b = nodes["gw-b"]
            t_kill = time.monotonic()
            await asyncio.to_thread(n3.stop, signal.SIGKILL)
            proxy.target_port = n2.mqtt_port
            proxy.reset()  # the member's death: its connections end (a dead host: RST)
            await asyncio.to_thread(submit_at_central, central, "after-kill", "gw-b")
            seen: set[tuple[str, str] | None] = set()

            def runs_and_watch() -> bool:
                seen.add(status_and_cause(central, "gw-b"))
                return runs(gw_b, "after-kill")

            try:
                await until(runs_and_watch, 40, "gw-b running central's task via nats2")
            except TimeoutError:
                for m in (n1, n2):
                    print(f"--- {m.name}\n{m.output()}")
                print(f"--- gw-b\n{gw_b.log.read_text()[-3000:]}")
                raise
            moved_in = time.monotonic() - t_kill
            await until(lambda: converged(central, nodes), 30, "converged after the move")
            # Whether central reads gw-b's will is not promised either way: in most runs
            # nats3's death takes it along (central never reads gw-b offline), but in a CI
            # run under load central read it (the session taken over on nats2, it seems).
            # What edgesched relies on is neither: silence marks a node offline whose will
            # was lost, and the node moves and runs its work. Printed, not asserted.
            will = ("offline", "will") in seen
            log = gw_b.log.read_text()
            assert log.count("connected to broker") >= 2, log[-2000:]
            print(
                f"gw-b ran central's task {moved_in:.1f}s after its member was killed; "
                f"central {'read' if will else 'never read'} its will"
            )

            # The member comes back and rejoins; the fleet is undisturbed.
            await asyncio.to_thread(n3.start)
            await asyncio.to_thread(nats.wait_ready, 40)
            await asyncio.to_thread(submit_at_central, central, "after-rejoin", "gw-a")
            await until(lambda: runs(nodes["gw-a"], "after-rejoin"), 20, "gw-a after the rejoin")
            await until(lambda: converged(central, nodes), 30, "converged after the rejoin")


# --- a partition in network namespaces (root only) ------------------------------------------


@pytest.mark.skipif(netns_unavailable() is not None, reason=f"{netns_unavailable()}")
@pytest.mark.skipif(
    not os.environ.get("EDGESCHED_SLOW"),
    reason="EDGESCHED_SLOW=1 (30 s; in CI a partition on NATS is test_fieldtest_nats's "
    "isolate-central in namespaces)",
)
async def test_partitioned_member_heals_with_documents_converged(tmp_path: Path) -> None:
    """(e) Each member in its own namespace; central reaches nats1, gw-a nats2, gw-b nats3
    (proxies in the root namespace connecting from the clients' namespace). nats3's links go
    down (the kernel's partition): gw-b turns autonomous and decides alone, central goes on
    with gw-a through the majority; after the heal nats3 rejoins and every replica is
    byte-equal, gw-b's offline decisions at central."""
    with netns_cluster() as cluster:
        assert cluster.fabric is not None and cluster.clients is not None
        ns = cluster.clients.ns
        async with contextlib.AsyncExitStack() as stack:
            proxies: dict[str, FaultProxy] = {}
            for member in cluster.members:
                proxies[member.name] = await stack.enter_async_context(
                    FaultProxy(
                        "127.0.0.1",
                        0,
                        member.mqtt_host,
                        member.mqtt_port,
                        upstream_sock=lambda: socket_in(ns),
                    )
                )
            ports = {"gw-a": proxies["nats2"].port, "gw-b": proxies["nats3"].port}
            fleet = nats_fleet(tmp_path, proxies["nats1"].port, ports)
            central, nodes = await stack.enter_async_context(fleet)
            await until(lambda: converged(central, nodes), 30, "central holding both documents")
            gw_b = nodes["gw-b"]

            await asyncio.to_thread(cluster.fabric.isolate, "nats3")
            await until(
                lambda: gw_b.get("/v1/status")[1]["mode"] == "autonomous", 20, "gw-b autonomous"
            )
            offline = [f"gw-b-offline-{i}" for i in range(3)]
            for task_id in offline:
                await asyncio.to_thread(submit_at_node, gw_b, task_id)
            t_cut = time.monotonic()
            await asyncio.to_thread(submit_at_central, central, "gw-a-during", "gw-a")
            # 40 s as for the kill above: the JetStream assets nats3 led (the MQTT streams,
            # gw-a's consumer) elect new leaders among nats1 and nats2 first; on a loaded CI
            # machine that outlasted 20 s once. A miss says what central and gw-a saw.
            try:
                await until(lambda: runs(nodes["gw-a"], "gw-a-during"), 40, "the majority goes on")
            except TimeoutError as exc:
                raise TimeoutError(f"{exc}\n{majority_report(central, nodes['gw-a'])}") from None
            majority_in = time.monotonic() - t_cut
            await until(lambda: runs(gw_b, *offline), 20, "gw-b deciding alone")
            during = await asyncio.to_thread(status_of, central, "gw-b")

            t_heal = time.monotonic()
            await asyncio.to_thread(cluster.fabric.heal, "nats3")
            hashes = await until(lambda: converged(central, nodes), 60, "converged after heal")
            healed_in = time.monotonic() - t_heal
            _, detail = await asyncio.to_thread(central.get, "/v1/nodes/gw-b")
            for task_id in offline:
                assert detail["content"]["tasks"][task_id]["decided_by"] == "edge-autonomous"
            await until(lambda: status_of(central, "gw-b") == "online", 20, "gw-b online")
            await asyncio.to_thread(cluster.wait_ready, 40)
            assert len(set(hashes.values())) == 2
            print(
                f"gw-a ran central's task {majority_in:.1f}s into the partition; gw-b read "
                f"{during!r} at central during it; converged {healed_in:.1f}s after the heal"
            )


# --- the session on the cluster, in process --------------------------------------------------


async def test_session_fails_over_to_the_next_member(nats: NatsCluster) -> None:
    """An ``Endpoint`` with ``alternates`` (sync/session.py): a node's session on nats3 with
    nats1 and nats2 as alternates, central's on nats1; one document syncs; nats3 is killed:
    the node's session moves to the next member by itself and the document converges again,
    with what the node wrote meanwhile."""
    n1, n2, n3 = nats.members
    node_doc = NodeDoc("node-gw-x", client_id_for("gw-x"))
    central_doc = NodeDoc("node-gw-x", client_id_for("central"))

    def session(peer_id: str, first: Member, *more: Member) -> MqttSession:
        endpoint = Endpoint(
            first.mqtt_host,
            first.mqtt_port,
            f"{peer_id}-x",
            keepalive_s=2,
            protocol="3.1.1",
            alternates=tuple((m.mqtt_host, m.mqtt_port) for m in more),
        )
        s = MqttSession(endpoint, backoff_initial_s=0.05, backoff_max_s=0.5)
        s.add(DocPeer(doc := node_doc if peer_id == "gw-x" else central_doc, peer_id))
        assert s.channels[0].doc is doc  # type: ignore[attr-defined]
        return s

    central_s = session("central", n1)
    node_s = session("gw-x", n3, n1, n2)
    tasks = [asyncio.create_task(central_s.run()), asyncio.create_task(node_s.run())]

    def same() -> bool:
        return node_doc.content_hash() == central_doc.content_hash()

    try:
        node_doc.put_task("t1", TaskReport(state=TaskState.RUNNING, updated_at=1.0))
        await _until(same, 15, "converged on two members")
        assert node_s.address == (n3.mqtt_host, n3.mqtt_port)
        await asyncio.to_thread(n3.stop, signal.SIGKILL)
        t_kill = time.monotonic()
        for i in range(20):
            node_doc.put_task(f"t{i + 2}", TaskReport(state=TaskState.RUNNING, updated_at=2.0 + i))
        await _until(same, 30, "converged after the node's member died")
        moved_in = time.monotonic() - t_kill
        assert node_s.address in ((n1.mqtt_host, n1.mqtt_port), (n2.mqtt_host, n2.mqtt_port))
        assert node_s.stats["connects"] >= 2
        print(f"node's session moved to {node_s.address[1]} and converged in {moved_in:.1f}s")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)
