"""Simulated servers: small sysfs/procfs trees that :func:`edgesched.edge.hal.discover` reads.

A tree is plain files written under a directory in the kernel's layout (with the symlinks sysfs
uses for PCI devices), so ``discover(root)`` reads it exactly as it reads ``/sys`` and
``/proc``. An edge node configured with ``[edge] hal_root = "<dir>"`` then registers as that
server (architecture, cores and clusters, memory, GPUs, NVMe disks, server class, estimated
power model) while its tasks still run on this machine.

The builders (:func:`cpu_tree`, :func:`block_dev`, :func:`pci_device`, :func:`drm_card`) are
what the HAL tests use; :data:`SERVER_KINDS` are the ready-made servers of ``edgesched demo``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

GIB_KB = 1024 * 1024
PCI_IDS = """\
# minimal pci.ids
10de  NVIDIA Corporation
\t20b0  GA100 [A100 SXM4 40GB]
\t\t10de 134f  A100 subsystem
\t2330  GH100 [H100 SXM5 80GB]
19e5  Huawei Technologies Co., Ltd.
\td500  Ascend 310P
"""


def write(root: Path, rel: str, text: str) -> Path:
    """``text`` (plus a newline, as sysfs has) in ``root/rel``, parents created."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path


def link(root: Path, rel: str, target_rel: str) -> None:
    """A sysfs-style relative symlink at ``rel`` to ``target_rel`` (both inside ``root``)."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    (root / target_rel).mkdir(parents=True, exist_ok=True)
    path.symlink_to(os.path.relpath((root / target_rel).resolve(), path.parent.resolve()))


def cpu_tree(
    root: Path,
    *,
    machine: str,
    cpus: int,
    cluster_of: Mapping[int, int] | None = None,
    numa: Mapping[int, str] | None = None,
    package_of: Mapping[int, int] | None = None,
    cpuinfo_block: str = "",
    mem_gib: int = 64,
) -> None:
    """CPUs (online list, topology ids, NUMA nodes, cpuinfo), memory and a cache hierarchy
    (64K L1d/L1i, 512K L2, 32M L3)."""
    write(root, "proc/sys/kernel/arch", machine)
    write(root, "sys/devices/system/cpu/online", f"0-{cpus - 1}")
    for cpu in range(cpus):
        topo = f"sys/devices/system/cpu/cpu{cpu}/topology"
        write(root, f"{topo}/cluster_id", str((cluster_of or {}).get(cpu, cpu)))
        write(root, f"{topo}/physical_package_id", str((package_of or {}).get(cpu, 0)))
        write(root, f"{topo}/die_id", "0")
    for node, cpulist in (numa or {0: f"0-{cpus - 1}"}).items():
        write(root, f"sys/devices/system/node/node{node}/cpulist", cpulist)
    write(
        root,
        "proc/cpuinfo",
        "\n\n".join(f"processor\t: {c}\n{cpuinfo_block}" for c in range(cpus)),
    )
    write(root, "proc/meminfo", f"MemTotal:       {mem_gib * GIB_KB} kB\nMemFree: 1 kB")
    cache = "sys/devices/system/cpu/cpu0/cache"
    for index, (level, kind, size) in enumerate(
        [
            (1, "Data", "64K"),
            (1, "Instruction", "64K"),
            (2, "Unified", "512K"),
            (3, "Unified", "32M"),
        ]
    ):
        write(root, f"{cache}/index{index}/level", str(level))
        write(root, f"{cache}/index{index}/type", kind)
        write(root, f"{cache}/index{index}/size", size)


def block_dev(root: Path, name: str, gb: float, *, rotational: bool = False, **extra: str) -> None:
    """A block device of ``gb`` GB under ``sys/block``; ``extra`` files (``hidden="1"`` ...)."""
    write(root, f"sys/block/{name}/size", str(int(gb * 1e9 / 512)))
    write(root, f"sys/block/{name}/queue/rotational", "1" if rotational else "0")
    for key, value in extra.items():
        write(root, f"sys/block/{name}/{key}", value)


def pci_device(root: Path, addr: str, vendor: str, device: str, pci_class: str) -> str:
    """A PCI device at ``addr`` (linked from ``sys/bus/pci/devices``); returns its path."""
    rel = f"sys/devices/pci0000:00/{addr}"
    write(root, f"{rel}/vendor", vendor)
    write(root, f"{rel}/device", device)
    write(root, f"{rel}/class", pci_class)
    link(root, f"sys/bus/pci/devices/{addr}", rel)
    return rel


def drm_card(root: Path, card: str, device_rel: str, *, render: bool) -> None:
    """A DRM card for the PCI device at ``device_rel``; ``render`` adds a render node."""
    link(root, f"sys/class/drm/{card}", f"{device_rel}/drm/{card}")
    link(root, f"sys/class/drm/{card}/device", device_rel)
    if render:
        (root / device_rel / "drm/renderD128").mkdir(parents=True, exist_ok=True)


def sriov_vfs(root: Path, pf_addr: str, total: int, enabled: int) -> list[str]:
    """SR-IOV on the PCI device at ``pf_addr``: ``sriov_totalvfs``, ``sriov_numvfs`` and,
    for each enabled virtual function, a PCI device of its own (next functions of the same
    slot, then the next slots) with a ``physfn`` link back and a ``virtfn<N>`` link to it.
    Returns the virtual functions' addresses."""
    pf_rel = f"sys/devices/pci0000:00/{pf_addr}"
    write(root, f"{pf_rel}/sriov_totalvfs", str(total))
    write(root, f"{pf_rel}/sriov_numvfs", str(enabled))
    domain, bus, rest = pf_addr.split(":")
    slot = int(rest.split(".")[0], 16)
    vendor = (root / pf_rel / "vendor").read_text().strip()
    device = (root / pf_rel / "device").read_text().strip()
    pci_class = (root / pf_rel / "class").read_text().strip()
    out: list[str] = []
    for n in range(enabled):
        number = n + 1  # function 0 is the physical function itself
        addr = f"{domain}:{bus}:{slot + number // 8:02x}.{number % 8}"
        vf_rel = pci_device(root, addr, vendor, device, pci_class)
        link(root, f"{vf_rel}/physfn", pf_rel)
        link(root, f"{pf_rel}/virtfn{n}", vf_rel)
        out.append(addr)
    return out


def nvidia_smi_list(gpus: int, mig: dict[int, int]) -> str:
    """The text ``nvidia-smi -L`` prints for ``gpus`` A100s, GPU i split into ``mig[i]``
    instances (``MIG-<gpu>-<n>`` UUIDs, fake but of the printed shape)."""
    lines: list[str] = []
    for i in range(gpus):
        lines.append(f"GPU {i}: NVIDIA A100-SXM4-40GB (UUID: GPU-0000000{i}-fake)")
        for n in range(mig.get(i, 0)):
            lines.append(f"  MIG 1g.5gb     Device  {n}: (UUID: MIG-{i}-{n}-fake)")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- ready-made servers

_KUNPENG = "CPU implementer\t: 0x48\nCPU part\t: 0xd01"
_NEOVERSE_N1 = "CPU implementer\t: 0x41\nCPU part\t: 0xd0c"


def arm_general_48(root: Path) -> None:
    """A 48-core ARM general server (4 clusters of 12, Kunpeng 920 class), 256 GiB, 1 NVMe."""
    cpu_tree(
        root,
        machine="aarch64",
        cpus=48,
        cluster_of={c: c // 12 for c in range(48)},
        cpuinfo_block=_KUNPENG,
        mem_gib=256,
    )
    block_dev(root, "nvme0n1", 960)


def x86_ai_4gpu(root: Path) -> None:
    """An x86 AI-accelerator server: 32 CPUs on 2 NUMA nodes, 512 GiB, 4 A100 GPUs."""
    cpu_tree(
        root,
        machine="x86_64",
        cpus=32,
        numa={0: "0-15", 1: "16-31"},
        package_of={c: c // 16 for c in range(32)},
        cpuinfo_block="vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7543 32-Core Processor",
        mem_gib=512,
    )
    write(root, "usr/share/hwdata/pci.ids", PCI_IDS)
    for i, bus in enumerate(("17", "3b", "86", "af")):
        gpu = pci_device(root, f"0000:{bus}:00.0", "0x10de", "0x20b0", "0x030200")
        drm_card(root, f"card{i + 1}", gpu, render=True)
    bmc = pci_device(root, "0000:02:00.0", "0x1a03", "0x2000", "0x030000")
    drm_card(root, "card0", bmc, render=False)  # BMC VGA: display only
    block_dev(root, "nvme0n1", 3840)


def x86_storage_6nvme(root: Path) -> None:
    """An x86 storage-dense server: 24 CPUs, 128 GiB, 6 NVMe disks and a boot SSD."""
    cpu_tree(
        root,
        machine="x86_64",
        cpus=24,
        cpuinfo_block="vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Silver 4310",
        mem_gib=128,
    )
    for i in range(6):
        block_dev(root, f"nvme{i}n1", 7680)
    block_dev(root, "sda", 480)


def arm_small_8(root: Path) -> None:
    """A small ARM general node (an edge gateway): 8 cores, 32 GiB, eMMC and one NVMe."""
    cpu_tree(root, machine="aarch64", cpus=8, cpuinfo_block=_NEOVERSE_N1, mem_gib=32)
    block_dev(root, "mmcblk0", 64)
    block_dev(root, "nvme0n1", 480)


def x86_general_32(root: Path) -> None:
    """An x86 general server: 32 CPUs on 2 NUMA nodes, 256 GiB, 2 NVMe disks."""
    cpu_tree(
        root,
        machine="x86_64",
        cpus=32,
        numa={0: "0-15", 1: "16-31"},
        package_of={c: c // 16 for c in range(32)},
        cpuinfo_block="vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6330",
        mem_gib=256,
    )
    for i in range(2):
        block_dev(root, f"nvme{i}n1", 1920)


@dataclass(frozen=True)
class ServerKind:
    """A ready-made simulated server: a short name (for node ids) and its tree builder."""

    name: str
    describe: str
    build: Callable[[Path], None]


#: The demo's servers, in the order nodes are made (cycled when more are asked for).
SERVER_KINDS: tuple[ServerKind, ...] = (
    ServerKind("arm48", "ARM general, 48 cores in 4 clusters", arm_general_48),
    ServerKind("ai4gpu", "x86 AI accelerator, 32 CPUs, 4 GPUs", x86_ai_4gpu),
    ServerKind("stor6", "x86 storage-dense, 24 CPUs, 6 NVMe", x86_storage_6nvme),
    ServerKind("arm8", "small ARM general, 8 cores", arm_small_8),
    ServerKind("x86g32", "x86 general, 32 CPUs", x86_general_32),
)


def build_server(kind: ServerKind, root: Path) -> Path:
    """Write ``kind``'s tree into ``root`` (a fresh or empty directory); returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty; a simulated server needs a fresh directory")
    kind.build(root)
    return root
