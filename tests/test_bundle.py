"""`edgesched bundle` for real: a bundle built for this machine is unpacked and installed, as a
new user would, inside a network namespace where nothing is reachable (checked), into a fresh
prefix with a fresh virtual environment; the node then starts from the installed release,
answers its health endpoint and runs a task, all offline. Tampered and wrong-architecture
bundles are refused by install.sh. A bundle for aarch64 is built (not installed) to prove
cross-architecture downloads. Dependencies without wheels are turned into wheels when they are
pure Python and refused by name when they are not (local sources, no index needed for them).

Needs root for the namespace (CI runs as root) and a package index for the wheels (pip's
configured one; PyPI in CI)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import edgesched_binary, free_port, kill_task_processes, write_edge_config

from edgesched.bundle import (
    BundleError,
    build_bundle,
    host_arch,
    platform_tags,
    read_manifest,
    verify_bundle,
)

REPO = Path(__file__).resolve().parents[1]
# The interpreter a fresh gateway has: the system's python3, not a pyenv shim or our venv.
TARGET_PY = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")


def _target_version() -> str | None:
    if TARGET_PY is None:
        return None
    out = subprocess.run(
        [TARGET_PY, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or None


PYVER = _target_version()


def _clean_env(home: Path) -> dict[str, str]:
    """What a new user's shell has: no PIP_* settings, no virtualenv, the system's PATH."""
    home.mkdir(parents=True, exist_ok=True)
    assert TARGET_PY is not None
    return {"PATH": f"{Path(TARGET_PY).parent}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def _bundle_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [edgesched_binary(), "bundle", *args], capture_output=True, text=True, cwd=cwd, check=False
    )


@pytest.fixture(scope="module")
def host_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tarball `edgesched bundle --tar` builds for this machine, unpacked with tar."""
    if PYVER is None:
        pytest.skip("no system python3 to install with")
    out = tmp_path_factory.mktemp("dist")
    started = time.monotonic()
    done = _bundle_cli(
        "--arch", host_arch(), "--python", PYVER, "--out", str(out), "--tar", cwd=out
    )
    assert done.returncode == 0, done.stderr
    print(f"host bundle built in {time.monotonic() - started:.1f} s")
    tarball = Path(done.stdout.strip())
    assert tarball.name == f"edgesched-{_version()}-{host_arch()}-py{PYVER}.tar.gz"
    sha = (out / (tarball.name + ".sha256")).read_text().split()[0]
    assert sha == _sha256(tarball)
    subprocess.run(["tar", "-xzf", str(tarball), "-C", str(out)], check=True)
    unpacked = out / tarball.name.removesuffix(".tar.gz")
    assert (unpacked / "install.sh").stat().st_mode & 0o111
    return unpacked


@pytest.fixture(scope="module")
def arm_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An aarch64 bundle, built on this (x86_64) machine."""
    if host_arch() == "aarch64":
        pytest.skip("the host is aarch64: the cross-arch bundle would be x86_64's, not covered")
    if not _pypi_reachable():
        pytest.skip("PyPI is unreachable: cannot download aarch64 wheels")
    out = tmp_path_factory.mktemp("dist-arm")
    done = _bundle_cli("--arch", "aarch64", "--python", "3.11", "--out", str(out), cwd=out)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def _version() -> str:
    from edgesched.version import __version__

    return __version__


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace with only a loopback: nothing outside is reachable from it."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("an offline network namespace needs root and iproute2")
    name = f"es-bundle-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _in(ns: str, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``argv`` inside the namespace, with only ``env``, from the home folder (not this
    checkout, whose edgesched/ would shadow the installed one for ``python -c``)."""
    return subprocess.run(
        ["ip", "netns", "exec", ns, "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
        cwd=env["HOME"],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )


def test_bundle_installs_offline_and_the_node_runs(
    host_bundle: Path, netns: str, tmp_path: Path
) -> None:
    env = _clean_env(tmp_path / "home")
    assert TARGET_PY is not None

    # The namespace really is offline: no route, no name resolution, and pip cannot fetch.
    probe = "import socket; socket.create_connection(('151.101.0.223', 443), timeout=3)"
    offline = _in(netns, [TARGET_PY, "-c", probe], env)
    assert offline.returncode != 0 and "unreachable" in offline.stderr.lower(), offline.stderr
    fetch = _in(
        netns,
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--isolated",
            "--no-cache-dir",
            "--retries=0",
            "--timeout=3",
            "--index-url=https://pypi.org/simple",
            "-d",
            str(tmp_path / "dl"),
            "six",
        ],
        env,
    )
    assert fetch.returncode != 0, fetch.stdout
    assert not (tmp_path / "dl").exists() or not any((tmp_path / "dl").iterdir())

    prefix = tmp_path / "opt" / "edgesched"
    started = time.monotonic()
    done = _in(
        netns, ["sh", str(host_bundle / "install.sh"), "--prefix", str(prefix), "--no-service"], env
    )
    took = time.monotonic() - started
    print(f"offline install took {took:.1f} s\n{done.stdout}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "files verified (sha256)" in done.stdout
    version = read_manifest(host_bundle)["version"]
    assert os.readlink(prefix / "current") == f"releases/{version}"
    release = prefix / "releases" / version
    # A real install inside the release, not a link back to this checkout.
    where = subprocess.run(
        [str(release / "bin" / "python"), "-c", "import edgesched; print(edgesched.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=env["HOME"],
    ).stdout.strip()
    assert where.startswith(str(release)), where
    assert json.loads((release / ".edgesched-release.json").read_text())["version"] == version

    # Again, now with the service step: the release is reused, and the arguments install.sh
    # does not know go to `edgesched install` (a dry run staged under a scratch root here).
    done = _in(netns, ["sh", str(host_bundle / "install.sh"), "--prefix", str(prefix),
                       "--node-id", "gw-bundle", "--broker", "127.0.0.1", "--dry-run",
                       "--root", str(tmp_path / "root")],
               env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"release {version} is already installed" in done.stdout
    assert (
        f"edgesched install --prefix {prefix} --node-id gw-bundle --broker 127.0.0.1 --dry-run"
        in done.stdout
    )
    assert f"ExecStart={prefix}/current/bin/edgesched edge run" in done.stdout, done.stdout
    assert not (tmp_path / "root").exists()  # a dry run writes nothing

    # The node starts from the installed release, offline (no broker anywhere), and works.
    config, state = write_edge_config(tmp_path, free_port())
    exe = str(prefix / "current" / "bin" / "edgesched")
    log = (tmp_path / "edge.log").open("ab")
    argv = ["ip", "netns", "exec", netns, exe, "edge", "run", "--config", str(config)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, cwd=env["HOME"])
    try:
        health = (
            "import urllib.request, sys; p = open(sys.argv[1]).read().strip();"
            "print(urllib.request.urlopen(f'http://127.0.0.1:{p}/v1/health', timeout=3).status)"
        )
        deadline = time.monotonic() + 60
        answered = None
        while time.monotonic() < deadline and proc.poll() is None:
            if (state / "api-port").exists():
                answered = _in(
                    netns,
                    [str(release / "bin" / "python"), "-c", health, str(state / "api-port")],
                    env,
                )
                if answered.stdout.strip() == "200":
                    break
            time.sleep(0.3)
        print(f"node healthy {time.monotonic() - started:.1f} s after its start")
        assert answered is not None and answered.stdout.strip() == "200", (
            tmp_path / "edge.log"
        ).read_text()[-3000:]
        marker = tmp_path / "ran-offline"
        submit = _in(
            netns,
            [
                exe,
                "edge",
                "submit",
                "-c",
                str(config),
                "--id",
                "hello",
                "--restart",
                "never",
                "--cpu",
                "0.5",
                "--",
                "/bin/sh",
                "-c",
                f"echo offline > {marker}",
            ],
            env,
        )
        assert submit.returncode == 0, submit.stderr
        deadline = time.monotonic() + 30
        listing = ""
        while time.monotonic() < deadline:
            listing = _in(netns, [exe, "edge", "tasks", "-c", str(config)], env).stdout
            if re.search(r"^hello\s+exited", listing, re.M):
                break
            time.sleep(0.3)
        assert re.search(r"^hello\s+exited", listing, re.M), listing
        assert marker.read_text() == "offline\n"
        status = json.loads(_in(netns, [exe, "edge", "status", "-c", str(config)], env).stdout)
        assert status["broker_connected"] is False and status["tasks"] == {"exited": 1}
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
        kill_task_processes(state)
        shutil.rmtree(prefix, ignore_errors=True)  # a release is ~300 MB
    assert proc.returncode == 0, (tmp_path / "edge.log").read_text()[-3000:]


def _copy(bundle: Path, to: Path) -> Path:
    shutil.copytree(bundle, to, symlinks=True)
    return to


def test_tampered_or_padded_bundle_is_refused(host_bundle: Path, tmp_path: Path) -> None:
    env = _clean_env(tmp_path / "home")
    prefix = tmp_path / "opt"
    tampered = _copy(host_bundle, tmp_path / "tampered")
    wheel = next(p for p in sorted((tampered / "wheels").glob("*.whl")) if "numpy" in p.name)
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit
    wheel.write_bytes(bytes(data))
    done = subprocess.run(
        ["sh", str(tampered / "install.sh"), "--prefix", str(prefix), "--no-service"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 1
    assert f"wheels/{wheel.name}: sha256 does not match manifest.json" in done.stderr
    assert not (prefix / "releases").exists()  # refused before anything was written
    with pytest.raises(BundleError, match="sha256 differs"):
        verify_bundle(tampered)

    padded = _copy(host_bundle, tmp_path / "padded")
    shutil.copy(wheel, padded / "wheels" / "numpy-99.0-py3-none-any.whl")
    done = subprocess.run(
        ["sh", str(padded / "install.sh"), "--prefix", str(prefix)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 1
    assert "not listed in manifest.json" in done.stderr and "numpy-99.0" in done.stderr
    assert not (prefix / "releases").exists()

    verify_bundle(host_bundle)  # the original still checks out


def test_aarch64_bundle_is_built_here_and_refused_on_x86_64(arm_bundle: Path) -> None:
    manifest = verify_bundle(arm_bundle)
    assert manifest["arch"] == "aarch64" and manifest["python"] == "3.11"
    wheels = [p.name for p in (arm_bundle / "wheels").glob("*.whl")]
    native = [w for w in wheels if not w.endswith("-any.whl")]
    assert native and all("aarch64" in w for w in native), native
    for dep in ("numpy", "onnxruntime", "pycrdt", "cryptography", "psutil"):
        assert any(w.lower().startswith(dep) and "aarch64" in w for w in wheels), dep
    done = subprocess.run(
        ["sh", str(arm_bundle / "install.sh"), "--prefix", "/nonexistent"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "this bundle is for aarch64 but this machine is x86_64" in done.stderr
    assert "edgesched bundle --arch x86_64" in done.stderr


def test_platform_tags_and_bad_options() -> None:
    tags = platform_tags("aarch64", "2.28")
    assert tags[0] == "manylinux_2_28_aarch64" and "manylinux2014_aarch64" in tags
    assert "manylinux_2_29_aarch64" not in tags and "manylinux1_aarch64" not in tags
    assert "manylinux1_x86_64" in platform_tags("x86_64", "2.17")
    for kwargs, message in [
        ({"arch": "sparc", "python": "3.11"}, "--arch: one of x86_64, aarch64"),
        ({"arch": "x86_64", "python": "2.7"}, "--python"),
        ({"arch": "x86_64", "python": "3.11", "glibc": "2.5"}, "--glibc"),
        ({"arch": "x86_64", "python": "3.11", "version": "not a version"}, "--set-version"),
    ]:
        with pytest.raises(BundleError, match=re.escape(message)):
            build_bundle(out=Path("/nonexistent/never-written"), source=REPO, **kwargs)  # type: ignore[arg-type]


# -- dependencies without wheels ------------------------------------------------------------


def _sdist(where: Path, name: str, *, native: bool) -> None:
    """A source distribution of ``name`` 1.0; ``native`` makes it build a platform wheel
    (as a C extension would) without needing a compiler."""
    root = where / "src" / f"{name}-1.0"
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "1.0"\n'
        f'[tool.setuptools]\npy-modules = ["{name.replace("-", "_")}"]\n'
    )
    (root / f"{name.replace('-', '_')}.py").write_text("VALUE = 1\n")
    if native:
        (root / "setup.py").write_text(
            "from setuptools import setup\nfrom setuptools.dist import Distribution\n\n"
            "class Binary(Distribution):\n    def has_ext_modules(self):\n        return True\n\n"
            "setup(distclass=Binary)\n"
        )
    with tarfile.open(where / f"{name.replace('-', '_')}-1.0.tar.gz", "w:gz") as tf:
        tf.add(root, arcname=root.name)


def _project_wheel(where: Path, requires: list[str]) -> Path:
    """A minimal edgesched wheel that needs ``requires`` (``--wheel`` takes it as it is):
    what matters here is how its dependencies are fetched, not its code."""
    wheel = where / "edgesched-0.0.0-py3-none-any.whl"
    info = "edgesched-0.0.0.dist-info"
    meta = "Metadata-Version: 2.1\nName: edgesched\nVersion: 0.0.0\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{info}/METADATA", meta)
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def test_pure_python_sources_become_wheels_and_native_ones_are_refused(tmp_path: Path) -> None:
    links = tmp_path / "links"
    links.mkdir()
    _sdist(links, "edgesched-probe-pure", native=False)
    _sdist(links, "edgesched-probe-native", native=True)

    pure = _project_wheel(tmp_path, ["edgesched-probe-pure"])
    result = build_bundle(
        arch=host_arch(), python="3.11", out=tmp_path / "out", wheel=pure, find_links=[links]
    )
    manifest = verify_bundle(result.path)
    assert manifest["built_from_source"] == ["edgesched_probe_pure-1.0-py3-none-any.whl"]
    with zipfile.ZipFile(result.path / "wheels" / manifest["built_from_source"][0]) as zf:
        assert "edgesched_probe_pure.py" in zf.namelist()
    assert result.wheels == 2  # edgesched and the probe: nothing else was asked for

    native = _project_wheel(tmp_path / "out", ["edgesched-probe-native"])
    with pytest.raises(BundleError) as refused:
        build_bundle(
            arch="aarch64", python="3.11", out=tmp_path / "out2", wheel=native, find_links=[links]
        )
    message = str(refused.value)
    assert "edgesched-probe-native" in message and "platform-specific" in message, message
    assert not (tmp_path / "out2" / "edgesched-0.0.0-aarch64-py3.11").exists()


def test_cli_refuses_a_missing_source_clearly(tmp_path: Path) -> None:
    done = _bundle_cli(
        "--arch", "x86_64", "--source", str(tmp_path), "--out", str(tmp_path), cwd=tmp_path
    )
    assert done.returncode == 1
    assert "error:" in done.stderr and "pyproject.toml" in done.stderr
    assert "Traceback" not in done.stderr
