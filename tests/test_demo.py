"""``edgesched demo`` as a user runs it: real processes (brokers, central, edge nodes, tasks).

A short run on Mosquitto must cut a whole site off (three nodes behind their own bridged
broker), see the site elect its coordinator, restart the replica of a member that lost power on
a peer while still cut off, merge it back (central adopting the site's placement) and pass its
own checks; SIGINT in the middle must stop everything promptly; the embedded broker (no
Mosquitto, no bridge) must cut one node off instead; and whatever happens, no process of the
run's work directory may be left behind. The pure parts (timeline, workload plan, the site's
members) are checked without processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from edgesched.config import TelemetrySource, load_config, parse_config
from edgesched.demo import (
    DAY_S,
    LOCAL_CLASSES,
    MIN_CUT_REAL_S,
    TASK_MARKER,
    DemoError,
    DemoOptions,
    cut_node_of,
    make_nodes,
    plan_workload,
    site_members_of,
    site_victim_of,
    timeline,
)

pytestmark = pytest.mark.timeout(150)


def demo_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgesched.cli", "demo", *args]


def leftovers(workdir: Path, pids: Sequence[int] = ()) -> list[str]:
    """Processes of this run still alive: the work dir in argv or in the task marker, or one
    of ``pids``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            argv = " ".join(proc.info["cmdline"] or ())
            hit = str(workdir) in argv or proc.pid in pids
            if not hit:
                with contextlib.suppress(psutil.Error):
                    hit = proc.environ().get(TASK_MARKER) == str(workdir)
            if hit:
                found.append(f"{proc.pid}: {argv}")
        except psutil.Error:
            continue
    return found


def no_leftovers(workdir: Path, pids: Sequence[int] = (), timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := leftovers(workdir, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left behind: {left}"


def run_json(workdir: Path, *args: str, timeout: float = 120.0) -> dict[str, Any]:
    done = subprocess.run(
        demo_argv("--json", "--workdir", str(workdir), *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/tmp",
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert json.loads((workdir / "demo-report.json").read_text())["checks"] == result["checks"]
    return result


# --------------------------------------------------------------------------- real runs


def test_short_run_cuts_a_site_off_and_merges_it_back(tmp_path: Path) -> None:
    workdir = tmp_path / "wd"
    result = run_json(workdir, "--hours", "3", "--speed", "720")
    assert result["ok"] and all(result["checks"].values()), result["checks"]
    assert result["broker"]["kind"] == "mosquitto"
    part = result["partition"]
    assert part["mode"] == "site" and part["site"] == "site-1"
    members = ["arm48-1", "stor6-3", "arm8-4"]
    assert part["members"] == members
    # the members elected the smallest id, one term for the whole cut
    assert part["coordinator"] == "arm48-1" and part["terms_seen"] == ["arm48-1@1"]
    assert 0 < part["elected_after_cut_s"] < part["cut_real_s"]
    # the storage node lost power while cut off; its gate service came back on a site peer
    # by the coordinator's order, before the heal, and central adopted that placement
    lost = part["lost_power"]
    assert lost["node"] == "stor6-3" and lost["after_cut_s"] < part["cut_real_s"]
    assert lost["task_processes_killed"] >= 1
    moved = {mv["task"]: mv for mv in part["moved"]}
    assert "svc-gate-3" in moved, part["moved"]
    for mv in moved.values():
        assert mv["from"] == "stor6-3" and mv["to"] in ("arm48-1", "arm8-4"), mv
        assert mv["decided_by"] == "site:arm48-1", mv
        assert mv["restored_during_cut"] is True, mv
        assert 0 < mv["restored_after_kill_s"] < part["cut_real_s"], mv
        assert mv["central_node_after_heal"] == mv["to"], mv
        assert mv["adopted_after_heal_s"] is not None and mv["adopted_after_heal_s"] < 30, mv
    assert set(moved) <= set(part["site_decided"]) and part["site_decisions"] >= len(moved)
    assert part["site_orders"] >= 1
    assert part["offline_decisions"] > part["site_decisions"]  # members also decided alone
    for member in ("arm48-1", "arm8-4"):  # the live members' own count is central's
        d = part["decisions"][member]
        assert (d["site"], d["alone"]) == (d["site_at_node"], d["alone_at_node"]), d
    assert part["merge_s"] is not None and 0 < part["merge_s"] < 30
    # byte-equal after the heal (the dead member has no document to compare), nothing twice
    assert result["unequal_replicas"] == [] and result["tasks_on_two_nodes"] == []
    assert result["failovers"] == 0  # central's grace outlasts the cut: the site moved it
    assert result["reconciled"] >= 1  # central adopting the site's placement
    by_id = {n["id"]: n for n in result["nodes"]}
    assert [n for n in by_id if by_id[n]["cut_off"]] == members
    assert [n for n in by_id if by_id[n]["lost_power"]] == ["stor6-3"]
    assert load_config(workdir / "nodes" / "arm8-4" / "edge.toml").edge.site_peers == (
        "arm48-1",
        "stor6-3",
    )
    assert {n["server_class"] for n in result["nodes"]} == {
        "general",
        "ai-accelerator",
        "storage-dense",
    }
    tasks = result["tasks"]
    assert tasks["submitted_at_central"] > 0 and tasks["submitted_at_nodes"] > 0
    assert tasks["refused"] == 0, tasks["refusals"]
    assert sum(n["tasks_ran"] for n in result["nodes"]) > 20
    assert 0 < result["utilization"]["fleet"] < 1
    assert result["energy"]["kwh"] > 0
    assert "telemetry_source = reserved" in result["energy"]["source"]
    for n in result["nodes"]:  # each simulated node reports its server, not this host
        edge = load_config(workdir / "nodes" / n["id"] / "edge.toml").edge
        assert edge.telemetry_source is TelemetrySource.RESERVED, n["id"]
    assert result["dashboard"].startswith("http://127.0.0.1:")
    assert "/dashboard/#token=" in result["dashboard"]
    no_leftovers(workdir, [p for p in result["processes"].values() if p])


def test_the_forecast_scales_the_gate_service_out_before_the_morning_peak(
    tmp_path: Path,
) -> None:
    """The gate front end (an autoscaled service, metric forecast) grows ahead of the 07:00
    face-recognition peak: its first scale-out is the forecast's, before 07:00, and its count
    follows the load up to the peak's (issue 15)."""
    workdir = tmp_path / "wd"
    result = run_json(workdir, "--start", "04:00", "--hours", "3.5", "--no-partition")
    assert result["ok"], result["checks"]
    gates = result["service"]
    changes = gates["changes"]
    assert changes[0]["reason"].startswith("manual: created with 1 replicas"), changes
    out = next(c for c in changes if c["at"] == gates["forecast_scale_out_at"])
    assert out["reason"].startswith("forecast: "), changes
    assert out["at"] < "07:00" and gates["forecast_lead_min"] > 0, changes
    after = [c["replicas"] for c in changes if c["at_s"] >= out["at_s"]]
    assert after == sorted(after), changes  # held from then through the rising morning
    assert gates["peak_replicas"] >= 5, changes  # the load at the peak wants 5-6
    no_leftovers(workdir, [p for p in result["processes"].values() if p])


def test_sigint_in_the_middle_stops_everything(tmp_path: Path) -> None:
    workdir = tmp_path / "wd"
    proc = subprocess.Popen(
        demo_argv("--workdir", str(workdir)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/tmp",
    )
    try:
        deadline = time.monotonic() + 60
        # The day has started once task processes run.
        while time.monotonic() < deadline and proc.poll() is None:
            tasks = [p for p in leftovers(workdir) if "sleep" in p and "/bin/sh" not in p]
            if len(tasks) >= 3:
                break
            time.sleep(0.3)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no task started within 60 s"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=40)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    assert "stopped" in stderr and "Traceback" not in stderr
    assert took < 30, f"took {took:.1f}s to stop"
    no_leftovers(workdir)


def test_embedded_broker(tmp_path: Path) -> None:
    workdir = tmp_path / "wd"
    result = run_json(workdir, "--broker", "embedded", "--hours", "2", "--nodes", "3")
    assert result["broker"] == {"kind": "embedded", "protocol": "3.1.1"}
    assert result["ok"], result["checks"]
    part = result["partition"]  # no bridge without Mosquitto: one node is cut off
    assert part["mode"] == "node" and part["node"] == "stor6-3"
    assert "Mosquitto" in part["why"]
    assert part["offline_decisions"] > 0
    assert part["offline_decisions"] == part["offline_decisions_at_node"]
    assert part["merge_s"] is not None
    assert "site_kept_services" not in result["checks"]
    no_leftovers(workdir, [p for p in result["processes"].values() if p])


def test_a_port_in_use_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    workdir = tmp_path / "wd"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            demo_argv("--workdir", str(workdir), "--api-port", str(port)),
            capture_output=True,
            text=True,
            timeout=90,
            cwd="/tmp",
        )
    assert done.returncode == 1
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: central did not start"), done.stderr
    assert "Traceback" not in done.stderr
    no_leftovers(workdir)


def test_bad_options_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "junk").write_text("x")
    for args, expected in (
        (["--workdir", str(tmp_path)], "not an empty directory"),
        (["--minutes", "10", "--hours", "1"], "give one of them"),
        (["--speed", "0"], "--speed"),
        (["--nodes", "1"], "--nodes"),
        (["--broker", "rabbit"], "--broker"),
        (["--start", "25:00"], "--start"),
    ):
        done = subprocess.run(
            demo_argv(*args), capture_output=True, text=True, timeout=30, cwd="/tmp"
        )
        assert done.returncode == 2, (args, done.stderr)
        assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr


# --------------------------------------------------------------------------- pure parts


def test_timeline() -> None:
    day = timeline(DemoOptions())
    assert (day.start_s, day.end_s) == (0.0, DAY_S)
    assert day.cut_at == 10 * 3600 and day.energy_at == 18 * 3600
    assert day.heal_at == day.cut_at + max(3600, MIN_CUT_REAL_S * 720)
    short = timeline(DemoOptions(duration_s=3 * 3600))
    assert short.start_s < short.cut_at < short.heal_at <= short.end_s  # type: ignore[operator]
    assert short.start_s <= short.energy_at < short.end_s
    calm = timeline(DemoOptions(duration_s=3600, partition=False))
    assert calm.cut_at is None and calm.end_s - calm.start_s == 3600
    with pytest.raises(DemoError, match="--speed"):
        DemoOptions(speed=0)
    with pytest.raises(DemoError, match="--nodes"):
        DemoOptions(nodes=40)


def test_workload_plan(tmp_path: Path) -> None:
    nodes = make_nodes(5, tmp_path / "hw")
    assert [n.id for n in nodes] == ["arm48-1", "ai4gpu-2", "stor6-3", "arm8-4", "x86g32-5"]
    assert nodes[1].accel == 4 and nodes[0].cpu == 48
    cut = cut_node_of(nodes)
    assert cut.id == "stor6-3"
    tl = timeline(DemoOptions())
    kwargs: dict[str, Any] = {"cut_node": cut.id, "env": {TASK_MARKER: "/x"}, "cwd": "/x"}
    plan = plan_workload(nodes, tl, seed=1, **kwargs)
    assert plan == plan_workload(nodes, tl, seed=1, **kwargs)  # seeded
    assert plan != plan_workload(nodes, tl, seed=2, **kwargs)
    ids = [a.spec["id"] for a in plan]
    assert len(ids) == len(set(ids))
    assert 200 < len(plan) < 1500
    assert [a.at for a in plan] == sorted(a.at for a in plan)
    services = [a for a in plan if a.spec["restart"] == "always"]
    assert len(services) == 5 and [a.pin for a in services].count(cut.id) == 1
    by_id = {n.id: n for n in nodes}
    for a in plan:
        workload = a.spec["workload"]
        if a.spec["restart"] == "always":
            continue
        if workload in LOCAL_CLASSES:
            node = by_id[a.route]
            assert not a.spec["archs"] or node.arch in a.spec["archs"]
        else:
            assert a.route == "central"
        if workload == "cloud-desktop":
            assert a.spec["archs"] == ["x86_64"]
        if workload == "ai-training":
            assert a.spec["server_classes"] == ["ai-accelerator"] and a.spec["accel"] in (1, 2)
        assert float(a.spec["command"][1]) >= 0.2
    assert tl.cut_at is not None and tl.heal_at is not None
    during = [a for a in plan if tl.cut_at <= a.at < tl.heal_at and a.route == cut.id]
    assert during, "the cut-off node gets local work while it is cut off"
    # a site: its members get local work during the cut, its victim's gate service is pinned
    members = site_members_of(nodes)
    assert [n.id for n in members] == ["stor6-3", "arm8-4", "x86g32-5"]
    victim = site_victim_of(members)
    assert victim.id == "stor6-3"
    site = [n.id for n in members]
    planned = plan_workload(nodes, tl, seed=1, **{**kwargs, "cut_node": victim.id}, site=site)
    assert [a.pin for a in planned if a.spec["restart"] == "always"].count(victim.id) == 1
    to_site = {a.route for a in planned if tl.cut_at <= a.at < tl.heal_at and a.route in site}
    assert to_site == set(site), to_site
    # the morning gates: face recognition arrives mostly 07:00-09:00
    fr = [a.at for a in plan if a.spec["id"].startswith("fr-")]
    assert sum(1 for t in fr if 7 * 3600 <= t < 9 * 3600) > len(fr) / 3


def test_site_members() -> None:
    """Three nodes but the AI node (central keeps the GPUs and an x86 node during the cut);
    the victim is never the member the site elects (the smallest id); too few nodes: none."""
    with tempfile.TemporaryDirectory() as d:
        twelve = make_nodes(12, Path(d) / "hw")  # make_nodes(k): the first k of these
    four = twelve[:4]
    assert [n.id for n in site_members_of(four)] == ["arm48-1", "stor6-3", "arm8-4"]
    assert site_victim_of(site_members_of(four)).id == "stor6-3"
    assert site_members_of(twelve[:3]) == []
    for count in range(4, 13):
        nodes = twelve[:count]
        members = site_members_of(nodes)
        assert len(members) == 3 and any(n.server_class == "ai-accelerator"
                                         for n in nodes if n not in members)  # fmt: skip
        assert site_victim_of(members).id != min(n.id for n in members)


def test_hal_root_in_config() -> None:
    assert parse_config({}).edge.hal_root == "/"
    cfg = parse_config({"edge": {"node_id": "n", "hal_root": "/tmp/hw"}})
    assert cfg.edge.hal_root == "/tmp/hw"
