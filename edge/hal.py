"""Hardware abstraction layer: discover a server from sysfs/procfs and classify it.

Role: the resource-awareness tier's first step. :func:`discover` reads the machine (CPU
architecture, online logical CPUs and their clusters, memory, last-level cache, accelerators,
block storage) into a frozen :class:`HardwareProfile`; :func:`classify` puts it in one of the
three server classes; :func:`default_power_model` estimates a power model when no sensor is
known; :func:`to_node` turns the profile into the scheduling core's
:class:`~edgesched.core.model.Node`. Every tier then sees general, AI-accelerator and
storage-dense servers, ARM or x86, through that one model.

``discover(root)`` reads only files under ``root`` (``root/"sys"/...``, ``root/"proc"/...``),
so tests can point it at a small directory tree, and it never raises for odd or missing
hardware information: what it cannot read becomes a fallback plus a line in
``HardwareProfile.warnings``. The one error is an architecture the core does not schedule
(:class:`UnsupportedHardware`): only arm64 and x86_64.

Rules (each stated where it is applied):

* *Cores*: logical CPUs online (``sys/devices/system/cpu/online``, else ``proc/cpuinfo``).
* *Clusters*: on ARM, ``cpu*/topology/cluster_id`` when it groups cores (more than one cluster
  and not one per core); else NUMA nodes (``sys/devices/system/node/node*/cpulist``) when there
  is more than one; else (package, die) when more than one; else a single cluster.
* *Accelerators*: a DRM card (``sys/class/drm/card*``) with a render node is a GPU; a device
  under ``sys/class/accel`` is an NPU; a PCI device of class 0x1200 (processing accelerator,
  e.g. Huawei Ascend, Intel Gaudi) is an NPU even without a driver class; ``nvidia-smi`` adds
  NVIDIA GPUs whose driver has no DRM node. An accelerator is *compute* (can take AI work, so
  the server is AI-accelerator class) when it is an NPU, an NVIDIA/AMD device of a headless
  compute PCI class (0x0302 3D controller, 0x0380 display controller, 0x1200), or an NVIDIA
  GPU that ``nvidia-smi`` lists (the CUDA driver is loaded). Integrated and display GPUs are
  listed but not compute.
* *Storage*: ``sys/block/{nvme*,sd*,vd*,xvd*,hd*,mmcblk*}``; loop/ram/zram/dm/md/optical are
  skipped, as are hidden (NVMe multipath), removable and empty devices. Kind: ``nvme``; ``emmc``;
  ``virtual`` for paravirtual disks (virtio/Xen, whose rotational flag means nothing); else
  ``hdd`` when rotational, ``ssd`` when not. Size is ``size`` (512-byte sectors) in GB (1e9).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from edgesched.core.model import Arch, CoreTopology, Node, PowerModel, Resources, ServerClass
from edgesched.core.slices import LAYOUT_LABEL, Device
from edgesched.edge.sysfs import listdir, read_int, read_text

#: How long ``nvidia-smi`` may take before discovery gives up on it.
NVIDIA_SMI_TIMEOUT_S = 5.0

_ARCH_ALIASES: Mapping[str, Arch] = {
    "aarch64": Arch.ARM64,
    "arm64": Arch.ARM64,
    "x86_64": Arch.X86_64,
    "amd64": Arch.X86_64,
}

PCI_VENDORS: Mapping[str, str] = {
    "0x10de": "nvidia",
    "0x1002": "amd",
    "0x8086": "intel",
    "0x19e5": "huawei",
    "0x1da3": "habana",
    "0x1af4": "virtio",
    "0x1a03": "aspeed",
    "0x1234": "qemu",
    "0x15ad": "vmware",
}
#: PCI (base class, subclass) prefixes of headless compute devices.
_COMPUTE_PCI_CLASSES = ("0x0302", "0x0380", "0x1200")
_PROCESSING_ACCELERATOR = "0x1200"
_COMPUTE_GPU_VENDORS = frozenset({"nvidia", "amd"})

#: ARM ``CPU implementer`` codes and (implementer, part) names, for ``/proc/cpuinfo`` on arm64
#: (which has no "model name").
_ARM_IMPLEMENTERS: Mapping[str, str] = {
    "0x41": "ARM",
    "0x42": "Broadcom",
    "0x43": "Cavium",
    "0x46": "Fujitsu",
    "0x48": "HiSilicon",
    "0x4e": "NVIDIA",
    "0x50": "Applied Micro",
    "0x51": "Qualcomm",
    "0x61": "Apple",
    "0x70": "Phytium",
    "0xc0": "Ampere",
}
_ARM_PARTS: Mapping[tuple[str, str], str] = {
    ("0x41", "0xd03"): "Cortex-A53",
    ("0x41", "0xd05"): "Cortex-A55",
    ("0x41", "0xd07"): "Cortex-A57",
    ("0x41", "0xd08"): "Cortex-A72",
    ("0x41", "0xd0b"): "Cortex-A76",
    ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd40"): "Neoverse-V1",
    ("0x41", "0xd49"): "Neoverse-N2",
    ("0x41", "0xd4f"): "Neoverse-V2",
    ("0x41", "0xd8e"): "Neoverse-N3",
    ("0x41", "0xd84"): "Neoverse-V3",
    ("0x43", "0x0af"): "ThunderX2",
    ("0x46", "0x001"): "A64FX",
    ("0x48", "0xd01"): "Kunpeng-920",
    ("0xc0", "0xac3"): "AmpereOne",
}

_STORAGE_PREFIXES = ("nvme", "sd", "vd", "xvd", "hd", "mmcblk")
_SECTOR_BYTES = 512


class UnsupportedHardware(RuntimeError):
    """The machine's CPU architecture is not one the scheduling core places work on."""


@dataclass(frozen=True, slots=True)
class Accelerator:
    """One accelerator: ``kind`` is ``"gpu"`` or ``"npu"``; ``vendor`` a lower-case name (or
    the PCI vendor id when unknown); ``path`` the sysfs device path (or ``nvidia-smi:<bus>``).
    ``compute`` is True when it can take AI work (see the module docstring's rule)."""

    kind: str
    vendor: str
    model: str
    path: str
    compute: bool = False
    #: Hardware slices it offers: ``"mig"`` (NVIDIA MIG instances, ``units`` their UUIDs)
    #: or ``"sriov"`` (enabled virtual functions, ``units`` their PCI addresses); empty: none.
    slicing: str = ""
    units: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StorageDevice:
    """One block device: ``kind`` is ``nvme``, ``ssd``, ``hdd``, ``emmc`` or ``virtual``."""

    name: str
    kind: str
    size_gb: float
    path: str


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """What :func:`discover` found. ``cores`` counts logical CPUs online; ``topology`` holds
    their ids grouped by cluster (``topology_source`` says which rule grouped them)."""

    arch: Arch
    machine: str
    cpu_model: str
    cores: int
    topology: CoreTopology
    mem_gib: float
    accelerators: tuple[Accelerator, ...]
    storage: tuple[StorageDevice, ...]
    server_class: ServerClass
    class_reason: str
    llc_kib: int | None
    warnings: tuple[str, ...]
    topology_source: str = "single"

    @property
    def compute_accelerators(self) -> tuple[Accelerator, ...]:
        return tuple(a for a in self.accelerators if a.compute)

    def to_json(self) -> dict[str, object]:
        """A JSON-ready view (CLI output, the agent's registration message)."""
        return {
            "arch": self.arch.value,
            "machine": self.machine,
            "cpu_model": self.cpu_model,
            "cores": self.cores,
            "clusters": [list(c) for c in self.topology.clusters],
            "topology_source": self.topology_source,
            "mem_gib": round(self.mem_gib, 3),
            "llc_kib": self.llc_kib,
            "accelerators": [
                {
                    "kind": a.kind,
                    "vendor": a.vendor,
                    "model": a.model,
                    "path": a.path,
                    "compute": a.compute,
                    **({"slicing": a.slicing, "units": list(a.units)} if a.slicing else {}),
                }
                for a in self.accelerators
            ],
            "storage": [
                {"name": s.name, "kind": s.kind, "size_gb": round(s.size_gb, 3), "path": s.path}
                for s in self.storage
            ],
            "server_class": self.server_class.value,
            "class_reason": self.class_reason,
            "warnings": list(self.warnings),
        }


# --------------------------------------------------------------------------- file helpers


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse a kernel CPU list such as ``"0-3,8,10-11"`` (empty text -> no CPUs).

    Raises ValueError on malformed text.
    """
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"bad CPU range {part!r}")
            out.update(range(a, b + 1))
        else:
            out.add(int(part))
    return tuple(sorted(out))


def _cpu_number(name: str) -> int | None:
    m = re.fullmatch(r"cpu(\d+)", name)
    return int(m.group(1)) if m else None


def _parse_cpuinfo(text: str) -> list[dict[str, str]]:
    """``/proc/cpuinfo`` as one dict per processor block (keys lower-cased)."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        if ":" in line:
            key, value = line.split(":", 1)
            current[key.strip().lower()] = value.strip()
    if current:
        blocks.append(current)
    return blocks


# --------------------------------------------------------------------------- architecture


def arch_of(machine: str) -> Arch:
    """Map a raw ``uname -m`` machine name to an :class:`Arch`, or raise UnsupportedHardware."""
    arch = _ARCH_ALIASES.get(machine.strip().lower())
    if arch is None:
        raise UnsupportedHardware(
            f"unsupported CPU architecture {machine!r}: edgesched schedules only arm64 "
            "(aarch64) and x86_64 (amd64) servers"
        )
    return arch


def _machine(root: Path, cpuinfo: list[dict[str, str]], warn: list[str]) -> str:
    if root.resolve() == Path("/"):
        return os.uname().machine
    text = read_text(root / "proc/sys/kernel/arch")
    if text:
        return text
    first = cpuinfo[0] if cpuinfo else {}
    if "cpu implementer" in first:
        return "aarch64"
    if first.get("vendor_id") in ("GenuineIntel", "AuthenticAMD", "HygonGenuine"):
        return "x86_64"
    machine = platform.machine()
    warn.append(f"architecture not found under {root}; assumed this host's {machine!r}")
    return machine


def _cpu_model(cpuinfo: list[dict[str, str]], warn: list[str]) -> str:
    for block in cpuinfo:
        if block.get("model name"):
            return block["model name"]
    for block in cpuinfo:
        impl = block.get("cpu implementer", "").lower()
        if impl:
            part = block.get("cpu part", "").lower()
            vendor = _ARM_IMPLEMENTERS.get(impl, f"implementer {impl}")
            name = _ARM_PARTS.get((impl, part), f"part {part or '?'}")
            return f"{vendor} {name}"
    for block in cpuinfo:
        if block.get("hardware"):
            return block["hardware"]
    warn.append("CPU model not found in /proc/cpuinfo")
    return "unknown"


# --------------------------------------------------------------------------- CPUs and memory


def _online_cpus(root: Path, cpuinfo: list[dict[str, str]], warn: list[str]) -> tuple[int, ...]:
    cpu_dir = root / "sys/devices/system/cpu"
    text = read_text(cpu_dir / "online")
    if text is not None:
        try:
            cpus = parse_cpulist(text)
        except ValueError:
            cpus = ()
        if cpus:
            return cpus
    procs = [b["processor"] for b in cpuinfo if b.get("processor", "").isdigit()]
    if procs:
        warn.append("online CPU list unreadable; counted processors in /proc/cpuinfo")
        return tuple(sorted(int(p) for p in procs))
    numbered = sorted(n for p in listdir(cpu_dir) if (n := _cpu_number(p.name)) is not None)
    if numbered:
        warn.append("online CPU list unreadable; counted cpu* directories in sysfs")
        return tuple(numbered)
    warn.append("no CPU information in sysfs or /proc/cpuinfo; assumed 1 CPU")
    return (0,)


def _group(cpus: Iterable[int], keys: Mapping[int, object]) -> tuple[tuple[int, ...], ...]:
    groups: dict[object, list[int]] = {}
    for cpu in cpus:
        groups.setdefault(keys[cpu], []).append(cpu)
    return tuple(sorted((tuple(sorted(g)) for g in groups.values()), key=lambda g: g[0]))


def _topology(
    root: Path, arch: Arch, online: tuple[int, ...], warn: list[str]
) -> tuple[CoreTopology, str]:
    """Group the online CPUs into clusters by the rule in the module docstring."""
    cpu_dir = root / "sys/devices/system/cpu"
    n = len(online)

    def ids(name: str) -> dict[int, int] | None:
        out: dict[int, int] = {}
        for cpu in online:
            value = read_int(cpu_dir / f"cpu{cpu}/topology/{name}")
            if value is None or value < 0:
                return None
            out[cpu] = value
        return out

    if arch is Arch.ARM64 and n > 1:
        cluster = ids("cluster_id")
        if cluster is not None:
            package = ids("physical_package_id") or dict.fromkeys(online, 0)
            groups = _group(online, {c: (package[c], cluster[c]) for c in online})
            if 1 < len(groups) < n:
                return CoreTopology(groups), "arm-cluster"

    node_of: dict[int, int] = {}
    for node_path in listdir(root / "sys/devices/system/node"):
        m = re.fullmatch(r"node(\d+)", node_path.name)
        text = read_text(node_path / "cpulist") if m else None
        if m is None or text is None:
            continue
        try:
            for cpu in parse_cpulist(text):
                node_of[cpu] = int(m.group(1))
        except ValueError:
            warn.append(f"unreadable NUMA cpulist in {node_path.name}")
    if node_of:
        if all(c in node_of for c in online):
            groups = _group(online, node_of)
            if len(groups) > 1:
                return CoreTopology(groups), "numa"
        else:
            warn.append("NUMA nodes do not cover every online CPU; NUMA grouping ignored")

    package_ids = ids("physical_package_id")
    if package_ids is not None:
        die = ids("die_id") or dict.fromkeys(online, 0)
        groups = _group(online, {c: (package_ids[c], die[c]) for c in online})
        if len(groups) > 1:
            return CoreTopology(groups), "package"
    elif n > 1:
        warn.append("no CPU topology in sysfs; all cores put in one cluster")
    return CoreTopology((online,)), "single"


def _mem_gib(root: Path, warn: list[str]) -> float:
    text = read_text(root / "proc/meminfo")
    if text is not None:
        m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
        if m:
            return int(m.group(1)) / 1024**2
    total_kib = 0
    for node_path in listdir(root / "sys/devices/system/node"):
        node_text = read_text(node_path / "meminfo") if node_path.name.startswith("node") else None
        m = re.search(r"MemTotal:\s+(\d+)\s*kB", node_text or "")
        if m:
            total_kib += int(m.group(1))
    if total_kib:
        warn.append("/proc/meminfo unreadable; summed NUMA node memory")
        return total_kib / 1024**2
    warn.append("memory size unknown (/proc/meminfo unreadable); reported as 0")
    return 0.0


def _size_kib(text: str) -> int | None:
    """A sysfs cache size (``"48K"``, ``"32M"``, or bytes) in KiB."""
    m = re.fullmatch(r"(\d+)\s*([KMG]?)", text.strip().upper())
    if not m:
        return None
    value, unit = int(m.group(1)), m.group(2)
    if unit == "":
        return value // 1024
    return value * {"K": 1, "M": 1024, "G": 1024**2}[unit]


def _llc_kib(root: Path, online: tuple[int, ...]) -> int | None:
    """Size of the highest-level data/unified cache of the first online CPU, in KiB."""
    cache_dir = root / f"sys/devices/system/cpu/cpu{online[0]}/cache"
    best: tuple[int, int] | None = None
    for index in listdir(cache_dir):
        if not index.name.startswith("index"):
            continue
        level = read_int(index / "level")
        kind = read_text(index / "type")
        size_text = read_text(index / "size")
        if level is None or kind == "Instruction" or size_text is None:
            continue
        size = _size_kib(size_text)
        if size is not None and (best is None or level > best[0]):
            best = (level, size)
    return best[1] if best else None


# --------------------------------------------------------------------------- accelerators


def _pci_names(root: Path) -> str | None:
    for rel in ("usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids", "usr/share/pci.ids"):
        text = read_text(root / rel)
        if text:
            return text
    return None


def pci_device_name(pci_ids: str | None, vendor_id: str, device_id: str) -> str:
    """The ``pci.ids`` name of a device (``"10de:20b0"`` style when not listed)."""
    vendor = vendor_id.lower().removeprefix("0x")
    device = device_id.lower().removeprefix("0x")
    fallback = f"{vendor}:{device}"
    if not pci_ids:
        return fallback
    in_vendor = False
    for line in pci_ids.splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith("\t"):
            in_vendor = line[:4].lower() == vendor
            continue
        if in_vendor and not line.startswith("\t\t") and line[1:5].lower() == device:
            return line[5:].strip() or fallback
    return fallback


def _rel(root: Path, path: Path) -> str:
    """``path`` (resolved) as an absolute path inside ``root``."""
    try:
        resolved = path.resolve()
        return "/" + str(resolved.relative_to(root.resolve()))
    except (OSError, RuntimeError, ValueError):  # RuntimeError: a symlink loop
        return str(path)


def _bus_id(path_text: str) -> str:
    """The PCI address (``"3b:00.0"``, domain dropped) at the end of a device path."""
    m = re.search(r"([0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$", path_text)
    return m.group(1).lower() if m else path_text


def _pci_accelerator(
    kind: str, device: Path, root: Path, pci_ids: str | None, *, force_compute: bool = False
) -> Accelerator:
    vendor_id = (read_text(device / "vendor") or "").lower()
    device_id = (read_text(device / "device") or "").lower()
    pci_class = (read_text(device / "class") or "").lower()
    vendor = PCI_VENDORS.get(vendor_id, vendor_id or "unknown")
    compute = (
        force_compute
        or kind == "npu"
        or (vendor in _COMPUTE_GPU_VENDORS and pci_class.startswith(_COMPUTE_PCI_CLASSES))
    )
    model = pci_device_name(pci_ids, vendor_id, device_id) if vendor_id else "unknown"
    return Accelerator(kind, vendor, model, _rel(root, device), compute)


def parse_nvidia_smi(text: str) -> tuple[tuple[str, str], ...]:
    """Parse ``nvidia-smi --query-gpu=pci.bus_id,name --format=csv,noheader`` output into
    ``(bus_id, name)`` pairs, bus ids normalised like :func:`_bus_id` (``"3b:00.0"``)."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        if "," not in line:
            continue
        bus, name = (s.strip() for s in line.split(",", 1))
        if bus and name:
            out.append((_bus_id(bus), name))
    return tuple(out)


def _run_nvidia_smi(warn: list[str]) -> tuple[tuple[str, str], ...]:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return ()
    try:
        done = subprocess.run(
            [binary, "--query-gpu=pci.bus_id,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        warn.append(f"nvidia-smi failed: {exc}")
        return ()
    if done.returncode != 0:
        warn.append(f"nvidia-smi exited {done.returncode}: {done.stderr.strip()[:200]}")
        return ()
    return parse_nvidia_smi(done.stdout)


def _accelerators(
    root: Path,
    nvidia: tuple[tuple[str, str], ...],
    mig: Mapping[int, tuple[str, ...]] | None = None,
) -> tuple[Accelerator, ...]:
    mig = mig or {}
    pci_ids: str | None = None
    loaded = False

    def names() -> str | None:
        nonlocal pci_ids, loaded
        if not loaded:
            pci_ids, loaded = _pci_names(root), True
        return pci_ids

    found: dict[str, Accelerator] = {}  # by PCI bus id (or path when not a PCI device)
    drm = root / "sys/class/drm"
    for card in listdir(drm):
        if not re.fullmatch(r"card\d+", card.name):
            continue  # connectors (card0-HDMI-A-1) and render nodes
        device = card / "device"
        has_render = any(p.name.startswith("renderD") for p in listdir(device / "drm"))
        if not has_render:
            continue  # a display-only adapter (BMC VGA, simpledrm): not an accelerator
        acc = _pci_accelerator("gpu", device, root, names())
        found.setdefault(_bus_id(acc.path), acc)
    for accel in listdir(root / "sys/class/accel"):
        if re.fullmatch(r"accel\d+", accel.name):
            acc = _pci_accelerator("npu", accel / "device", root, names())
            found.setdefault(_bus_id(acc.path), acc)
    for device in listdir(root / "sys/bus/pci/devices"):
        if (device / "physfn").exists():
            continue  # an SR-IOV virtual function: a slice of its physical function
        pci_class = (read_text(device / "class") or "").lower()
        vendor = PCI_VENDORS.get((read_text(device / "vendor") or "").lower(), "")
        bus = _bus_id(_rel(root, device))
        if bus in found:
            continue
        if pci_class.startswith(_PROCESSING_ACCELERATOR):
            found[bus] = _pci_accelerator("npu", device, root, names())
        elif vendor in _COMPUTE_GPU_VENDORS and pci_class.startswith(_COMPUTE_PCI_CLASSES):
            found[bus] = _pci_accelerator("gpu", device, root, names())
    for bus, name in nvidia:
        known = found.get(bus)
        if known is not None:
            found[bus] = Accelerator("gpu", "nvidia", name, known.path, compute=True)
        else:
            found[bus] = Accelerator("gpu", "nvidia", name, f"nvidia-smi:{bus}", compute=True)
    for bus, acc in found.items():
        vfs = _virtual_functions(root, acc.path) if acc.compute else ()
        if vfs:
            found[bus] = replace(acc, slicing="sriov", units=vfs)
    for index, uuids in mig.items():
        if index < len(nvidia) and uuids and nvidia[index][0] in found:
            found[nvidia[index][0]] = replace(found[nvidia[index][0]], slicing="mig", units=uuids)
    return tuple(found[k] for k in sorted(found))


def _virtual_functions(root: Path, path: str) -> tuple[str, ...]:
    """The PCI addresses of a physical function's enabled SR-IOV virtual functions
    (``sriov_numvfs`` of them, from its ``virtfn<N>`` links in N's order)."""
    if not path.startswith("/sys/"):
        return ()
    device = root / path.lstrip("/")
    enabled = read_int(device / "sriov_numvfs") or 0
    if enabled <= 0:
        return ()
    links = [p for p in listdir(device) if re.fullmatch(r"virtfn\d+", p.name)]
    links.sort(key=lambda p: int(p.name[6:]))
    out: list[str] = []
    for vf in links[:enabled]:
        try:
            out.append(vf.resolve().name)
        except (OSError, RuntimeError):
            continue
    return tuple(out)


def parse_nvidia_mig(text: str) -> dict[int, tuple[str, ...]]:
    """Parse ``nvidia-smi -L`` output into GPU index -> its MIG instances' UUIDs (in the
    listed order); a GPU without MIG instances is absent."""
    out: dict[int, list[str]] = {}
    gpu: int | None = None
    for line in text.splitlines():
        top = re.match(r"GPU (\d+):", line)
        if top:
            gpu = int(top.group(1))
            continue
        m = re.match(r"\s+MIG .*\(UUID: (MIG-[^)\s]+)\)", line)
        if m and gpu is not None:
            out.setdefault(gpu, []).append(m.group(1))
    return {k: tuple(v) for k, v in out.items()}


def _run_nvidia_smi_list(warn: list[str]) -> dict[int, tuple[str, ...]]:
    """MIG instances per GPU index, from ``nvidia-smi -L`` (none when it fails)."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return {}
    try:
        done = subprocess.run(
            [binary, "-L"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        warn.append(f"nvidia-smi -L failed: {exc}")
        return {}
    if done.returncode != 0:
        return {}
    return parse_nvidia_mig(done.stdout)


# --------------------------------------------------------------------------- storage


def _storage(root: Path, warn: list[str]) -> tuple[StorageDevice, ...]:
    block = root / "sys/block"
    entries = listdir(block)
    if not entries:
        warn.append("no /sys/block entries; storage unknown")
    out: list[StorageDevice] = []
    for dev in entries:
        name = dev.name
        if not name.startswith(_STORAGE_PREFIXES) or re.search(r"boot\d+$|rpmb$", name):
            continue
        if read_text(dev / "hidden") == "1" or read_text(dev / "removable") == "1":
            continue
        sectors = read_int(dev / "size")
        if sectors is None:
            warn.append(f"block device {name}: size unreadable; skipped")
            continue
        if sectors == 0:
            continue
        if name.startswith("nvme"):
            kind = "nvme"
        elif name.startswith("mmcblk"):
            kind = "emmc"
        elif name.startswith(("vd", "xvd")):
            kind = "virtual"
        else:
            rotational = read_text(dev / "queue/rotational")
            if rotational is None:
                warn.append(f"block device {name}: rotational flag unreadable; assumed ssd")
            kind = "hdd" if rotational == "1" else "ssd"
        out.append(StorageDevice(name, kind, sectors * _SECTOR_BYTES / 1e9, _rel(root, dev)))
    return tuple(out)


# --------------------------------------------------------------------------- classification

#: Storage-dense thresholds.
STORAGE_DENSE_NVME = 4
STORAGE_DENSE_DISKS = 8


def classify(
    accelerators: Iterable[Accelerator], storage: Iterable[StorageDevice], cores: int
) -> tuple[ServerClass, str]:
    """The server class and the rule that chose it.

    AI-accelerator when any accelerator is *compute* (an NPU, an NVIDIA/AMD compute-class
    device, or an NVIDIA GPU that nvidia-smi lists); else storage-dense with at least
    ``STORAGE_DENSE_NVME`` NVMe devices or ``STORAGE_DENSE_DISKS`` disks of any kind; else
    general. AI wins over storage (a GPU box with 8 NVMe scratch drives is an AI server).
    """
    accs = tuple(accelerators)
    disks = tuple(storage)
    compute = [a for a in accs if a.compute]
    if compute:
        kinds = ", ".join(sorted({f"{a.vendor} {a.kind}" for a in compute}))
        return ServerClass.AI_ACCELERATOR, (
            f"ai-accelerator: {len(compute)} compute accelerator(s) ({kinds}); rule: any NPU "
            "or NVIDIA/AMD compute-class GPU"
        )
    nvme = sum(1 for d in disks if d.kind == "nvme")
    if nvme >= STORAGE_DENSE_NVME or len(disks) >= STORAGE_DENSE_DISKS:
        return ServerClass.STORAGE_DENSE, (
            f"storage-dense: {nvme} NVMe of {len(disks)} disks; rule: >= {STORAGE_DENSE_NVME} "
            f"NVMe or >= {STORAGE_DENSE_DISKS} disks"
        )
    display = len(accs)
    return ServerClass.GENERAL, (
        f"general: {cores} cores, {len(disks)} disk(s) ({nvme} NVMe), no compute accelerator"
        + (f" ({display} non-compute GPU(s))" if display else "")
        + f"; below storage-dense thresholds ({STORAGE_DENSE_NVME} NVMe / "
        f"{STORAGE_DENSE_DISKS} disks)"
    )


# --------------------------------------------------------------------------- discovery


def discover(
    root: Path = Path("/"), *, machine: str | None = None, nvidia_smi: bool | None = None
) -> HardwareProfile:
    """Discover the server whose ``sys`` and ``proc`` trees live under ``root``.

    ``machine`` overrides the architecture name (default: ``uname -m`` when ``root`` is ``/``,
    else ``root/proc/sys/kernel/arch`` or a guess from ``cpuinfo``). ``nvidia_smi`` runs
    ``nvidia-smi`` when it is on PATH (default: only when ``root`` is ``/``). Raises
    :class:`UnsupportedHardware` for an architecture other than arm64/x86_64; never raises
    for missing or malformed files (see ``warnings``).
    """
    warn: list[str] = []
    cpuinfo_text = read_text(root / "proc/cpuinfo")
    if cpuinfo_text is None:
        warn.append("/proc/cpuinfo unreadable")
    cpuinfo = _parse_cpuinfo(cpuinfo_text or "")
    raw_machine = machine if machine is not None else _machine(root, cpuinfo, warn)
    arch = arch_of(raw_machine)
    online = _online_cpus(root, cpuinfo, warn)
    topology, topology_source = _topology(root, arch, online, warn)
    run_smi = nvidia_smi if nvidia_smi is not None else root.resolve() == Path("/")
    nvidia = _run_nvidia_smi(warn) if run_smi else ()
    accelerators = _accelerators(root, nvidia, _run_nvidia_smi_list(warn) if nvidia else None)
    storage = _storage(root, warn)
    server_class, reason = classify(accelerators, storage, len(online))
    return HardwareProfile(
        arch=arch,
        machine=raw_machine,
        cpu_model=_cpu_model(cpuinfo, warn),
        cores=len(online),
        topology=topology,
        mem_gib=_mem_gib(root, warn),
        accelerators=accelerators,
        storage=storage,
        server_class=server_class,
        class_reason=reason,
        llc_kib=_llc_kib(root, online),
        warnings=tuple(warn),
        topology_source=topology_source,
    )


# --------------------------------------------------------------------------- power and node

#: Estimated platform power (W) per architecture: (idle base, idle per logical CPU,
#: peak base, peak per logical CPU). The bases cover board, fans, DRAM and NICs. x86 per-CPU
#: figures assume SMT (a 2x40-core, 160-thread Xeon: ~240 W idle, ~710 W peak); ARM figures
#: follow Ampere Altra / Kunpeng 920 class parts (~3 W per core at full load).
CPU_POWER_W: Mapping[Arch, tuple[float, float, float, float]] = {
    Arch.X86_64: (50.0, 1.2, 70.0, 4.0),
    Arch.ARM64: (30.0, 0.6, 50.0, 3.0),
}
#: Estimated (idle, peak) W added per accelerator: compute GPU (A100/H100 PCIe class), NPU
#: (Ascend 310P / Gaudi-lite class), non-compute GPU.
ACCEL_POWER_W: Mapping[str, tuple[float, float]] = {
    "gpu-compute": (40.0, 300.0),
    "npu": (10.0, 75.0),
    "gpu": (5.0, 30.0),
}
#: Estimated (idle, active) W per block device; virtual disks draw power on their host.
STORAGE_POWER_W: Mapping[str, tuple[float, float]] = {
    "nvme": (5.0, 12.0),
    "ssd": (1.0, 5.0),
    "hdd": (5.0, 9.0),
    "emmc": (0.1, 0.5),
    "virtual": (0.0, 0.0),
}
#: Parked (soft-off / suspend) draw: BMC and standby rails.
PARKED_W = 10.0
#: Wake latency: base boot/resume time, plus disk spin-up, plus accelerator driver init.
WAKE_BASE_S = 60.0
WAKE_HDD_S = 30.0
WAKE_ACCEL_S = 30.0


def _accel_key(acc: Accelerator) -> str:
    if acc.kind == "npu":
        return "npu"
    return "gpu-compute" if acc.compute else "gpu"


def default_power_model(profile: HardwareProfile) -> PowerModel:
    """An *estimated* linear power model from the profile's CPUs, accelerators and disks.

    Used when no measured model is configured; :func:`to_node` labels a node built with it
    ``power_model=estimated``. Numbers: :data:`CPU_POWER_W`, :data:`ACCEL_POWER_W`,
    :data:`STORAGE_POWER_W`, :data:`PARKED_W`, ``WAKE_*_S``.
    """
    idle_base, idle_per, peak_base, peak_per = CPU_POWER_W[profile.arch]
    idle = idle_base + idle_per * profile.cores
    peak = peak_base + peak_per * profile.cores
    for acc in profile.accelerators:
        a_idle, a_peak = ACCEL_POWER_W[_accel_key(acc)]
        idle += a_idle
        peak += a_peak
    for disk in profile.storage:
        d_idle, d_peak = STORAGE_POWER_W.get(disk.kind, (0.0, 0.0))
        idle += d_idle
        peak += d_peak
    wake = WAKE_BASE_S
    if any(d.kind == "hdd" for d in profile.storage):
        wake += WAKE_HDD_S
    if profile.compute_accelerators:
        wake += WAKE_ACCEL_S
    return PowerModel(
        idle_w=round(idle, 3),
        peak_w=round(peak, 3),
        parked_w=min(PARKED_W, idle),
        wake_latency_s=wake,
    )


#: Estimated random-read IOPS (thousands) per device kind, until fio measures the node.
IOPS_K: Mapping[str, float] = {
    "nvme": 400.0,
    "ssd": 60.0,
    "hdd": 0.2,
    "emmc": 2.0,
    "virtual": 5.0,
}


def estimated_iops_k(storage: Iterable[StorageDevice]) -> float:
    """Sum of :data:`IOPS_K` over the devices."""
    return sum(IOPS_K.get(d.kind, 0.0) for d in storage)


def to_node(
    profile: HardwareProfile,
    node_id: str,
    site: str = "default",
    power: PowerModel | None = None,
    *,
    iops_k: float | None = None,
    perf: float = 1.0,
    accel_time_slices: int = 1,
) -> Node:
    """The scheduling core's view of this server.

    Capacity: every online logical CPU, all memory, the compute accelerators, and ``iops_k``
    (default :func:`estimated_iops_k`), and the slices its accelerators offer
    (:func:`accel_devices`; 0 when none is sliced). ``power`` defaults to
    :func:`default_power_model`.
    Labels record the CPU model, raw machine name, classification reason and whether power and
    IOPS are estimated.
    """
    model = power if power is not None else default_power_model(profile)
    labels = {
        "cpu_model": profile.cpu_model,
        "machine": profile.machine,
        "class_reason": profile.class_reason,
        "topology_source": profile.topology_source,
        "power_model": "estimated" if power is None else "supplied",
        "iops": "estimated" if iops_k is None else "supplied",
    }
    if profile.llc_kib is not None:
        labels["llc_kib"] = str(profile.llc_kib)
    devices = accel_devices(profile, accel_time_slices)
    if slices_offered(devices):
        labels[LAYOUT_LABEL] = ",".join(str(d.slices) for d in devices)
    return Node(
        id=node_id,
        arch=profile.arch,
        server_class=profile.server_class,
        capacity=Resources(
            cpu=float(profile.cores),
            mem_gib=profile.mem_gib,
            accel=len(profile.compute_accelerators),
            iops_k=estimated_iops_k(profile.storage) if iops_k is None else iops_k,
            accel_slices=slices_offered(devices),
        ),
        power=model,
        topology=profile.topology,
        perf=perf,
        site=site,
        labels=labels,
    )


# --------------------------------------------------------------------------- sliced accelerators


def accel_devices(profile: HardwareProfile, time_slices: int = 1) -> tuple[Device, ...]:
    """The compute accelerators as :mod:`edgesched.core.slices` devices, indexed in
    discovery order (PCI bus order, what CUDA numbers them by with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``): a MIG GPU offers its instances, an SR-IOV device its
    enabled virtual functions, any other ``time_slices`` shares (``[edge]
    accel_time_slices``; 1: whole)."""
    if time_slices < 1:
        raise ValueError(f"time_slices must be >= 1, got {time_slices}")
    out: list[Device] = []
    for index, acc in enumerate(profile.compute_accelerators):
        address = _bus_id(acc.path)
        if acc.slicing and acc.units:
            out.append(Device(index, len(acc.units), acc.slicing, acc.units, address))
        elif time_slices > 1:
            out.append(Device(index, time_slices, "time", (), address))
        else:
            out.append(Device(index, 1, "whole", (), address))
    return tuple(out)


def slices_offered(devices: Iterable[Device]) -> int:
    """A node's ``accel_slices`` capacity: its devices' slices in all, 0 when none is
    sliced (then tasks asking slices go elsewhere)."""
    devs = tuple(devices)
    return sum(d.slices for d in devs) if any(d.slices > 1 for d in devs) else 0
