"""Container images and per-architecture workload images.

The Dockerfiles are checked statically (this machine has the docker client but no daemon and
no registry access): stages, targets, non-root users, health checks, volumes, TARGETARCH, no
`latest`, and agreement with the install layout and the config defaults; a build runs only if
a daemon answers. Per-architecture images are followed from the task spec through the core,
central's placement, the executor (a real process) and a real edge node's API.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import EdgeNode, free_port, write_edge_config

from edgesched.central.placement import fleet_view, place
from edgesched.config import CentralConfig, ConfigError, EdgeConfig, parse_config
from edgesched.core.model import Arch, PowerModel, Resources, ServerClass, Task
from edgesched.core.policy import PolicyConfig
from edgesched.core.scheduler import ClusterView, schedule
from edgesched.core.task import SpecError, TaskSpec
from edgesched.edge.container import container_argv, image_for
from edgesched.edge.executor import Executor, ExecutorError, kill_leftovers
from edgesched.install import (
    DEFAULT_ETC_DIR,
    Role,
    config_name,
    executable,
    state_dir_name,
)
from edgesched.sync.schema import NodeView

REPO = Path(__file__).resolve().parent.parent
IMAGES = REPO / "images"
ARM = "registry.example/vision:1.4.0-arm64"
X86 = "registry.example/vision:1.4.0-amd64"


# --- a small Dockerfile reader ----------------------------------------------------------------


@dataclass
class Stage:
    name: str
    base: str
    platform: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, "a continuation runs off the end of the file"
    return out


def stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    """The global ARG defaults and the stages, in order."""
    args: dict[str, str] = {}
    found: list[Stage] = []
    for keyword, rest in instructions(text):
        if keyword == "FROM":
            words = rest.split()
            platform = words.pop(0).split("=", 1)[1] if words[0].startswith("--platform") else None
            assert len(words) == 3 and words[1].upper() == "AS", f"unnamed stage: FROM {rest}"
            found.append(Stage(words[2], words[0], platform))
        elif found:
            found[-1].instructions.append((keyword, rest))
        elif keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
    return args, found


def chain(all_stages: list[Stage], name: str) -> list[Stage]:
    """``name``'s stage and the stages it is built FROM, nearest first."""
    by_name = {s.name: s for s in all_stages}
    out = [by_name[name]]
    while out[-1].base in by_name:
        out.append(by_name[out[-1].base])
    return out


def resolved_base(base: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), base)


def check_pinned(image: str) -> None:
    """An explicit tag (or digest) that is not ``latest``."""
    name, _, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    assert ":" in last or digest, f"{image}: no tag"
    assert last.split(":", 1)[-1] != "latest", f"{image}: latest"


def last_user(stage_chain: list[Stage]) -> str:
    for stage in stage_chain:
        users = stage.all("USER")
        if users:
            return users[-1]
    return "root"


# --- the edgesched images -----------------------------------------------------------------------


def test_one_dockerfile_builds_edge_and_central_for_both_architectures() -> None:
    text = (IMAGES / "Dockerfile").read_text()
    args, all_stages = stages(text)
    names = [s.name for s in all_stages]
    assert names == ["wheel", "venv", "runtime", "central", "edge"]  # edge: the default target
    assert all_stages[0].platform == "$BUILDPLATFORM"  # the pure-Python wheel, built natively
    for stage in all_stages:
        if stage.base not in names:
            check_pinned(resolved_base(stage.base, args))
            assert stage.platform in (None, "$BUILDPLATFORM"), stage.name
    assert not re.search(r"\blatest\b", text)
    venv = all_stages[1]
    assert "TARGETARCH" in venv.all("ARG") and "TARGETPLATFORM" in venv.all("ARG")
    checks = " ".join(venv.all("RUN"))
    assert "${TARGETARCH}" in checks and "amd64)" in checks and "arm64)" in checks
    assert "--only-binary=:all:" in checks  # nothing compiled under emulation


@pytest.mark.parametrize("role", ["edge", "central"])
def test_each_role_runs_as_a_non_root_user_with_a_health_check_and_its_state_volume(
    role: Role,
) -> None:
    _, all_stages = stages((IMAGES / "Dockerfile").read_text())
    own = chain(all_stages, role)
    user = last_user(own)
    assert user.split(":")[0] not in ("root", "0"), user
    assert own[0].all("HEALTHCHECK"), "no health check"
    state = f"/var/lib/{state_dir_name(role)}"  # the same state dir as `edgesched install`
    assert own[0].all("VOLUME") == [json.dumps([state])]
    port = EdgeConfig().api_port if role == "edge" else CentralConfig().api_port
    assert own[0].all("EXPOSE") == [str(port)]
    cmd = json.loads(own[0].all("CMD")[-1])
    assert cmd == [role, "run", "--config", str(DEFAULT_ETC_DIR / config_name(role))]
    entry = json.loads(next(s.all("ENTRYPOINT")[-1] for s in own if s.all("ENTRYPOINT")))
    assert entry[-1] == str(executable())  # /opt/edgesched/current/bin/edgesched
    assert entry[0] == "/usr/bin/tini"  # PID 1 reaps the tasks the engine leaves behind


def test_the_image_holds_every_package_the_project_maps() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    _, all_stages = stages((IMAGES / "Dockerfile").read_text())
    copied = {args.split()[0] for args in all_stages[0].all("COPY")}
    assert folders <= copied, folders - copied
    lines = (IMAGES / "Dockerfile.dockerignore").read_text().splitlines()
    ignore = [ln for ln in lines if ln and not ln.startswith("#")]
    assert ignore[0] == "*"  # everything ignored but the sources
    assert {f"!{f}/" for f in folders} <= set(ignore)


def test_the_health_check_probes_a_real_edge_node(edge_node: EdgeNode) -> None:
    _, all_stages = stages((IMAGES / "Dockerfile").read_text())
    probe = json.loads(chain(all_stages, "edge")[0].all("HEALTHCHECK")[0].split(" CMD ", 1)[1])
    assert probe[:2] == ["python", "-c"]
    code = probe[2].replace("/var/lib/edgesched/", f"{edge_node.state}/")
    assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0
    dead = code.replace(f"{edge_node.state}/api-port", f"{edge_node.state}/nope")
    assert subprocess.run([sys.executable, "-c", dead], capture_output=True).returncode != 0


def test_the_workload_template_is_per_architecture() -> None:
    text = (IMAGES / "workloads" / "Dockerfile").read_text()
    args, all_stages = stages(text)
    assert [s.name for s in all_stages] == ["pick", "workload"]
    assert all_stages[0].platform == "$BUILDPLATFORM"  # copying binaries needs no emulation
    for stage in all_stages:
        if stage.base not in ("pick", "workload"):
            check_pinned(resolved_base(stage.base, args))
    assert not re.search(r"\blatest\b", text)
    pick = all_stages[0]
    assert "TARGETARCH" in pick.all("ARG")
    assert '"/dist/${TARGETARCH}/${APP}"' in " ".join(pick.all("RUN"))
    own = chain(all_stages, "workload")
    assert last_user(own).split(":")[0] not in ("root", "0")
    assert own[0].all("HEALTHCHECK") and own[0].all("VOLUME")


def test_the_example_task_names_an_image_per_architecture() -> None:
    spec = TaskSpec.from_json(json.loads((IMAGES / "workloads" / "example-task.json").read_text()))
    assert set(spec.images) == {Arch.ARM64, Arch.X86_64}
    assert spec.to_task(0).runs_on(Arch.ARM64) and spec.to_task(0).runs_on(Arch.X86_64)


def test_build_when_a_docker_daemon_answers(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client here")
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"no Docker daemon to build with (docker info: {reason})")
    done = subprocess.run(  # pragma: no cover - needs a daemon and the base images
        [docker, "build", "-f", str(IMAGES / "Dockerfile"), "--target", "edge",
         "-t", "edgesched-edge:test", str(REPO)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


# --- per-architecture images: spec, core, central -------------------------------------------


def test_the_spec_carries_and_checks_images() -> None:
    body = {"id": "v", "command": ["run"], "images": {"arm64": ARM, "x86_64": X86}}
    spec = TaskSpec.from_json(body)
    assert spec.images == {Arch.ARM64: ARM, Arch.X86_64: X86}
    assert spec.to_json()["images"] == {"arm64": ARM, "x86_64": X86}
    assert TaskSpec.from_json(spec.to_json()) == spec
    assert spec.to_task(0).images == spec.images
    # without images the field is not written: an older release reading it refuses unknowns
    assert "images" not in TaskSpec.from_json({"id": "v", "command": ["run"]}).to_json()
    for good in ("alpine", "alpine:3.19", "localhost:5000/a/b_c:v1.0-rc.1",
                 "ghcr.io/org/img@sha256:" + "a" * 64, "a__b/c--d.e"):  # fmt: skip
        TaskSpec.from_json({**body, "images": {"arm64": good}})
    bad: list[tuple[Any, str]] = [
        ({"sparc": "alpine"}, "images.sparc: unknown architecture"),
        ({"arm64": "Alpine"}, "images.arm64: not an image reference"),
        ({"arm64": "alpine:"}, "images.arm64: not an image reference"),
        ({"arm64": "alpine latest"}, "images.arm64: not an image reference"),
        ({"arm64": "alpine\n"}, "images.arm64: not an image reference"),
        ({"arm64": "a" * 256}, "at most 255 characters"),
        ({"arm64": 3}, "images.arm64: expected a string"),
        (["alpine"], "images: expected an object"),
    ]
    for images, message in bad:
        with pytest.raises(SpecError, match=re.escape(message)):
            TaskSpec.from_json({**body, "images": images})


POWER = PowerModel(idle_w=60, peak_w=200, parked_w=8, wake_latency_s=45)


def test_the_core_places_a_task_only_where_it_has_an_image() -> None:
    from edgesched.core.model import Node

    x86 = Node("x86", Arch.X86_64, ServerClass.GENERAL, Resources(32, 64), POWER)
    arm = Node("arm", Arch.ARM64, ServerClass.GENERAL, Resources(8, 16), POWER)
    arm_only = TaskSpec.from_json({"id": "v", "command": ["run"], "images": {"arm64": ARM}})
    task: Task = arm_only.to_task(0.0)
    both = schedule(ClusterView((x86, arm)), [task], PolicyConfig())
    assert [(d.task_id, d.node_id) for d in both.decisions] == [("v", "arm")]
    only_x86 = schedule(ClusterView((x86,)), [task], PolicyConfig())
    assert not only_x86.decisions
    assert "wrong architecture or no image" in only_x86.waiting["v"]


def test_central_places_an_arm_only_image_on_the_arm_node() -> None:
    reg = {"site": "s", "server_class": "general", "cpu": 8.0, "mem_gib": 16.0, "accel": 0,
           "perf": 1.0, "power": {"idle_w": 60.0, "peak_w": 200.0, "parked_w": 8.0,
                                  "wake_latency_s": 45.0}}  # fmt: skip
    docs = {
        "big-x86": {"node": {"registration": {**reg, "arch": "x86_64", "cpu": 64.0}}, "tasks": {}},
        "small-arm": {"node": {"registration": {**reg, "arch": "arm64"}}, "tasks": {}},
    }
    views = {node_id: NodeView.from_content(content) for node_id, content in docs.items()}
    view = fleet_view(views, {"big-x86": "online", "small-arm": "online"}, 0.0)
    assert view.unusable == {}
    arm_only = TaskSpec.from_json({"id": "v", "command": ["run"], "images": {"arm64": ARM}})
    assert place(arm_only, view, PolicyConfig()).node_id == "small-arm"
    pinned = place(arm_only, view, PolicyConfig(), pin="big-x86")
    assert pinned.node_id is None and "no image" in pinned.reason


# --- per-architecture images: on the node -------------------------------------------------------


def test_container_argv() -> None:
    spec = TaskSpec.from_json({
        "id": "cam-7", "command": ["--camera", "7"], "cpu": 1.5, "env": {"TOKEN": "s3cret"},
        "limits": {"memory_mb": 512}, "images": {"arm64": ARM},
    })  # fmt: skip
    argv = container_argv("docker", spec, ARM, cores=[3, 2])
    assert argv == (
        "docker", "run", "--rm", "--init", "--name", "edgesched-cam-7", "--cpus", "1.5",
        "--memory", "512m", "--cpuset-cpus", "2,3", "-e", "EDGESCHED_ARCH",
        "-e", "EDGESCHED_IMAGE", "-e", "TOKEN", "--label", "edgesched.task=cam-7",
        ARM, "--camera", "7",
    )  # fmt: skip
    assert "s3cret" not in " ".join(argv)  # values come from the environment, not argv
    podman = container_argv("/usr/bin/podman", spec, ARM)
    assert "--replace" in podman and "--cpuset-cpus" not in podman
    assert image_for(spec, Arch.ARM64) == ARM
    assert image_for(TaskSpec(id="n", command=("x",)), Arch.ARM64) is None


def test_container_runtime_config() -> None:
    assert parse_config({}).edge.container_runtime == ""  # none: commands run as they are
    for ok in ("docker", "podman", "/usr/local/bin/nerdctl"):
        assert parse_config({"edge": {"container_runtime": ok}}).edge.container_runtime == ok
    with pytest.raises(ConfigError, match="container_runtime must be docker, podman or an"):
        parse_config({"edge": {"container_runtime": "dockr"}})


def fake_runtime(tmp_path: Path) -> Path:
    """A stand-in for the docker CLI (no daemon here): it records its argv and the
    environment names it was asked to pass, then runs the command after the image."""
    script = tmp_path / "fake-docker"
    record = tmp_path / "runtime-argv.json"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "argv = sys.argv[1:]\n"
        "names = [argv[i + 1] for i, a in enumerate(argv) if a == '-e']\n"
        "env = {n: os.environ.get(n) for n in names}\n"
        f"open({str(record)!r}, 'w').write(json.dumps({{'argv': argv, 'env': env}}))\n"
    )
    script.chmod(0o755)
    return script


def run_task(ex: Executor, spec: TaskSpec) -> str:
    """Start ``spec``, wait for its exit, return its log."""

    async def go() -> str:
        handle = await ex.start(spec)
        async for event in ex.exits():
            if event.task_id == spec.id:
                break
        await ex.aclose()
        return handle.log_path.read_text()

    return asyncio.run(asyncio.wait_for(go(), 30))


def test_the_executor_runs_the_node_s_image(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    spec = TaskSpec.from_json({
        "id": "v1", "command": ["sh", "-c", "echo image=$EDGESCHED_IMAGE arch=$EDGESCHED_ARCH"],
        "images": {"arm64": ARM, "x86_64": X86}, "env": {"TOKEN": "s3cret"},
    })  # fmt: skip
    try:
        # no runtime: the command runs as it is, told which image is its architecture's
        log = run_task(Executor(run_dir, cgroup_parent=None, arch=Arch.ARM64), spec)
        assert log.strip() == f"image={ARM} arch=arm64"
        # a runtime: it is asked to run the image, with the environment passed by name
        runtime = fake_runtime(tmp_path)
        ex = Executor(run_dir, cgroup_parent=None, arch=Arch.X86_64, container_runtime=str(runtime))
        run_task(ex, spec)
        seen = json.loads((tmp_path / "runtime-argv.json").read_text())
        assert seen["argv"][:6] == ["run", "--rm", "--init", "--name", "edgesched-v1", "--cpus"]
        assert seen["argv"][-4:] == [X86, *spec.command]
        assert seen["env"] == {"EDGESCHED_ARCH": "x86_64", "EDGESCHED_IMAGE": X86,
                               "TOKEN": "s3cret"}  # fmt: skip
        # no image for this architecture, or no runtime binary: refused before spawning
        arm_only = TaskSpec.from_json({"id": "v2", "command": ["true"], "images": {"arm64": ARM}})

        async def refused(ex: Executor, spec: TaskSpec) -> str:
            with pytest.raises(ExecutorError) as err:
                await ex.start(spec)
            return str(err.value)

        x86 = Executor(run_dir, cgroup_parent=None, arch=Arch.X86_64)
        assert "v2: no image for x86_64 (it has images for arm64)" in asyncio.run(
            refused(x86, arm_only)
        )
        missing = Executor(run_dir, cgroup_parent=None, arch=Arch.ARM64,
                           container_runtime="/nonexistent/docker")  # fmt: skip
        assert "not found" in asyncio.run(refused(missing, arm_only))
        assert not (run_dir / "v2.pid").exists()
    finally:
        kill_leftovers([run_dir])


def test_a_real_node_refuses_a_task_without_its_image_and_runs_one_with_it(
    tmp_path: Path,
) -> None:
    runtime = fake_runtime(tmp_path)
    config, state = write_edge_config(tmp_path, free_port(), container_runtime=str(runtime))
    node = EdgeNode(config, state, tmp_path / "edge.log")
    node.start()
    try:
        status, _ = node.get("/v1/status")
        assert status == 200
        here = "x86_64" if os.uname().machine in ("x86_64", "amd64") else "arm64"
        other = "arm64" if here == "x86_64" else "x86_64"
        body = {"id": "elsewhere", "command": ["--serve"], "images": {other: ARM}, "cpu": 0.1}
        status, problem = node.request("POST", "/v1/tasks", body)
        assert (status, problem["field"]) == (422, "images"), problem
        assert f"this node is {here}" in problem["detail"]
        bad = {"id": "bad", "command": ["x"], "images": {here: "Not/An:Image:"}}
        status, problem = node.request("POST", "/v1/tasks", bad)
        assert (status, problem["field"]) == (400, f"images.{here}"), problem
        # the command is the container's: "--serve" is no program on this node, and need not be
        body = {"id": "here", "command": ["--serve"], "images": {here: X86}, "cpu": 0.1}
        status, record = node.request("POST", "/v1/tasks", body)
        assert status == 201, record
        record_path = tmp_path / "runtime-argv.json"
        node.wait(lambda: record_path.exists(), what="the runtime was run")
        seen = json.loads(record_path.read_text())
        assert seen["argv"][-2:] == [X86, "--serve"] and "edgesched-here" in seen["argv"]
        assert node.tasks()["here"]["spec"]["images"] == {here: X86}
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.kill()
        kill_leftovers([state / "run"])
