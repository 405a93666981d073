"""The pure reconcile rule: one winner, the same for any input order, per policy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgesched.sync.reconcile import (
    DEFAULT_POLICY,
    Claim,
    ReconcilePolicy,
    losers,
    resolve,
    winner,
)

ORIGINAL = Claim("t1", "edge-a", 3, "edge-a", started_at=100.0, score=0.4, replacement=False)
REPLACEMENT = Claim("t1", "edge-b", 4, "central", started_at=160.0, score=0.9, replacement=True)

CLAIMS = st.builds(
    Claim,
    task_id=st.just("t1"),
    node_id=st.sampled_from(["edge-a", "edge-b", "edge-c"]),
    epoch=st.integers(0, 3),
    decided_by=st.sampled_from(["central", "central:2", "edge-a", "edge-b"]),
    started_at=st.sampled_from([0.0, 10.0, 20.0]),
    score=st.sampled_from([0.1, 0.5]),
    replacement=st.booleans(),
    running=st.booleans(),
)


@given(
    claims=st.lists(CLAIMS, min_size=1, max_size=6),
    policy=st.sampled_from(ReconcilePolicy),
    seed=st.randoms(),
)
def test_winner_is_independent_of_input_order(
    claims: list[Claim], policy: ReconcilePolicy, seed: object
) -> None:
    import random

    assert isinstance(seed, random.Random)
    shuffled = list(claims)
    seed.shuffle(shuffled)
    best = winner(claims, policy)
    assert winner(shuffled, policy) == best
    assert best in claims
    lost = losers(shuffled, policy)
    assert lost == losers(claims, policy)
    # Exactly one copy survives: every node but the winner's stops its copy.
    assert best.node_id not in {c.node_id for c in lost}
    assert {c.node_id for c in lost} | {best.node_id} == {c.node_id for c in claims}


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (ReconcilePolicy.KEEP_ORIGINAL, ORIGINAL),
        (ReconcilePolicy.KEEP_REPLACEMENT, REPLACEMENT),
        (ReconcilePolicy.BEST_SCORE, REPLACEMENT),
        (ReconcilePolicy.LONGEST_RUNNING, ORIGINAL),
    ],
)
def test_each_policy_on_a_failover(policy: ReconcilePolicy, expected: Claim) -> None:
    assert winner([ORIGINAL, REPLACEMENT], policy) == expected
    assert winner([REPLACEMENT, ORIGINAL], policy) == expected
    (loser,) = losers([ORIGINAL, REPLACEMENT], policy)
    assert loser != expected


@pytest.mark.parametrize("policy", list(ReconcilePolicy))
def test_a_copy_that_runs_wins_over_one_that_does_not_whatever_the_policy(
    policy: ReconcilePolicy,
) -> None:
    """The original preempted on its cut-off node by local work, the replacement running:
    keep-original kept the preempted copy and stopped the running one, and the service ran
    nowhere (issue 14). A copy that runs always wins over one that does not."""
    from dataclasses import replace

    preempted_original = replace(ORIGINAL, running=False)
    assert winner([preempted_original, REPLACEMENT], policy) == REPLACEMENT
    assert losers([REPLACEMENT, preempted_original], policy) == [preempted_original]


@given(claims=st.lists(CLAIMS, min_size=1, max_size=6), policy=st.sampled_from(ReconcilePolicy))
def test_the_winner_runs_if_any_copy_does(claims: list[Claim], policy: ReconcilePolicy) -> None:
    assert winner(claims, policy).running == any(c.running for c in claims)


def test_default_policy_keeps_the_original() -> None:
    assert DEFAULT_POLICY is ReconcilePolicy.KEEP_ORIGINAL
    assert winner([REPLACEMENT, ORIGINAL]) == ORIGINAL


def test_tie_breaks_epoch_then_central_then_node_id() -> None:
    base = dict(task_id="t", started_at=1.0, score=0.5, replacement=True)
    low = Claim(node_id="edge-a", epoch=1, decided_by="central", **base)  # type: ignore[arg-type]
    high = Claim(node_id="edge-z", epoch=2, decided_by="edge-z", **base)  # type: ignore[arg-type]
    assert winner([low, high], ReconcilePolicy.KEEP_REPLACEMENT) == high  # epoch first
    edge = Claim(node_id="edge-a", epoch=2, decided_by="edge-a", **base)  # type: ignore[arg-type]
    central = Claim(node_id="edge-z", epoch=2, decided_by="central:1", **base)  # type: ignore[arg-type]
    assert winner([edge, central], ReconcilePolicy.KEEP_REPLACEMENT) == central  # then decider
    b = Claim(node_id="edge-b", epoch=2, decided_by="central", **base)  # type: ignore[arg-type]
    a = Claim(node_id="edge-a", epoch=2, decided_by="central", **base)  # type: ignore[arg-type]
    assert winner([b, a], ReconcilePolicy.KEEP_REPLACEMENT) == a  # then node id


def test_claim_on_the_winners_node_is_not_a_loser() -> None:
    older = Claim("t1", "edge-a", 2, "edge-a", started_at=100.0, score=0.4, replacement=False)
    assert losers([ORIGINAL, older, REPLACEMENT]) == [REPLACEMENT]


def test_resolve_and_bad_input() -> None:
    other = Claim("t2", "edge-c", 1, "central", 5.0, 0.1, False)
    assert resolve([REPLACEMENT, other, ORIGINAL]) == {"t1": ORIGINAL, "t2": other}
    with pytest.raises(ValueError):
        winner([])
    with pytest.raises(ValueError, match="several tasks"):
        winner([ORIGINAL, other])
    with pytest.raises(ValueError):
        Claim("t", "n", -1, "central", 0.0, 0.0, False)
    with pytest.raises(ValueError):
        Claim("t", "n", 1, "central", float("nan"), 0.0, False)


def test_a_sites_coordinator_ranks_between_central_and_a_node_alone() -> None:
    """Issue 16: copies alike in all but their decider settle for central's, then the site
    coordinator's (``site:<node>``), then a node's own decision."""

    def claim(node: str, by: str) -> Claim:
        return Claim("t", node, 2, by, 0.0, 0.0, True)

    central, site, alone = claim("z", "central"), claim("y", "site:gw-b"), claim("x", "x")
    assert [c.decider_rank for c in (central, site, alone)] == [0, 1, 2]
    assert winner([alone, site, central]) == central
    assert winner([alone, site]) == site
