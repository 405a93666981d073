"""The site coordination rule (edgesched.core.site): election, fencing, the coordinator's plan."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.model import Arch, Node, PowerModel, Resources, ServerClass, Task
from edgesched.core.policy import PolicyConfig
from edgesched.core.site import (
    Copy,
    MemberState,
    Offer,
    SiteOrder,
    Term,
    acting_term,
    failover_candidates,
    followed_term,
    majority,
    next_vote,
    plan_site,
)

SITE = ("gw-a", "gw-b", "gw-c")


def _elect(live_views: dict[str, set[str]], rounds: int = 6) -> dict[str, MemberState]:
    """Run the rule with every member seeing every other's document at once."""
    states = {m: MemberState() for m in SITE}
    for _ in range(rounds):
        for m in SITE:
            if m not in live_views:
                continue
            vote = next_vote(m, SITE, live_views[m], states)
            if vote is not None:
                states[m] = MemberState(vote, states[m].acting)
        for m in SITE:
            if m in live_views:
                term = acting_term(m, SITE, live_views[m], states)
                states[m] = MemberState(states[m].vote, None if term is None else term.epoch)
    return states


def test_majority() -> None:
    assert [majority(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_all_live_elect_the_smallest_id_and_follow_it() -> None:
    everyone = set(SITE)
    states = _elect({m: everyone for m in SITE})
    assert {states[m].vote for m in SITE} == {Term(1, "gw-a")}
    assert states["gw-a"].acting == 1
    assert states["gw-b"].acting is None and states["gw-c"].acting is None
    for m in SITE:
        assert followed_term(m, everyone, states) == Term(1, "gw-a")


def test_a_dead_coordinator_is_replaced_at_a_higher_epoch() -> None:
    everyone = set(SITE)
    states = _elect({m: everyone for m in SITE})
    rest = {"gw-b", "gw-c"}
    for _ in range(4):
        for m in sorted(rest):
            vote = next_vote(m, SITE, rest, states)
            if vote is not None:
                states[m] = MemberState(vote, states[m].acting)
    assert states["gw-b"].vote == Term(2, "gw-b") == states["gw-c"].vote
    assert acting_term("gw-b", SITE, rest, states) == Term(2, "gw-b")
    # the old coordinator's document still says it acts at 1: nobody follows it now
    assert followed_term("gw-c", rest, states) is None  # gw-b has not written its lease yet
    states["gw-b"] = MemberState(states["gw-b"].vote, 2)
    assert followed_term("gw-c", rest, states) == Term(2, "gw-b")


def test_a_minority_elects_nobody_and_a_former_coordinator_stops() -> None:
    everyone = set(SITE)
    states = _elect({m: everyone for m in SITE})
    # gw-a loses the site broker: it sees nobody; the others see each other
    assert next_vote("gw-a", SITE, set(), states) is None
    assert acting_term("gw-a", SITE, set(), states) is None
    assert next_vote("gw-b", SITE, {"gw-c"}, states) == Term(2, "gw-b")


def test_two_member_site_has_no_coordinator_with_one_dead() -> None:
    pair = ("x", "y")
    states = {"x": MemberState(Term(1, "x"), 1), "y": MemberState(Term(1, "x"))}
    assert acting_term("x", pair, {"y"}, states) == Term(1, "x")
    assert acting_term("x", pair, set(), states) is None
    assert next_vote("y", pair, set(), states) is None


def test_a_higher_epoch_fences_the_older_term() -> None:
    states = {
        "gw-a": MemberState(Term(3, "gw-a"), 3),
        "gw-b": MemberState(Term(4, "gw-b")),
        "gw-c": MemberState(Term(3, "gw-a")),
    }
    # gw-a still counts a majority at 3 but sees gw-b's vote at 4: it no longer acts
    assert acting_term("gw-a", SITE, set(SITE), states) is None


def test_joins_the_candidates_election_rather_than_starting_another() -> None:
    states = {"gw-a": MemberState(Term(7, "gw-a")), "gw-b": MemberState(Term(5, "gw-c"))}
    assert next_vote("gw-b", SITE, set(SITE), states) == Term(7, "gw-a")
    # and the candidate adopts a higher epoch a voter started for it
    states = {"gw-a": MemberState(Term(2, "gw-a")), "gw-b": MemberState(Term(4, "gw-a"))}
    assert next_vote("gw-a", SITE, set(SITE), states) == Term(4, "gw-a")


# ---- property: at most one coordinator acts per epoch, whatever each member sees


@st.composite
def _histories(draw: st.DrawFn) -> list[tuple[str, frozenset[str], dict[str, int]]]:
    """Steps of (member, its live view, how far into each other member's vote history its
    view of that member's document is: stale views included)."""
    members = list(SITE) + ["gw-d", "gw-e"][: draw(st.integers(0, 2))]
    steps = []
    for _ in range(draw(st.integers(1, 40))):
        me = draw(st.sampled_from(members))
        live = frozenset(draw(st.sets(st.sampled_from(members))))
        lag = {m: draw(st.integers(0, 3)) for m in members}
        steps.append((me, live, lag))
    return steps


@settings(max_examples=300, deadline=None)
@given(_histories())
def test_never_two_coordinators_at_one_epoch(
    steps: list[tuple[str, frozenset[str], dict[str, int]]],
) -> None:
    members = sorted({m for _, _, lag in steps for m in lag})
    history: dict[str, list[Term]] = {m: [] for m in members}  # each member's votes, in order
    acting: dict[int, set[str]] = {}
    for me, live, lag in steps:

        def view(m: str, lag: dict[str, int] = lag, me: str = me) -> MemberState:
            votes = history[m]
            if m != me:  # another member's document, as this one last heard it
                votes = votes[: max(0, len(votes) - lag[m])]
            return MemberState(votes[-1] if votes else None)

        states = {m: view(m) for m in members}
        vote = next_vote(me, members, live, states)
        if vote is not None:
            own = history[me]
            assert not own or vote.epoch >= own[-1].epoch
            if own and vote.epoch == own[-1].epoch:
                assert vote == own[-1], "two votes at one epoch"
            own.append(vote)
            states[me] = MemberState(vote)
        term = acting_term(me, members, live, states)
        if term is not None:
            acting.setdefault(term.epoch, set()).add(term.holder)
    for epoch, holders in acting.items():
        assert len(holders) == 1, f"epoch {epoch}: {holders} all acted"


# ---- the coordinator's plan


def _node(node_id: str, cpu: float = 8.0) -> Node:
    return Node(
        id=node_id,
        arch=Arch.X86_64,
        server_class=ServerClass.GENERAL,
        capacity=Resources(cpu=cpu, mem_gib=16.0),
        power=PowerModel(idle_w=100, peak_w=300),
    )


def _task(task_id: str, cpu: float = 2.0) -> Task:
    return Task(id=task_id, workload="default", priority=0, demand=Resources(cpu, 1.0))


def test_plan_restarts_a_dead_members_replicas_after_the_failover_time() -> None:
    copies = {
        "web.0.aa.0": [Copy(_task("web.0.aa.0"), "gw-a", True, 1, True)],
        "batch": [Copy(_task("batch"), "gw-a", True, 0, False)],  # not movable: stays
        "web.1.aa.0": [Copy(_task("web.1.aa.0"), "gw-b", True, 1, True)],
    }
    term = Term(2, "gw-b")
    nodes = [_node("gw-b"), _node("gw-c")]
    early = plan_site(term, nodes, copies, [], {}, dead_since={"gw-a": 100.0}, now=105.0,
                      failover_after_s=10.0, policy=PolicyConfig())  # fmt: skip
    assert early.orders == ()
    plan = plan_site(term, nodes, copies, [], {}, dead_since={"gw-a": 100.0}, now=111.0,
                     failover_after_s=10.0, policy=PolicyConfig())  # fmt: skip
    assert [(o.task_id, o.origin, o.epoch, o.replacement, o.term) for o in plan.orders] == [
        ("web.0.aa.0", "gw-a", 2, True, 2)
    ]
    assert plan.orders[0].node in {"gw-b", "gw-c"}
    # ordered once: the standing order holds it until its target reports it
    standing = {o.task_id: o for o in plan.orders}
    again = plan_site(term, nodes, copies, [], standing, dead_since={"gw-a": 100.0}, now=112.0,
                      failover_after_s=10.0, policy=PolicyConfig())  # fmt: skip
    assert again.orders == ()


def test_plan_places_an_offer_on_a_member_with_room() -> None:
    full = [Copy(_task(f"t{i}", 2.0), "gw-a", True, 0, False) for i in range(4)]
    copies = {c.task.id: [c] for c in full}
    offer = Offer(_task("burst", 2.0), "gw-a")
    nodes = [_node("gw-a"), _node("gw-b")]
    plan = plan_site(Term(1, "gw-a"), nodes, copies, [offer], {}, dead_since={}, now=1.0,
                     failover_after_s=10.0, policy=PolicyConfig())  # fmt: skip
    assert [(o.task_id, o.node, o.origin, o.epoch, o.replacement) for o in plan.orders] == [
        ("burst", "gw-b", "gw-a", 1, False)
    ]


def test_in_flight_orders_hold_their_targets_room() -> None:
    offers = [Offer(_task(f"o{i}", 6.0), "gw-a") for i in range(2)]
    standing = {
        "o0": SiteOrder("o0", "gw-b", "gw-a", 1, 1, False, 0.0, 0.0, "earlier"),
    }
    nodes = [_node("gw-a", 1.0), _node("gw-b")]
    plan = plan_site(Term(1, "gw-a"), nodes, {}, offers, standing, dead_since={}, now=1.0,
                     failover_after_s=10.0, policy=PolicyConfig())  # fmt: skip
    assert plan.orders == ()  # gw-b's room is held by o0, not reported yet
    assert set(plan.waiting) == {"o1"}


def test_failover_candidates_skip_tasks_running_on_a_live_member() -> None:
    task = _task("web.0.aa.0")
    copies = {task.id: [Copy(task, "gw-a", True, 1, True), Copy(task, "gw-b", True, 2, True)]}
    assert failover_candidates(copies, {"gw-b"}, {"gw-a": 0.0}, 100.0, 10.0) == []
    assert failover_candidates(copies, {"gw-c"}, {"gw-a": 0.0, "gw-b": 0.0}, 100.0, 10.0) == [
        copies[task.id][0]
    ]


def test_a_vote_at_the_last_epoch_stalls_the_election_without_breaking_it() -> None:
    """A stolen member votes the last epoch the documents allow: the others vote for nobody
    (they schedule node by node, as without site autonomy) and nothing raises."""
    from edgesched.core.site import MAX_EPOCH

    states = {"gw-c": MemberState(Term(MAX_EPOCH, "gw-c"))}
    assert next_vote("gw-a", SITE, set(SITE), states) is None
    assert acting_term("gw-a", SITE, set(SITE), states) is None
