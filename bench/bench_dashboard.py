"""The dashboard at fleet scale, in headless Chromium (issue 14): first paint and a page of
tasks at 1,000 nodes and 100,000 tasks, against 100 nodes and 10,000 tasks in the same run.

Central is built as ``bench_control_step.py`` builds it (its real engine, N nodes of
``--tasks`` entries each, 70% central's running assignments, 30% tasks the nodes finished),
and its real API app (``build_app``: the dashboard, the stream, ``GET /v1/tasks``) is served
on 127.0.0.1. Chromium (``/usr/bin/chromium``, driven by Playwright; never a download) opens
the page. Measured per size:

- the stream's snapshot on central's loop (ms to build and encode) and its size (bytes);
- **first paint**: from navigation to the node table and the first page of tasks rendered;
- **a page of tasks**: a click on "next" until the next 50 rows are rendered (median of
  ``--pages``), and a filtered page (phase ``exited``, central scanning for matches);
- **a snapshot's render** in the page (the page's own timing of one render, median).

Then each figure at the largest size against the smallest (a ratio).

    .venv/bin/python bench/bench_dashboard.py [--nodes 100,1000] [--tasks 100] [--pages 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_control_step as base
from aiohttp import web
from playwright.async_api import Browser, Page, async_playwright, expect

from edgesched.central import dashboard
from edgesched.central.api import build_app

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]
WAIT_MS = 60_000


async def _tasks_loaded(page: Page, before: str | None) -> str:
    """Wait until the page has rendered a task load newer than ``before``; its counter."""
    handle = await page.wait_for_function(
        "b => { const v = document.body.dataset.tasksLoaded; return v && v !== b ? v : null }",
        arg=before,
        timeout=WAIT_MS,
    )
    return str(await handle.json_value())


async def measure(browser: Browser, nodes: int, tasks: int, pages: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        built = time.perf_counter()
        engine, _clock, _running = base.build(nodes, tasks, Path(tmp))
        engine.sync_index(project=False)
        build_s = time.perf_counter() - built
        gc.collect()
        snaps = []
        size = 0
        for _ in range(5):
            start = time.perf_counter()
            data = json.dumps(dashboard.snapshot(engine), separators=(",", ":"), default=str)
            snaps.append((time.perf_counter() - start) * 1e3)
            size = len(data)
        app = build_app(engine, "admin-token", "read-token")
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        context = await browser.new_context(viewport={"width": 1280, "height": 860})
        page = await context.new_page()
        try:
            start = time.perf_counter()
            await page.goto(f"http://127.0.0.1:{port}/dashboard/#token=admin-token")
            await expect(page.locator("#nodes tr.node").first).to_be_visible(timeout=WAIT_MS)
            loaded = await _tasks_loaded(page, None)
            await expect(page.locator("#tasks tr[data-task]")).to_have_count(50, timeout=WAIT_MS)
            first_paint_ms = (time.perf_counter() - start) * 1e3
            page_ms = []
            for _ in range(pages):
                first = await page.locator("#tasks tr[data-task]").first.get_attribute("data-task")
                start = time.perf_counter()
                await page.locator("#tasks-next").click()
                loaded = await _tasks_loaded(page, loaded)
                page_ms.append((time.perf_counter() - start) * 1e3)
                now = await page.locator("#tasks tr[data-task]").first.get_attribute("data-task")
                assert now != first, "next did not move"
            start = time.perf_counter()
            await page.locator("#task-phase").select_option("exited")
            loaded = await _tasks_loaded(page, loaded)
            filtered_ms = (time.perf_counter() - start) * 1e3
            states = await page.locator("#tasks tr[data-task]").evaluate_all(
                "rows => rows.map(r => r.dataset.state)"
            )
            assert states and set(states) == {"exited"}, states
            renders = []
            for _ in range(5):
                await page.wait_for_timeout(1100)  # a snapshot a second
                renders.append(float(await page.evaluate("document.body.dataset.renderMs")))
        finally:
            await context.close()
            await runner.cleanup()
        return {
            "nodes": nodes,
            "tasks": len(engine.task_ids()),
            "build_s": round(build_s, 1),
            "snapshot_ms": round(statistics.median(snaps), 2),
            "snapshot_bytes": size,
            "first_paint_ms": round(first_paint_ms, 1),
            "page_ms": round(statistics.median(page_ms), 1),
            "filtered_page_ms": round(filtered_ms, 1),
            "render_ms": round(statistics.median(renders), 2),
        }


async def main_async(sizes: list[int], tasks: int, pages: int) -> list[dict[str, Any]]:
    out = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for nodes in sizes:
                result = await measure(browser, nodes, tasks, pages)
                print(json.dumps(result), flush=True)
                out.append(result)
        finally:
            await browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,1000")
    parser.add_argument("--tasks", type=int, default=100, help="task entries per node")
    parser.add_argument("--pages", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    results = asyncio.run(main_async(sizes, args.tasks, args.pages))
    small, large = results[0], results[-1]
    print()
    print(f"{'':18}" + "".join(f"{r['nodes']:>7} nodes" for r in results) + "   ratio")
    for key in (
        "tasks",
        "snapshot_ms",
        "snapshot_bytes",
        "first_paint_ms",
        "page_ms",
        "filtered_page_ms",
        "render_ms",
    ):
        ratio = large[key] / small[key] if small[key] else float("nan")
        print(f"{key:18}" + "".join(f"{r[key]:>13}" for r in results) + f"   x{ratio:.2f}")


if __name__ == "__main__":
    main()
