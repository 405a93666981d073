"""The README as a newcomer uses it, and the links between the documents.

- A shell block of README.md marked runnable (the line ``<!-- runnable -->`` right before a
  `` ```sh `` block) runs for real in a temporary directory with this environment's ``bin`` first
  on ``PATH`` (what ``. .venv/bin/activate`` does) and ``CI=true``; it must exit 0.
- Every other shell command of README.md (each command of each line of a `` ```sh `` block,
  continuation lines joined, comments dropped) must start with an entry of :data:`COVERED`, which
  names the tests or CI step that exercise it, or be plain shell (:data:`PLAIN_SHELL`): an
  unverified command cannot be added silently. Every entry must still be used, and every test it
  names must exist.
- README.md stays at most 15,000 bytes: the reference lives in ``docs/``.
- Every TOML block of README.md and ``docs/*.md`` is an edgesched config that loads.
- Every relative link of README.md, CHANGELOG.md and ``docs/*.md`` points at a file of the
  repository, and at a heading of it when it names one.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgesched.config import parse_config

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_BYTES = 15_000
RUNNABLE = "<!-- runnable -->"
SHELL_LANGUAGES = frozenset({"sh", "bash", "shell", "console"})
BLOCK_TIMEOUT_S = 120

#: README commands not run by this test, by prefix (as :func:`commands` renders a command: its
#: words, unquoted, joined by one space), and what exercises each: a test file (optionally
#: ``::test_name``) or a CI step. The longest matching prefix wins.
COVERED: dict[str, tuple[str, ...]] = {
    "make demo": (".ci/run", "tests/test_demo.py"),  # make setup, then edgesched demo
    "make test": (".ci/run",),
    ". .venv/bin/activate": ("tests/test_readme.py::test_runnable_readme_block",),
    "mosquitto -p": (
        "tests/test_central_sync.py::test_partitioned_node_decides_alone_and_merges_at_central",
    ),
    "edgesched central run": (
        "tests/test_central_sync.py::test_partitioned_node_decides_alone_and_merges_at_central",
    ),
    "edgesched edge run": (
        "tests/test_central_sync.py::test_partitioned_node_decides_alone_and_merges_at_central",
    ),
    "export EDGESCHED_ADDR=": ("tests/test_fleetcli.py::test_the_operators_commands",),
    "edgesched run ": ("tests/test_fleetcli.py::test_the_operators_commands",),
    "edgesched logs ": ("tests/test_logs_central.py::test_logs_through_central",),
    "edgesched tasks": (
        "tests/test_fleetcli.py::test_the_operators_commands",
        "tests/test_task_lifecycle_fleet.py::test_every_task_shows_at_central_with_its_end",
    ),
    "edgesched edge submit": (
        "tests/test_bundle.py::test_bundle_installs_offline_and_the_node_runs",
    ),
    "edgesched edge status": (
        "tests/test_bundle.py::test_bundle_installs_offline_and_the_node_runs",
    ),
    "echo http://127.0.0.1:7300/dashboard/#token=$(cat state/central/api-token)": (
        "tests/test_dashboard.py::test_dashboard_in_chromium",
    ),
    # the broker stopped under a node that keeps deciding, then started again
    "kill %1": ("tests/test_central_sync.py::test_broker_restart_loses_nothing",),
    # a real gateway over TLS: broker init, the join server, add-node and the printed line
    "edgesched broker init": (
        "tests/test_join.py::test_a_gateway_joins_with_the_printed_line_and_a_removed_one_is_refused",
    ),
    "edgesched central join-server": (
        "tests/test_join.py::test_a_gateway_joins_with_the_printed_line_and_a_removed_one_is_refused",
    ),
    "edgesched central add-node": (
        "tests/test_join.py::test_a_gateway_joins_with_the_printed_line_and_a_removed_one_is_refused",
    ),
    "edgesched join ": (
        "tests/test_join.py::test_a_gateway_joins_with_the_printed_line_and_a_removed_one_is_refused",
    ),
    "edgesched fieldtest run --scenario isolate-node": (
        "tests/test_fieldtest.py::test_one_scenario_through_the_fault_proxy",
    ),
}
#: Commands that are plain shell, with nothing of edgesched to verify.
PLAIN_SHELL = frozenset({"cd", "mkdir"})

_FENCE = re.compile(
    r"^(?P<marker>[ \t]*<!--\s*runnable\s*-->[ \t]*\n)?"  # RUNNABLE on the line before
    r"```(?P<lang>[\w+-]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$",
    re.M | re.S,
)
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
_COMMAND_SEPARATORS = frozenset({"&&", "||", ";", "|", "&"})


def blocks(text: str) -> Iterator[tuple[str, bool, str]]:
    """Every fenced block of a Markdown text: (language, marked runnable, body)."""
    for match in _FENCE.finditer(text):
        yield match["lang"].lower(), match["marker"] is not None, match["body"]


def shell_blocks(text: str) -> list[tuple[bool, str]]:
    return [(runnable, body) for lang, runnable, body in blocks(text) if lang in SHELL_LANGUAGES]


def commands(body: str) -> list[str]:
    """The commands of a shell block, each as its words joined by one space."""
    found: list[str] = []
    for line in body.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars="&|;")
        lexer.whitespace_split = True
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token in _COMMAND_SEPARATORS:
                if words:
                    found.append(" ".join(words))
                words = []
            else:
                words.append(token)
    return found


def covering_prefix(command: str) -> str | None:
    """The longest prefix of COVERED that ``command`` starts with."""
    matches = [prefix for prefix in COVERED if command.startswith(prefix)]
    return max(matches, key=len) if matches else None


def coverage_of(command: str) -> tuple[str, ...] | None:
    """What exercises ``command``: its entry of COVERED, or plain shell; None if nothing."""
    if command.split()[0] in PLAIN_SHELL:
        return ("plain shell",)
    prefix = covering_prefix(command)
    return None if prefix is None else COVERED[prefix]


def _runnable_blocks() -> list[str]:
    return [body for runnable, body in shell_blocks(README.read_text()) if runnable]


def _block_id(body: str) -> str:
    first = commands(body)
    return first[0][:40] if first else "empty"


def test_the_readme_has_runnable_blocks() -> None:
    assert _runnable_blocks(), f"no shell block of README.md is marked {RUNNABLE}"


@pytest.mark.parametrize("body", _runnable_blocks(), ids=_block_id)
def test_runnable_readme_block(body: str, tmp_path: Path) -> None:
    """A block marked runnable exits 0, run as a newcomer would after activating .venv."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "edgesched").exists(), f"no edgesched console script in {bin_dir}"
    env = dict(os.environ)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(bin_dir.parent),
        CI="true",
    )
    script = tmp_path / "block.sh"
    script.write_text("set -eu -o pipefail\n" + body)
    done = subprocess.run(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    assert done.returncode == 0, (
        f"exit {done.returncode}\n--- block\n{body}--- stdout\n{done.stdout[-3000:]}"
        f"--- stderr\n{done.stderr[-3000:]}"
    )


def test_every_other_readme_command_names_what_exercises_it() -> None:
    unverified: list[str] = []
    used: set[str] = set()
    for runnable, body in shell_blocks(README.read_text()):
        if runnable:
            continue
        for command in commands(body):
            if coverage_of(command) is None:
                unverified.append(command)
            prefix = covering_prefix(command)
            if prefix is not None:
                used.add(prefix)
    assert not unverified, (
        "README commands that no test exercises (mark the block runnable, or add each to "
        f"COVERED with the test or CI step that runs it): {unverified}"
    )
    stale = sorted(set(COVERED) - used)
    assert not stale, f"COVERED entries no README command uses any more: {stale}"


def test_covered_names_tests_that_exist() -> None:
    missing: list[str] = []
    for verifiers in COVERED.values():
        for ref in verifiers:
            path, _, name = ref.partition("::")
            file = ROOT / path
            defined = re.compile(rf"^(?:async )?def {re.escape(name)}\(", re.M)
            if not file.is_file() or (name and not defined.search(file.read_text())):
                missing.append(ref)
    assert not missing, f"COVERED names tests or steps that do not exist: {missing}"


def test_commands_are_split_as_the_shell_reads_them() -> None:
    block = (
        ". .venv/bin/activate && mkdir -p /tmp/x && cd /tmp/x\n"
        "mosquitto -p 1884 &\n"
        'echo "http://h/#token=$T"   # a comment\n'
        'curl -s -X POST http://h/v1/tasks \\\n  -d \'{"id": "a"}\'\n'
    )
    assert commands(block) == [
        ". .venv/bin/activate",
        "mkdir -p /tmp/x",
        "cd /tmp/x",
        "mosquitto -p 1884",
        "echo http://h/#token=$T",
        'curl -s -X POST http://h/v1/tasks -d {"id": "a"}',
    ]
    assert coverage_of("make demo") == COVERED["make demo"]
    assert coverage_of("cd /tmp") == ("plain shell",)
    assert coverage_of("edgesched bundle --arch aarch64") is None


def test_the_readme_is_at_most_15000_bytes() -> None:
    size = len(README.read_bytes())
    assert size <= MAX_README_BYTES, (
        f"README.md is {size} bytes (at most {MAX_README_BYTES}): move reference into docs/"
    )


def documents() -> list[Path]:
    return [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize(
    "path", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name
)
def test_toml_snippets_are_configs_that_load(path: Path) -> None:
    for lang, _, body in blocks(path.read_text()):
        if lang == "toml":
            parse_config(tomllib.loads(body), f"{path.name}: {body.splitlines()[0]}")


def _prose(text: str) -> str:
    """Markdown without fenced blocks and inline code (no links or headings in there)."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for match in _HEADING.finditer(_FENCE.sub("", path.read_text())):
        base = slug(match[1])
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def test_slugs_as_github_makes_them() -> None:
    assert slug("Binding: leave `bindVerb` unset") == "binding-leave-bindverb-unset"
    assert slug("`edge.toml`") == "edgetoml"
    assert slug("2. The broker") == "2-the-broker"
    assert slug("Central's fan-in") == "centrals-fan-in"


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.name)
def test_relative_links_point_at_files_of_the_repository(path: Path) -> None:
    broken: list[str] = []
    for target in _LINK.findall(_prose(path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        file = (path.parent / file_part).resolve() if file_part else path
        if not file.is_relative_to(ROOT):
            broken.append(f"{target} (outside the repository)")
        elif not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no such heading in {file.name})")
    assert not broken, f"{path.relative_to(ROOT)}: {broken}"
