"""The edge sub-engine: one node that keeps scheduling on its own.

:class:`EdgeEngine` owns the node's effects and runs them as sibling tasks in one
``asyncio.TaskGroup``:

* **schedule**: every ``cycle_s`` (or at once after a submission or an exit), the very same
  :func:`edgesched.core.scheduler.schedule` as central, over this node, with the cached policy;
  every decision is committed to SQLite *before* it is acted on;
* **exits**: task processes ending; restart policies (with backoff) decide what happens next;
* **sample**: the agent's resource samples into the store, downsampled hourly; the telemetry
  central shows, of this host or of what the tasks reserve of the registered server
  (``[edge] telemetry_source``, :mod:`edgesched.edge.telemetry`); and one
  bounded batch of history pruning (finished tasks and decisions older than
  ``[edge] history_retention_s`` leave the hot tables, counted per day); what repeats reads
  only the active tasks, so its cost does not grow with the history;
* **link**: MQTT to central; the node is *connected* while it heard central within the lease,
  *autonomous* after that (mode changes are logged and counted);
* **api**: the loopback HTTP API (submit, list, cancel, status, /metrics).

Crash safety: a task is committed as ``accepted`` before the submission is acknowledged; a
placement is committed as ``placed`` before the process starts, and the executor records
every spawn (pid and start time) in its run directory before it returns. On start the engine
rebuilds its state from SQLite: tasks whose processes survived (engine crash, upgrade) are
adopted by pid *and* start time, never started twice; tasks whose processes are gone (power
loss, reboot) go back to the queue and are placed again, with or without a network.

One SQLite transaction per state change (:meth:`EdgeEngine._put`): the task rows, the decisions
behind them and the node document's update for them commit together (one fsync with
``synchronous=FULL``), so the document update is on disk before it can be published.
Submissions that queue up while one commits share the next transaction (group commit); a
cycle commits its decisions with every row they change before acting, then the started
processes in one more. Submission to running is 3 transactions for a task alone, fewer per
task in a burst (bench/bench_edge_transactions.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from edgesched.config import EdgeschedConfig, TelemetrySource, builtin_profiles
from edgesched.core.classdemand import ClassDemand
from edgesched.core.model import Decision, DecisionKind, Node, Placement, Resources
from edgesched.core.scheduler import ClusterView, schedule
from edgesched.core.slices import (
    HELD_LABEL,
    Device,
    Grant,
    Request,
    device_env,
    held_label,
    plan,
)
from edgesched.core.task import (
    RestartPolicy,
    SpecError,
    TaskRecord,
    TaskSpec,
    TaskState,
)
from edgesched.edge.agent import Agent, Sample
from edgesched.edge.executor import Executor, ExecutorError, ExitEvent
from edgesched.edge.hal import (
    HardwareProfile,
    accel_devices,
    default_power_model,
    discover,
    to_node,
)
from edgesched.edge.link import CentralLink
from edgesched.edge.logserve import LogServer
from edgesched.edge.metrics import EdgeMetrics
from edgesched.edge.power import PowerControl
from edgesched.edge.qualify import QualificationReport
from edgesched.edge.site import SiteMember
from edgesched.edge.telemetry import host_telemetry, reserved_telemetry
from edgesched.policies.models import ActiveModels
from edgesched.rest.server import ApiStarter
from edgesched.sync.doc import (
    NodeDoc,
    PolicyDoc,
    SiteNodeDoc,
    SyncedDoc,
    client_id_for,
    desired_doc_name,
)
from edgesched.sync.journal import DocJournal
from edgesched.sync.peer import DocPeer, refusals
from edgesched.sync.schema import (
    AssignmentEntry,
    ModelReport,
    PowerModel,
    Registration,
    TaskReport,
)
from edgesched.sync.session import MqttSession, presence_topic, wait_event
from edgesched.sync.statelock import StateLock
from edgesched.sync.store import Store, StoreError, StoreFullError
from edgesched.sync.telemetry import TelemetryPublisher

log = logging.getLogger("edgesched.edge.engine")
_T = TypeVar("_T")

_QUEUED = (TaskState.ACCEPTED, TaskState.PREEMPTED)
QUALIFICATION_FILE = "qualification.json"  # written by `edgesched node qualify --save`
#: Finished tasks leave the node document after this long (SQLite keeps them): bounded growth.
DOC_RETENTION_S = 86_400.0
#: Central's desired-state document (see :class:`edgesched.sync.doc.PolicyDoc`).
POLICY_DOC = "policy"
_HELD = (TaskState.PLACED, TaskState.RUNNING)
#: The store's meta key of the accelerator units the node's tasks hold (JSON list of grants).
ACCEL_GRANTS_META = "accel_grants"
_ACTIVE = tuple(s for s in TaskState if not s.terminal)
_TERMINAL = tuple(s for s in TaskState if s.terminal)
_POWER = (DecisionKind.PARK, DecisionKind.WAKE)
_ACT_ORDER = {
    DecisionKind.PREEMPT: 0,
    DecisionKind.PIN: 1,
    DecisionKind.PLACE: 2,
    DecisionKind.MIGRATE: 3,
    DecisionKind.PARK: 4,
    DecisionKind.WAKE: 4,
}


class Mode(StrEnum):
    CONNECTED = "connected"
    AUTONOMOUS = "autonomous"


class SubmitError(Exception):
    """A submission refused; ``status`` is the HTTP status, ``field`` what was wrong."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.status = status
        self.field = field
        self.message = message


class IdentityError(Exception):
    """The state directory belongs to another node id."""


class EdgeEngine:
    """The sub-engine of one edge node. Create, then ``await run()``; ``stop()`` ends it."""

    def __init__(
        self,
        config: EdgeschedConfig,
        *,
        hal_root: Path = Path("/"),
        clock: Callable[[], float] = time.time,
        max_page_count: int | None = None,
        api: ApiStarter[EdgeEngine] | None = None,
    ) -> None:
        """``api`` starts the node's HTTP API once the engine is up (``edgesched.serve`` wires
        in :func:`edgesched.edge.api.serve`); without it the engine serves no API."""
        if not config.edge.node_id:
            raise ValueError("edge.node_id: missing (required to run an edge node)")
        self.config = config
        self.edge = config.edge
        self.state_dir = Path(self.edge.state_dir)
        self.hal_root = hal_root
        self.clock = clock
        self.max_page_count = max_page_count
        self._api = api
        self.metrics = EdgeMetrics()
        self.link = CentralLink(self.edge.node_id, self.edge.mqtt)
        self.telemetry = TelemetryPublisher(self.edge.node_id)
        self._endpoint = self.edge.mqtt.endpoint(self.edge.node_id)  # bad key files fail here
        self._signing = self.edge.mqtt.frame_signing(self.edge.node_id)  # and a bad signing key
        self.mode = Mode.AUTONOMOUS
        #: (link clock, task id) of tasks we placed labelled edge-connected, within the
        #: lease: relabelled edge-autonomous if central's heartbeat stops before a later one
        self._connected_decisions: deque[tuple[float, str]] = deque(maxlen=10_000)
        self.started_at = clock()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        self._lock = asyncio.Lock()  # one cycle or state change at a time
        self._not_before: dict[str, float] = {}  # restart backoff
        #: This node's accelerators as devices to slice, and the unit each task holds
        #: (edgesched.core.slices); kept in the store's meta (ACCEL_GRANTS_META).
        self._accel_devices: tuple[Device, ...] = ()
        self._grants: dict[str, Grant] = {}
        self._pins: dict[str, frozenset[int]] = {}
        self._store: Store | None = None
        self._executor: Executor | None = None
        self.profile: HardwareProfile | None = None
        self.node: Node | None = None
        self.api_port: int | None = None
        #: the node's one MQTT connection, made in run() (its ``link``: the status's broker)
        self.session: MqttSession | None = None
        self.models: ActiveModels | None = None  # loaded in run(): onnxruntime is slow to import
        self.demand = ClassDemand()  # what each workload class asks for, in 5-minute bins
        self.power = PowerControl(
            clock,
            self.edge.park_command,
            self.edge.wake_command,
            on_error=lambda stage: self.metrics.power_errors.labels(stage).inc(),
        )
        self.forecast_cpu: float | None = None
        self._doc: NodeDoc | None = None
        self._policy: PolicyDoc | None = None
        #: Our shard of the fleet's desired state: the assignments, stop orders and power
        #: order central gives this node (``desired-<node>``; see edgesched.central.desired).
        self._desired: PolicyDoc | None = None
        #: our document's, the policy's and our desired document's peers (by channel)
        self._peers: dict[str, DocPeer] = {}
        self._policy_dirty = False
        self._policy_saved = ""  # content hash of the policy replica last written to SQLite
        self._desired_saved = ""
        self.tidal_profile = "config"  # the config file's, until central names one
        self._journal: DocJournal | None = None
        #: Submissions waiting for their commit (see :meth:`submit`).
        self._submissions: list[tuple[TaskRecord, asyncio.Future[Exception | None]]] = []
        #: Our membership of a site (``[edge] site_peers``; None: a node alone).
        self.site: SiteMember | None = None
        self._site_persisted = 0.0
        #: Turns of the schedule loop completed: what the systemd watchdog watches
        #: (edgesched.sdnotify)
        self.loop_turns = 0

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        return _started(self._store)

    @property
    def executor(self) -> Executor:
        return _started(self._executor)

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def stop(self) -> None:
        self._stop.set()

    @property
    def loop_period_s(self) -> float:
        return self.edge.cycle_s

    def service_status(self) -> str:
        """One line for ``systemctl status`` (sent with every watchdog ping)."""
        heard = self.link.last_heard
        central = "never" if heard is None else f"{self.link.clock() - heard:.0f} s ago"
        broker = "connected" if self.link.broker_connected else "not connected"
        running = 0 if self._executor is None else len(self._executor.running())
        return (
            f"edge node {self.edge.node_id} {self.mode.value}: broker {broker}, central heard "
            f"{central}; {running} task process(es); {self.loop_turns} cycles"
        )

    async def run(self) -> None:
        """Recover from SQLite, then run every loop until :meth:`stop`. Tasks keep running."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock = StateLock.acquire(self.state_dir, f"edge engine {self.edge.node_id}")
        try:
            await self._run_locked()
        finally:
            lock.release()

    async def _run_locked(self) -> None:
        self._store = await Store.open(
            self.state_dir / "edge.db", max_page_count=self.max_page_count
        )
        try:
            await self._claim_identity()
            self.profile = discover(self.hal_root)
            power = default_power_model(self.profile)
            perf, iops_k = self._qualification()
            self.node = to_node(
                self.profile,
                self.edge.node_id,
                self.edge.site,
                power,
                iops_k=iops_k,
                perf=perf,
                accel_time_slices=self.edge.accel_time_slices,
            )
            self._accel_devices = accel_devices(self.profile, self.edge.accel_time_slices)
            self._grants = await self._load_grants()
            self._executor = Executor(
                self.state_dir / "run",
                arch=self.profile.arch,
                container_runtime=self.edge.container_runtime,
                cgroup_parent="auto",  # inside the cgroup systemd delegates, if it does
            )
            agent = Agent(self.profile, power, self.hal_root)
            self._load_models()
            await self._open_document()
            await self._open_site()
            self._follow_models()  # the cached policy's models, before any decision
            await self._recover()
            await self._mirror_all()
            await self._seed_demand()
            async with asyncio.TaskGroup() as group:
                runner = None if self._api is None else await self._api(self)
                loops: list[asyncio.Task[None]] = []
                try:
                    loops = [
                        group.create_task(self._schedule_loop(), name="schedule"),
                        group.create_task(self._exit_loop(), name="exits"),
                        group.create_task(self._sample_loop(agent), name="sample"),
                        group.create_task(_started(self._journal).run(), name="doc-log"),
                        group.create_task(self._mqtt_session().run(), name="mqtt"),
                    ]
                    self._ready.set()
                    log.info(
                        "edge node %s up: %s %s, %d cores, class %s; API on %s:%s",
                        self.edge.node_id,
                        self.profile.arch.value,
                        self.profile.cpu_model,
                        self.profile.cores,
                        self.profile.server_class.value,
                        self.edge.api_host,
                        self.api_port,
                    )
                    await self._stop.wait()
                    with contextlib.suppress(TimeoutError):  # log what is queued, then stop
                        async with asyncio.timeout(5.0):
                            await _started(self._journal).flushed()
                finally:
                    for task in loops:
                        task.cancel()
                    if runner is not None:
                        await runner.cleanup()
        finally:
            if self._executor is not None:
                await self._executor.aclose()
            await self.store.close()
            log.info("edge node %s stopped; its tasks keep running", self.edge.node_id)

    @property
    def doc(self) -> NodeDoc:
        return _started(self._doc)

    @property
    def policy(self) -> PolicyDoc:
        """Our replica of central's fleet-wide policy document (mode, tidal profile, models);
        we never write it."""
        return _started(self._policy)

    @property
    def desired(self) -> PolicyDoc:
        """Our replica of our desired-state document (what central assigns, stops and orders
        this node); we never write it."""
        return _started(self._desired)

    async def _open_document(self) -> None:
        """This node's CRDT document, rebuilt from SQLite, with its fixed client id."""
        stored = await self.store.get_meta("client_id")
        client_id = int(stored) if stored else client_id_for(self.edge.node_id)
        if not stored:
            await self.store.set_meta("client_id", str(client_id))
        kind = SiteNodeDoc if self.edge.site_peers else NodeDoc  # (site maps tracked by key)
        self._doc = await kind.load_from(self.store, f"node-{self.edge.node_id}", client_id)
        self._journal = DocJournal(self._doc, self.store, on_error=self._count_store_error)
        assert self.node is not None and self.profile is not None
        self._doc.set_registration(
            Registration(
                site=self.edge.site,
                arch=self.node.arch,
                server_class=self.node.server_class,
                cpu=self.node.capacity.cpu,
                mem_gib=round(self.node.capacity.mem_gib, 3),
                accel=self.node.capacity.accel,
                accel_slices=self.node.capacity.accel_slices,
                perf=self.node.perf,
                cpu_model=self.profile.cpu_model,
                reads_packed=True,
                power=PowerModel(
                    idle_w=self.node.power.idle_w,
                    peak_w=self.node.power.peak_w,
                    parked_w=self.node.power.parked_w,
                    wake_latency_s=self.node.power.wake_latency_s,
                ),
            )
        )
        self._policy = await PolicyDoc.load_from(self.store, POLICY_DOC, client_id)
        self._policy_saved = self._policy.content_hash()
        self._policy.on_remote_change(self._policy_changed)
        self._desired = await PolicyDoc.load_from(
            self.store, desired_doc_name(self.edge.node_id), client_id
        )
        self._desired_saved = self._desired.content_hash()
        self._desired.on_remote_change(self._policy_changed)
        self._policy_dirty = True  # follow what the cached copies say, offline or not

    def _policy_changed(self, sender: str) -> None:
        self._policy_dirty = True
        self._wake.set()

    async def _follow_policy(self) -> list[str]:
        """Take the tasks central assigned to us, cancel the copies central ordered stopped,
        and keep the policy replica in SQLite (a node rebooted while cut off follows it).
        Returns the tasks whose processes are to be stopped (once the lock is released)."""
        self._policy_dirty = False
        self._follow_policy_settings()
        me = self.edge.node_id
        to_stop: list[str] = []
        for task_id, entry in self.desired.assignments().items():
            if entry.node == me and await self._follow_assignment(task_id, entry):
                to_stop.append(task_id)
        for key, order in self.desired.stops().items():
            task_id, _, node_id = key.rpartition("@")
            if node_id != me:
                continue
            record = await self.store.get_task(task_id)
            if (
                record is not None
                and not record.state.terminal
                and record.assignment is not None
                and record.assignment.epoch == order.epoch
            ):
                log.warning("task %s: stopping our copy: %s", task_id, order.reason)
                why = f"reconciled: {order.reason or 'placed twice'}"
                if await self._cancel_record(record, why):
                    to_stop.append(task_id)
        busy = bool(await self.store.list_tasks((*_QUEUED, *_HELD)))
        if await self.power.follow(self.desired.power().get(me), busy):
            self._report_power()
        now_hash = self.policy.content_hash()
        if now_hash != self._policy_saved:
            await self.policy.persist_to(self.store)
            self._policy_saved = now_hash
        now_hash = self.desired.content_hash()
        if now_hash != self._desired_saved:
            await self.desired.persist_to(self.store)
            self._desired_saved = now_hash
        return to_stop

    def _follow_policy_settings(self) -> None:
        """Central's mode and tidal profile, when it set them, replace the config file's; and
        once central says it reads packed entries, this node writes its own so."""
        self.doc.packed = self.policy.packed_entries()
        policy = self.config.policy
        mode = self.policy.mode()
        if mode is not None and mode != policy.mode:
            policy = replace(policy, mode=mode)
        tidal_entry = self.policy.tidal()
        tidal = None if tidal_entry is None else tidal_entry.profile
        profiles = builtin_profiles()
        if tidal is not None and tidal in profiles and tidal != self.tidal_profile:
            policy = replace(policy, tidal=profiles[tidal])
            self.tidal_profile = tidal
        if policy != self.config.policy:
            log.warning("policy from central: mode %s, tidal %s", policy.mode, self.tidal_profile)
            self.config = replace(self.config, policy=policy)
        self._follow_models()

    def _follow_models(self) -> None:
        """Swap in the models central published (verified first), and tell central through
        our document which models we run and what we refused."""
        self.active_models.follow({k: e.to_entry() for k, e in self.policy.models().items()})
        self.doc.set_model_reports(
            {
                kind: ModelReport(
                    sha256=str(info["sha256"] or ""),
                    source=str(info["source"] or ""),
                    refused=str(info["refused"] or ""),
                )
                for kind, info in self.active_models.status().items()
            }
        )

    def _report_power(self) -> None:
        """Our power state for central's power stage (and the parked figure in telemetry)."""
        self.doc.set_power_report(self.power.state.report())

    async def _follow_assignment(self, task_id: str, entry: AssignmentEntry) -> bool:
        """Apply one assignment to us; True if a process is to be stopped."""
        record = await self.store.get_task(task_id)
        if not entry.active:
            if record is not None and record.assignment is not None and not record.state.terminal:
                return await self._cancel_record(record, "cancelled at central")
            return False
        spec, assignment = entry.task_spec, entry.to_assignment()
        if spec.id != task_id:
            log.error("assignment of %s ignored: its spec is task %s", task_id, spec.id)
            return False
        now = self.clock()
        if record is None:
            state, reason = TaskState.ACCEPTED, f"assigned by {assignment.central}"
            try:
                self._check_feasible(spec, _started(self.node))
            except SubmitError as exc:  # central's view was stale: say so in our document
                state, reason = TaskState.FAILED, f"assigned but cannot run here: {exc}"
            await self._put(
                TaskRecord(
                    spec=spec,
                    state=state,
                    submitted_at=now,
                    updated_at=now,
                    decided_by="central",
                    node_id=self.edge.node_id,
                    reason=reason,
                    assignment=assignment,
                )
            )
            if state is TaskState.ACCEPTED:
                self.metrics.submissions.inc()
        elif record.assignment is None:
            log.error("assignment of %s ignored: a local task has that id", task_id)
        elif record.assignment.epoch < assignment.epoch and not record.state.terminal:
            await self._put(replace(record, assignment=assignment))  # kept by a reconcile
        elif record.assignment.epoch < assignment.epoch:
            # A newer epoch for a copy that finished here (a failover or a migration back to
            # us): central wants it run again. Ignoring it left the task running nowhere, with
            # central waiting for a copy of the new epoch that never came (issue 14).
            await self._put(
                TaskRecord(
                    spec=spec,
                    state=TaskState.ACCEPTED,
                    submitted_at=now,
                    updated_at=now,
                    decided_by="central",
                    node_id=self.edge.node_id,
                    reason=f"assigned again by {assignment.central} (epoch {assignment.epoch}; "
                    f"our copy of epoch {record.assignment.epoch} had {record.state.value})",
                    assignment=assignment,
                )
            )
            self.metrics.submissions.inc()
        return False

    async def _cancel_record(self, record: TaskRecord, reason: str) -> bool:
        """Commit ``record`` cancelled; True if it has a process to stop (by
        :meth:`_stop_processes`, outside the engine lock: stopping waits the grace period)."""
        await self._put(record.with_state(TaskState.CANCELLED, self.clock(), reason=reason))
        return record.state in _HELD

    async def _stop_processes(self, task_ids: list[str]) -> None:
        for task_id in task_ids:
            await self.executor.stop(task_id, self.edge.stop_grace_s)
            self.executor.forget(task_id)

    def _mqtt_session(self) -> MqttSession:
        """The node's one MQTT connection, as ``node_id``: the central link and our document."""
        session = self.session = MqttSession(
            self._endpoint,
            will=self.link.will(),
            backoff_initial_s=min(0.5, self.edge.mqtt.reconnect_max_s),
            backoff_max_s=self.edge.mqtt.reconnect_max_s,
            presence=presence_topic(self.edge.node_id),  # a second process as us stops
        )
        session.add(self.link)
        session.add(self.telemetry)
        self._peers["node"] = DocPeer(
            self.doc,
            self.edge.node_id,
            before_publish=_started(self._journal).flushed,  # on disk before it leaves
            writers=frozenset({self.doc.client_id}),  # ours alone, relayed by the centrals
            relays=self.edge.centrals,
            signing=self._signing,
        )
        centrals = frozenset(client_id_for(c) for c in self.edge.centrals)
        # Read only, and from the centrals only: they author both documents, and hearing
        # every other node's step 1 of the policy would grow our traffic with the fleet.
        for channel, doc in (("policy", self.policy), ("desired", self.desired)):
            self._peers[channel] = DocPeer(
                doc,
                self.edge.node_id,
                writers=centrals,
                relays=self.edge.centrals,
                listen_to=self.edge.centrals,
                signing=self._signing,
            )
        for peer in self._peers.values():
            session.add(peer)
        if self.site is not None:
            for site_channel in self.site.channels():
                session.add(site_channel)
        # central's requests for a task's output (GET /v1/tasks/{id}/logs at central)
        logs = LogServer(self.edge.node_id, self.store.get_task, self.executor.log_path)
        logs.signing = self._signing
        session.add(logs)
        return session

    async def _put(
        self, *records: TaskRecord, decisions: Sequence[Decision] = (), source: str = ""
    ) -> None:
        """Commit task records (and the ``decisions`` behind them) and their mirror in the node
        document (for central) in one SQLite transaction: one fsync per state change, and the
        document update is on disk before it can be published. If the commit fails, the
        document is put back as it was (that undo is logged later, by the journal's retries)."""
        journal = _started(self._journal)
        before = {r.spec.id: self.doc.task(r.spec.id) for r in records}
        try:
            async with journal.transaction():
                await self.store.put_tasks(records)
                await self.store.append_decisions(decisions, source)
                # One CRDT transaction, one update for them all.
                with self.doc.doc.transaction():
                    for record in records:
                        self._mirror(record)
        except BaseException:
            for task_id, report in before.items():
                if report is None:
                    self.doc.remove_task(task_id)
                else:
                    self.doc.put_task(task_id, report)
            raise

    async def _mirror_all(self) -> None:
        """Bring the document in line with SQLite (the record of truth) after a restart: an
        update that was queued but not yet logged when the engine died is re-derived here."""
        horizon = self.clock() - DOC_RETENTION_S
        # by state and age: the active tasks and the recently finished, never all the history
        records = await self.store.list_tasks(_ACTIVE)
        records += await self.store.list_tasks(_TERMINAL, updated_since=horizon)
        for record in records:
            self._mirror(record)

    def _mirror(self, record: TaskRecord) -> None:
        if self._doc is not None:
            self._doc.put_task(record.spec.id, TaskReport.of(record))

    def _expire_doc_tasks(self, now: float) -> None:
        for task_id, report in self.doc.tasks().items():
            if not report.active and now - report.updated_at > DOC_RETENTION_S:
                self.doc.remove_task(task_id)

    def _qualification(self) -> tuple[float, float | None]:
        """(perf, iops_k) from ``<state_dir>/qualification.json`` if `node qualify` saved one."""
        path = self.state_dir / QUALIFICATION_FILE
        if not path.exists():
            return 1.0, None
        try:
            report = QualificationReport.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.error("ignoring %s: %s", path, exc)
            return 1.0, None
        profile = report.profile()
        perf = profile.get("perf", 1.0)
        log.info("node profile from %s: perf %.2f, iops_k %s", path, perf, profile.get("iops_k"))
        return (perf if perf > 0 else 1.0), profile.get("iops_k")

    def _load_models(self) -> None:
        """The forecaster and placement score: the config's files, else the shipped ones;
        central may swap either later through the policy document (:meth:`_follow_models`)."""
        self.models = ActiveModels(
            self.state_dir / "models",
            {"forecast": self.edge.forecast_model, "placement": self.edge.placement_model},
            on_event=lambda kind, stage: self.metrics.model_fallbacks.labels(kind, stage).inc(),
        )

    @property
    def active_models(self) -> ActiveModels:
        return _started(self.models)

    async def _seed_demand(self) -> None:
        """The per-class demand history saved at the last closed bin, so a restart keeps its
        forecast (a malformed copy is logged and dropped: it only costs forecast quality)."""
        saved = await self.store.get_meta("class_demand")
        if not saved:
            return
        try:
            self.demand = ClassDemand.from_json(json.loads(saved))
        except ValueError as exc:
            log.error("dropping the saved demand history: %s", exc)

    async def _observe_demand(self, now: float, records: list[TaskRecord]) -> None:
        """Fold what each class asks for now (CPU of its queued and running tasks) into the
        5-minute bins; on each closed bin, forecast the next 15 minutes and save the bins."""
        asked: dict[str, float] = {}
        for r in records:
            if r.state in _QUEUED or r.state in _HELD:
                asked[r.spec.workload] = asked.get(r.spec.workload, 0.0) + r.spec.cpu
        if not self.demand.observe(now, asked):
            return
        assert self.profile is not None
        self.forecast_cpu = self.active_models.peak(self.demand, float(self.profile.cores))
        if self.forecast_cpu is not None:
            self.metrics.forecast.set(self.forecast_cpu)
        with contextlib.suppress(StoreError):  # counted where the store fails for real
            await self.store.set_meta("class_demand", json.dumps(self.demand.to_json()))

    async def _claim_identity(self) -> None:
        owner = await self.store.get_meta("node_id")
        if owner is None:
            await self.store.set_meta("node_id", self.edge.node_id)
        elif owner != self.edge.node_id:
            raise IdentityError(
                f"state directory {self.state_dir} belongs to node {owner!r}, not "
                f"{self.edge.node_id!r}; a node's identity is fixed"
            )

    async def _recover(self) -> None:
        """Rebuild from SQLite: adopt live processes, requeue the ones that are gone."""
        now = self.clock()
        adopted = requeued = 0
        changed: list[TaskRecord] = []
        for record in await self.store.list_tasks(_HELD):
            handle = None
            if record.pid is not None and record.pid_started_at is not None:
                handle = self.executor.adopt(record.spec.id, record.pid, record.pid_started_at)
            else:
                spawned = self.executor.recorded(record.spec.id)
                if spawned is not None:  # died between spawn and our commit: still adopt
                    handle = self.executor.adopt(record.spec.id, *spawned)
            if handle is not None:
                adopted += 1
                changed.append(
                    record.with_state(
                        TaskState.RUNNING, now, pid=handle.pid, pid_started_at=handle.started_at
                    )
                )
            elif self.executor.exit_pending(record.spec.id):
                pass  # finished while we were down: its exit event is queued for the exit loop
            else:
                requeued += 1
                changed.append(
                    record.with_state(
                        TaskState.ACCEPTED,
                        now,
                        pid=None,
                        pid_started_at=None,
                        reason="process gone after restart (reboot or power loss): requeued",
                    )
                )
        if changed:
            await self._put(*changed)  # one transaction for the whole recovery
        if adopted or requeued:
            log.warning(
                "recovered from SQLite: %d task(s) adopted alive, %d requeued", adopted, requeued
            )
        self.metrics.recovered.labels("adopted").inc(adopted)
        self.metrics.recovered.labels("requeued").inc(requeued)

    # --- API-facing operations ----------------------------------------------------------------

    async def submit(self, spec: TaskSpec) -> TaskRecord:
        """Validate, commit as accepted, then acknowledge (return). Raises SubmitError."""
        node = self.node
        if node is None:
            raise SubmitError(503, "node", "engine is starting")
        self._check_feasible(spec, node)
        now = self.clock()
        record = TaskRecord(
            spec=spec,
            state=TaskState.ACCEPTED,
            submitted_at=now,
            updated_at=now,
            decided_by="",
            reason="accepted locally",
        )
        # Group commit: submissions that queue up while one commits go in together, in the
        # next transaction (one fsync for a burst); each is acknowledged once it is committed.
        waiter: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self._submissions.append((record, waiter))
        async with self._lock:
            if not waiter.done():
                await self._commit_submissions()
        refused = waiter.result()
        if refused is not None:
            raise refused
        self.metrics.submissions.inc()
        self._wake.set()
        return record

    async def _commit_submissions(self) -> None:
        """Commit every queued submission in one transaction (the engine lock held) and tell
        each submitter its outcome: None (accepted), or the error to raise."""
        batch, self._submissions = self._submissions, []
        fresh: dict[str, tuple[TaskRecord, asyncio.Future[Exception | None]]] = {}
        outcome: Exception | None = StoreError("submission interrupted: not accepted")
        try:
            for record, waiter in batch:
                task_id = record.spec.id
                if task_id in fresh or await self.store.get_task(task_id) is not None:
                    waiter.set_result(SubmitError(409, "id", f"task {task_id!r} already exists"))
                else:
                    fresh[task_id] = (record, waiter)
            if fresh:
                await self._put(*(record for record, _ in fresh.values()))
            outcome = None
        except StoreFullError as exc:
            self.metrics.store_errors.labels("full").inc()
            outcome = SubmitError(507, "store", f"not accepted: {exc}")
        except StoreError as exc:
            outcome = exc
        finally:
            for _, waiter in batch:
                if not waiter.done():  # each submitter raises an error of its own
                    waiter.set_result(_copy_error(outcome))

    def _check_feasible(self, spec: TaskSpec, node: Node) -> None:
        task = spec.to_task(0.0)
        if not task.runs_on(node.arch):
            field = "images" if not task.archs or node.arch in task.archs else "archs"
            raise SubmitError(422, field, f"this node is {node.arch.value}")
        if task.server_classes and node.server_class not in task.server_classes:
            raise SubmitError(422, "server_classes", f"this node is {node.server_class.value}")
        cap = node.capacity
        for name, want, have in (
            ("cpu", task.demand.cpu, cap.cpu),
            ("mem_gib", task.demand.mem_gib, cap.mem_gib),
            ("accel", float(task.demand.accel), float(cap.accel)),
        ):
            if want > have + 1e-9:
                raise SubmitError(422, name, f"asks for {want:g}, this node has {have:g} in all")
        if spec.accel_slices:
            most = max((d.slices for d in self._accel_devices if d.slices > 1), default=0)
            if spec.accel_slices > most:
                offer = f"its devices offer at most {most}" if most else "it offers none"
                raise SubmitError(
                    422,
                    "accel_slices",
                    f"asks for {spec.accel_slices} slices of one device; this node: {offer}",
                )
        program = spec.command[0]
        if spec.images and self.edge.container_runtime:  # the command runs inside its image
            program = self.edge.container_runtime
        if "/" in program:
            if not (Path(spec.cwd or ".") / program).exists() and not Path(program).exists():
                raise SubmitError(422, "command", f"{program!r} does not exist")
        elif shutil.which(program, path=spec.env.get("PATH")) is None:
            raise SubmitError(422, "command", f"{program!r} not found on PATH")

    async def cancel(self, task_id: str) -> TaskRecord:
        async with self._lock:
            record = await self.store.get_task(task_id)
            if record is None:
                raise SubmitError(404, "id", f"no task {task_id!r}")
            if record.state.terminal:
                return record
            has_process = await self._cancel_record(record, "cancelled")
        if has_process:
            await self._stop_processes([task_id])
        self._wake.set()
        cancelled = await self.store.get_task(task_id)
        return cancelled or record

    def refused_by_channel(self) -> dict[str, dict[str, int]]:
        """Channel (``node``: our document, ``policy``, ``desired``) → reason → messages
        refused since start (:data:`~edgesched.sync.peer.REFUSAL_REASONS`, and ``schema``:
        entries the schema refused)."""
        return {
            channel: refusals([peer.stats])
            | {"schema": sum(self._channel_doc(channel).refusals.by_kind().values())}
            for channel, peer in self._peers.items()
        }

    def _channel_doc(self, channel: str) -> SyncedDoc:
        return {"node": self.doc, "policy": self.policy, "desired": self.desired}[channel]

    def status(self) -> dict[str, Any]:
        profile = self.profile
        return {
            "node": self.edge.node_id,
            "site": self.edge.site,
            "mode": self.mode.value,
            "broker_connected": self.link.broker_connected,
            "central_heard_s_ago": (
                None if self.link.last_heard is None else self.link.clock() - self.link.last_heard
            ),
            "lease_s": self.edge.lease_s,
            "policy": self.config.policy.mode.value,
            "tidal_profile": self.tidal_profile,
            "uptime_s": self.clock() - self.started_at,
            "document": None
            if self._doc is None
            else {
                "name": self._doc.name,
                "client_id": self._doc.client_id,
                "content_hash": self._doc.content_hash(),
                "tasks": len(self._doc.tasks()),
                "packed": self._doc.packed,
                "refused_entries": self._doc.refusals.by_kind(),
            },
            "policy_document": None
            if self._policy is None
            else {
                "content_hash": self._policy.content_hash(),
                "refused_entries": self._policy.refusals.by_kind(),
            },
            "desired_document": None
            if self._desired is None
            else {
                "name": self._desired.name,
                "content_hash": self._desired.content_hash(),
                "assignments": len(self._desired.assignments()),
                "refused_entries": self._desired.refusals.by_kind(),
            },
            "refused": self.refused_by_channel(),
            "site_autonomy": None
            if self.site is None or self._doc is None
            else self._site_status(),
            "models": self.active_models.status(),
            "power": {**self.power.state.report().to_entry(), "last_error": self.power.last_error},
            "forecast": {
                "model": self.active_models.forecast_name,
                "peak_cpu_next_15min": self.forecast_cpu,
                "history_bins": max((len(v) for v in self.demand.bins.values()), default=0),
                "classes": sorted(self.demand.bins),
            },
            "hardware": None
            if profile is None
            else {
                "arch": profile.arch.value,
                "cpu_model": profile.cpu_model,
                "cores": profile.cores,
                "mem_gib": round(profile.mem_gib, 2),
                "server_class": profile.server_class.value,
                "class_reason": profile.class_reason,
                "perf": None if self.node is None else self.node.perf,
                "iops_k": None if self.node is None else self.node.capacity.iops_k,
            },
        }

    def _site_status(self) -> dict[str, Any]:
        site = _started(self.site)
        vote, lease = self.doc.site_vote(), self.doc.site_lease()
        return {
            "members": list(site.members),
            "live": sorted(site.presence.live()),
            "vote": None if vote is None else {"epoch": vote.epoch, "holder": vote.holder},
            "coordinating": None if lease is None else {"epoch": lease.epoch,
                                                        "since": lease.since,
                                                        "members": list(lease.members)},
            "following": None if site.followed is None else {"epoch": site.followed.epoch,
                                                             "holder": site.followed.holder},
            "orders": len(self.doc.site_orders()),
            "offered": sorted(site.offered(self.doc)),
        }  # fmt: skip

    # --- loops ---------------------------------------------------------------------------------

    def _update_mode(self) -> None:
        mode = Mode.CONNECTED if self.link.heard_within(self.edge.lease_s) else Mode.AUTONOMOUS
        if mode is not self.mode:
            # Losing central is worth a WARNING; hearing it (every start begins autonomous,
            # and every heal) is not.
            level = logging.WARNING if mode is Mode.AUTONOMOUS else logging.INFO
            log.log(level, "mode %s -> %s", self.mode.value, mode.value)
            self.metrics.mode_changes.labels(mode.value).inc()
            self.mode = mode
        for m in Mode:
            self.metrics.mode.labels(m.value).set(1 if m is self.mode else 0)

    async def _relabel_after_cut(self) -> None:
        """Tasks we placed labelled ``edge-connected`` after central's last heartbeat, once
        central is lost (:meth:`CentralLink.live` false): central never heard of those
        decisions while it could act on them, so they are ``edge-autonomous`` (the task's
        record and the node document; its decision rows keep what was known then)."""
        decided = self._connected_decisions
        last = self.link.last_heard
        if not decided or self.link.live(self.edge.lease_s):
            while decided and last is not None and decided[0][0] < last:
                decided.popleft()  # central was heard after it: connected, as labelled
            return
        after = {task_id for at, task_id in decided if last is None or at > last}
        decided.clear()
        if not after:
            return
        async with self._lock:
            changed = []
            for task_id in sorted(after):
                record = await self.store.get_task(task_id)
                if record is not None and record.decided_by == "edge-connected":
                    changed.append(replace(record, decided_by="edge-autonomous"))
            if changed:
                await self._put(*changed)
                log.info(
                    "%d task(s) placed after central's last heartbeat relabelled "
                    "edge-autonomous: %s",
                    len(changed),
                    ", ".join(r.spec.id for r in changed[:10]),
                )

    async def _schedule_loop(self) -> None:
        while True:
            await wait_event(self._wake, self.edge.cycle_s)
            self._wake.clear()
            self._update_mode()
            try:
                await self._relabel_after_cut()
                try:
                    await self.site_cycle()
                except StoreError:
                    raise
                except Exception:  # what a peer wrote must never stop this node's own cycle
                    self.metrics.site_errors.inc()
                    log.exception("site cycle failed; this node schedules alone this cycle")
                await self.cycle()
            except StoreError as exc:
                # The engine keeps running what it runs; it retries next cycle.
                self.metrics.store_errors.labels(
                    "full" if isinstance(exc, StoreFullError) else "error"
                ).inc()
                log.error("scheduling cycle skipped: %s", exc)
            self.loop_turns += 1

    def _count_store_error(self, exc: StoreError) -> None:
        self.metrics.store_errors.labels(
            "full" if isinstance(exc, StoreFullError) else "error"
        ).inc()

    async def _open_site(self) -> None:
        """Our site membership, with our replicas of the peers' documents as last persisted."""
        if not self.edge.site_peers:
            return
        site = SiteMember(
            self.edge.node_id,
            self.edge.site_peers,
            client_id=self.doc.client_id,
            centrals=self.edge.centrals,
            signing=self._signing,
            failover_after_s=self.edge.site_failover_s,
            offer_after_s=self.edge.site_offer_after_s,
            clock=self.clock,
        )
        await site.open(self.store)
        site.on_term = lambda _term: self.metrics.site_elections.inc()
        for replica in site.replicas.values():
            replica.on_remote_change(lambda _sender: self._wake.set())
        self.site = site

    async def site_cycle(self) -> None:
        """The site's part of a cycle (a node with site peers): vote, coordinate or follow,
        under the engine lock; see :mod:`edgesched.edge.site`."""
        site, node = self.site, self.node
        if site is None or node is None:
            return
        to_stop: list[str] = []
        async with self._lock:
            now = self.clock()
            # cut off from central: not live now, and either heard before or up longer than
            # the lease (a site does not elect at boot before central's first heartbeat)
            autonomous = not self.link.live(self.edge.lease_s) and (
                self.link.last_heard is not None or now - self.started_at > self.edge.lease_s
            )
            with self.doc.doc.transaction():
                site.elect(self.doc, now, autonomous)
            active = {r.spec.id: r for r in await self.store.list_tasks(_ACTIVE)}
            acts = site.actions(self.doc, active)
            changed: list[TaskRecord] = []
            for task_id, peer in acts.handed:
                record = active.pop(task_id)
                changed.append(record.with_state(
                    TaskState.CANCELLED, now,
                    reason=f"moved to site peer {peer} by the site's coordinator",
                ))  # fmt: skip
                if record.state in _HELD:
                    to_stop.append(task_id)
            for task_id, why in acts.stop:
                if task_id in active:
                    record = active.pop(task_id)
                    changed.append(record.with_state(
                        TaskState.CANCELLED, now, reason=f"reconciled in the site: {why}"
                    ))  # fmt: skip
                    if record.state in _HELD:
                        to_stop.append(task_id)
            for spec, assignment, why in acts.take:
                old = await self.store.get_task(spec.id)
                if old is not None and (
                    not old.state.terminal
                    or (old.assignment is not None and old.assignment.epoch >= assignment.epoch)
                ):
                    continue
                state, reason = TaskState.ACCEPTED, why
                try:
                    self._check_feasible(spec, node)
                except SubmitError as exc:
                    state, reason = TaskState.FAILED, f"ordered by the site but cannot run: {exc}"
                record = TaskRecord(
                    spec=spec, state=state, submitted_at=now, updated_at=now,
                    decided_by=assignment.central, node_id=self.edge.node_id, reason=reason,
                    assignment=assignment,
                )  # fmt: skip
                changed.append(record)
                active[spec.id] = record
            site.taken_back.update(acts.take_back)
            if changed:
                await self._put(*changed)
            with self.doc.doc.transaction():
                site.keep_specs(self.doc, active, site.offers(active, now, autonomous))
                if site.acting is not None:
                    site.plan(self.doc, self._with_held_units(node), now,
                              self.active_models.policy(self.config.policy))  # fmt: skip
            if now - self._site_persisted >= 5.0:
                self._site_persisted = now
                await site.persist(self.store)
        if to_stop:
            await self._stop_processes(to_stop)
        if acts.take or acts.take_back:
            self._wake.set()

    async def cycle(self) -> list[Decision]:
        """One scheduling cycle over this node; decisions committed before they are acted on."""
        node = self.node
        if node is None:
            return []
        if self._policy_dirty and self._policy is not None:
            async with self._lock:
                to_stop = await self._follow_policy()
            await self._stop_processes(to_stop)
        async with self._lock:
            now = self.clock()
            records = await self.store.list_tasks((*_QUEUED, *_HELD))
            held = [r for r in records if r.state in _HELD]
            offered = frozenset() if self.site is None else self.site.offered(self.doc)
            queued = [
                r
                for r in records
                if r.state in _QUEUED
                and self._not_before.get(r.spec.id, 0) <= now
                and r.spec.id not in offered  # the site's coordinator places it
            ]
            changed = self.power.observe(bool(records))
            if queued and await self.power.wake(f"{len(queued)} task(s) to run"):
                changed = True
            if changed:
                self._report_power()
            if not queued and not held:
                return []
            running = tuple(
                Placement(r.spec.to_task(r.submitted_at), node.id, r.updated_at) for r in held
            )
            view = ClusterView(
                (self._with_held_units(node),),
                running,
                now,
                forecast_cpu=self.forecast_cpu,
                pin_cores=node.topology is not None,
                pins=dict(self._pins),
            )
            pending = [r.spec.to_task(r.submitted_at) for r in queued]
            result = schedule(view, pending, self.active_models.policy(self.config.policy))
            # One node does not park itself: power decisions are for fleets and sites.
            decisions = [d for d in result.decisions if d.kind not in _POWER]
            if not decisions:
                return []
            # (not the mode: inside the lease after a cut the mode is still connected, but
            # central cannot know of what we decide now)
            live = self.link.live(self.edge.lease_s)
            source = "edge-connected" if live else "edge-autonomous"
            by_id = {r.spec.id: r for r in records}
            # Act in the order that frees before it fills and pins a placed task before its
            # process starts (so it starts on its cores).
            ordered = sorted(decisions, key=lambda d: _ACT_ORDER[d.kind])
            # One transaction: the decisions, every row they change before anything is acted
            # on (preempted, pinned, placed) and the document's mirror of them.
            staged = self._stage(ordered, by_id, source, now)
            await self._put(*staged.values(), decisions=decisions, source=source)
            if live:
                heard = self.link.clock()
                self._connected_decisions.extend(
                    (heard, r.spec.id) for r in staged.values() if r.decided_by == source
                )
            self.metrics.decisions.labels(source).inc(len(decisions))
            by_id.update(staged)
            outcome: dict[str, TaskRecord] = {}
            for decision in ordered:
                await self._act(decision, by_id, outcome)
            if outcome:  # one more: the started processes (running) and the failed starts
                await self._put(*outcome.values())
            return decisions

    def _stage(
        self, ordered: list[Decision], by_id: dict[str, TaskRecord], source: str, now: float
    ) -> dict[str, TaskRecord]:
        """The rows the decisions change before they are acted on, one per task (its last)."""
        staged: dict[str, TaskRecord] = {}
        for d in ordered:
            task_id = d.task_id or ""
            current = staged.get(task_id) or by_id.get(task_id)
            if current is None:
                continue
            if d.kind is DecisionKind.PLACE:
                staged[task_id] = current.with_state(
                    TaskState.PLACED,
                    now,
                    # central chose the node for an assigned task; we chose when and which cores
                    decided_by=current.decided_by if current.assignment is not None else source,
                    node_id=d.node_id,
                    reason=d.reason,
                )
            elif d.kind is DecisionKind.PREEMPT:
                staged[task_id] = current.with_state(
                    TaskState.PREEMPTED, now, pid=None, pid_started_at=None, reason=d.reason
                )
            elif d.kind is DecisionKind.PIN:
                staged[task_id] = replace(current, cores=tuple(d.cores))
        return staged

    async def _act(
        self, d: Decision, by_id: dict[str, TaskRecord], outcome: dict[str, TaskRecord]
    ) -> None:
        """Act on one committed decision; the rows its outcome changes go into ``outcome``
        (committed together once every decision of the cycle is acted on)."""
        record = by_id.get(d.task_id or "")
        if record is None:
            return
        task_id = record.spec.id
        if d.kind is DecisionKind.PLACE:
            cores = self._pins.get(task_id)
            unit = await self._grant_unit(record, by_id)
            if unit is None:  # no device has the unit free now: back to the queue
                self._not_before[task_id] = self.clock() + self.edge.cycle_s
                outcome[task_id] = by_id[task_id] = record.with_state(
                    TaskState.ACCEPTED,
                    self.clock(),
                    reason="waiting for an accelerator unit (no device has it free)",
                )
                return
            try:
                handle = await self.executor.start(
                    record.spec, self._host_cores(cores), accel_env=unit
                )
            except ExecutorError as exc:
                failed = record.with_state(TaskState.FAILED, self.clock(), reason=str(exc))
                outcome[task_id] = failed
                self.metrics.start_failures.inc()
                log.error("task %s failed to start: %s", task_id, exc)
                return
            by_id[task_id] = outcome[task_id] = record.with_state(
                TaskState.RUNNING, self.clock(), pid=handle.pid, pid_started_at=handle.started_at
            )
            self.metrics.starts.inc()
        elif d.kind is DecisionKind.PREEMPT:
            self._pins.pop(task_id, None)
            await self.executor.stop(task_id, self.edge.stop_grace_s)
            self.executor.forget(task_id)
            self.metrics.preemptions.inc()
        elif d.kind is DecisionKind.PIN:
            self._pins[task_id] = frozenset(d.cores)
            if record.state is TaskState.RUNNING:
                with contextlib.suppress(ExecutorError):
                    self.executor.pin(task_id, self._host_cores(d.cores) or d.cores)

    async def _grant_unit(
        self, record: TaskRecord, by_id: dict[str, TaskRecord]
    ) -> dict[str, str] | None:
        """The environment that hands ``record``'s task its accelerator unit, planned next to
        the units the node's other placed and running tasks hold (``{}`` for a task that
        asks none, or a node without accelerators); None when none is free now."""
        spec = record.spec
        request = Request(devices=spec.accel, slices=spec.accel_slices)
        if request.empty or not self._accel_devices:
            return {}
        held = {t for t, r in by_id.items() if r.state in _HELD and t != spec.id}
        grants = {t: g for t, g in self._grants.items() if t in held}
        grant = plan(self._accel_devices, grants.values(), spec.id, request)
        if grant is None:
            return None
        grants[spec.id] = grant
        self._grants = grants
        await self.store.set_meta(
            ACCEL_GRANTS_META, json.dumps([g.to_json() for g in grants.values()])
        )
        return device_env(self._accel_devices, grant)

    def _with_held_units(self, node: Node) -> Node:
        """``node`` as this cycle's core sees it: with the units its tasks hold in its
        labels (``accel_held``), so the core packs slices around the real grants, not a
        replay of them (which a release can make differ)."""
        if not self._grants:
            return node
        return replace(node, labels={**node.labels, HELD_LABEL: held_label(self._grants.values())})

    async def _load_grants(self) -> dict[str, Grant]:
        """The units the tasks held when the engine last ran (its processes keep them)."""
        raw = await self.store.get_meta(ACCEL_GRANTS_META)
        if not raw:
            return {}
        try:
            grants = [Grant.from_json(g) for g in json.loads(raw)]
        except (ValueError, TypeError, AttributeError):
            log.warning("accelerator grants in the store unreadable; starting with none")
            return {}
        return {g.task_id: g for g in grants}

    def _host_cores(self, cores: Iterable[int] | None) -> list[int] | None:
        """The CPUs of this machine to pin a task to. A simulated node (``hal_root`` other than
        ``/``) plans on its simulated cores, which this machine may not have: each is folded
        onto one of ours (id modulo our CPU count), so its tasks still run here."""
        if not cores:
            return None
        if self.hal_root.resolve() == Path("/"):
            return sorted(cores)
        ours = sorted(os.sched_getaffinity(0))
        return sorted({ours[c % len(ours)] for c in cores})

    async def _exit_loop(self) -> None:
        async for event in self.executor.exits():
            try:
                await self._on_exit(event)
            except StoreError as exc:
                self.metrics.store_errors.labels("error").inc()
                log.error("exit of %s not recorded: %s", event.task_id, exc)

    async def _on_exit(self, event: ExitEvent) -> None:
        async with self._lock:
            record = await self.store.get_task(event.task_id)
            if record is None or record.state not in _HELD:
                self.executor.forget(event.task_id)
                return  # we stopped it on purpose (cancel, preempt) or it is unknown
            now = self.clock()
            code = event.exit_code
            spec = record.spec
            failed = code != 0
            again = spec.restart is RestartPolicy.ALWAYS or (
                spec.restart is RestartPolicy.ON_FAILURE and failed
            )
            self._pins.pop(spec.id, None)
            self.metrics.exits.labels("failure" if failed else "success").inc()
            if again and record.restarts < spec.max_restarts:
                delay = min(2.0**record.restarts, 60.0)
                self._not_before[spec.id] = now + delay
                await self._put(
                    record.with_state(
                        TaskState.ACCEPTED,
                        now,
                        pid=None,
                        pid_started_at=None,
                        exit_code=code,
                        restarts=record.restarts + 1,
                        reason=f"exit {code}: restart {record.restarts + 1} in {delay:g}s",
                    )
                )
                self.metrics.restarts.inc()
            else:
                state = TaskState.FAILED if failed else TaskState.EXITED
                why = "exited" if not failed else f"failed with exit {code}"
                if again:
                    why += f" after {record.restarts} restarts"
                await self._put(record.with_state(state, now, exit_code=code, reason=why, pid=None))
            self.executor.forget(spec.id)  # the outcome is committed: drop the exit record
        self._wake.set()

    def _publish_telemetry(self, sample: Sample, active: list[TaskRecord] | None) -> None:
        """This sample's telemetry, from this host or from what ``active``'s placed and running
        tasks reserve of the registered server (``[edge] telemetry_source``); with the latter
        and no tasks read (the store failed), nothing: a wrong figure is worse than none."""
        running = len(self.executor.running())
        if self.edge.telemetry_source != TelemetrySource.RESERVED:
            self.telemetry.offer(host_telemetry(sample, running))
        elif active is not None and self.node is not None:
            reserved = (
                Resources.shared(r.spec.cpu, r.spec.mem_gib, r.spec.accel)
                for r in active
                if r.state in _HELD
            )
            self.telemetry.offer(
                reserved_telemetry(
                    self.node,
                    reserved,
                    at=sample.at,
                    tasks_running=running,
                    parked=self.power.state.parked,
                )
            )

    async def _sample_loop(self, agent: Agent) -> None:
        last_rollup = self.clock()
        while True:
            now = self.clock()
            if now - last_rollup >= 3600:
                try:
                    await self.store.downsample(now)
                    self._expire_doc_tasks(now)
                    last_rollup = now
                except StoreError as exc:
                    self._count_store_error(exc)
                    log.error("samples not downsampled: %s", exc)
            await self._sample_step(agent, now)
            await asyncio.sleep(self.edge.sample_s)

    async def _sample_step(self, agent: Agent, now: float) -> None:
        """The sample loop's work, every ``sample_s``: one sample stored and published, the
        per-state task gauges, the demand forecast's input and one bounded batch of history
        pruning. It reads only the active tasks and the store's kept counts: its cost does not
        grow with the finished history (bench/bench_edge_history.py)."""
        sample = agent.sample(now, parked=self.power.state.parked)
        self.metrics.observe(sample)
        active: list[TaskRecord] | None = None
        with contextlib.suppress(StoreError):  # counted where the store fails for real
            active = await self.store.list_tasks(_ACTIVE)
        self._publish_telemetry(sample, active)
        try:
            await self.store.add_sample(now, sample.to_json())
        except StoreError as exc:
            self._count_store_error(exc)
            log.error("sample not stored: %s", exc)
        self.executor.rotate_logs()
        try:
            await self._prune_history(now)
        except StoreError as exc:
            self._count_store_error(exc)
            log.error("history not pruned: %s", exc)
        with contextlib.suppress(StoreError):
            counts = await self.store.task_counts()
            for state in TaskState:
                self.metrics.tasks.labels(state.value).set(counts.get(state, 0))
            if active is not None:
                try:
                    await self._observe_demand(now, active)
                except ValueError as exc:  # a forecast is advice: never let it stop the node
                    log.error("demand forecast skipped: %s", exc)

    async def _prune_history(self, now: float) -> tuple[int, int]:
        """One bounded batch: finished tasks and decisions older than ``history_retention_s``
        leave the hot tables (counted per day in the store's history tables). Tasks central
        still assigns to us stay: pruned, a finished one would be taken as new and run again."""
        me = self.edge.node_id
        keep = [] if self._desired is None else [
            task_id for task_id, entry in self.desired.assignments().items() if entry.node == me
        ]  # fmt: skip
        pruned = await self.store.prune_history(now - self.edge.history_retention_s, keep=keep)
        if any(pruned):
            log.debug("history pruned: %d task(s), %d decision(s)", *pruned)
        return pruned


def _copy_error(error: Exception | None) -> Exception | None:
    if isinstance(error, SubmitError):
        return SubmitError(error.status, error.field, error.message)
    if isinstance(error, StoreError):
        return type(error)(str(error))
    return error


def _started(part: _T | None) -> _T:
    """A part the engine creates in :meth:`EdgeEngine.run`; an error before that."""
    if part is None:
        raise RuntimeError("engine not started")
    return part


def parse_submission(body: object) -> TaskSpec:
    """Untrusted JSON to a TaskSpec; SubmitError(400) naming the field."""
    try:
        return TaskSpec.from_json(body)
    except SpecError as exc:
        field, _, message = str(exc).partition(": ")
        raise SubmitError(400, field, message or str(exc)) from None
