"""Resource sampling on this machine, and power metering from RAPL/hwmon sysfs trees.

The power sensor trees are plain files in ``tmp_path`` laid out as the kernel lays out
``/sys/class/powercap`` and ``/sys/class/hwmon``; the tests write new counter values between
reads the way the kernel updates them.
"""

from __future__ import annotations

import json
import math
import time
from collections import namedtuple
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgesched.core.model import PowerModel
from edgesched.edge.agent import (
    Agent,
    PowerMeter,
    Sample,
    busy_fraction,
    physical_interfaces,
    rapl_delta_uj,
)
from edgesched.edge.hal import default_power_model, discover

MODEL = PowerModel(idle_w=100.0, peak_w=300.0)
RAPL_MAX = 262_143_328_850  # a real package zone's max_energy_range_uj
NOWHERE = Path("/nonexistent-edgesched-root")


def write(root: Path, rel: str, value: object) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def rapl_zone(root: Path, zone: str, name: str, energy: int, max_uj: int | None = RAPL_MAX) -> None:
    write(root, f"sys/class/powercap/{zone}/name", name)
    write(root, f"sys/class/powercap/{zone}/energy_uj", energy)
    if max_uj is not None:
        write(root, f"sys/class/powercap/{zone}/max_energy_range_uj", max_uj)


# --------------------------------------------------------------------------- real sampling


def test_sampling_this_machine() -> None:
    profile = discover()
    agent = Agent(profile, default_power_model(profile))
    time.sleep(0.2)
    t0 = time.monotonic()
    first = agent.sample(t0)
    spin_until = time.monotonic() + 0.05
    while time.monotonic() < spin_until:  # 50 ms of CPU work between samples
        pass
    time.sleep(0.2)
    second = agent.sample(time.monotonic())
    for s in (first, second):
        assert len(s.cpu_per_core) == profile.cores
        assert all(0.0 <= u <= 1.0 for u in s.cpu_per_core)
        assert 0.0 <= s.cpu_total <= 1.0
        assert s.mem_total_gib > 0 and 0 < s.mem_used_gib <= s.mem_total_gib
        assert s.mem_total_gib == pytest.approx(profile.mem_gib, rel=0.05)
        assert all(f > 0 for f in s.freq_mhz)
        assert math.isfinite(s.power_w) and s.power_w > 0
        assert s.power_source in ("rapl", "hwmon", "model")
        assert s.power_estimated == (s.power_source == "model")
        json.dumps(s.to_json())
    assert first.net_rx_bps == 0.0 and first.net_tx_bps == 0.0  # no baseline yet
    assert math.isfinite(second.net_rx_bps) and second.net_rx_bps >= 0
    assert math.isfinite(second.net_tx_bps) and second.net_tx_bps >= 0
    assert second.cpu_total > 0  # the loop above ran on some core
    assert second.at > first.at


def test_sample_to_json() -> None:
    s = Sample(1.0, (0.5, 0.25), 0.375, (), 1.0, 2.0, 10.0, 20.0, 150.0, "model", True)
    out = s.to_json()
    assert out["cpu_per_core"] == [0.5, 0.25] and out["freq_mhz"] == []
    assert out["power_source"] == "model" and out["power_estimated"] is True
    json.dumps(out)


CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")


def test_busy_fraction_matches_psutil_rules() -> None:
    before = CpuTimes(10, 0, 5, 80, 5, 0, 0, 0, 0, 0)
    # +6 user of which 4 is guest, +2 system, +10 idle, +2 iowait: busy 8 of 20
    after = CpuTimes(16, 0, 7, 90, 7, 0, 0, 0, 4, 0)
    assert busy_fraction(before, after) == pytest.approx(8 / 20)
    assert busy_fraction(after, after) == 0.0
    assert busy_fraction(after, before) == 0.0  # counters went backwards


def test_physical_interfaces(tmp_path: Path) -> None:
    (tmp_path / "sys/class/net/eth0/device").mkdir(parents=True)
    (tmp_path / "sys/class/net/ifb0").mkdir(parents=True)
    assert physical_interfaces(tmp_path, ["eth0", "ifb0", "lo", "veth1"]) == ("eth0",)
    assert physical_interfaces(NOWHERE, ["lo", "wlan0", "eth1"]) == ("wlan0", "eth1")


# --------------------------------------------------------------------------- RAPL


def test_rapl_delta_and_wraparound(tmp_path: Path) -> None:
    rapl_zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000)
    rapl_zone(tmp_path, "intel-rapl:1", "package-1", 5_000_000)
    rapl_zone(tmp_path, "intel-rapl:0:0", "dram", 7)  # subzone: not summed
    rapl_zone(tmp_path, "intel-rapl-mmio:0", "package-0", 9)  # MMIO duplicate of package 0
    meter = PowerMeter(tmp_path, MODEL)
    assert meter.source == "rapl"

    first = meter.measure(10.0, 0.5)  # no delta yet: the model answers
    assert first.estimated and first.source == "model" and first.watts == MODEL.power(0.5)

    write(tmp_path, "sys/class/powercap/intel-rapl:0/energy_uj", 1_000_000 + 50_000_000)
    write(tmp_path, "sys/class/powercap/intel-rapl:1/energy_uj", 5_000_000 + 30_000_000)
    second = meter.measure(11.0, 0.5)  # 50 J + 30 J over 1 s
    assert not second.estimated and second.source == "rapl"
    assert second.watts == pytest.approx(80.0)

    # package 0 wraps: 10 J before the top, then 5 J after zero -> 15 J; package 1 +5 J
    write(tmp_path, "sys/class/powercap/intel-rapl:0/energy_uj", RAPL_MAX - 10_000_000)
    write(tmp_path, "sys/class/powercap/intel-rapl:1/energy_uj", 40_000_000)
    meter.read(12.0, 0.5)
    write(tmp_path, "sys/class/powercap/intel-rapl:0/energy_uj", 5_000_000)
    write(tmp_path, "sys/class/powercap/intel-rapl:1/energy_uj", 45_000_000)
    assert meter.read(12.5, 0.5) == pytest.approx((15 + 5) / 0.5)


def test_rapl_without_range_falls_back_on_backwards_counter(tmp_path: Path) -> None:
    rapl_zone(tmp_path, "intel-rapl:0", "package-0", 9_000_000, max_uj=None)
    meter = PowerMeter(tmp_path, MODEL)
    meter.read(0.0, 0.0)
    write(tmp_path, "sys/class/powercap/intel-rapl:0/energy_uj", 1_000_000)
    reading = meter.measure(1.0, 0.25)
    assert reading.estimated and reading.watts == MODEL.power(0.25)
    write(tmp_path, "sys/class/powercap/intel-rapl:0/energy_uj", 3_000_000)
    assert meter.measure(2.0, 0.25).watts == pytest.approx(2.0)  # recovers with a new base


def test_rapl_same_timestamp_and_vanished_zone_use_model(tmp_path: Path) -> None:
    rapl_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    meter = PowerMeter(tmp_path, MODEL)
    meter.read(5.0, 0.0)
    assert meter.measure(5.0, 0.0).estimated  # dt == 0
    (tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj").unlink()
    assert meter.measure(6.0, 1.0) == meter.measure(7.0, 1.0)
    assert meter.measure(8.0, 1.0).watts == MODEL.peak_w


def test_rapl_psys_only_is_not_a_package(tmp_path: Path) -> None:
    rapl_zone(tmp_path, "intel-rapl:1", "psys", 0)
    rapl_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    meter = PowerMeter(tmp_path, MODEL)
    meter.read(0.0, 0.0)
    write(tmp_path, "sys/class/powercap/intel-rapl:0/energy_uj", 20_000_000)
    write(tmp_path, "sys/class/powercap/intel-rapl:1/energy_uj", 99_000_000)
    assert meter.read(1.0, 0.0) == pytest.approx(20.0)


# --------------------------------------------------------------------------- hwmon


def test_hwmon_microwatts_summed(tmp_path: Path) -> None:
    # an ARM server's SoC sensors: CPU and IO power on one device, DRAM on another
    write(tmp_path, "sys/class/hwmon/hwmon0/name", "smpro_hwmon")
    write(tmp_path, "sys/class/hwmon/hwmon0/power1_input", 45_000_000)
    write(tmp_path, "sys/class/hwmon/hwmon0/power2_input", 15_500_000)
    write(tmp_path, "sys/class/hwmon/hwmon1/name", "dimm_power")
    write(tmp_path, "sys/class/hwmon/hwmon1/power1_average", 4_500_000)
    write(tmp_path, "sys/class/hwmon/hwmon2/name", "coretemp")
    write(tmp_path, "sys/class/hwmon/hwmon2/temp1_input", 50_000)
    meter = PowerMeter(tmp_path, MODEL)
    assert meter.source == "hwmon"
    reading = meter.measure(0.0, 0.9)  # no delta needed: the first read is measured
    assert reading.watts == pytest.approx(65.0) and not reading.estimated
    write(tmp_path, "sys/class/hwmon/hwmon0/power1_input", 95_000_000)
    assert meter.read(1.0, 0.9) == pytest.approx(115.0)


def test_hwmon_skips_psu_output_and_prefers_system_meter(tmp_path: Path) -> None:
    write(tmp_path, "sys/class/hwmon/hwmon0/name", "pmbus")
    write(tmp_path, "sys/class/hwmon/hwmon0/power1_label", "pin")
    write(tmp_path, "sys/class/hwmon/hwmon0/power1_input", 200_000_000)
    write(tmp_path, "sys/class/hwmon/hwmon0/power2_label", "pout1")
    write(tmp_path, "sys/class/hwmon/hwmon0/power2_input", 180_000_000)
    assert PowerMeter(tmp_path, MODEL).read(0.0, 0.0) == pytest.approx(200.0)

    # an ACPI power meter measures the whole server: it alone is used, even over RAPL
    rapl_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    write(tmp_path, "sys/class/hwmon/hwmon3/name", "power_meter")
    write(tmp_path, "sys/class/hwmon/hwmon3/power1_average", 412_000_000)
    meter = PowerMeter(tmp_path, MODEL)
    assert meter.source == "hwmon" and meter.read(0.0, 0.0) == pytest.approx(412.0)


def test_hwmon_read_failure_uses_model(tmp_path: Path) -> None:
    write(tmp_path, "sys/class/hwmon/hwmon0/power1_input", 1_000_000)
    meter = PowerMeter(tmp_path, MODEL)
    (tmp_path / "sys/class/hwmon/hwmon0/power1_input").unlink()
    reading = meter.measure(0.0, 0.5)
    assert reading.estimated and reading.source == "model" and reading.watts == 200.0


def test_rapl_preferred_over_plain_hwmon(tmp_path: Path) -> None:
    rapl_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    write(tmp_path, "sys/class/hwmon/hwmon0/power1_input", 1_000_000)
    assert PowerMeter(tmp_path, MODEL).source == "rapl"


# --------------------------------------------------------------------------- model


def test_model_fallback_marks_samples_estimated(tmp_path: Path) -> None:
    meter = PowerMeter(tmp_path, MODEL)
    assert meter.source == "model"
    reading = meter.measure(0.0, 0.5)
    assert reading.watts == 200.0 and reading.estimated and reading.source == "model"

    profile = discover()
    agent = Agent(profile, MODEL, root=tmp_path)  # tmp_path holds no sensors
    s = agent.sample(time.monotonic())
    assert s.power_source == "model" and s.power_estimated
    assert s.power_w == pytest.approx(MODEL.power(s.cpu_total))


@st.composite
def power_models(draw: st.DrawFn) -> PowerModel:
    parked = draw(st.floats(0, 50))
    idle = parked + draw(st.floats(0, 500))
    peak = idle + draw(st.floats(0, 2000))
    return PowerModel(idle_w=idle, peak_w=peak, parked_w=parked)


@given(
    model=power_models(),
    u1=st.floats(-0.5, 1.5, allow_nan=False),
    u2=st.floats(-0.5, 1.5, allow_nan=False),
)
def test_model_power_monotonic_and_bounded(model: PowerModel, u1: float, u2: float) -> None:
    meter = PowerMeter(NOWHERE, model)
    lo, hi = sorted((u1, u2))
    w_lo, w_hi = meter.read(0.0, lo), meter.read(0.0, hi)
    assert w_lo <= w_hi
    for w in (w_lo, w_hi):
        assert model.idle_w - 1e-9 <= w <= model.peak_w + 1e-9


@given(
    before=st.integers(0, RAPL_MAX),
    used=st.integers(0, RAPL_MAX - 1),  # a full range is indistinguishable from none
)
def test_rapl_delta_recovers_energy_across_one_wrap(before: int, used: int) -> None:
    after = before + used
    if after > RAPL_MAX:
        after -= RAPL_MAX
    assert rapl_delta_uj(before, after, RAPL_MAX) == used
