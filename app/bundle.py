"""``edgesched bundle``: an offline install bundle for a gateway's architecture and Python.

Role: build, on a machine with a package index, a directory (or tarball) that installs
edgesched on a gateway with no network at all::

    edgesched-<version>-<arch>-py<python>/
      install.sh      POSIX sh; checks the machine, verifies every file, installs a release
      README.txt      what install.sh does and its options
      manifest.json   version, arch, python, glibc floor, platform tags, sha256 of every file
      wheels/         the project wheel and every runtime dependency as a wheel

How it is built:

* the project wheel comes from the source tree (``pip wheel --no-deps`` of a staged copy:
  only the package folders, pyproject.toml and README.md, so nothing else in the checkout
  leaks in; ``version`` overrides the version in that copy, the checkout is never touched),
  or from a wheel given as is;
* the runtime dependencies (the wheel's ``Requires-Dist``, no extras) are resolved by
  ``pip download --only-binary=:all:`` with the target's platform tags (manylinux up to the
  glibc floor), ``--python-version``, ``--implementation cp`` and ``--abi``;
* a dependency published only as a source distribution is downloaded as source and turned
  into a wheel here, *if* that wheel is pure Python (``py3-none-any``: the same on every
  platform); one that builds a platform-specific wheel is refused with its name, because a
  wheel built on this machine would not run on the target.

``install.sh`` (generated from :data:`INSTALL_SH`) installs into ``<prefix>/releases/<version>``
(the layout of :mod:`edgesched.install`), switches ``<prefix>/current`` atomically and then
runs ``edgesched install`` from the new release with the arguments it did not recognise. It
ignores the machine's pip configuration and never asks an index (``--no-index``).

Limit: pip evaluates environment markers of dependencies (``; platform_machine == ...``)
against the machine that builds the bundle, not the target; the install on the target is the
proof, and it fails loudly (pip names the missing requirement) rather than half-installing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import Any, Final

from edgesched.install import DEFAULT_PREFIX
from edgesched.version import __version__

__all__ = [
    "ARCHES",
    "BundleError",
    "BundleResult",
    "build_bundle",
    "bundle_name",
    "host_arch",
    "platform_tags",
    "project_source",
    "read_manifest",
    "verify_bundle",
]

ARCHES: Final = ("x86_64", "aarch64")
#: The oldest glibc the wheels may need, by default: Debian 10, Ubuntu 18.10, RHEL 8.
DEFAULT_GLIBC: Final = "2.28"
MANIFEST: Final = "manifest.json"
FORMAT: Final = 1
_ARCH_ALIASES: Final = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
_WHEEL_RE: Final = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)
# PEP 440 public versions plus a local part; enough to refuse typos before pip does.
_VERSION_RE: Final = re.compile(
    r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?$"
)
_UNSATISFIED_RE: Final = re.compile(r"satisfies the requirement (\S+)")

Progress = Callable[[str], None]


class BundleError(Exception):
    """A bundle cannot be built (or read); the message says why and what to do."""


@dataclass(frozen=True)
class BundleResult:
    path: Path  # the bundle directory, or the tarball with ``tar``
    version: str
    arch: str
    python: str
    wheels: int
    size_bytes: int
    built_from_source: tuple[str, ...]  # dependencies turned into wheels here (pure Python)
    manifest_sha256: str


def host_arch() -> str:
    """This machine's architecture in the bundle's terms (``x86_64`` or ``aarch64``)."""
    machine = os.uname().machine
    return _ARCH_ALIASES.get(machine, machine)


def bundle_name(version: str, arch: str, python: str) -> str:
    return f"edgesched-{version}-{arch}-py{python}"


def _parse_glibc(glibc: str) -> tuple[int, int]:
    match = re.fullmatch(r"2\.(\d+)", glibc)
    if match is None or int(match.group(1)) < 17:
        raise BundleError(f"--glibc: a glibc version 2.17 or newer such as 2.28, got {glibc!r}")
    return 2, int(match.group(1))


def platform_tags(arch: str, glibc: str = DEFAULT_GLIBC) -> list[str]:
    """pip ``--platform`` tags a machine with ``arch`` and glibc ``glibc`` accepts, newest
    first: ``manylinux_2_<n>`` down to the first one published for ``arch``, and the legacy
    aliases (manylinux2014 = 2.17, manylinux2010 = 2.12, manylinux1 = 2.5)."""
    if arch not in ARCHES:
        raise BundleError(f"--arch: one of {', '.join(ARCHES)}, got {arch!r}")
    major, minor = _parse_glibc(glibc)
    lowest = 5 if arch == "x86_64" else 17
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, lowest - 1, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{arch}" for m, name in legacy.items() if lowest <= m <= minor]
    return tags


def _parse_python(python: str) -> tuple[int, int]:
    match = re.fullmatch(r"3\.(\d+)", python)
    if match is None or int(match.group(1)) < 11:
        raise BundleError(f"--python: a CPython version 3.11 or newer such as 3.11, got {python!r}")
    return 3, int(match.group(1))


def project_source() -> Path | None:
    """The source tree this edgesched was installed from (an editable or local-directory
    install records it in ``direct_url.json``), or None."""
    from importlib.metadata import PackageNotFoundError, distribution
    from urllib.parse import unquote, urlparse

    try:
        text = distribution("edgesched").read_text("direct_url.json")
    except PackageNotFoundError:
        return None
    if not text:
        return None
    url = urlparse(json.loads(text).get("url", ""))
    if url.scheme != "file":
        return None
    path = Path(unquote(url.path))
    return path if (path / "pyproject.toml").is_file() else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pip(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run this interpreter's pip; BundleError with pip's last lines when it fails."""
    argv = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 and "No module named pip" in proc.stderr:
        raise BundleError(f"pip is not available in {sys.executable} (python -m ensurepip)")
    return proc


def _tail(text: str, lines: int = 15) -> str:
    kept = [line for line in text.splitlines() if "is ignored: it is neither" not in line]
    return "\n".join(kept[-lines:])


def _stage_source(source: Path, into: Path, version: str | None) -> Path:
    """Copy what the wheel is built from (pyproject's package folders, pyproject.toml,
    README.md) to ``into``; with ``version``, write it into the copy's version module."""
    pyproject = source / "pyproject.toml"
    try:
        meta = tomllib.loads(pyproject.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BundleError(f"--source: {pyproject} is not readable TOML: {exc}") from None
    if meta.get("project", {}).get("name") != "edgesched":
        raise BundleError(f"--source: {source} is not the edgesched source tree")
    package_dir: dict[str, str] = meta.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    into.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        if (source / name).is_file():
            shutil.copy2(source / name, into / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")
    for folder in sorted(set(package_dir.values()) or {"edgesched"}):
        if not (source / folder).is_dir():
            raise BundleError(f"--source: {source / folder} (a package in pyproject) is missing")
        shutil.copytree(source / folder, into / folder, ignore=ignore)
    if version is not None:
        if not _VERSION_RE.fullmatch(version):
            raise BundleError(
                f"--set-version: not a version such as 1.2.3 or 1.2.3+site1: {version}"
            )
        version_py = into / package_dir.get("edgesched", "edgesched") / "version.py"
        version_py.write_text(
            '"""The edgesched version (set by `edgesched bundle --set-version`)."""\n\n'
            f'__version__ = "{version}"\n'
        )
    return into


def _wheel_requirements(wheel: Path) -> tuple[str, str, list[str]]:
    """(name, version, runtime requirements) from a wheel's METADATA (extras left out)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
            if len(names) != 1:
                raise BundleError(f"{wheel.name}: not a wheel (no single METADATA)")
            meta = Parser().parsestr(zf.read(names[0]).decode())
    except zipfile.BadZipFile:
        raise BundleError(f"{wheel}: not a wheel (not a zip file)") from None
    requires = [r for r in meta.get_all("Requires-Dist", []) if "extra ==" not in r]
    return str(meta["Name"]), str(meta["Version"]), requires


def _target_args(arch: str, python: str, glibc: str) -> list[str]:
    major, minor = _parse_python(python)
    args = ["--only-binary=:all:"]
    for tag in platform_tags(arch, glibc):
        args += ["--platform", tag]
    args += ["--python-version", python, "--implementation", "cp"]
    for abi in (f"cp{major}{minor}", "abi3", "none"):
        args += ["--abi", abi]
    return args


def _wheel_from_sdist(
    requirement: str, wheels: Path, work: Path, find_links: Sequence[Path], progress: Progress
) -> str:
    """Turn ``requirement``'s source distribution into a pure-Python wheel in ``wheels``;
    returns the wheel's file name. BundleError when it has no source or is not pure."""
    sdists = work / "sdist"
    built = work / "built"
    shutil.rmtree(sdists, ignore_errors=True)
    shutil.rmtree(built, ignore_errors=True)
    links = [a for d in find_links for a in ("--find-links", str(d))]
    progress(f"{requirement}: no wheel for the target; building one from its source")
    got = _pip(
        ["download", "--no-deps", "--no-binary=:all:", "-d", str(sdists), *links, requirement],
        work,
    )
    sources = sorted(sdists.glob("*")) if got.returncode == 0 else []
    if not sources:
        raise BundleError(
            f"{requirement} has no wheel for the target and no source distribution either:\n"
            + _tail(got.stderr or got.stdout)
        )
    made = _pip(["wheel", "--no-deps", "-w", str(built), str(sources[0])], work)
    produced = sorted(built.glob("*.whl"))
    if made.returncode != 0 or len(produced) != 1:
        raise BundleError(
            f"{requirement}: no wheel for the target, and its source did not build here:\n"
            + _tail(made.stderr or made.stdout)
        )
    wheel = produced[0]
    match = _WHEEL_RE.match(wheel.name)
    if match is None or match["abi"] != "none" or match["plat"] != "any":
        raise BundleError(
            f"{requirement} has no wheel for the target, and its source builds a "
            f"platform-specific wheel here ({wheel.name}), which would not run there. Build it "
            "on a machine of the target's architecture and pass that folder with --find-links."
        )
    shutil.move(str(wheel), wheels / wheel.name)
    return wheel.name


def _download(
    project_wheel: Path,
    wheels: Path,
    work: Path,
    arch: str,
    python: str,
    glibc: str,
    find_links: Sequence[Path],
    progress: Progress,
) -> list[str]:
    """``pip download`` the project wheel's dependencies for the target into ``wheels``;
    returns the dependencies built from source here."""
    built: list[str] = []
    links = [a for d in (wheels, *find_links) for a in ("--find-links", str(d))]
    target = _target_args(arch, python, glibc)
    for _ in range(50):  # one round per dependency without a wheel; bounded all the same
        argv = ["download", "--progress-bar", "off", "-d", str(wheels), *target, *links]
        got = _pip([*argv, str(project_wheel)], work)
        if got.returncode == 0:
            return built
        missing = _UNSATISFIED_RE.findall(got.stderr)
        if not missing or "No matching distribution found" not in got.stderr:
            raise BundleError("pip download failed:\n" + _tail(got.stderr or got.stdout))
        requirement = missing[-1]
        if requirement.split("[")[0].lower().replace("_", "-") == "edgesched":
            raise BundleError("pip download failed:\n" + _tail(got.stderr))
        built.append(_wheel_from_sdist(requirement, wheels, work, find_links, progress))
    raise BundleError("pip download: too many dependencies without wheels")


def _install_sh(version: str, arch: str, python: str, glibc: str) -> str:
    return (
        INSTALL_SH.replace("@VERSION@", version)
        .replace("@ARCH@", arch)
        .replace("@PYTHON@", python)
        .replace("@GLIBC@", glibc)
        .replace("@PREFIX@", str(DEFAULT_PREFIX))
    )


def build_bundle(
    *,
    arch: str,
    python: str,
    out: Path,
    source: Path | None = None,
    wheel: Path | None = None,
    version: str | None = None,
    glibc: str = DEFAULT_GLIBC,
    tar: bool = False,
    find_links: Sequence[Path] = (),
    progress: Progress = lambda _msg: None,
) -> BundleResult:
    """Build the bundle in ``out`` (its parent folder); see the module docstring."""
    platform_tags(arch, glibc)
    _parse_python(python)
    if wheel is not None and (source is not None or version is not None):
        raise BundleError("--wheel takes the wheel as it is: leave out --source and --set-version")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".bundle-", dir=out) as tmp:
        work = Path(tmp)
        wheels = work / "bundle" / "wheels"
        wheels.mkdir(parents=True)
        if wheel is None:
            src = source if source is not None else project_source()
            if src is None:
                raise BundleError(
                    "no source tree known for this edgesched: pass --source DIR (a checkout "
                    "with pyproject.toml) or --wheel FILE"
                )
            progress(f"building the edgesched wheel from {src}")
            staged = _stage_source(src, work / "src", version)
            made = _pip(["wheel", "--no-deps", "-w", str(work / "project"), str(staged)], work)
            produced = sorted((work / "project").glob("edgesched-*.whl"))
            if made.returncode != 0 or len(produced) != 1:
                raise BundleError(
                    "building the wheel failed:\n" + _tail(made.stderr or made.stdout)
                )
            wheel = produced[0]
        name, wheel_version, requires = _wheel_requirements(wheel)
        if name.lower() != "edgesched":
            raise BundleError(f"{wheel.name} is a wheel of {name}, not edgesched")
        project_wheel = wheels / wheel.name
        shutil.copy2(wheel, project_wheel)
        progress(
            f"downloading {len(requires)} dependencies and theirs for {arch}, CPython {python}, "
            f"glibc >= {glibc}"
        )
        built = _download(project_wheel, wheels, work, arch, python, glibc, find_links, progress)
        root = work / "bundle"
        _write_text(root / "install.sh", _install_sh(wheel_version, arch, python, glibc), 0o755)
        _write_text(root / "README.txt", _readme(wheel_version, arch, python, glibc), 0o644)
        files = {
            p.relative_to(root).as_posix(): _sha256(p)
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "name": "edgesched",
            "version": wheel_version,
            "arch": arch,
            "python": python,
            "implementation": "cp",
            "glibc": glibc,
            "platforms": platform_tags(arch, glibc),
            "requires": requires,
            "built_from_source": built,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "built_with": f"edgesched {__version__}",
            "files": files,
        }
        _write_text(root / MANIFEST, json.dumps(manifest, indent=2) + "\n", 0o644)
        size = sum((root / f).stat().st_size for f in files)
        name_dir = bundle_name(wheel_version, arch, python)
        final = out / (name_dir + ".tar.gz" if tar else name_dir)
        _make_room(final)
        if tar:
            progress(f"writing {final}")
            partial = work / "bundle.tar.gz"
            with tarfile.open(partial, "w:gz") as tf:
                tf.add(root, arcname=name_dir)
            os.replace(partial, final)
            (out / (final.name + ".sha256")).write_text(f"{_sha256(final)}  {final.name}\n")
        else:
            os.replace(root, final)
        return BundleResult(
            path=final,
            version=wheel_version,
            arch=arch,
            python=python,
            wheels=sum(1 for f in files if f.startswith("wheels/")),
            size_bytes=size,
            built_from_source=tuple(built),
            manifest_sha256=hashlib.sha256(
                (json.dumps(manifest, indent=2) + "\n").encode()
            ).hexdigest(),
        )


def _write_text(path: Path, text: str, mode: int) -> None:
    path.write_text(text)
    path.chmod(mode)


def _make_room(final: Path) -> None:
    """Replace an earlier bundle at ``final``; refuse to delete anything else."""
    if final.is_dir():
        if not (final / MANIFEST).is_file():
            raise BundleError(f"{final} exists and is not a bundle; move it away first")
        shutil.rmtree(final)
    elif final.exists():
        final.unlink()


def read_manifest(bundle: Path) -> dict[str, Any]:
    """The manifest of the bundle directory ``bundle``; BundleError if it is not one."""
    try:
        manifest: dict[str, Any] = json.loads((bundle / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BundleError(f"{bundle} is not an edgesched bundle ({MANIFEST}: {exc})") from None
    for key in ("name", "version", "arch", "python", "files"):
        if key not in manifest:
            raise BundleError(f"{bundle / MANIFEST}: no {key!r}")
    if manifest["name"] != "edgesched":
        raise BundleError(f"{bundle} is a bundle of {manifest['name']}, not edgesched")
    return manifest


def verify_bundle(bundle: Path) -> dict[str, Any]:
    """Check every file against the manifest (and that no wheel was slipped in); returns
    the manifest. The same check install.sh runs before it installs anything."""
    manifest = read_manifest(bundle)
    files: dict[str, str] = manifest["files"]
    for rel, sha in sorted(files.items()):
        path = bundle / rel
        if not path.is_file():
            raise BundleError(f"{rel}: missing from the bundle (copy the whole bundle again)")
        if _sha256(path) != sha:
            raise BundleError(f"{rel}: sha256 differs from the manifest (damaged or altered)")
    extra = sorted(
        p.relative_to(bundle).as_posix()
        for p in (bundle / "wheels").iterdir()
        if p.relative_to(bundle).as_posix() not in files
    )
    if extra:
        raise BundleError(f"not in the manifest, refusing to install with them: {extra}")
    return manifest


def _readme(version: str, arch: str, python: str, glibc: str) -> str:
    return README_TXT.format(
        version=version, arch=arch, python=python, glibc=glibc, prefix=DEFAULT_PREFIX
    )


README_TXT: Final = """\
edgesched {version} offline bundle for {arch}, CPython {python}, glibc >= {glibc}

Install (as root, no network needed):

    sh install.sh --node-id gw-01 --broker mqtt.example:8883 --ca ca.pem --cert gw-01.pem \
        --key gw-01.key              # into {prefix}, then `edgesched install` with those
    sh install.sh --prefix /srv/es --no-service     # the release only, no service

What install.sh does, in order, stopping at the first problem with a message that says why:

 1. checks this machine: architecture {arch}, python3 is CPython {python} with the venv module
    (Debian/Ubuntu: apt-get install python3-venv), glibc {glibc} or newer;
 2. checks the sha256 of every file against manifest.json, and that wheels/ holds nothing
    else (compare manifest.json's own sha256 with the one `edgesched bundle` printed);
 3. creates the virtual environment {prefix}/releases/{version} and installs
    edgesched=={version} into it from wheels/ only (pip --no-index; the machine's pip
    configuration is ignored). A release already installed there is reused;
 4. points {prefix}/current at that release (a new symlink renamed over the old one);
 5. runs `<prefix>/releases/{version}/bin/edgesched install --prefix <prefix> ARGS` (the
    service, its config, identity and user; see `edgesched install --help`) with every
    argument install.sh did not recognise, for example --node-id gw-01 --broker HOST, or
    --dry-run to see what it would write.

Options: --prefix DIR, --python PATH (default python3), --no-switch (install the release,
leave `current` alone: what `edgesched upgrade` uses), --no-service (skip step 5), and
`--` before arguments meant for `edgesched install` only.

Upgrade a running node later with `edgesched upgrade --bundle <this folder or tarball>`:
it installs the new release beside this one, backs up the state database, restarts the
engine (its tasks keep running) and rolls back by itself if the new engine does not come up.
"""


INSTALL_SH: Final = r"""#!/bin/sh
# edgesched @VERSION@ offline installer for @ARCH@ / CPython @PYTHON@ (see README.txt).
# Generated by `edgesched bundle`. Needs no network: it installs from wheels/ only.
set -eu

VERSION='@VERSION@'
ARCH='@ARCH@'
PYVER='@PYTHON@'
GLIBC='@GLIBC@'
PREFIX='@PREFIX@'
PYTHON=python3
SERVICE=1
SWITCH=1

die() { echo "install.sh: error: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }

HERE=$(cd "$(dirname "$0")" && pwd)

# Options; whatever is not ours is kept, in order, for `edgesched install`.
n=$#
while [ "$n" -gt 0 ]; do
    arg=$1; shift; n=$((n - 1))
    case $arg in
        --prefix) [ "$n" -gt 0 ] || die "--prefix needs a directory"
                  PREFIX=$1; shift; n=$((n - 1)) ;;
        --prefix=*) PREFIX=${arg#--prefix=} ;;
        --python) [ "$n" -gt 0 ] || die "--python needs an interpreter"
                  PYTHON=$1; shift; n=$((n - 1)) ;;
        --python=*) PYTHON=${arg#--python=} ;;
        --no-service) SERVICE=0 ;;
        --no-switch) SWITCH=0 ;;
        -h|--help) sed -n '1,40p' "$HERE/README.txt"; exit 0 ;;
        --) while [ "$n" -gt 0 ]; do set -- "$@" "$1"; shift; n=$((n - 1)); done ;;
        *) set -- "$@" "$arg" ;;
    esac
done
case $PREFIX in /*) ;; *) die "--prefix must be an absolute path, got '$PREFIX'" ;; esac

# Nothing from this machine's pip setup may send pip to an index or another folder.
for v in $(env | sed -n 's/^\(PIP_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_CONFIG_FILE PIP_NO_INDEX PIP_DISABLE_PIP_VERSION_CHECK
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV 2>/dev/null || true
umask 022

# 1. This machine.
machine=$(uname -m)
case $machine in amd64) machine=x86_64 ;; arm64) machine=aarch64 ;; esac
[ "$machine" = "$ARCH" ] || die "this bundle is for $ARCH but this machine is $machine;\
 build one for it with: edgesched bundle --arch $machine --python $PYVER"
command -v "$PYTHON" >/dev/null 2>&1 || die "no '$PYTHON' found: install CPython $PYVER\
 (Debian/Ubuntu: apt-get install python3 python3-venv) or pass --python PATH"

# 2. The interpreter, glibc, and every file of the bundle against manifest.json.
"$PYTHON" - "$HERE" "$PYVER" "$GLIBC" <<'PYCHECK' || exit 1
import hashlib, json, os, platform, sys

here, want_py, want_glibc = sys.argv[1:4]
def die(msg):
    sys.stderr.write("install.sh: error: " + msg + "\n")
    sys.exit(1)
have_py = "%d.%d" % sys.version_info[:2]
if platform.python_implementation() != "CPython" or have_py != want_py:
    die("this bundle needs CPython %s, but %s is %s %s; install python%s or pass --python PATH"
        % (want_py, sys.executable, platform.python_implementation(), have_py, want_py))
try:
    import ensurepip, venv  # noqa: F401
except ImportError:
    die("%s has no venv/ensurepip module (Debian/Ubuntu: apt-get install python3-venv)"
        % sys.executable)
lib, ver = platform.libc_ver()
def vt(v):
    return tuple(int(x) for x in v.split(".")[:2])
if lib != "glibc" or not ver or vt(ver) < vt(want_glibc):
    die("the wheels need glibc %s or newer, this machine has %s %s"
        % (want_glibc, lib or "an unknown libc", ver))
try:
    with open(os.path.join(here, "manifest.json")) as f:
        manifest = json.load(f)
    files = manifest["files"]
except (OSError, ValueError, KeyError) as exc:
    die("manifest.json is missing or unreadable (%s): copy the whole bundle again" % exc)
for rel, sha in sorted(files.items()):
    path = os.path.join(here, rel)
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        die("%s is missing from the bundle: copy the whole bundle again" % rel)
    if h.hexdigest() != sha:
        die("%s: sha256 does not match manifest.json (the bundle is damaged or was altered): "
            "copy it again from the machine that built it" % rel)
extra = sorted("wheels/" + n for n in os.listdir(os.path.join(here, "wheels"))
               if "wheels/" + n not in files)
if extra:
    die("not listed in manifest.json, refusing to install with them: %s" % ", ".join(extra))
print("install.sh: %d files verified (sha256)" % len(files))
PYCHECK

# 3. The release: a virtual environment with edgesched from wheels/ only.
REL="$PREFIX/releases/$VERSION"
mkdir -p "$PREFIX/releases" 2>/dev/null \
    || die "cannot create $PREFIX/releases: run as root (sudo sh install.sh) or pass --prefix DIR"
if [ -f "$REL/.edgesched-release.json" ] && [ -x "$REL/bin/edgesched" ]; then
    say "release $VERSION is already installed in $REL; reusing it"
else
    rm -rf "$REL"
    say "creating $REL"
    if ! "$PYTHON" -m venv "$REL"; then
        rm -rf "$REL"
        die "python -m venv failed (Debian/Ubuntu: apt-get install python3-venv)"
    fi
    say "installing edgesched $VERSION and its dependencies from wheels/ (no network)"
    if ! "$REL/bin/python" -m pip install --quiet --no-index --no-cache-dir \
            --find-links "$HERE/wheels" "edgesched==$VERSION"; then
        rm -rf "$REL"
        die "pip could not install edgesched $VERSION from the bundle's wheels (see above)"
    fi
    if ! got=$("$REL/bin/edgesched" --version 2>&1) || [ "$got" != "edgesched $VERSION" ]; then
        rm -rf "$REL"
        die "the installed edgesched does not start as edgesched $VERSION: $got"
    fi
    cp "$HERE/manifest.json" "$REL/.edgesched-release.json"
    say "installed $got"
fi

# 4. current -> releases/<version>, atomically (a new link renamed over the old one).
if [ "$SWITCH" = 1 ]; then
    tmp="$PREFIX/.current.$$"
    rm -f "$tmp"
    ln -s "releases/$VERSION" "$tmp"
    if ! "$REL/bin/python" -c 'import os, sys; os.replace(sys.argv[1], sys.argv[2])' \
            "$tmp" "$PREFIX/current"; then
        rm -f "$tmp"
        die "could not point $PREFIX/current at releases/$VERSION"
    fi
    say "$PREFIX/current -> releases/$VERSION"
fi

# 5. The service, config and user: `edgesched install` of the new release, when it has one.
if [ "$SERVICE" = 1 ]; then
    if help=$("$REL/bin/edgesched" install --help 2>/dev/null); then
        case $help in *--prefix*) set -- --prefix "$PREFIX" "$@" ;; esac
        say "running: $REL/bin/edgesched install $*"
        exec "$REL/bin/edgesched" install "$@"
    fi
    say "this release has no 'edgesched install' command; set up the service yourself"
fi
say "done"
"""
