"""Spreading a service's replicas: a hard per-node limit and a score that evens them out.

A :class:`SpreadGroup` is what the scheduler knows of one service while it places some of its
replicas: the per-node limit, the topology keys to even out over (``node``, ``site``,
``arch``), and where the service's replicas run already (node id -> count). The cycle counts
the replicas it places on top (:class:`GroupCounts`), so replicas placed in one cycle spread
among themselves too.

:func:`spread_mask` is the hard part (a node at ``max_per_node`` cannot take one more);
:func:`spread_score` the soft one, as Kubernetes' topology spread scores it: per key, a node
in a domain holding fewer of the group's replicas scores higher (1 for the emptiest domains,
0 for the fullest), averaged over the keys. The scheduler adds it, weighted by
:data:`SPREAD_WEIGHT`, to the policy's score, which lies in [0, 1]: the spread decides
between domains, the policy among the nodes of equally filled ones.

Pure, vectorized over a :class:`~edgesched.core.nodetable.NodeTable` (or a window of it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from edgesched.core.nodetable import BoolArray, FloatArray, IntArray, NodeTable

#: The spread score's weight against the policy's (whose weighted sum lies in [0, 1]).
SPREAD_WEIGHT = 2.0


@dataclass(frozen=True, slots=True)
class SpreadGroup:
    """One service's replicas, as the scheduler spreads them."""

    name: str
    max_per_node: int = 0  # 0: no bound
    across: tuple[str, ...] = ()
    placed: Mapping[str, int] = field(default_factory=dict)  # node id -> replicas there now


@dataclass(slots=True)
class GroupCounts:
    """A cycle's count of each group's replicas per node: where they were, plus what the
    cycle placed."""

    by_node: dict[str, dict[str, int]] = field(default_factory=dict)

    def of(self, group: SpreadGroup) -> dict[str, int]:
        counts = self.by_node.get(group.name)
        if counts is None:
            counts = {n: c for n, c in group.placed.items() if c > 0}
            self.by_node[group.name] = counts
        return counts

    def add(self, group: SpreadGroup, node_id: str, n: int = 1) -> None:
        counts = self.of(group)
        left = counts.get(node_id, 0) + n
        if left > 0:
            counts[node_id] = left
        else:
            counts.pop(node_id, None)


def spread_mask(table: NodeTable, group: SpreadGroup, counts: Mapping[str, int]) -> BoolArray:
    """Nodes of ``table`` (the cycle's whole table) that can take one more of ``group``'s
    replicas."""
    mask: BoolArray = np.ones(len(table), dtype=np.bool_)
    if group.max_per_node > 0:
        for node_id, count in counts.items():
            row = table.index.get(node_id)
            if row is not None and count >= group.max_per_node:
                mask[row] = False
    return mask


def spread_score(
    table: NodeTable,
    group: SpreadGroup,
    counts: Mapping[str, int],
    domains_of: Mapping[str, tuple[list[str], IntArray]],
) -> FloatArray:
    """Per node of ``table`` (the cycle's whole table), in [0, 1]: how little of ``group``
    its domains hold, averaged over ``group.across`` (1: the emptiest domains; 0: the
    fullest, however close their counts: the spread decides between unequal domains).
    ``domains_of[key]``: :func:`domain_codes` of the table for each key but ``node``
    (computed once per cycle by the caller)."""
    if not group.across or not len(table):
        return np.zeros(len(table), dtype=np.float64)
    total = np.zeros(len(table), dtype=np.float64)
    for key in group.across:
        if key == "node":
            per_row = np.zeros(len(table), dtype=np.float64)
            for node_id, count in counts.items():
                row = table.index.get(node_id)
                if row is not None:
                    per_row[row] = count
        else:
            names, codes = domains_of[key]
            per_domain = np.zeros(len(names), dtype=np.float64)
            for node_id, count in counts.items():
                row = table.index.get(node_id)
                if row is not None:
                    per_domain[codes[row]] += count
            per_row = per_domain[codes]
        # (relative to the spread of the counts, not to the fullest's count: with 9 and 8
        # replicas in two sites, 1 - 8/9 gave the emptier site 0.11, which the energy
        # score's dislike of waking an idle node outweighed, and the sites drifted apart)
        top, bottom = float(per_row.max()), float(per_row.min())
        if top > bottom:
            total += (top - per_row) / (top - bottom)
        else:
            total += 1.0
    score: FloatArray = total / len(group.across)
    return score


def domain_codes(table: NodeTable, key: str) -> tuple[list[str], IntArray]:
    """The domains of ``key`` over ``table`` (site names, or architectures) and each row's
    domain code. ``node`` needs none (each node is its own)."""
    if key == "site":
        values = [node.site for node in table.nodes]
    elif key == "arch":
        values = [node.arch.value for node in table.nodes]
    else:
        raise ValueError(f"no domains for spread key {key!r}")
    names = sorted(set(values))
    code = {name: i for i, name in enumerate(names)}
    codes: IntArray = np.fromiter((code[v] for v in values), dtype=np.int64, count=len(values))
    return names, codes
