"""The central engine: the fleet's replicas, its liveness, its heartbeat and its API.

``edgesched central run --config central.toml``. One MQTT connection (a
:class:`~edgesched.sync.session.MqttSession` as ``central_id``) carries every channel:

* :class:`~edgesched.central.heartbeat.Heartbeat`: the nodes' lease on central;
* :class:`~edgesched.central.liveness.Liveness`: retained status and last wills;
* :class:`~edgesched.central.replicas.NodeReplicas`: a vetted replica of every node's
  document (fan-in), discovered as nodes speak, snapshotted to SQLite.

Loops run in one ``asyncio.TaskGroup`` owned by :meth:`CentralEngine.run`; :meth:`stop`
ends them, saves the replicas and closes the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgesched.central.heartbeat import Heartbeat
from edgesched.central.liveness import Liveness
from edgesched.central.metrics import CentralMetrics
from edgesched.central.replicas import NodeReplicas
from edgesched.config import EdgeschedConfig
from edgesched.edge.store import Store
from edgesched.sync.session import MqttSession

log = logging.getLogger("edgesched.central.engine")


class CentralEngine:
    """Owns central's store, its MQTT session and the loops that keep the fleet view."""

    def __init__(self, config: EdgeschedConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.central = config.central
        self.state_dir = Path(self.central.state_dir)
        self.clock = clock
        self.metrics = CentralMetrics()
        self._endpoint = self.central.mqtt.endpoint(self.central.central_id)  # files read now
        self.session = MqttSession(
            self._endpoint,
            backoff_initial_s=min(0.5, self.central.mqtt.reconnect_max_s),
            backoff_max_s=self.central.mqtt.reconnect_max_s,
        )
        self.heartbeat = Heartbeat(self.central.central_id, self.central.heartbeat_s, clock)
        self.liveness = Liveness(clock)
        self.replicas = NodeReplicas(
            self.central.central_id, self.session, nodes=self.central.nodes, clock=clock
        )
        self.session.fallback = self.replicas
        self.session.add(self.heartbeat)
        self.session.add(self.liveness)
        self.api_port: int | None = None
        self.started_at = clock()
        self._store: Store | None = None
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("central engine not started")
        return self._store

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Restore the replicas from SQLite, then serve until :meth:`stop`."""
        from edgesched.central.api import serve  # the API module imports this one

        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._store = await Store.open(self.state_dir / "central.db")
        try:
            self.replicas.store = self._store
            restored = await self.replicas.load()
            log.info("central %s: %d node replicas restored", self.central.central_id, restored)
            async with asyncio.TaskGroup() as group:
                runner = await serve(self, self.central.api_host, self.central.api_port)
                loops: list[asyncio.Task[None]] = []
                try:
                    loops = [
                        group.create_task(self.session.run(), name="mqtt"),
                        group.create_task(self._snapshot_loop(), name="snapshots"),
                    ]
                    self._ready.set()
                    log.info(
                        "central %s up: broker %s:%d, API on %s:%s",
                        self.central.central_id,
                        self._endpoint.host,
                        self._endpoint.port,
                        self.central.api_host,
                        self.api_port,
                    )
                    await self._stop.wait()
                finally:
                    for task in loops:
                        task.cancel()
                    await runner.cleanup()
            await self.replicas.persist_changed()
        finally:
            await self.store.close()
            log.info("central %s stopped", self.central.central_id)

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self.central.snapshot_s)
            written = await self.replicas.persist_changed()
            if written:
                self.metrics.snapshots.inc(written)

    # --- views for the API ----------------------------------------------------------------

    def node_summary(self, node_id: str) -> dict[str, Any]:
        replica = self.replicas.replicas[node_id]
        doc = replica.doc
        tasks = doc.tasks()
        states: dict[str, int] = {}
        for entry in tasks.values():
            state = str(entry.get("state", "?"))
            states[state] = states.get(state, 0) + 1
        status = self.liveness.nodes.get(node_id)
        return {
            "id": node_id,
            "status": self.liveness.state(node_id),
            "status_since": None if status is None else status.since,
            "registration": doc.node().get("registration"),
            "document": {
                "epoch": doc.epoch,
                "content_hash": doc.content_hash(),
                "changed_at": replica.changed_at or None,
            },
            "tasks": states,
        }

    def status(self) -> dict[str, Any]:
        peers = [r.peer.stats for r in self.replicas.replicas.values()]
        rejected = {
            key: sum(p[key] for p in peers)
            for key in ("rejected_frames", "rejected_payloads", "rejected_updates")
        }
        rejected["rejected_senders"] = sum(p["rejected_senders"] for p in peers)
        rejected["unknown_documents"] = self.replicas.stats["refused_unknown"]
        rejected["status_messages"] = self.liveness.rejected
        return {
            "central": self.central.central_id,
            "uptime_s": round(self.clock() - self.started_at, 3),
            "broker_connected": self.session.connected,
            "nodes": len(self.replicas.replicas),
            "online": sum(1 for s in self.liveness.nodes.values() if s.state == "online"),
            "heartbeats_sent": self.heartbeat.sent,
            "updates_in": sum(p["updates_in"] + p["step2_in"] for p in peers),
            "rejected": rejected,
        }

    def refresh_metrics(self) -> None:
        status = self.status()
        self.metrics.nodes.set(status["nodes"])
        self.metrics.online.set(status["online"])
        self.metrics.broker_connected.set(1 if status["broker_connected"] else 0)
        for kind, count in status["rejected"].items():
            self.metrics.rejected.labels(kind).set(count)


async def run_until_signalled(engine: CentralEngine) -> None:
    """Run ``engine`` until SIGTERM or SIGINT."""
    import signal

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, engine.stop)
    await engine.run()
