"""The site-autonomy benchmark (bench/bench_site_autonomy.py) in its quick mode: its tables and
its JSON parse, have the expected columns and rows, and say what the runs measured."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_site_autonomy as bench


def test_the_quick_tables_parse_and_site_mode_keeps_the_replicas(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench.main(["--quick"])
    out = capsys.readouterr().out
    tables: list[list[list[str]]] = []
    for block in out.split("\n\n"):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        if rows:
            tables.append([[c.strip() for c in row.strip("|").split("|")] for row in rows])
    assert len(tables) == 2  # the two sizes
    for cells in tables:
        assert tuple(cells[0]) == bench.HEADER
        assert all(set(c) <= {"-"} for c in cells[1])
        body = {row[0]: row[1:] for row in cells[2:]}
        assert list(body) == [label for _, label, _ in bench.ROWS]

        def num(text: str) -> float:
            return float(text.replace(",", ""))

        down = body["replica downtime, replica-s"]
        assert num(down[0]) > num(down[1]) > 0  # every cut has a crash in quick mode
        assert float(down[2]) < 1
        subs = body["local submissions"]
        assert subs[0] == subs[1] and subs[3] == subs[4] and num(subs[0]) > 0
        misses = body["SLO misses"]
        assert num(misses[1]) <= num(misses[0])
        assert misses[3] == misses[4] == "0"  # outside cuts, the modes do the same
    lines = out.strip().splitlines()
    assert re.fullmatch(r"scale 0\.2: 10 nodes, [\d,]+ submissions, .* s \(both modes\)", lines[-3])
    growth = re.fullmatch(r"runtime ratio scale 0\.4 / scale 0\.2: ([\d.]+) for .*", lines[-1])
    assert growth is not None and float(growth.group(1)) > 0


def test_the_quick_json_has_every_figure_of_both_modes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench.main(["--quick", "--json", "--seed", "1"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["seed"] == 1 and doc["runtime_ratio"] > 0
    assert [s["scale"] for s in doc["sizes"]] == [0.2, 0.4]
    for size in doc["sizes"]:
        assert set(size["modes"]) == {"node-only", "site"}
        for mode in size["modes"].values():
            for window in ("cut", "outside"):
                assert set(mode[window]) == set(doc["figures"])
        cut = {m: size["modes"][m]["cut"] for m in ("node-only", "site")}
        assert cut["site"]["replica_down_s"] <= cut["node-only"]["replica_down_s"]
        assert cut["site"]["submissions"] == cut["node-only"]["submissions"] > 0
