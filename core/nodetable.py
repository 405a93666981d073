"""Columnar (numpy) view of the nodes for one scheduling cycle.

The scheduler builds one :class:`NodeTable` from the cluster view at the start of a cycle and
updates its ``used`` matrix as it decides, so filter and score plugins run as vector
operations over every node at once instead of a Python loop per node.

A caller that keeps a table up to date itself (central's fleet index, over thousands of
nodes and a million placements) hands it in ready-made; each cycle works on a
:meth:`NodeTable.fork` (the mutable columns copied, the rest shared), so building a cycle
costs O(nodes), not O(placements). Rows of ``on_node`` are never mutated in place, only
replaced, which is what lets a fork share them. When one node changes, such a caller patches
its table with :meth:`NodeTable.with_node` / :meth:`NodeTable.without_node`: a new table in
array copies (no Python work per node), the old one untouched.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import count
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from edgesched.core.model import Arch, Node, NodeState, Placement, Resources, ServerClass, Task

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

#: Column order of the resource matrices.
RESOURCE_COLUMNS = ("cpu", "mem_gib", "accel", "iops_k")
ARCH_CODES = {arch: i for i, arch in enumerate(Arch)}
CLASS_CODES = {cls: i for i, cls in enumerate(ServerClass)}
STATE_CODES = {state: i for i, state in enumerate(NodeState)}


def resource_vector(r: Resources) -> FloatArray:
    return np.array([r.cpu, r.mem_gib, float(r.accel), r.iops_k], dtype=np.float64)


_node_id = attrgetter("id")
_EPS = 1e-9
#: Which of :meth:`NodeTable._columns` are fixed (never written in place, so shared by forks);
#: ``used`` and ``state`` change during a cycle.
_FIXED = (True, False, True, True, False, True, True, True, True, True)


def natural_class(task: Task) -> ServerClass:
    """The server class a task belongs on when it has a choice (keeps scarce hardware free)."""
    if task.demand.accel > 0 or task.demand.accel_slices > 0:
        return ServerClass.AI_ACCELERATOR
    if task.demand.iops_k > 0:
        return ServerClass.STORAGE_DENSE
    return ServerClass.GENERAL


@dataclass(slots=True)
class NodeTable:
    """Node attributes as aligned numpy columns; row ``i`` is ``nodes[i]``."""

    nodes: tuple[Node, ...]
    index: dict[str, int]
    capacity: FloatArray  # (n, 4)
    used: FloatArray  # (n, 4), updated during the cycle
    arch: IntArray
    server_class: IntArray
    state: IntArray
    efficiency: FloatArray
    perf: FloatArray
    idle_w: FloatArray
    peak_w: FloatArray
    #: The accelerators' dynamic watts (``PowerModel.accel_dynamic_w``), or -1 where the node's
    #: model does not split CPU and accelerators (:func:`accel_dynamic_column`).
    accel_dyn_w: FloatArray
    #: What runs on each row (unordered), and CPU in use per workload class.
    on_node: list[list[Placement]]
    usage: dict[str, float]
    #: CPU and memory that work without accelerators leaves free per free accelerator.
    reserve_per_accel: tuple[float, float] = (0.0, 0.0)

    @classmethod
    def build(
        cls,
        nodes: Sequence[Node],
        placements: Iterable[Placement],
        reserve_per_accel: tuple[float, float] = (0.0, 0.0),
    ) -> NodeTable:
        ordered = tuple(sorted(nodes, key=lambda n: n.id))
        index = {node.id: i for i, node in enumerate(ordered)}
        if len(index) != len(ordered):
            raise ValueError("node ids must be unique")
        n = len(ordered)
        # Column-major: plugins work column by column over every node.
        capacity = np.array(
            [(c.cpu, c.mem_gib, float(c.accel), c.iops_k) for c in (x.capacity for x in ordered)],
            dtype=np.float64,
            order="F",
        ).reshape((n, len(RESOURCE_COLUMNS)), order="F")
        used = np.zeros_like(capacity, order="F")
        rows: list[int] = []
        demands: list[tuple[float, float, float, float]] = []
        on_node: list[list[Placement]] = [[] for _ in range(n)]
        usage: dict[str, float] = {}
        get = index.get
        for p in placements:  # the one pass over what runs: keep it lean
            row = get(p.node_id)
            if row is not None:
                task = p.task
                d = task.demand
                rows.append(row)
                demands.append((d.cpu, d.mem_gib, float(d.accel), d.iops_k))
                on_node[row].append(p)
                usage[task.workload] = usage.get(task.workload, 0.0) + d.cpu
        if rows:
            np.add.at(used, np.array(rows), np.array(demands, dtype=np.float64))
        return cls(
            nodes=ordered,
            index=index,
            capacity=capacity,
            used=used,
            arch=np.array([ARCH_CODES[n.arch] for n in ordered], dtype=np.int64),
            server_class=np.array([CLASS_CODES[n.server_class] for n in ordered], dtype=np.int64),
            state=np.array([STATE_CODES[n.state] for n in ordered], dtype=np.int64),
            efficiency=np.array([n.efficiency for n in ordered], dtype=np.float64),
            perf=np.array([n.perf for n in ordered], dtype=np.float64),
            idle_w=np.array([n.power.idle_w for n in ordered], dtype=np.float64),
            peak_w=np.array([n.power.peak_w for n in ordered], dtype=np.float64),
            accel_dyn_w=np.array([accel_dynamic_column(n) for n in ordered], dtype=np.float64),
            on_node=on_node,
            usage=usage,
            reserve_per_accel=reserve_per_accel,
        )

    def __len__(self) -> int:
        return len(self.nodes)

    def fork(self, reserve_per_accel: tuple[float, float] | None = None) -> NodeTable:
        """A table for one cycle: ``used``, ``state``, ``usage`` and the list of ``on_node``
        rows copied (the rows themselves shared: cycles replace a row, never mutate it), the
        fixed columns shared. O(nodes)."""
        return NodeTable(
            nodes=self.nodes,
            index=self.index,
            capacity=self.capacity,
            used=self.used.copy(order="F"),
            arch=self.arch,
            server_class=self.server_class,
            state=self.state.copy(),
            efficiency=self.efficiency,
            perf=self.perf,
            idle_w=self.idle_w,
            peak_w=self.peak_w,
            accel_dyn_w=self.accel_dyn_w,
            on_node=list(self.on_node),
            usage=dict(self.usage),
            reserve_per_accel=(
                self.reserve_per_accel if reserve_per_accel is None else reserve_per_accel
            ),
        )

    def subset(self, rows: Sequence[int]) -> NodeTable:
        """A table of ``rows`` only (ascending), what runs on them and their usage: the table
        :meth:`build` would give for those nodes and their placements."""
        picked = np.array(sorted(rows), dtype=np.int64)
        nodes = tuple(self.nodes[int(r)] for r in picked)
        on_node = [self.on_node[int(r)] for r in picked]
        usage: dict[str, float] = {}
        for placements in on_node:
            for p in placements:
                usage[p.task.workload] = usage.get(p.task.workload, 0.0) + p.task.demand.cpu
        return NodeTable(
            nodes=nodes,
            index={node.id: i for i, node in enumerate(nodes)},
            capacity=np.asfortranarray(self.capacity[picked]),
            used=np.asfortranarray(self.used[picked]),
            arch=self.arch[picked],
            server_class=self.server_class[picked],
            state=self.state[picked],
            efficiency=self.efficiency[picked],
            perf=self.perf[picked],
            idle_w=self.idle_w[picked],
            peak_w=self.peak_w[picked],
            accel_dyn_w=self.accel_dyn_w[picked],
            on_node=on_node,
            usage=usage,
            reserve_per_accel=self.reserve_per_accel,
        )

    def window(self, start: int, stop: int) -> NodeTable:
        """Rows ``start:stop`` as a table for the filter and score plugins, which read columns
        only: every column a numpy view of this table's (no copy: a row bound in this table
        is bound in the window), no index, nothing of what runs on the rows. Never patched,
        forked or bound itself. O(stop - start) for the tuple of nodes, no array copy."""
        rows = slice(start, stop)
        return self._patched(self.nodes[rows], {}, [c[rows] for c in self._columns()], [], {})

    def with_node(self, node: Node, used: npt.ArrayLike, placements: list[Placement]) -> NodeTable:
        """A new table with ``node``'s row holding ``used`` and ``placements`` (what
        :meth:`build` gives them): inserted in id order, or replacing the row of that id. This
        table is left as it is; a replacement shares the fixed columns its row leaves as they
        were (as :meth:`fork` does). O(nodes) in array and tuple copies, no Python loop."""
        row = self.index.get(node.id)
        values = _row_values(node, used)
        if row is None:
            row = bisect_left(self.nodes, node.id, key=_node_id)
            index = self.index.copy()
            index.update(zip(map(_node_id, self.nodes[row:]), count(row + 1)))
            index[node.id] = row
            return self._patched(
                (*self.nodes[:row], node, *self.nodes[row:]),
                index,
                [_inserted(col, row, v) for col, v in zip(self._columns(), values, strict=True)],
                [*self.on_node[:row], placements, *self.on_node[row:]],
                _moved_usage(self.usage, (), placements),
            )
        on_node = list(self.on_node)
        on_node[row] = placements
        was = _row_values(self.nodes[row], ())  # what the fixed columns hold there (not used)
        return self._patched(
            (*self.nodes[:row], node, *self.nodes[row + 1 :]),
            self.index,  # never mutated: shared
            [
                col if fixed and old == v else _replaced(col, row, v)
                for col, v, old, fixed in zip(self._columns(), values, was, _FIXED, strict=True)
            ],
            on_node,
            _moved_usage(self.usage, self.on_node[row], placements),
        )

    def without_node(self, node_id: str) -> NodeTable:
        """A new table without ``node_id``'s row (KeyError if it has none) and what runs
        there. This table is left as it is. O(nodes) in array and tuple copies."""
        row = self.index[node_id]
        index = self.index.copy()
        del index[node_id]
        index.update(zip(map(_node_id, self.nodes[row + 1 :]), count(row)))
        return self._patched(
            self.nodes[:row] + self.nodes[row + 1 :],
            index,
            [_deleted(col, row) for col in self._columns()],
            self.on_node[:row] + self.on_node[row + 1 :],
            _moved_usage(self.usage, self.on_node[row], ()),
        )

    def with_rows(
        self, changes: Mapping[str, tuple[Node, npt.ArrayLike, list[Placement]] | None]
    ) -> NodeTable:
        """A new table with many rows patched at once: each id of ``changes`` gets the row
        ``(node, used, placements)`` (inserted in id order, or replacing its row) or, for
        None, loses its row if it has one. The table that :meth:`with_node` and
        :meth:`without_node` one change after another would give; this one is left as it
        is. O(nodes) in one pass (a Python step per row for the tuples and the index, array
        gathers for the columns), not O(nodes) per change: central's table at 10,000 nodes
        moved by hundreds of rows a step while a fleet came up, and rebuilding it whole took
        ~40% of central's CPU."""
        for node_id, change in changes.items():
            if change is not None and change[0].id != node_id:
                raise ValueError(f"row {node_id!r} given node {change[0].id!r}")
        kept = [n.id for n in self.nodes if n.id not in changes]
        ids = sorted((*kept, *(i for i, c in changes.items() if c is not None)))
        old_row = self.index
        nodes: list[Node] = []
        on_node: list[list[Placement]] = []
        source = np.empty(len(ids), dtype=np.int64)  # the row each comes from (-1: new)
        for i, node_id in enumerate(ids):
            change = changes.get(node_id)
            if change is None:
                row = old_row[node_id]
                nodes.append(self.nodes[row])
                on_node.append(self.on_node[row])
                source[i] = row
            else:
                nodes.append(change[0])
                on_node.append(change[2])
                source[i] = -1
        fresh = np.flatnonzero(source < 0)
        columns = []
        for col in self._columns():
            out = np.empty((len(ids), *col.shape[1:]), dtype=col.dtype, order="F")
            if len(ids):
                out[source >= 0] = col[source[source >= 0]]
            columns.append(out)
        for at in fresh.tolist():
            node, used, _ = changes[ids[at]]  # type: ignore[misc]
            for out, value in zip(columns, _row_values(node, used), strict=True):
                out[at] = value
        gone: list[Placement] = []
        for node_id in changes:
            had = old_row.get(node_id)
            if had is not None:
                gone.extend(self.on_node[had])
        new = [p for c in changes.values() if c is not None for p in c[2]]
        return self._patched(
            tuple(nodes),
            dict(zip(ids, range(len(ids)), strict=True)),
            columns,
            on_node,
            _moved_usage(self.usage, gone, new),
        )

    def _columns(self) -> tuple[npt.NDArray[Any], ...]:
        """The numpy columns, in the order of :func:`_row_values` and :data:`_FIXED`."""
        return (
            self.capacity,
            self.used,
            self.arch,
            self.server_class,
            self.state,
            self.efficiency,
            self.perf,
            self.idle_w,
            self.peak_w,
            self.accel_dyn_w,
        )

    def _patched(
        self,
        nodes: tuple[Node, ...],
        index: dict[str, int],
        columns: Sequence[npt.NDArray[Any]],
        on_node: list[list[Placement]],
        usage: dict[str, float],
    ) -> NodeTable:
        capacity, used, arch, server_class, state, efficiency, perf = columns[:7]
        idle_w, peak_w, accel_dyn_w = columns[7:]
        return NodeTable(
            nodes=nodes,
            index=index,
            capacity=capacity,
            used=used,
            arch=arch,
            server_class=server_class,
            state=state,
            efficiency=efficiency,
            perf=perf,
            idle_w=idle_w,
            peak_w=peak_w,
            accel_dyn_w=accel_dyn_w,
            on_node=on_node,
            usage=usage,
            reserve_per_accel=self.reserve_per_accel,
        )

    def active_mask(self) -> BoolArray:
        mask: BoolArray = self.state == STATE_CODES[NodeState.ACTIVE]
        return mask

    def cpu_utilization(self) -> FloatArray:
        util: FloatArray = self.used[:, 0] / self.capacity[:, 0]
        return util

    def add(self, row: int, demand: Resources) -> None:
        self.used[row] += resource_vector(demand)

    def remove(self, row: int, demand: Resources) -> None:
        self.used[row] = np.maximum(self.used[row] - resource_vector(demand), 0.0)

    def set_state(self, row: int, state: NodeState) -> None:
        self.state[row] = STATE_CODES[state]


def accel_dynamic_column(node: Node) -> float:
    """The node's :attr:`NodeTable.accel_dyn_w`: its accelerators' dynamic watts where its
    power model splits them out, -1 where it does not (:meth:`PowerModel.draw`'s older
    rule)."""
    return node.power.accel_dynamic_w if node.power.split else -1.0


def power_draw(
    idle_w: FloatArray,
    peak_w: FloatArray,
    accel_dyn_w: FloatArray,
    cpu_util: FloatArray,
    accel_util: FloatArray,
) -> FloatArray:
    """Active power (W) per node, :meth:`~edgesched.core.model.PowerModel.draw` over arrays:
    CPU and accelerator power apart where the model splits them (``accel_dyn_w >= 0``: the
    accelerators' dynamic watts), the larger of the two utilizations where it does not (-1,
    :func:`accel_dynamic_column`)."""
    u = np.clip(cpu_util, 0.0, 1.0)
    a = np.clip(accel_util, 0.0, 1.0)
    split = accel_dyn_w >= 0
    accel = np.maximum(accel_dyn_w, 0.0)
    dynamic = peak_w - idle_w
    apart = (dynamic - accel) * u + accel * a
    watts: FloatArray = idle_w + np.where(split, apart, dynamic * np.maximum(u, a))
    return watts


def _row_values(node: Node, used: npt.ArrayLike) -> tuple[npt.ArrayLike, ...]:
    """One row of :meth:`NodeTable._columns` for ``node``, as :meth:`NodeTable.build` makes it."""
    c = node.capacity
    return (
        (c.cpu, c.mem_gib, float(c.accel), c.iops_k),
        used,
        ARCH_CODES[node.arch],
        CLASS_CODES[node.server_class],
        STATE_CODES[node.state],
        node.efficiency,
        node.perf,
        node.power.idle_w,
        node.power.peak_w,
        accel_dynamic_column(node),
    )


def _inserted(col: npt.NDArray[Any], row: int, value: npt.ArrayLike) -> npt.NDArray[Any]:
    out = np.empty((len(col) + 1, *col.shape[1:]), dtype=col.dtype, order="F")
    out[:row] = col[:row]
    out[row] = value
    out[row + 1 :] = col[row:]
    return out


def _deleted(col: npt.NDArray[Any], row: int) -> npt.NDArray[Any]:
    out = np.empty((len(col) - 1, *col.shape[1:]), dtype=col.dtype, order="F")
    out[:row] = col[:row]
    out[row:] = col[row + 1 :]
    return out


def _replaced(col: npt.NDArray[Any], row: int, value: npt.ArrayLike) -> npt.NDArray[Any]:
    out = col.copy(order="F")
    out[row] = value
    return out


def _moved_usage(
    usage: Mapping[str, float], gone: Iterable[Placement], new: Iterable[Placement]
) -> dict[str, float]:
    """``usage`` less the CPU of ``gone``, plus that of ``new``; the workloads of ``gone``
    left at (about) zero are dropped."""
    out = dict(usage)
    left = set()
    for p in gone:
        out[p.task.workload] = out.get(p.task.workload, 0.0) - p.task.demand.cpu
        left.add(p.task.workload)
    for p in new:
        out[p.task.workload] = out.get(p.task.workload, 0.0) + p.task.demand.cpu
    for workload in left:
        if abs(out[workload]) < _EPS:
            del out[workload]
    return out
