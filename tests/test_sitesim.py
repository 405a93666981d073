"""Site autonomy against node-only autonomy (core/sitesim.py): hand-built cuts and crashes with
their figures computed by hand, determinism, and properties over random small fleets."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesched.core.campus import arm48_node
from edgesched.core.model import Node
from edgesched.core.sitesim import (
    MODES,
    Crash,
    Cut,
    Run,
    SiteReport,
    SiteScenario,
    SiteService,
    Submission,
    campus_site_scenario,
    compare,
    simulate_sites,
    split_sites,
)


def node(node_id: str, site: str) -> Node:
    """A 48-core, 192 GiB node of ``site``."""
    return replace(arm48_node(node_id), site=site)


def runs_of(report: SiteReport, key: str) -> list[Run]:
    return sorted((r for r in report.runs if r.key == key), key=lambda r: (r.start, r.end))


# --- the campus scenario -----------------------------------------------------------------------


def test_the_campus_is_split_in_three_sites_of_mixed_nodes() -> None:
    sc = campus_site_scenario(seed=0, days=1.0, scale=1.0)
    assert sc.sites == ("site-0", "site-1", "site-2")
    sizes = [sum(1 for n in sc.nodes if n.site == s) for s in sc.sites]
    assert sizes == [17, 17, 16]
    for site in sc.sites:
        pools = {n.labels["pool"] for n in sc.nodes if n.site == site}
        assert len(pools) >= 4  # round-robin over sorted ids mixes the server types
    # every site is cut twice a day for an hour, never overlapping itself
    for site in sc.sites:
        cuts = sorted((c for c in sc.cuts if c.site == site), key=lambda c: c.start)
        assert len(cuts) == 2
        assert all(c.end - c.start == pytest.approx(3600.0) for c in cuts)
        assert cuts[0].end <= cuts[1].start
    # crashes happen inside a cut of the crashed node's site
    site_of = {n.id: n.site for n in sc.nodes}
    for crash in sc.crashes:
        assert any(c.site == site_of[crash.node] and c.start <= crash.at < c.end for c in sc.cuts)


def test_a_seed_gives_the_same_run_and_another_seed_another() -> None:
    a = campus_site_scenario(seed=4, days=0.5, scale=0.2, crash_p=1.0)
    assert a == campus_site_scenario(seed=4, days=0.5, scale=0.2, crash_p=1.0)
    assert a != campus_site_scenario(seed=5, days=0.5, scale=0.2, crash_p=1.0)
    for mode in MODES:
        first, second = simulate_sites(a, mode), simulate_sites(a, mode)
        assert first == second
        assert first.runs == second.runs and first.waits == second.waits


def test_without_faults_both_modes_give_the_same_result() -> None:
    sc = campus_site_scenario(seed=1, days=0.5, scale=0.2).without_faults()
    reports = compare(sc)
    node_only, site = reports["node-only"], reports["site"]
    assert node_only.cut == site.cut
    assert node_only.outside == site.outside
    assert node_only.runs == site.runs and node_only.waits == site.waits
    assert node_only.cut.submissions == 0  # nothing arrives while cut: there is no cut
    assert node_only.outside.submissions == len(sc.submissions)
    assert node_only.outside.replica_down_s == 0.0


# --- a member dies in a cut site ---------------------------------------------------------------


def crash_scenario() -> SiteScenario:
    # a and b in site A, c in site B; three 8-core replicas, spread one a node by central at 0.
    # A is cut over [1000, 4600); a crashes at 2000 and is back at 8000.
    return SiteScenario(
        nodes=(node("a", "A"), node("b", "A"), node("c", "B")),
        services=(SiteService("svc", 3, 8.0),),
        submissions=(),
        cuts=(Cut("A", 1000.0, 4600.0),),
        crashes=(Crash("a", 2000.0, 8000.0),),
        horizon_s=10_000.0,
        failover_s=10.0,
    )


def test_site_mode_restarts_a_dead_members_replicas_on_a_live_member() -> None:
    sc = crash_scenario()
    first = {r.key: r.node for r in simulate_sites(sc, "site").runs if r.start == 0.0}
    assert sorted(first.values()) == ["a", "b", "c"]  # spread at t = 0
    (lost,) = [k for k, n in first.items() if n == "a"]

    site = simulate_sites(sc, "site")
    before, after = runs_of(site, lost)
    assert (before.node, before.end, before.how) == ("a", 2000.0, "killed")
    # the coordinator sees the crash failover_s later and places it on b, its live member
    assert (after.node, after.start, after.how) == ("b", 2010.0, "horizon")
    assert site.cut.replica_down_s == pytest.approx(10.0)
    assert site.outside.replica_down_s == 0.0

    node_only = simulate_sites(sc, "node-only")
    before, after = runs_of(node_only, lost)
    assert (before.node, before.end) == ("a", 2000.0)
    # nobody owns a's work until the WAN returns; central fails it over failover_s later
    assert after.start == pytest.approx(4610.0) and after.node in {"b", "c"}
    assert node_only.cut.replica_down_s == pytest.approx(4600.0 - 2000.0)
    assert node_only.outside.replica_down_s == pytest.approx(10.0)
    assert site.cut.replica_down_s < node_only.cut.replica_down_s


def test_a_node_back_within_the_cut_restarts_its_own_replicas_in_node_only_mode() -> None:
    sc = replace(crash_scenario(), crashes=(Crash("a", 2000.0, 3000.0),))
    lost = next(r.key for r in simulate_sites(sc, "node-only").runs if r.node == "a")
    node_only = simulate_sites(sc, "node-only")
    _, after = runs_of(node_only, lost)
    assert (after.node, after.start) == ("a", 3000.0)
    assert node_only.cut.replica_down_s == pytest.approx(1000.0)
    # site mode had moved it to b: a, back, does not start it a second time
    site = simulate_sites(sc, "site")
    assert [(r.node, r.start) for r in runs_of(site, lost)] == [("a", 0.0), ("b", 2010.0)]


# --- a burst to a full node ---------------------------------------------------------------------


def burst_scenario() -> SiteScenario:
    # a and b in site A, cut over [0, 3600). A 40-core replica fills most of one of them; three
    # 4-core tasks are submitted to that node at 100 s: two fit beside the replica, one does not.
    return SiteScenario(
        nodes=(node("a", "A"), node("b", "A")),
        services=(SiteService("big", 1, 40.0),),
        submissions=(),
        cuts=(Cut("A", 0.0, 3600.0),),
        horizon_s=7200.0,
        slo_wait_s=60.0,
    )


def test_a_burst_to_a_full_node_goes_to_a_peer_in_site_mode_and_waits_in_node_only() -> None:
    base = burst_scenario()
    (replica,) = simulate_sites(base, "site").runs
    full = replica.node
    peer = "b" if full == "a" else "a"
    sc = replace(
        base,
        submissions=tuple(Submission(f"t{k}", full, 100.0, 4.0, 1000.0) for k in range(3)),
    )

    site = simulate_sites(sc, "site")
    assert site.cut.submissions == 3 and site.cut.slo_misses == 0
    assert all(site.waits[f"t{k}"] == 0.0 for k in range(3))
    placed = {r.key: r.node for r in site.runs if r.kind == "task"}
    assert peer in placed.values()

    node_only = simulate_sites(sc, "node-only")
    waits = sorted(w for w in node_only.waits.values() if w is not None)
    # two start at once on the full node; the third waits there until they end at 1100
    assert waits[:2] == [0.0, 0.0]
    assert waits[2] == pytest.approx(1000.0)
    assert node_only.cut.slo_misses == 1
    first_two = [r for r in node_only.runs if r.kind == "task" and r.start == 100.0]
    assert {r.node for r in first_two} == {full}


def test_a_submission_to_a_dead_node_waits_for_it_in_node_only_mode() -> None:
    sc = SiteScenario(
        nodes=(node("a", "A"), node("b", "A")),
        services=(),
        submissions=(Submission("t", "a", 500.0, 4.0, 100.0),),
        cuts=(Cut("A", 0.0, 3600.0),),
        crashes=(Crash("a", 200.0, 1500.0),),
        horizon_s=7200.0,
    )
    assert simulate_sites(sc, "site").waits["t"] == 0.0  # the coordinator places it on b
    node_only = simulate_sites(sc, "node-only")
    assert node_only.waits["t"] == pytest.approx(1000.0)  # a is back at 1500 and runs it
    assert [r.node for r in node_only.runs] == ["a"]


def test_work_lost_in_a_crash() -> None:
    # one 8-core task runs 600 s on a before a crashes in the cut: 4,800 CPU-seconds lost;
    # site mode reruns it on b after failover_s, node-only when the WAN returns.
    sc = SiteScenario(
        nodes=(node("a", "A"), node("b", "A")),
        services=(),
        submissions=(Submission("t", "a", 100.0, 8.0, 5000.0),),
        cuts=(Cut("A", 0.0, 3600.0),),
        crashes=(Crash("a", 700.0, 9000.0),),
        horizon_s=10_000.0,
        failover_s=10.0,
    )
    site, node_only = simulate_sites(sc, "site"), simulate_sites(sc, "node-only")
    for report in (site, node_only):
        assert report.cut.killed == 1
        assert report.cut.killed_cpu_s == pytest.approx(8.0 * 600.0)
        assert report.outside.killed == 0
    assert site.cut.rerun_wait_s == pytest.approx(10.0)
    assert node_only.cut.rerun_wait_s == pytest.approx(3610.0 - 700.0)
    assert [r.node for r in runs_of(site, "t")] == ["a", "b"]


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        simulate_sites(crash_scenario(), "anarchy")
    with pytest.raises(ValueError, match="overlap"):
        replace(crash_scenario(), crashes=(Crash("a", 0, 10), Crash("a", 5, 20)))
    with pytest.raises(ValueError, match="unknown node"):
        replace(crash_scenario(), submissions=(Submission("t", "zz", 0, 1, 1),))
    with pytest.raises(ValueError):
        split_sites((), 0)


# --- properties --------------------------------------------------------------------------------


@st.composite
def small_scenarios(draw: st.DrawFn, max_crashes: int = 2) -> SiteScenario:
    """2-5 nodes in 1-2 sites; 0-2 services; up to 12 submissions; one cut of a site with up to
    ``max_crashes`` crashes inside it (and the other site maybe cut too, without crashes)."""
    horizon = 6000.0
    n_nodes = draw(st.integers(2, 5))
    n_sites = draw(st.integers(1, 2))
    nodes = split_sites([node(f"n{i}", "x") for i in range(n_nodes)], n_sites)
    sites = sorted({n.site for n in nodes})
    services = tuple(
        SiteService(f"s{k}", draw(st.integers(1, 3)), draw(st.sampled_from([4.0, 8.0, 16.0])))
        for k in range(draw(st.integers(0, 2)))
    )
    times = st.floats(0.0, horizon - 1.0, allow_nan=False).map(lambda t: round(t, 1))
    subs = tuple(
        Submission(
            f"t{k}",
            draw(st.sampled_from([n.id for n in nodes])),
            draw(times),
            draw(st.sampled_from([2.0, 8.0, 24.0])),
            draw(st.floats(10.0, 3000.0).map(lambda d: round(d, 1))),
        )
        for k in range(draw(st.integers(0, 12)))
    )
    site = draw(st.sampled_from(sites))
    start = draw(st.floats(0.0, 3000.0).map(lambda t: round(t, 1)))
    cut = Cut(site, start, start + 2000.0)
    cuts = [cut]
    if len(sites) > 1 and draw(st.booleans()):
        other = next(s for s in sites if s != site)
        at = draw(st.floats(0.0, 4000.0).map(lambda t: round(t, 1)))
        cuts.append(Cut(other, at, at + 1500.0))
    members = [n.id for n in nodes if n.site == site]
    crashed = draw(st.lists(st.sampled_from(members), unique=True, max_size=max_crashes))
    crashes = tuple(
        Crash(
            name,
            at := draw(st.floats(cut.start, cut.end - 1.0).map(lambda t: round(t, 1))),
            at + draw(st.floats(1.0, 4000.0).map(lambda d: round(d, 1))),
        )
        for name in crashed
    )
    return SiteScenario(
        tuple(nodes),
        services,
        subs,
        tuple(cuts),
        crashes,
        horizon,
        slo_wait_s=60.0,
        failover_s=draw(st.sampled_from([0.0, 10.0, 120.0])),
    )


def check_runs(sc: SiteScenario, report: SiteReport) -> None:
    """No key runs twice at once, nothing runs on a dead node, no node over its cores."""
    by_key: dict[str, list[Run]] = defaultdict(list)
    for r in report.runs:
        assert r.start <= r.end
        by_key[r.key].append(r)
    for runs in by_key.values():
        runs.sort(key=lambda r: (r.start, r.end))
        for a, b in itertools.pairwise(runs):
            assert a.end <= b.start, f"{a.key} runs twice at once"
        assert all(r.how == "killed" for r in runs[:-1])
    for crash in sc.crashes:
        for r in report.runs:
            if r.node == crash.node:
                # a run on the crashed node ends at the crash or starts after it is back
                assert r.end <= crash.at or r.start >= crash.back
    capacity = {n.id: n.capacity.cpu for n in sc.nodes}
    cpu = {s.id: s.cpu for s in sc.submissions}
    for svc in sc.services:
        cpu.update(dict.fromkeys(svc.slots(), svc.cpu))
    edges: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in report.runs:
        if r.end > r.start:
            edges[r.node] += [(r.start, cpu[r.key]), (r.end, -cpu[r.key])]
    for node_id, deltas in edges.items():
        used = 0.0
        for _, delta in sorted(deltas, key=lambda e: (e[0], e[1])):  # ends before starts
            used += delta
            assert used <= capacity[node_id] + 1e-9


PROPERTY = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@PROPERTY
@given(small_scenarios())
def test_both_modes_stay_sound(sc: SiteScenario) -> None:
    """No replica or task runs twice at once, nothing runs on a dead node or over a node's
    cores, every submission is counted once; node-only runs a submission made while cut on
    the node it was made at (when it starts before the WAN returns)."""
    reports = compare(sc)
    for report in reports.values():
        check_runs(sc, report)
        total = report.cut.submissions + report.outside.submissions
        assert total == len(sc.submissions)
    node_only = reports["node-only"]
    cut_of = {c.site: c for c in sc.cuts}
    site_of = {n.id: n.site for n in sc.nodes}
    for sub in sc.submissions:
        cut = cut_of.get(site_of[sub.node])
        if cut is None or not cut.start <= sub.at < cut.end:
            continue
        first = runs_of(node_only, sub.id)
        if first and first[0].start < cut.end:
            assert first[0].node == sub.node


@PROPERTY
@given(small_scenarios(max_crashes=1))
def test_with_one_crash_a_cut_site_mode_never_has_more_replica_downtime(
    sc: SiteScenario,
) -> None:
    """One crash in a cut: the same slots go down in both modes; node-only brings them back
    when the node does or after the cut, site mode at the latest then (the node comes back
    empty, and replicas go before tasks)."""
    reports = compare(sc)
    site, node_only = reports["site"], reports["node-only"]
    assert site.cut.replica_down_s <= node_only.cut.replica_down_s + 1e-6


def test_with_two_crashes_in_a_cut_site_mode_can_do_worse_on_replicas() -> None:
    """Not a theorem for two crashes (hypothesis found this): site mode moves n1's replica
    s1/0 to n0 when n1 crashes at 0; n0 crashes at 12 and takes it down again, and n1 (back at
    1) is full of the site's tasks by then, so n0's three replicas wait until n0 is back at 14.
    Node-only left s1/0 on n1, back at 1: 6 replica-seconds against 7."""
    subs = tuple(Submission(f"t{k}", "n0", 0.0, 2.0, 10.0) for k in range(8))
    sc = SiteScenario(
        nodes=(node("n0", "A"), node("n1", "A")),
        services=(SiteService("s0", 1, 16.0), SiteService("s1", 3, 16.0)),
        submissions=(*subs, Submission("t8", "n0", 0.0, 24.0, 10.0)),
        cuts=(Cut("A", 0.0, 2000.0),),
        crashes=(Crash("n1", 0.0, 1.0), Crash("n0", 12.0, 14.0)),
        horizon_s=6000.0,
        failover_s=0.0,
    )
    reports = compare(sc)
    assert reports["node-only"].cut.replica_down_s == pytest.approx(6.0)
    assert reports["site"].cut.replica_down_s == pytest.approx(7.0)
    assert [(r.node, r.start, r.end) for r in runs_of(reports["site"], "s1/0")] == [
        ("n1", 0.0, 0.0),
        ("n0", 0.0, 12.0),
        ("n0", 14.0, 6000.0),
    ]
    for report in reports.values():
        check_runs(sc, report)
