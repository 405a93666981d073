"""Per-architecture workload images on a node: which image a task runs, and how.

Role: the article's per-architecture images. A task spec may name one image per architecture
(``TaskSpec.images``, validated in :mod:`edgesched.core.task`); the core places such a task
only on a node whose architecture has one (``Task.runs_on``). On the node, the executor asks
this module what to run:

* the image is ``images[<this node's architecture>]``; a task with images but none for this
  node is refused (:class:`NoImage`), it never runs the wrong architecture's binary;
* with ``[edge] container_runtime`` set (``docker``, ``podman`` or a path), the command runs
  inside the image: ``<runtime> run --rm --init --name edgesched-<task id> --cpus <cpu>
  [--memory <MB>m] [--cpuset-cpus <cores>] -e KEY... <image> <command...>``. The runtime
  client is the task's process, so the executor's stop (SIGTERM to its group) reaches the
  container through the client's signal proxy; the task's environment is passed by name
  (``-e KEY``), so values never show in ``ps``;
* without a runtime the command runs on the node as it is, with ``EDGESCHED_IMAGE`` (the
  reference) and ``EDGESCHED_ARCH`` in its environment: a node without containers (a small
  gateway) can still pick the right architecture's artifact from it.

Limits: CPU pinning changed after the start (``Executor.pin``) reaches the runtime client, not
a running container; a container whose client was SIGKILLed keeps running in the runtime's
daemon (podman's ``--replace`` lets the next start take its name; with docker it must be
removed by hand).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from edgesched.core.model import Arch
from edgesched.core.task import TaskSpec

#: Environment of a task with images: the reference and the node's architecture.
IMAGE_ENV = "EDGESCHED_IMAGE"
ARCH_ENV = "EDGESCHED_ARCH"


class NoImage(ValueError):
    """The task names images, but none for this node's architecture."""


def image_for(spec: TaskSpec, arch: Arch) -> str | None:
    """The image ``spec`` runs on ``arch``: None when it names no images at all, NoImage when
    it names some but not this architecture's."""
    if not spec.images:
        return None
    image = spec.images.get(arch)
    if image is None:
        have = ", ".join(sorted(a.value for a in spec.images))
        raise NoImage(f"no image for {arch.value} (it has images for {have})")
    return image


def image_env(image: str, arch: Arch) -> dict[str, str]:
    return {IMAGE_ENV: image, ARCH_ENV: arch.value}


def container_name(task_id: str) -> str:
    """``edgesched-<task id>``: task ids are letters, digits, ``-``, ``_`` and ``.``, which
    docker and podman accept in names."""
    return f"edgesched-{task_id}"


def container_argv(
    runtime: str,
    spec: TaskSpec,
    image: str,
    *,
    cores: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """The command that runs ``spec`` in ``image`` with ``runtime`` (docker or podman CLI).

    ``env``: the names passed into the container (their values come from the client's own
    environment); the task's ``env``, ``EDGESCHED_IMAGE`` and ``EDGESCHED_ARCH`` by default.
    """
    argv = [runtime, "run", "--rm", "--init", "--name", container_name(spec.id)]
    if runtime.rsplit("/", 1)[-1] == "podman":
        argv.append("--replace")  # a container left by a SIGKILLed client gives its name up
    argv += ["--cpus", f"{spec.cpu:g}"]
    if spec.limits.memory_mb is not None:
        argv += ["--memory", f"{spec.limits.memory_mb}m"]
    if cores:
        argv += ["--cpuset-cpus", ",".join(str(c) for c in sorted(set(cores)))]
    names = sorted(env) if env is not None else sorted({*spec.env, IMAGE_ENV, ARCH_ENV})
    for name in names:
        argv += ["-e", name]
    argv += ["--label", f"edgesched.task={spec.id}", image, *spec.command]
    return tuple(argv)
