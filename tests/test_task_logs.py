"""A task's output at the node (issue 14): ``GET /v1/tasks/{id}/logs`` (the last lines, then
follow) and ``edgesched edge logs``, against a real edge node process."""

from __future__ import annotations

import subprocess
import time

from conftest import EdgeNode, edgesched_binary


def submit(node: EdgeNode, task_id: str, script: str) -> None:
    body = {"id": task_id, "command": ["sh", "-c", script], "cpu": 0.05, "mem_gib": 0.05,
            "restart": "never"}  # fmt: skip
    code, reply = node.request("POST", "/v1/tasks", body)
    assert code == 201, reply


def wait_state(node: EdgeNode, task_id: str, state: str) -> None:
    node.wait(lambda: node.tasks().get(task_id, {}).get("state") == state, 20, f"{task_id} {state}")


def logs(node: EdgeNode, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [edgesched_binary(), "edge", "logs", "-c", str(node.config), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_last_lines_of_a_tasks_output(edge_node: EdgeNode) -> None:
    submit(edge_node, "talk", "for i in 1 2 3 4 5; do echo out$i; done; echo err >&2")
    wait_state(edge_node, "talk", "exited")
    code, text = edge_node.get("/v1/tasks/talk/logs?tail=2")
    assert code == 200 and text == "out5\nerr\n", text
    code, text = edge_node.get("/v1/tasks/talk/logs")
    assert code == 200 and text.splitlines() == ["out1", "out2", "out3", "out4", "out5", "err"]
    assert edge_node.get("/v1/tasks/talk/logs?tail=0")[1] in ("", None)
    code, problem = edge_node.get("/v1/tasks/nope/logs")
    assert code == 404 and problem["field"] == "id"
    code, problem = edge_node.get("/v1/tasks/talk/logs?tail=-1")
    assert code == 400 and problem["field"] == "tail"
    done = logs(edge_node, "talk", "--tail", "3")
    assert done.returncode == 0 and done.stdout == "out4\nout5\nerr\n", done
    missing = logs(edge_node, "nope")
    assert missing.returncode == 2 and "no task 'nope'" in missing.stderr


def test_following_a_task_until_it_finishes(edge_node: EdgeNode) -> None:
    submit(edge_node, "slow", "echo start; sleep 1; echo middle; sleep 1; echo end")
    wait_state(edge_node, "slow", "running")
    start = time.monotonic()
    done = logs(edge_node, "slow", "-f")
    took = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["start", "middle", "end"], done.stdout
    assert 0.5 < took < 30  # it waited for the task, and ended when the task did
