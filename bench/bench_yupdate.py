"""What the per-operation authorship check costs a peer: decoding a Yjs update in Python.

``sync/yupdate.py`` decodes every struct and the delete set of an update (issue 13) where the
old writer check only asked pycrdt (Rust) for the update's state vector. Two sizes, each
against ``pycrdt.get_state`` of the same update in the same run (the ratio is the figure to
keep; the microseconds move with the machine):

- one entry: a one-entry map update as pycrdt makes it (what a node sends per change);
- 100 entries: a 100-entry document's full state (a y-sync step 2 of a small document).

Run: ``.venv/bin/python bench/bench_yupdate.py``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from pycrdt import Doc, Map, get_state

from edgesched.sync.yupdate import authorship_violation, decode_update


def _per_call_us(fn: Callable[[], object], budget_s: float = 0.3, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean time of one call, in microseconds."""
    n = 1
    while True:  # calibrate: enough calls for ~budget/rounds seconds
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - start > budget_s / rounds / 4:
            break
        n *= 2
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(samples)


def _updates() -> dict[str, bytes]:
    doc: Doc[Any] = Doc(client_id=12345)
    tasks = doc.get("tasks", type=Map)
    updates: list[bytes] = []
    doc.observe(lambda event: updates.append(event.update))
    tasks["t-0"] = {"state": "running", "node": "n-17", "cpu": 2.5, "since": 1_700_000_000}
    one = updates[-1]
    for i in range(1, 100):
        tasks[f"t-{i}"] = {"state": "running", "node": f"n-{i % 7}", "cpu": 0.5 * i, "since": i}
    return {"one entry": one, "100 entries": doc.get_update()}


def main() -> None:
    writers = frozenset({12345})
    print(
        f"{'update':<12} {'bytes':>6} {'decode µs':>10} {'check µs':>9} "
        f"{'get_state µs':>13} {'ratio':>6}"
    )
    for name, update in _updates().items():
        assert authorship_violation(update, writers) is None
        decode = _per_call_us(lambda u=update: decode_update(u))  # type: ignore[misc]
        check = _per_call_us(lambda u=update: authorship_violation(u, writers))  # type: ignore[misc]
        state = _per_call_us(lambda u=update: get_state(u))  # type: ignore[misc]
        print(
            f"{name:<12} {len(update):>6} {decode:>10.1f} {check:>9.1f} {state:>13.1f} "
            f"{check / state:>6.1f}"
        )
    print("ratio: authorship_violation / pycrdt.get_state of the same update, same run")


if __name__ == "__main__":
    main()
