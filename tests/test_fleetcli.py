"""The operator's CLI (``edgesched run``, ``tasks``, ``task``, ``cancel``, ``nodes``) against a
real central and node over Mosquitto, as an operator types it (issue 14)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

from conftest import Broker, EdgeNode, central_and_nodes, edgesched_binary, until

from edgesched.ports import free_port


def cli(central: EdgeNode | None, *args: str, token: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    if central is not None:
        env["EDGESCHED_ADDR"] = central.url("")
        env["EDGESCHED_TOKEN"] = token or (central.state / "api-token").read_text().strip()
    return subprocess.run(
        [edgesched_binary(), *args], capture_output=True, text=True, timeout=60, env=env
    )


async def test_the_operators_commands(broker: Broker, tmp_path: Path) -> None:
    async with central_and_nodes(
        tmp_path, broker.port, {"gw-a": broker.port}, edge=lambda _n, _d: {"centrals": ["central"]}
    ) as (central, _nodes):

        def nodes_connected() -> bool:
            done = cli(central, "nodes", "--json")
            return done.returncode == 0 and [n["state"] for n in json.loads(done.stdout)] == [
                "connected"
            ]

        await until(nodes_connected, 30, "gw-a connected, as `edgesched nodes` says")
        table = await asyncio.to_thread(cli, central, "nodes")
        assert table.stdout.splitlines()[0].split() == ["ID", "STATE", "ARCH", "CLASS", "TASKS"]
        assert table.stdout.splitlines()[1].split()[:2] == ["gw-a", "connected"]

        # run: from flags, and from a TOML job file (a service)
        done = await asyncio.to_thread(
            cli, central, "run", "job", "--cpu", "0.05", "--mem-gib", "0.05", "--restart",
            "never", "--node", "gw-a", "--", "sh", "-c", "exit 7",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("job: placed on gw-a"), done.stdout
        job = tmp_path / "svc.toml"
        job.write_text(
            'command = ["sleep", "300"]\ncpu = 0.05\nmem_gib = 0.05\nrestart = "always"\n'
        )
        done = await asyncio.to_thread(cli, central, "run", "svc", "--file", str(job), "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["spec"]["restart"] == "always"

        def phases() -> dict[str, str] | None:
            done = cli(central, "tasks", "--json")
            got = {t["id"]: t["phase"] for t in json.loads(done.stdout)}
            return got if got == {"job": "failed", "svc": "running"} else None

        await until(phases, 30, "job failed, svc running, as `edgesched tasks` says")
        lines = (await asyncio.to_thread(cli, central, "tasks", "--phase", "failed")).stdout
        assert lines.splitlines()[1].split()[:4] == ["job", "failed", "gw-a", "7"], lines
        shown = await asyncio.to_thread(cli, central, "task", "job")
        assert "exit_code      7" in shown.stdout and "copy on gw-a: failed" in shown.stdout

        # cancel: the service stops; the finished job cannot be cancelled (a clear refusal)
        done = await asyncio.to_thread(cli, central, "cancel", "svc")
        assert done.returncode == 0 and done.stdout.strip() == "svc: cancelled", done.stdout
        refused = await asyncio.to_thread(cli, central, "cancel", "job")
        assert refused.returncode == 2 and "already finished (failed, exit code 7)" in (
            refused.stderr
        )
        history = await asyncio.to_thread(cli, central, "history", "--phase", "failed")
        assert history.stdout.splitlines()[1].split()[:6] == [
            "job", "failed", "gw-a", "7", "central", "default"
        ], history.stdout  # fmt: skip
        # an id beyond ASCII (word characters of any script are allowed) is quoted on the way
        done = await asyncio.to_thread(
            cli, central, "run", "caméra-7", "--cpu", "0.05", "--restart", "never", "--", "true"
        )
        assert done.returncode == 0, done.stderr
        shown = await asyncio.to_thread(cli, central, "task", "caméra-7", "--json")
        assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == "caméra-7", shown
        missing = await asyncio.to_thread(cli, central, "task", "nope")
        assert missing.returncode == 2 and "no task 'nope'" in missing.stderr
        wrong = await asyncio.to_thread(cli, central, "tasks", token="not-the-token")
        assert wrong.returncode == 2 and "401" in wrong.stderr

        # a context, as a kubeconfig's: set once, then no address or token on the line
        env = {k: v for k, v in os.environ.items() if not k.startswith("EDGESCHED_")}
        env["EDGESCHED_CONTEXT"] = str(tmp_path / "ctx" / "context.toml")

        def bare(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [edgesched_binary(), *args], capture_output=True, text=True, timeout=60, env=env
            )

        token_file = central.state / "api-token-read"
        done = await asyncio.to_thread(
            bare, "context", "set", "--addr", central.url(""), "--token-file", str(token_file)
        )
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "ctx" / "context.toml").stat().st_mode & 0o777 == 0o600
        shown = json.loads((await asyncio.to_thread(bare, "context", "show", "--json")).stdout)
        assert shown["addr"] == central.url("").rstrip("/")
        done = await asyncio.to_thread(bare, "tasks", "--json")
        assert done.returncode == 0
        assert {t["id"] for t in json.loads(done.stdout)} == {"job", "svc", "caméra-7"}
        (tmp_path / "ctx" / "context.toml").write_text("addr = 7\n")
        broken = await asyncio.to_thread(bare, "tasks")
        assert broken.returncode == 2 and "addr must be a non-empty string" in broken.stderr

    # central gone: one line naming the address
    port = free_port()
    env_addr = f"http://127.0.0.1:{port}"
    gone = await asyncio.to_thread(
        subprocess.run,
        [edgesched_binary(), "tasks", "--addr", env_addr, "--token", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert gone.returncode == 2 and f"cannot reach central at {env_addr}" in gone.stderr
    assert len(gone.stderr.strip().splitlines()) == 1
