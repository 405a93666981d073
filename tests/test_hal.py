"""Hardware discovery and classification on small sysfs/procfs trees, and on this machine.

The trees are plain files written into ``tmp_path`` in the kernel's layout (with the same
symlinks sysfs uses for PCI devices), so ``discover(root)`` reads them exactly as it reads
``/sys`` and ``/proc``. The builders live in :mod:`edgesched.edge.fakehw`, which also holds
the demo's simulated servers (checked at the end).
"""

from __future__ import annotations

import json
import os
import platform
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgesched.core.model import Arch, CoreTopology, PowerModel, ServerClass
from edgesched.core.slices import Device, Grant, device_env
from edgesched.edge.fakehw import (
    GIB_KB,
    PCI_IDS,
    SERVER_KINDS,
    block_dev,
    build_server,
    cpu_tree,
    drm_card,
    link,
    nvidia_smi_list,
    pci_device,
    sriov_vfs,
    write,
    x86_ai_4gpu,
)
from edgesched.edge.hal import (
    Accelerator,
    HardwareProfile,
    StorageDevice,
    UnsupportedHardware,
    accel_devices,
    arch_of,
    classify,
    default_power_model,
    discover,
    parse_cpulist,
    parse_nvidia_mig,
    parse_nvidia_smi,
    pci_device_name,
    to_node,
)

# --------------------------------------------------------------------------- CPUs


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("") == ()
    assert parse_cpulist("5\n") == (5,)
    with pytest.raises(ValueError):
        parse_cpulist("3-1")


def test_arm_server_48_cores_4_clusters(tmp_path: Path) -> None:
    cpu_tree(
        tmp_path,
        machine="aarch64",
        cpus=48,
        cluster_of={c: c // 12 for c in range(48)},
        cpuinfo_block="CPU implementer\t: 0x48\nCPU part\t: 0xd01",
        mem_gib=256,
    )
    block_dev(tmp_path, "nvme0n1", 960)
    p = discover(tmp_path)
    assert p.arch is Arch.ARM64 and p.machine == "aarch64"
    assert p.cores == 48
    assert p.topology_source == "arm-cluster"
    assert p.topology.clusters == tuple(tuple(range(i * 12, i * 12 + 12)) for i in range(4))
    assert p.cpu_model == "HiSilicon Kunpeng-920"
    assert p.mem_gib == pytest.approx(256)
    assert p.llc_kib == 32 * 1024
    assert p.server_class is ServerClass.GENERAL
    assert p.storage == (StorageDevice("nvme0n1", "nvme", 960.0, "/sys/block/nvme0n1"),)
    assert p.warnings == ()


def test_arm_one_cluster_per_core_falls_back_to_numa(tmp_path: Path) -> None:
    # cluster_id equal to the core id (private L2 per core) groups nothing: NUMA wins
    cpu_tree(
        tmp_path,
        machine="aarch64",
        cpus=8,
        numa={0: "0-3", 1: "4-7"},
        cpuinfo_block="CPU implementer\t: 0x41\nCPU part\t: 0xd0c",
    )
    p = discover(tmp_path)
    assert p.topology_source == "numa"
    assert p.topology.clusters == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert p.cpu_model == "ARM Neoverse-N1"


def test_x86_two_numa_nodes_interleaved(tmp_path: Path) -> None:
    # x86 cluster_id is the L2 group; it must not be used as the core cluster
    cpu_tree(
        tmp_path,
        machine="x86_64",
        cpus=16,
        cluster_of={c: c // 2 for c in range(16)},
        numa={0: "0-3,8-11", 1: "4-7,12-15"},
        package_of={c: 0 if c % 8 < 4 else 1 for c in range(16)},
        cpuinfo_block="vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6330",
    )
    write(tmp_path, "sys/devices/system/node/node2/cpulist", "")  # CXL memory-only node
    p = discover(tmp_path)
    assert p.arch is Arch.X86_64
    assert p.topology_source == "numa"
    assert p.topology.clusters == ((0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15))
    assert p.cpu_model == "Intel(R) Xeon(R) Gold 6330"


def test_x86_two_sockets_without_numa_groups_by_package(tmp_path: Path) -> None:
    cpu_tree(
        tmp_path,
        machine="x86_64",
        cpus=4,
        package_of={0: 0, 1: 0, 2: 1, 3: 1},
        cpuinfo_block="model name\t: x",
    )
    p = discover(tmp_path)
    assert p.topology_source == "package"
    assert p.topology.clusters == ((0, 1), (2, 3))


def test_offline_cpus_are_left_out(tmp_path: Path) -> None:
    cpu_tree(tmp_path, machine="x86_64", cpus=8, numa={0: "0-3", 1: "4-7"})
    write(tmp_path, "sys/devices/system/cpu/online", "0-2,4-6")
    p = discover(tmp_path)
    assert p.cores == 6
    assert p.topology.clusters == ((0, 1, 2), (4, 5, 6))


def test_cpu_model_fallbacks(tmp_path: Path) -> None:
    cpu_tree(
        tmp_path,
        machine="aarch64",
        cpus=2,
        cpuinfo_block="CPU implementer\t: 0x70\nCPU part\t: 0x663",
    )
    assert discover(tmp_path).cpu_model == "Phytium part 0x663"


# --------------------------------------------------------------------------- accelerators


def test_gpu_server(tmp_path: Path) -> None:
    cpu_tree(tmp_path, machine="x86_64", cpus=32, cpuinfo_block="model name\t: AMD EPYC 7543")
    write(tmp_path, "usr/share/hwdata/pci.ids", PCI_IDS)
    a100 = pci_device(tmp_path, "0000:3b:00.0", "0x10de", "0x20b0", "0x030200")
    drm_card(tmp_path, "card1", a100, render=True)
    link(tmp_path, "sys/class/drm/card1-DP-1", f"{a100}/drm/card1/card1-DP-1")
    bmc = pci_device(tmp_path, "0000:02:00.0", "0x1a03", "0x2000", "0x030000")
    drm_card(tmp_path, "card0", bmc, render=False)  # BMC VGA: display only
    # a second A100 whose driver made no DRM node: found on the PCI bus
    pci_device(tmp_path, "0000:5e:00.0", "0x10de", "0x20b0", "0x030200")
    pci_device(tmp_path, "0000:00:1f.0", "0x8086", "0x1234", "0x060100")  # ISA bridge
    p = discover(tmp_path)
    assert p.server_class is ServerClass.AI_ACCELERATOR
    assert "nvidia gpu" in p.class_reason and "rule" in p.class_reason
    assert len(p.accelerators) == 2
    assert {a.model for a in p.accelerators} == {"GA100 [A100 SXM4 40GB]"}
    assert all(a.kind == "gpu" and a.vendor == "nvidia" and a.compute for a in p.accelerators)
    assert p.accelerators[0].path == "/" + a100
    node = to_node(p, "gpu-1")
    assert node.capacity.accel == 2
    assert node.server_class is ServerClass.AI_ACCELERATOR


def test_integrated_gpu_is_not_an_ai_server(tmp_path: Path) -> None:
    cpu_tree(tmp_path, machine="x86_64", cpus=8)
    igpu = pci_device(tmp_path, "0000:00:02.0", "0x8086", "0x46a6", "0x030000")
    drm_card(tmp_path, "card0", igpu, render=True)
    p = discover(tmp_path)
    assert p.accelerators == (Accelerator("gpu", "intel", "8086:46a6", "/" + igpu, False),)
    assert p.server_class is ServerClass.GENERAL
    assert "non-compute GPU" in p.class_reason
    assert to_node(p, "n").capacity.accel == 0


def test_npus_from_accel_class_and_pci(tmp_path: Path) -> None:
    cpu_tree(tmp_path, machine="aarch64", cpus=4)
    write(tmp_path, "usr/share/misc/pci.ids", PCI_IDS)
    npu = pci_device(tmp_path, "0000:00:0b.0", "0x8086", "0x7d1d", "0x120000")
    link(tmp_path, "sys/class/accel/accel0", f"{npu}/accel/accel0")
    link(tmp_path, "sys/class/accel/accel0/device", npu)
    pci_device(tmp_path, "0000:81:00.0", "0x19e5", "0xd500", "0x120000")  # Ascend, no class
    p = discover(tmp_path)
    assert [(a.kind, a.vendor, a.model, a.compute) for a in p.accelerators] == [
        ("npu", "intel", "8086:7d1d", True),
        ("npu", "huawei", "Ascend 310P", True),
    ]
    assert p.server_class is ServerClass.AI_ACCELERATOR


def test_nvidia_smi_merges_by_bus_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_tree(tmp_path, machine="x86_64", cpus=8)
    # a GeForce (VGA class) is not compute by PCI class, but nvidia-smi shows CUDA is loaded
    pci_device(tmp_path, "0000:01:00.0", "0x10de", "0x2684", "0x030000")
    gpu = tmp_path / "sys/devices/pci0000:00/0000:01:00.0"
    drm_card(tmp_path, "card0", str(gpu.relative_to(tmp_path)), render=True)
    script = write(
        tmp_path,
        "bin/nvidia-smi",
        "#!/bin/sh\necho '00000000:01:00.0, NVIDIA GeForce RTX 4090'\n"
        "echo '00000000:02:00.0, NVIDIA L4'",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    p = discover(tmp_path, nvidia_smi=True)
    models = [(a.model, a.path, a.compute) for a in p.accelerators]
    assert models == [
        ("NVIDIA GeForce RTX 4090", "/sys/devices/pci0000:00/0000:01:00.0", True),
        ("NVIDIA L4", "nvidia-smi:02:00.0", True),
    ]
    assert p.server_class is ServerClass.AI_ACCELERATOR
    # by default nvidia-smi runs only when discovering "/" itself
    assert all(not a.compute for a in discover(tmp_path).accelerators)


def test_nvidia_smi_failure_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_tree(tmp_path, machine="x86_64", cpus=2)
    script = write(
        tmp_path, "bin/nvidia-smi", "#!/bin/sh\necho 'NVML: driver not loaded' >&2\nexit 9"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(script.parent))
    p = discover(tmp_path, nvidia_smi=True)
    assert p.accelerators == ()
    assert any("nvidia-smi exited 9" in w for w in p.warnings)


def test_parse_nvidia_smi_and_pci_names() -> None:
    assert parse_nvidia_smi("00000000:3B:00.0, NVIDIA A100-SXM4-40GB\n\nNo devices\n") == (
        ("3b:00.0", "NVIDIA A100-SXM4-40GB"),
    )
    assert pci_device_name(PCI_IDS, "0x10de", "0x2330") == "GH100 [H100 SXM5 80GB]"
    assert pci_device_name(PCI_IDS, "0x10de", "0x134f") == "10de:134f"  # subsystem line
    assert pci_device_name(None, "0x10de", "0x2330") == "10de:2330"


# --------------------------------------------------------------------------- storage


def test_storage_server_with_six_nvme(tmp_path: Path) -> None:
    cpu_tree(tmp_path, machine="x86_64", cpus=16)
    for i in range(6):
        block_dev(tmp_path, f"nvme{i}n1", 3840)
    block_dev(tmp_path, "nvme0c0n1", 3840, hidden="1")  # multipath path node
    block_dev(tmp_path, "sda", 480)
    block_dev(tmp_path, "sdb", 0)  # empty card reader
    block_dev(tmp_path, "sdc", 32, removable="1")  # USB stick
    for skipped in ("loop0", "ram0", "dm-0", "zram0", "md0", "sr0"):
        block_dev(tmp_path, skipped, 10)
    p = discover(tmp_path)
    assert [(d.name, d.kind) for d in p.storage] == [(f"nvme{i}n1", "nvme") for i in range(6)] + [
        ("sda", "ssd")
    ]
    assert p.storage[0].size_gb == pytest.approx(3840, rel=1e-6)
    assert p.server_class is ServerClass.STORAGE_DENSE
    assert ">= 4 NVMe" in p.class_reason
    assert to_node(p, "s").capacity.iops_k == pytest.approx(6 * 400 + 60)


def test_disk_kinds(tmp_path: Path) -> None:
    cpu_tree(tmp_path, machine="aarch64", cpus=2)
    block_dev(tmp_path, "sda", 8000, rotational=True)
    block_dev(tmp_path, "vda", 100, rotational=True)
    block_dev(tmp_path, "mmcblk0", 32)
    block_dev(tmp_path, "mmcblk0boot0", 4)
    kinds = {d.name: d.kind for d in discover(tmp_path).storage}
    assert kinds == {"sda": "hdd", "vda": "virtual", "mmcblk0": "emmc"}


def test_classify_rules() -> None:
    nvme = StorageDevice("nvme0n1", "nvme", 1.0, "/x")
    hdd = StorageDevice("sda", "hdd", 1.0, "/y")
    gpu = Accelerator("gpu", "nvidia", "A100", "/z", compute=True)
    assert classify([], [nvme] * 3, 8)[0] is ServerClass.GENERAL
    assert classify([], [nvme] * 4, 8)[0] is ServerClass.STORAGE_DENSE
    assert classify([], [hdd] * 7, 8)[0] is ServerClass.GENERAL
    cls, reason = classify([], [hdd] * 8, 8)
    assert cls is ServerClass.STORAGE_DENSE and ">= 8 disks" in reason
    assert classify([gpu], [nvme] * 8, 8)[0] is ServerClass.AI_ACCELERATOR
    assert classify([Accelerator("gpu", "intel", "x", "/", False)], [], 8)[0] is (
        ServerClass.GENERAL
    )


# --------------------------------------------------------------------------- odd hardware


def test_missing_files_everywhere(tmp_path: Path) -> None:
    p = discover(tmp_path, machine="x86_64")
    assert p.cores == 1 and p.topology.clusters == ((0,),)
    assert p.mem_gib == 0.0 and p.llc_kib is None and p.cpu_model == "unknown"
    assert p.accelerators == () and p.storage == ()
    assert p.server_class is ServerClass.GENERAL
    assert any("cpuinfo" in w for w in p.warnings)
    assert any("memory size unknown" in w for w in p.warnings)
    assert any("storage unknown" in w for w in p.warnings)
    node = to_node(p, "bare")
    assert node.capacity.cpu == 1.0


def test_empty_root_guesses_arch_from_host(tmp_path: Path) -> None:
    p = discover(tmp_path)
    assert p.machine == platform.machine()
    assert any("assumed this host" in w for w in p.warnings)


def test_malformed_files_fall_back(tmp_path: Path) -> None:
    write(tmp_path, "proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\n\nprocessor\t: 1")
    write(tmp_path, "sys/devices/system/cpu/online", "garbage")
    write(tmp_path, "sys/devices/system/node/node0/cpulist", "x-y")
    write(tmp_path, "sys/devices/system/node/node0/meminfo", f"Node 0 MemTotal: {GIB_KB} kB")
    write(tmp_path, "sys/block/sda/size", "not a number")
    write(tmp_path, "sys/devices/system/cpu/cpu0/cache/index0/size", "??")
    p = discover(tmp_path)
    assert p.arch is Arch.X86_64  # from cpuinfo vendor_id
    assert p.cores == 2
    assert p.topology.clusters == ((0, 1),)
    assert p.mem_gib == pytest.approx(1.0)
    assert p.storage == ()
    assert any("counted processors" in w for w in p.warnings)
    assert any("sda" in w for w in p.warnings)


@pytest.mark.parametrize("machine", ["riscv64", "ppc64le", "armv7l", "i686", "s390x"])
def test_unknown_arch_is_unsupported(tmp_path: Path, machine: str) -> None:
    cpu_tree(tmp_path, machine=machine, cpus=4)
    with pytest.raises(UnsupportedHardware, match=machine):
        discover(tmp_path)
    with pytest.raises(UnsupportedHardware, match="arm64"):
        arch_of(machine)


def test_arch_aliases() -> None:
    assert arch_of("aarch64") is arch_of("ARM64") is Arch.ARM64
    assert arch_of("x86_64") is arch_of("amd64") is Arch.X86_64


# --------------------------------------------------------------------------- power and node


def _profile(arch: Arch, cores: int, accels: int, nvme: int) -> HardwareProfile:
    accs = tuple(Accelerator("gpu", "nvidia", "A100", f"/g{i}", True) for i in range(accels))
    disks = tuple(StorageDevice(f"nvme{i}n1", "nvme", 1.0, "/") for i in range(nvme))
    cls, reason = classify(accs, disks, cores)
    return HardwareProfile(
        arch=arch,
        machine=arch.value,
        cpu_model="m",
        cores=cores,
        topology=CoreTopology.uniform(cores),
        mem_gib=64.0,
        accelerators=accs,
        storage=disks,
        server_class=cls,
        class_reason=reason,
        llc_kib=None,
        warnings=(),
    )


@given(
    arch=st.sampled_from(list(Arch)),
    cores=st.integers(1, 512),
    accels=st.integers(0, 8),
    nvme=st.integers(0, 24),
)
def test_default_power_model_is_valid_and_grows(
    arch: Arch, cores: int, accels: int, nvme: int
) -> None:
    model = default_power_model(_profile(arch, cores, accels, nvme))
    assert 0 < model.parked_w <= model.idle_w < model.peak_w
    bigger = default_power_model(_profile(arch, cores + 1, accels + 1, nvme + 1))
    assert bigger.idle_w > model.idle_w and bigger.peak_w > model.peak_w


def test_arm_is_more_efficient_than_x86_per_core() -> None:
    arm = to_node(_profile(Arch.ARM64, 48, 0, 0), "arm")
    x86 = to_node(_profile(Arch.X86_64, 48, 0, 0), "x86")
    assert arm.efficiency > x86.efficiency
    assert arm.labels["power_model"] == "estimated"


def test_to_node_with_supplied_power_and_iops(tmp_path: Path) -> None:
    cpu_tree(tmp_path, machine="aarch64", cpus=48, cluster_of={c: c // 12 for c in range(48)})
    p = discover(tmp_path)
    power = PowerModel(idle_w=90.0, peak_w=260.0)
    node = to_node(p, "arm-48", site="campus", power=power, iops_k=120.0, perf=1.2)
    assert node.id == "arm-48" and node.site == "campus" and node.perf == 1.2
    assert node.power is power and node.labels["power_model"] == "supplied"
    assert node.capacity.cpu == 48.0 and node.capacity.iops_k == 120.0
    assert node.topology is not None and len(node.topology.clusters) == 4
    assert node.labels["llc_kib"] == str(32 * 1024)


# --------------------------------------------------------------------------- this machine


def test_discover_this_machine() -> None:
    p = discover()
    assert p.cores == os.cpu_count()
    assert len(p.topology.cores) == p.cores
    assert p.mem_gib > 0
    assert p.machine == platform.machine()
    assert p.arch is arch_of(platform.machine())
    assert p.cpu_model
    assert all(d.size_gb > 0 for d in p.storage)
    json.dumps(p.to_json())
    node = to_node(p, "self")
    assert node.capacity.mem_gib == p.mem_gib


# --------------------------------------------------------------------------- simulated servers


def test_demo_servers_classify_as_intended(tmp_path: Path) -> None:
    found = {}
    for kind in SERVER_KINDS:
        p = discover(build_server(kind, tmp_path / kind.name))
        assert p.warnings == (), (kind.name, p.warnings)
        found[kind.name] = (p.arch, p.cores, p.server_class, len(p.compute_accelerators))
    assert found == {
        "arm48": (Arch.ARM64, 48, ServerClass.GENERAL, 0),
        "ai4gpu": (Arch.X86_64, 32, ServerClass.AI_ACCELERATOR, 4),
        "stor6": (Arch.X86_64, 24, ServerClass.STORAGE_DENSE, 0),
        "arm8": (Arch.ARM64, 8, ServerClass.GENERAL, 0),
        "x86g32": (Arch.X86_64, 32, ServerClass.GENERAL, 0),
    }
    with pytest.raises(FileExistsError):
        build_server(SERVER_KINDS[0], tmp_path / "arm48")


# --------------------------------------------------------------------------- sliced accelerators


def test_sriov_virtual_functions_are_slices_of_their_device(tmp_path: Path) -> None:
    x86_ai_4gpu(tmp_path)
    vfs = sriov_vfs(tmp_path, "0000:3b:00.0", total=16, enabled=3)
    assert vfs == ["0000:3b:00.1", "0000:3b:00.2", "0000:3b:00.3"]
    p = discover(tmp_path)
    # the virtual functions are not accelerators of their own
    assert len(p.compute_accelerators) == 4
    sliced = [a for a in p.accelerators if a.slicing]
    assert [(a.slicing, a.units) for a in sliced] == [("sriov", tuple(vfs))]
    devices = accel_devices(p)
    assert [(d.index, d.slices, d.kind) for d in devices] == [
        (0, 1, "whole"),
        (1, 3, "sriov"),
        (2, 1, "whole"),
        (3, 1, "whole"),
    ]
    node = to_node(p, "n1")
    assert node.capacity.accel == 4 and node.capacity.accel_slices == 6
    assert device_env(devices, Grant("t", ((1, (1,)),)))["EDGESCHED_VF_PCI"] == "0000:3b:00.2"
    entry = json.loads(json.dumps(p.to_json()))["accelerators"][1]
    assert entry["slicing"] == "sriov" and entry["units"] == vfs
    # without SR-IOV the profile's JSON is what it was
    assert "slicing" not in json.loads(json.dumps(p.to_json()))["accelerators"][0]


def test_sriov_with_no_enabled_vfs_is_whole(tmp_path: Path) -> None:
    x86_ai_4gpu(tmp_path)
    sriov_vfs(tmp_path, "0000:17:00.0", total=8, enabled=0)
    p = discover(tmp_path)
    assert not any(a.slicing for a in p.accelerators)
    assert to_node(p, "n").capacity.accel_slices == 0


def test_time_slicing_is_a_configured_share(tmp_path: Path) -> None:
    x86_ai_4gpu(tmp_path)
    p = discover(tmp_path)
    assert to_node(p, "n").capacity.accel_slices == 0
    node = to_node(p, "n", accel_time_slices=4)
    assert node.capacity.accel == 4 and node.capacity.accel_slices == 16
    assert {(d.slices, d.kind) for d in accel_devices(p, 4)} == {(4, "time")}
    devices = accel_devices(p, 4)
    assert device_env(devices, Grant("t", ((2, (0, 1)),))) == {
        "CUDA_VISIBLE_DEVICES": "2",
        "EDGESCHED_ACCEL_SLICE": "2:0,1/4",
    }
    with pytest.raises(ValueError):
        accel_devices(p, 0)


def test_mig_instances_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x86_ai_4gpu(tmp_path)
    listing = nvidia_smi_list(4, {1: 3})
    write(tmp_path, "nvidia-l.txt", listing)
    script = write(
        tmp_path,
        "bin/nvidia-smi",
        "#!/bin/sh\n"
        f'if [ "$1" = "-L" ]; then cat {tmp_path}/nvidia-l.txt; exit 0; fi\n'
        + "".join(
            f"echo '00000000:{bus}:00.0, NVIDIA A100-SXM4-40GB'\n"
            for bus in ("17", "3B", "86", "AF")
        ),
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    p = discover(tmp_path, nvidia_smi=True)
    mig = [a for a in p.accelerators if a.slicing == "mig"]
    assert len(mig) == 1 and mig[0].path.endswith("0000:3b:00.0")
    assert mig[0].units == ("MIG-1-0-fake", "MIG-1-1-fake", "MIG-1-2-fake")
    # MIG on one GPU, time-slicing on the others: the hardware's slices win where it has them
    devices = accel_devices(p, 2)
    assert [(d.slices, d.kind) for d in devices] == [
        (2, "time"),
        (3, "mig"),
        (2, "time"),
        (2, "time"),
    ]
    assert device_env(devices, Grant("t", ((1, (2,)),)))["CUDA_VISIBLE_DEVICES"] == "MIG-1-2-fake"


def test_parse_nvidia_mig() -> None:
    text = (
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d9)\n"
        "  MIG 3g.20gb     Device  0: (UUID: MIG-7f5e1c2a-aaaa)\n"
        "  MIG 3g.20gb     Device  1: (UUID: MIG-7f5e1c2a-bbbb)\n"
        "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-6e6cb1ea)\n"
        "No devices were found\n"
    )
    assert parse_nvidia_mig(text) == {0: ("MIG-7f5e1c2a-aaaa", "MIG-7f5e1c2a-bbbb")}
    assert parse_nvidia_mig("") == {}
    assert Device(0, 2, "mig", ("a", "b")).slices == 2
