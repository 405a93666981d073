"""Central's site index (central/sites.py), ``GET /v1/sites`` and the dashboard's Sites panel.

The index from real node documents: each member writes its ``site`` map (vote, lease, seen)
and its task reports in its own :class:`NodeDoc`, central's replica takes them as updates
(pycrdt's own), and the index learns them as central's engine does (the changed task ids
drained from the replica, the reports as the fleet index holds them). Votes, leases and what a
member sees follow the documents; a task a site's coordinator placed (``decided_by``
``site:<coordinator>``) appears in its site's decisions and goes when the report no longer says
so; a node that registers another site takes its decisions along. The update path is O(1):
the ``site`` root is decoded again only when it changed, a change of tasks alone reads no
site entry and walks no report but the changed ones, and a frozen replica stays frozen.

Then an in-process central (its broker unreachable) fed the members' documents as frames on
their sync topics and their statuses on their status topics: ``GET /v1/sites`` as documented
(validated against the OpenAPI schema), the distributed health check (a member offline at
central that an online member sees live on the site broker is *alive in its site*), only the
changed replicas learned per sync; and the dashboard's Sites panel in headless Chromium
showing the site, its coordinator and epoch, a member cut off but alive, and a site decision.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import free_port
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from playwright.async_api import async_playwright, expect

from edgesched.central.engine import CentralEngine
from edgesched.central.openapi import central_document
from edgesched.central.sites import (
    ALIVE_IN_SITE,
    CONNECTED,
    UNCONFIRMED,
    MemberLiveness,
    SiteIndex,
)
from edgesched.config import CentralConfig, EdgeschedConfig, MqttConfig
from edgesched.core.model import Arch, ServerClass
from edgesched.core.task import TaskState
from edgesched.serve import central_engine
from edgesched.sync import wire
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.schema import (
    AssignmentRef,
    Registration,
    SiteLease,
    SiteSeen,
    SiteVote,
    TaskReport,
)
from edgesched.sync.topics import status_topic

SITE = "campus"
CHROMIUM = "/usr/bin/chromium"


def registration(site: str = SITE) -> Registration:
    return Registration(arch=Arch.X86_64, server_class=ServerClass.GENERAL, cpu=4, site=site)


def site_report(coordinator: str, at: float, *, epoch: int = 2, replacement: bool = True,
                state: TaskState = TaskState.RUNNING) -> TaskReport:  # fmt: skip
    """A node's report of a task its site's coordinator placed (as edge/engine.py writes it)."""
    return TaskReport(
        state=state,
        updated_at=at,
        accepted_at=at,
        decided_by=f"site:{coordinator}",
        assignment=AssignmentRef(f"site:{coordinator}", epoch, replacement),
    )


class Member:
    """A site member's own document and central's replica of it."""

    def __init__(self, node_id: str, site: str = SITE) -> None:
        self.id = node_id
        self.own = NodeDoc(f"node-{node_id}", client_id_for(node_id))
        self.own.set_registration(registration(site))
        self.replica = NodeDoc(f"node-{node_id}", client_id_for("central"))
        self.replica.track_changes("tasks")  # as central's replicas do
        self.sync()

    def sync(self) -> None:
        self.replica.apply_remote(self.own.diff(self.replica.state_vector()), sender=self.id)

    def learn(self, index: SiteIndex, reports: Mapping[str, TaskReport] | None = None) -> None:
        """What central's engine does for a changed replica (``_learn_node``)."""
        changed = self.replica.drain_changes("tasks")
        index.learn(
            self.id,
            self.replica,
            self.replica.registration(),
            self.replica.tasks() if reports is None else reports,
            changed,
        )

    def write(self, index: SiteIndex, **entries: SiteVote | SiteLease | SiteSeen | None) -> None:
        for key, entry in entries.items():
            self.own.set_site_entry(key, entry)
        self.sync()
        self.learn(index)


def everyone_online(node_id: str) -> MemberLiveness:
    return MemberLiveness("online", "connected", 0.0)


def test_votes_leases_and_what_members_see_follow_their_documents() -> None:
    index = SiteIndex()
    a, b, c = (Member(n) for n in ("gw-a", "gw-b", "gw-c"))
    for m in (a, b, c):
        m.learn(index)
    assert index.sites == {}  # registered, but nobody says anything of a site yet
    assert index.view(everyone_online, {}) == []
    for m, peers in ((a, ("gw-b", "gw-c")), (b, ("gw-a", "gw-c")), (c, ("gw-a", "gw-b"))):
        m.write(index, vote=SiteVote(1, "gw-a", 10.0), seen=SiteSeen(peers, "gw-a", 1, 10.0))
    a.write(index, lease=SiteLease(1, 10.0, ("gw-a", "gw-b", "gw-c")))
    assert index.sites == {SITE: {"gw-a", "gw-b", "gw-c"}}
    (site,) = index.view(everyone_online, {})
    assert site["coordinator"] == {
        "node": "gw-a", "epoch": 1, "since": 10.0, "members": ["gw-a", "gw-b", "gw-c"]
    }  # fmt: skip
    assert site["bridge"] == {"up": True, "down_since": None}
    members = {m["id"]: m for m in site["members"]}
    assert members["gw-b"]["vote"] == {"epoch": 1, "holder": "gw-a", "at": 10.0}
    assert members["gw-b"]["seen"] == {
        "peers": ["gw-a", "gw-c"], "coordinator": "gw-a", "epoch": 1, "since": 10.0
    }  # fmt: skip
    assert members["gw-b"]["lease"] is None and members["gw-a"]["lease"]["epoch"] == 1
    assert {m["health"] for m in members.values()} == {CONNECTED}

    # gw-a dies: gw-b and gw-c elect gw-b at epoch 2; gw-a's last document still holds its
    # lease at epoch 1, but the coordinator is the lease at the highest epoch
    b.write(index, vote=SiteVote(2, "gw-b", 20.0), seen=SiteSeen(("gw-c",), "", 0, 20.0))
    c.write(index, vote=SiteVote(2, "gw-b", 20.0), seen=SiteSeen(("gw-b",), "gw-b", 2, 20.0))
    b.write(index, lease=SiteLease(2, 21.0, ("gw-b", "gw-c")))
    assert index.coordinator(SITE) == ("gw-b", SiteLease(2, 21.0, ("gw-b", "gw-c")))

    def liveness(node_id: str) -> MemberLiveness:
        if node_id == "gw-b":
            return MemberLiveness("online", "connected", 5.0)
        return MemberLiveness("offline", "partitioned", 15.0)

    (site,) = index.view(liveness, {SITE: 15.0})
    members = {m["id"]: m for m in site["members"]}
    assert site["bridge"] == {"up": False, "down_since": 15.0}
    # gw-c: offline at central, but gw-b (online) sees it live on the site broker
    assert members["gw-c"]["health"] == ALIVE_IN_SITE and members["gw-c"]["seen_live_by"] == [
        "gw-b"
    ]
    # gw-a: offline, and no online member sees it
    assert members["gw-a"]["health"] == UNCONFIRMED and members["gw-a"]["seen_live_by"] == []
    assert site["cut_off_alive"] == ["gw-c"]

    # central is back: the leases go, the votes stay
    a.write(index, lease=None)
    b.write(index, lease=None)
    assert index.coordinator(SITE) is None
    assert index.view(everyone_online, {})[0]["coordinator"] is None


def test_a_peer_named_but_silent_is_listed_as_a_member() -> None:
    """A member whose document says nothing of the site (never written, not replicated yet)
    is still listed when another member names it, with central's liveness of it."""
    index = SiteIndex()
    a = Member("gw-a")
    a.write(index, seen=SiteSeen(("gw-z",), "", 0, 1.0))
    (site,) = index.view(everyone_online, {})
    ids = [(m["id"], m["known"], m["vote"]) for m in site["members"]]
    assert ids == [("gw-a", True, None), ("gw-z", False, None)]


def test_site_decisions_appear_newest_first_and_go() -> None:
    index = SiteIndex()
    a, c = Member("gw-a"), Member("gw-c")
    a.write(index, seen=SiteSeen(("gw-c",), "", 0, 1.0))
    c.own.put_task("cam.0.r1.1", site_report("gw-a", 100.0))
    c.own.put_task("job-1", site_report("gw-a", 120.0, replacement=False, epoch=1))
    c.own.put_task("local", TaskReport(state=TaskState.RUNNING, updated_at=1.0,
                                       decided_by="edge-autonomous"))  # fmt: skip
    c.sync()
    c.learn(index)
    assert index.sites == {SITE: {"gw-a", "gw-c"}}  # a decision it runs makes it a member
    total, recent = index.decisions(SITE, 10)
    assert total == 2 and [d.task_id for d in recent] == ["job-1", "cam.0.r1.1"]
    (site,) = index.view(everyone_online, {}, limit=1)
    assert site["decisions"] == {
        "total": 2,
        "recent": [
            {
                "task": "job-1",
                "node": "gw-c",
                "decided_by": "site:gw-a",
                "coordinator": "gw-a",
                "state": "running",
                "epoch": 1,
                "replacement": False,
                "at": 120.0,
            }
        ],
    }
    assert {m["id"]: m["decisions"] for m in site["members"]} == {"gw-a": 0, "gw-c": 2}
    # the task ends: still the site's decision (its state follows)
    c.own.put_task("job-1", site_report("gw-a", 120.0, epoch=1, state=TaskState.EXITED))
    c.sync()
    c.learn(index)
    assert [d.state for d in index.decisions(SITE, 10)[1]] == ["exited", "running"]
    # central adopts the failover: the node's report now names central; the other is removed
    adopted = TaskReport(state=TaskState.RUNNING, updated_at=200.0, accepted_at=100.0,
                         decided_by="central", assignment=AssignmentRef("central", 3))  # fmt: skip
    c.own.put_task("cam.0.r1.1", adopted)
    c.own.remove_task("job-1")
    c.sync()
    c.learn(index)
    assert index.decisions(SITE, 10) == (0, [])
    assert index.sites == {SITE: {"gw-a"}}


def test_a_member_that_registers_another_site_takes_its_decisions_along() -> None:
    index = SiteIndex()
    c = Member("gw-c")
    c.own.put_task("t", site_report("gw-a", 5.0))
    c.sync()
    c.learn(index)
    assert index.decisions(SITE, 5)[0] == 1
    c.own.set_registration(registration("lab"))
    c.sync()
    c.learn(index)
    assert set(index.sites) == {"lab"} and index.decisions(SITE, 5) == (0, [])
    assert index.decisions("lab", 5)[0] == 1


class NoWalk(Mapping[str, TaskReport]):
    """A node's reports that fail the test if anything walks them (a lookup by id is fine)."""

    def __init__(self, reports: Mapping[str, TaskReport]) -> None:
        self.reports = reports

    def __getitem__(self, key: str) -> TaskReport:
        return self.reports[key]

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the site index walked a node's reports")

    def __len__(self) -> int:
        raise AssertionError("the site index counted a node's reports")


def test_the_update_path_is_o1() -> None:
    """Learning a node's change decodes its site root only when that root moved, looks only
    at the changed reports, and does not thaw a frozen replica."""
    index = SiteIndex()
    members = [Member(f"gw-{i:03d}") for i in range(300)]
    for i, m in enumerate(members):
        for t in range(20):
            m.own.put_task(f"t{t}", TaskReport(state=TaskState.RUNNING, updated_at=float(t)))
        m.own.set_site_entry("seen", SiteSeen((f"gw-{(i + 1) % 300:03d}",), "", 0, 1.0))
        m.sync()
        m.learn(index)
    assert index.reads == 300  # each site root decoded once
    one = members[7]
    one.own.put_task("t3", site_report("gw-000", 50.0))  # a task change only
    one.sync()
    one.learn(index, NoWalk(one.replica.tasks()))
    assert index.reads == 300 and index.decisions(SITE, 1)[0] == 1
    one.own.set_site_entry("vote", SiteVote(4, "gw-000", 51.0))  # its site root
    one.sync()
    one.learn(index, NoWalk(one.replica.tasks()))
    assert index.reads == 301 and index.members["gw-007"].vote == SiteVote(4, "gw-000", 51.0)
    # learned again with nothing changed (a resync that brought nothing): nothing read
    for m in members:
        m.learn(index, NoWalk(m.replica.tasks()))
    assert index.reads == 301
    # a frozen replica is not thawed to be learned
    quiet = members[9].replica
    assert quiet.freeze() > 0
    members[9].learn(index, NoWalk({}))
    assert quiet.frozen and index.reads == 301
    # ... and its site entries, read while frozen, come from the kept views (no thaw)
    assert quiet.site_seen() == SiteSeen(("gw-010",), "", 0, 1.0) and quiet.frozen


# --- in-process central: GET /v1/sites, the health check, the dashboard --------------------------


def _frame(doc: NodeDoc) -> bytes:
    payload = wire.update_payload(doc.diff(), doc.state_vector())
    (only,) = wire.encode(wire.Kind.UPDATE, doc.name, doc.client_id, payload)
    return only


def publish(engine: CentralEngine, doc: NodeDoc) -> None:
    """The node's document on its own sync topic, as central's wildcard receives it."""
    node_id = doc.name.removeprefix("node-")
    engine.replicas.handle(f"edgesched/v1/doc/{doc.name}/sync/{node_id}", _frame(doc))


def status(engine: CentralEngine, node_id: str, state: str) -> None:
    payload = json.dumps({"node": node_id, "state": state}).encode()
    engine.liveness.handle(status_topic(node_id), payload)


@pytest.fixture
async def central(tmp_path: Path) -> AsyncIterator[CentralEngine]:
    cfg = EdgeschedConfig(
        central=CentralConfig(
            state_dir=str(tmp_path / "central"),
            api_port=0,
            silent_after_s=0,  # statuses only: nothing here speaks but the test
            mqtt=MqttConfig(port=free_port(), reconnect_max_s=1.0),
        )
    )
    engine = central_engine(cfg)
    task = asyncio.create_task(engine.run())
    try:
        async with asyncio.timeout(10):
            await engine.wait_ready()
        yield engine
    finally:
        engine.stop()
        async with asyncio.timeout(15):
            await task


def cut_off_site(engine: CentralEngine) -> dict[str, NodeDoc]:
    """Site ``campus`` after gw-a died during a cut: gw-b coordinates at epoch 2 and failed
    gw-a's replica over to gw-c. Now gw-b is back at central; gw-c's own link to central is
    still down, but gw-b sees it on the site broker; gw-a is dead."""
    docs = {}
    for node_id in ("gw-a", "gw-b", "gw-c"):
        doc = NodeDoc(f"node-{node_id}", client_id_for(node_id))
        doc.set_registration(registration())
        docs[node_id] = doc
    docs["gw-a"].set_site_entry("vote", SiteVote(1, "gw-a", 100.0))
    docs["gw-a"].set_site_entry("seen", SiteSeen(("gw-b", "gw-c"), "", 0, 90.0))
    docs["gw-b"].set_site_entry("vote", SiteVote(2, "gw-b", 200.0))
    docs["gw-b"].set_site_entry("lease", SiteLease(2, 201.0, ("gw-b", "gw-c")))
    docs["gw-b"].set_site_entry("seen", SiteSeen(("gw-c",), "gw-b", 2, 200.0))
    docs["gw-c"].set_site_entry("vote", SiteVote(2, "gw-b", 200.0))
    docs["gw-c"].set_site_entry("seen", SiteSeen(("gw-b",), "gw-b", 2, 200.0))
    docs["gw-c"].put_task("cam.0.r1.1", site_report("gw-b", 260.0))
    for doc in docs.values():
        publish(engine, doc)
    status(engine, "gw-b", "online")
    status(engine, "gw-a", "offline")
    status(engine, "gw-c", "offline")
    return docs


async def get(engine: CentralEngine, path: str) -> tuple[int, Any]:
    token = (engine.state_dir / "api-token-read").read_text().strip()
    url = f"http://127.0.0.1:{engine.api_port}{path}"
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def validate_as_documented(body: Any, schema: str) -> None:
    doc = central_document()
    Draft202012Validator({**doc, "$ref": f"#/components/schemas/{schema}"}).validate(body)


async def test_get_sites_as_documented_with_the_health_check(central: CentralEngine) -> None:
    engine = central
    status_code, body = await get(engine, "/v1/sites")
    assert status_code == 200 and body["sites"] == []
    validate_as_documented(body, "SiteList")
    cut_off_site(engine)
    status_code, body = await get(engine, "/v1/sites")
    assert status_code == 200, body
    validate_as_documented(body, "SiteList")
    (site,) = body["sites"]
    assert site["site"] == SITE
    assert site["coordinator"] == {
        "node": "gw-b", "epoch": 2, "since": 201.0, "members": ["gw-b", "gw-c"]
    }  # fmt: skip
    members = {m["id"]: m for m in site["members"]}
    assert {n: (m["status"], m["health"]) for n, m in members.items()} == {
        "gw-a": ("offline", UNCONFIRMED),
        "gw-b": ("online", CONNECTED),
        "gw-c": ("offline", ALIVE_IN_SITE),
    }
    assert members["gw-c"]["seen_live_by"] == ["gw-b"] and site["cut_off_alive"] == ["gw-c"]
    assert members["gw-c"]["state"] == "suspect"  # central's own view, unchanged by this
    assert site["decisions"]["total"] == 1
    (decision,) = site["decisions"]["recent"]
    assert decision["task"] == "cam.0.r1.1" and decision["node"] == "gw-c"
    assert decision["decided_by"] == "site:gw-b" and decision["epoch"] == 2
    status_code, body = await get(engine, "/v1/sites?decisions=0")
    assert body["sites"][0]["decisions"] == {"total": 1, "recent": []}
    for bad in ("x", "-1", "1001"):
        status_code, body = await get(engine, f"/v1/sites?decisions={bad}")
        assert status_code == 400 and body["field"] == "decisions", body


async def test_central_learns_only_the_changed_replicas(
    central: CentralEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = central
    docs = cut_off_site(engine)
    engine.sync_index()
    learned: list[str] = []
    learn = engine.sites.learn

    def counted(node_id: str, *args: Any) -> None:
        learned.append(node_id)
        learn(node_id, *args)

    monkeypatch.setattr(engine.sites, "learn", counted)
    reads = engine.sites.reads
    docs["gw-c"].set_site_entry("seen", SiteSeen(("gw-a", "gw-b"), "gw-b", 2, 300.0))
    publish(engine, docs["gw-c"])
    engine.sync_index()
    assert learned == ["gw-c"] and engine.sites.reads == reads + 1
    assert engine.sites.members["gw-c"].seen == SiteSeen(("gw-a", "gw-b"), "gw-b", 2, 300.0)


@pytest.mark.timeout(90)
async def test_the_sites_panel_in_chromium(central: CentralEngine) -> None:
    if not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(f"{CHROMIUM} is missing: run `make setup` (the test never downloads one)")
    engine = central
    docs = cut_off_site(engine)
    token = (engine.state_dir / "api-token-read").read_text().strip()
    url = f"http://127.0.0.1:{engine.api_port}/dashboard/#token={token}"
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                            "--disable-dev-shm-usage"]
        )  # fmt: skip
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(15_000)
            await page.goto(url)
            card = page.locator(f'#sites article.site[data-site="{SITE}"]')
            await expect(card).to_be_visible()
            await expect(card.locator(".site-coordinator")).to_contain_text("gw-b")
            await expect(card.locator(".site-coordinator")).to_contain_text("epoch 2")
            gw_c = card.locator('tr.site-member[data-member="gw-c"]')
            await expect(gw_c).to_have_attribute("data-health", ALIVE_IN_SITE)
            await expect(gw_c).to_contain_text("alive in its site (seen by gw-b)")
            await expect(gw_c.locator(".badge")).to_have_text("suspect")
            await expect(card.locator('tr.site-member[data-member="gw-b"]')).to_contain_text(
                "coordinator"
            )
            decision = card.locator('li.site-decision[data-task="cam.0.r1.1"]')
            await expect(decision).to_contain_text("failed over to gw-c by gw-b @ epoch 2")
            await expect(card.locator(".site-decisions-h")).to_have_text(
                "1 decision made while cut off"
            )
            # central is back for the whole site: the lease goes, the decision stays listed
            docs["gw-b"].set_site_entry("lease", None)
            publish(engine, docs["gw-b"])
            await expect(card.locator(".site-coordinator")).to_contain_text("none")
            await expect(decision).to_be_visible()
        finally:
            await browser.close()
