"""Tests for TOML config loading and its key-naming errors (edgesched.config)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from edgesched.config import (
    KNOWN_WEIGHTS,
    ConfigError,
    EdgeschedConfig,
    SimConfig,
    builtin_profiles,
    default_config_toml,
    load_config,
    parse_config,
)
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.tidal import TidalProfile, campus_profile, parse_clock


def parse(text: str) -> EdgeschedConfig:
    return parse_config(tomllib.loads(text))


def error_of(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return info.value


WINDOW = """
[[policy.tidal.windows]]
name = "gates"
start = "07:00"
end = "09:00"
shares = { face-recognition = 0.7 }
"""


# --- valid configs -----------------------------------------------------------------------------


def test_example_parses_to_defaults_with_energy_mode_and_campus_profile() -> None:
    config = parse(default_config_toml())
    assert config == EdgeschedConfig(
        policy=PolicyConfig(mode=PolicyMode.ENERGY, tidal=campus_profile()),
        sim=SimConfig(),
    )


def test_example_loads_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "edgesched.toml"
    path.write_text(default_config_toml())
    assert load_config(path) == parse(default_config_toml())


def test_empty_file_gives_all_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.toml"
    path.write_text("")
    assert load_config(path) == EdgeschedConfig()
    assert parse_config({}) == EdgeschedConfig(PolicyConfig(), SimConfig())


def test_full_config() -> None:
    config = parse(
        """
        [policy]
        mode = "balance"
        preemption = false
        park_idle_after_s = 120
        spare_cpu_fraction = 0.25
        min_spare_cpu = 4.5
        max_migrations_per_cycle = 0
        consolidate_below = 0.5
        max_preemptions_per_task = 3
        [policy.weights]
        energy_efficiency = 3
        class_fit = 0.0
        [policy.tidal]
        name = "site-a"
        [[policy.tidal.windows]]
        name = "night"
        start = "22:00"
        end = 06:00:00
        shares = { video-analytics = 0.5, "odd class" = 0.1 }
        rotate = ["ai-training", "video-analytics"]
        rotate_share = 0.3
        slice_minutes = 15
        [[policy.tidal.windows]]
        name = "day"
        start = "08:00"
        end = "24:00"
        [sim]
        scenario = "factory"
        seed = 42
        days = 2
        scale = 0.5
        step_s = 5
        affinity_load = 0.9
        """
    )
    policy = config.policy
    assert policy.mode is PolicyMode.BALANCE
    assert policy.preemption is False
    assert policy.park_idle_after_s == 120.0
    assert policy.spare_cpu_fraction == 0.25
    assert policy.min_spare_cpu == 4.5
    assert policy.max_migrations_per_cycle == 0
    assert policy.consolidate_below == 0.5
    assert policy.max_preemptions_per_task == 3
    assert policy.weights == {"energy_efficiency": 3.0, "class_fit": 0.0}
    assert policy.effective_weights == {
        "least_allocated": 1.0,
        "balanced_allocation": 1.0,
        "energy_efficiency": 3.0,
    }
    tidal = policy.tidal
    assert tidal.name == "site-a"
    night, day = tidal.windows
    assert (night.start_s, night.end_s) == (22 * 3600.0, 6 * 3600.0)
    assert night.shares == {"video-analytics": 0.5, "odd class": 0.1}
    assert night.rotate == ("ai-training", "video-analytics")
    assert (night.rotate_share, night.slice_s) == (0.3, 900.0)
    assert (day.start_s, day.end_s, dict(day.shares), day.rotate) == (8 * 3600.0, 86400.0, {}, ())
    assert config.sim == SimConfig("factory", 42, 2.0, 0.5, 5.0, 0.9)
    assert isinstance(config.sim.days, float)


@pytest.mark.parametrize("name", ["campus", "none"])
def test_builtin_profiles_by_name(name: str) -> None:
    config = parse(f'[policy.tidal]\nprofile = "{name}"')
    assert config.policy.tidal == builtin_profiles()[name]


def test_builtin_profiles() -> None:
    profiles = builtin_profiles()
    assert profiles["campus"] == campus_profile()
    assert profiles["none"] == TidalProfile()


def test_mode_names_every_policy_mode() -> None:
    for mode in PolicyMode:
        assert parse(f'[policy]\nmode = "{mode.value}"').policy.mode is mode


# --- errors name the key -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("mdoe = 1", "mdoe", "unknown key"),
        ("[polcy]", "polcy", "did you mean 'policy'?"),
        ('[policy]\nmdoe = "energy"', "policy.mdoe", "did you mean 'mode'?"),
        ("[policy.weights]\nenergy = 1.0", "policy.weights.energy", "unknown key"),
        ('[policy.tidal]\nprofil = "campus"', "policy.tidal.profil", "did you mean 'profile'?"),
        (WINDOW + "colour = 1", "policy.tidal.windows[0].colour", "unknown key"),
        ("[sim]\nsede = 1", "sim.sede", "did you mean 'seed'?"),
    ],
)
def test_unknown_keys(text: str, key: str, fragment: str) -> None:
    err = error_of(text)
    assert str(err).startswith(f"{key}: ")
    assert err.key == key
    assert fragment in str(err)


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("policy = 3", "policy", "expected a table, got integer 3"),
        ("[policy]\nmode = 1", "policy.mode", "expected a string, got integer 1"),
        ('[policy]\npreemption = "yes"', "policy.preemption", "expected a boolean"),
        ('[policy]\npark_idle_after_s = "5m"', "policy.park_idle_after_s", "expected a number"),
        ("[policy]\nmax_migrations_per_cycle = 2.0", "policy.max_migrations_per_cycle", "float"),
        ("[policy]\nweights = [1]", "policy.weights", "expected a table, got an array"),
        ("[policy.tidal]\nwindows = 1", "policy.tidal.windows", "expected an array of tables"),
        ("[policy.tidal]\nwindows = [1]", "policy.tidal.windows[0]", "expected a table"),
        ("[sim]\nseed = 1.5", "sim.seed", "expected an integer, got float 1.5"),
        ("[sim]\nscenario = 1", "sim.scenario", "expected a string"),
        (WINDOW.replace('"07:00"', "7"), "policy.tidal.windows[0].start", 'like "07:30"'),
        (WINDOW + 'rotate = "ai"', "policy.tidal.windows[0].rotate", "an array of strings"),
        (WINDOW + "rotate = [1]", "policy.tidal.windows[0].rotate[0]", "non-empty string"),
        (
            WINDOW.replace("{ face-recognition = 0.7 }", "0.5"),
            "policy.tidal.windows[0].shares",
            "expected a table, got float 0.5",
        ),
        (
            WINDOW.replace("0.7", '"0.7"'),
            "policy.tidal.windows[0].shares.face-recognition",
            "expected a number, got string",
        ),
    ],
)
def test_wrong_types(text: str, key: str, expected: str) -> None:
    err = error_of(text)
    assert str(err).startswith(f"{key}: ")
    assert expected in str(err)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[policy]\nmin_spare_cpu = true", "policy.min_spare_cpu"),
        ("[policy]\nmax_preemptions_per_task = false", "policy.max_preemptions_per_task"),
        ("[policy.weights]\nclass_fit = true", "policy.weights.class_fit"),
        ("[sim]\nseed = true", "sim.seed"),
        ("[sim]\nscale = true", "sim.scale"),
    ],
)
def test_bool_is_not_a_number(text: str, key: str) -> None:
    err = error_of(text)
    assert str(err).startswith(f"{key}: expected ")
    assert "got boolean true" in str(err) or "got boolean false" in str(err)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            WINDOW.replace("0.7", "1.5"),
            "policy.tidal.windows[0].shares.face-recognition: must be between 0 and 1, got 1.5",
        ),
        (
            WINDOW.replace("0.7", "-0.1"),
            "policy.tidal.windows[0].shares.face-recognition: must be between 0 and 1, got -0.1",
        ),
        ("[policy]\npark_idle_after_s = -1", "policy.park_idle_after_s: must be >= 0, got -1"),
        (
            "[policy]\nspare_cpu_fraction = 11",
            "policy.spare_cpu_fraction: must be between 0 and 10",
        ),
        ("[policy]\nconsolidate_below = 1.01", "policy.consolidate_below: must be between 0 and 1"),
        ("[policy]\nmax_migrations_per_cycle = -1", "policy.max_migrations_per_cycle: must be >="),
        ("[policy.weights]\nclass_fit = -2", "policy.weights.class_fit: must be >= 0, got -2"),
        ("[policy]\nmin_spare_cpu = nan", "policy.min_spare_cpu: must be a finite number"),
        ("[sim]\ndays = 0", "sim.days: must be > 0, got 0"),
        ("[sim]\nstep_s = -inf", "sim.step_s: must be a finite number"),
        ("[sim]\nseed = -1", "sim.seed: must be >= 0"),
        ("[sim]\naffinity_load = 2", "sim.affinity_load: must be between 0 and 1"),
        ('[sim]\nscenario = ""', "sim.scenario: must not be empty"),
        (WINDOW + "rotate = ['a']\nrotate_share = 1.2", "policy.tidal.windows[0].rotate_share:"),
        (
            WINDOW + "rotate = ['a']\nrotate_share = 0.1\nslice_minutes = 0",
            "policy.tidal.windows[0].slice_minutes: must be > 0",
        ),
    ],
)
def test_out_of_range(text: str, message: str) -> None:
    assert str(error_of(text)).startswith(message)


def test_shares_summing_above_one() -> None:
    text = WINDOW.replace("face-recognition = 0.7", "face-recognition = 0.7, cloud-desktop = 0.4")
    assert str(error_of(text)).startswith("policy.tidal.windows[0].shares: add up to 1.1")
    with_rotation = WINDOW + 'rotate = ["ai-training"]\nrotate_share = 0.4'
    err = error_of(with_rotation)
    assert str(err).startswith("policy.tidal.windows[0].shares: add up to 1.1 (with rotate_share)")


@pytest.mark.parametrize("clock", ["25:00", "07:60", "24:30", "7", "seven", ""])
def test_bad_clock(clock: str) -> None:
    err = error_of(WINDOW + WINDOW.replace('"07:00"', f'"{clock}"').replace("gates", "x"))
    assert str(err).startswith("policy.tidal.windows[1].start: ")
    assert repr(clock) in str(err)


def test_missing_window_keys() -> None:
    for key in ("name", "start", "end"):
        text = "\n".join(line for line in WINDOW.splitlines() if not line.startswith(key))
        assert str(error_of(text)) == f"policy.tidal.windows[0].{key}: missing (required)"


def test_rotation_keys_go_together() -> None:
    err = error_of(WINDOW + 'rotate = ["a", "b"]')
    assert str(err).startswith("policy.tidal.windows[0].rotate_share: missing")
    err = error_of(WINDOW + "rotate_share = 0.2")
    assert str(err).startswith("policy.tidal.windows[0].rotate_share: only valid together")
    err = error_of(WINDOW + "slice_minutes = 10")
    assert str(err).startswith("policy.tidal.windows[0].slice_minutes: only valid together")


def test_core_validation_is_reraised_with_the_section_path() -> None:
    err = error_of(WINDOW.replace('end = "09:00"', 'end = "07:00"'))
    assert str(err).startswith("policy.tidal.windows[0]: ")
    assert "start and end are equal" in str(err)


def test_duplicate_window_names() -> None:
    err = error_of(WINDOW + WINDOW.replace("07:00", "10:00").replace("09:00", "11:00"))
    assert str(err) == "policy.tidal.windows[1].name: duplicate window name 'gates'"


def test_profile_and_windows_are_exclusive() -> None:
    err = error_of('[policy.tidal]\nprofile = "campus"\n' + WINDOW)
    assert str(err).startswith("policy.tidal: set either profile or windows, not both")


def test_profile_name_needs_windows() -> None:
    err = error_of('[policy.tidal]\nprofile = "campus"\nname = "x"')
    assert str(err).startswith("policy.tidal.name: ")


def test_unknown_profile() -> None:
    err = error_of('[policy.tidal]\nprofile = "harbour"')
    assert str(err) == "policy.tidal.profile: unknown profile 'harbour' (built-in: campus, none)"


def test_unknown_mode() -> None:
    err = error_of('[policy]\nmode = "fast"')
    assert str(err) == "policy.mode: must be one of priority, balance, energy, learned, got 'fast'"


def test_quoted_keys_are_quoted_in_the_path() -> None:
    text = WINDOW.replace("face-recognition = 0.7", '"odd class" = 2')
    assert str(error_of(text)).startswith('policy.tidal.windows[0].shares."odd class": ')


def test_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[policy]\nmode = "energy"\npreemption = \n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not valid TOML: ")
    assert "line 3" in message
    assert "column" in message
    assert info.value.source == str(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: no such file"


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)  # a directory
    assert str(info.value).startswith(f"{tmp_path}: cannot read")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_config(binary)


def test_key_errors_carry_the_source(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[policy]\nmdoe = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith("policy.mdoe: ")
    assert info.value.source == str(path)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_every_known_weight_is_accepted() -> None:
    text = "[policy.weights]\n" + "\n".join(f"{name} = 0.5" for name in sorted(KNOWN_WEIGHTS))
    assert parse(text).policy.weights == dict.fromkeys(KNOWN_WEIGHTS, 0.5)


# --- properties --------------------------------------------------------------------------------

clocks = st.integers(min_value=0, max_value=24 * 60).map(lambda m: f"{m // 60:02d}:{m % 60:02d}")
classes = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_ 0123456789", min_size=1, max_size=12)


@dataclass(frozen=True)
class WindowSpec:
    name: str
    start: str
    end: str
    shares: dict[str, float]
    rotate: tuple[str, ...] = ()
    rotate_share: float = 0.0
    slice_minutes: int = 30

    def to_toml(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name,
            "start": self.start,
            "end": self.end,
            "shares": self.shares,
        }
        if self.rotate:
            out.update(
                rotate=list(self.rotate),
                rotate_share=self.rotate_share,
                slice_minutes=self.slice_minutes,
            )
        return out


@st.composite
def window_specs(draw: st.DrawFn) -> list[WindowSpec]:
    count = draw(st.integers(min_value=0, max_value=5))
    out: list[WindowSpec] = []
    for i in range(count):
        start, end = draw(clocks), draw(clocks)
        assume(parse_clock(start) != parse_clock(end))
        names = draw(st.lists(classes, max_size=4, unique=True))
        bound = 1.0 / (len(names) + 1)
        shares = {n: draw(st.floats(min_value=0.0, max_value=bound)) for n in names}
        spec = WindowSpec(f"w{i}", start, end, shares)
        if draw(st.booleans()):
            spec = replace(
                spec,
                rotate=tuple(draw(st.lists(classes, min_size=1, max_size=3))),
                rotate_share=draw(st.floats(min_value=0.0, max_value=bound)),
                slice_minutes=draw(st.integers(min_value=1, max_value=120)),
            )
        out.append(spec)
    return out


@settings(max_examples=150, deadline=None)
@given(window_specs())
def test_valid_windows_round_trip(specs: list[WindowSpec]) -> None:
    data: dict[str, object] = {"policy": {"tidal": {"windows": [s.to_toml() for s in specs]}}}
    profile = parse_config(data).policy.tidal
    assert profile.name == "custom"
    assert len(profile.windows) == len(specs)
    for window, spec in zip(profile.windows, specs, strict=True):
        assert window.name == spec.name
        assert window.start_s == parse_clock(spec.start)
        assert window.end_s == parse_clock(spec.end)
        assert dict(window.shares) == spec.shares
        assert window.rotate == spec.rotate
        assert window.rotate_share == spec.rotate_share
        assert window.slice_s == 60.0 * spec.slice_minutes


# --- [edge] history_retention_s ----------------------------------------------------------------


def test_history_retention_defaults_to_a_day_and_is_in_the_example() -> None:
    from edgesched.config import EdgeConfig

    assert EdgeConfig().history_retention_s == 86_400.0
    assert "history_retention_s = 86400.0" in default_config_toml()
    assert parse(default_config_toml()).edge.history_retention_s == 86_400.0
    assert parse("[edge]\nhistory_retention_s = 3600\n").edge.history_retention_s == 3600.0
    assert parse("[edge]\nhistory_retention_s = 0.5\n").edge.history_retention_s == 0.5


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("0", "must be > 0"),
        ("-5", "must be > 0"),
        ("inf", "finite"),
        ("nan", "finite"),
        ("'1d'", "expected a number"),
        ("true", "expected a number"),
    ],
)
def test_history_retention_mistakes_are_named(value: str, needle: str) -> None:
    err = error_of(f"[edge]\nhistory_retention_s = {value}\n")
    assert "edge.history_retention_s" in str(err) and needle in str(err), str(err)


def test_history_retention_is_checked_in_code_too() -> None:
    from edgesched.config import EdgeConfig

    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="history_retention_s"):
            EdgeConfig(history_retention_s=bad)


# --- [edge] telemetry_source --------------------------------------------------------------------


def test_telemetry_source_defaults_to_the_host_and_is_in_the_example() -> None:
    from edgesched.config import EdgeConfig, TelemetrySource

    assert EdgeConfig().telemetry_source is TelemetrySource.HOST
    assert 'telemetry_source = "host"' in default_config_toml()
    assert parse(default_config_toml()).edge.telemetry_source is TelemetrySource.HOST
    reserved = parse('[edge]\ntelemetry_source = "reserved"\n').edge.telemetry_source
    assert reserved is TelemetrySource.RESERVED


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ('"simulated"', "must be one of host, reserved, got 'simulated'"),
        ('"Reserved"', "must be one of host, reserved"),
        ('""', "must not be empty"),
        ("1", "expected a string"),
    ],
)
def test_telemetry_source_mistakes_are_named(value: str, needle: str) -> None:
    err = error_of(f"[edge]\ntelemetry_source = {value}\n")
    assert "edge.telemetry_source" in str(err) and needle in str(err), str(err)


def test_telemetry_source_is_checked_in_code_too() -> None:
    from edgesched.config import EdgeConfig

    with pytest.raises(ValueError, match="telemetry_source must be one of host, reserved"):
        EdgeConfig(telemetry_source="guess")  # type: ignore[arg-type]


# --- [edge.mqtt]: TLS, credentials, and no plain TCP off loopback -----------------------------


def test_mqtt_defaults_are_loopback_plain() -> None:
    mqtt = parse("[edge]\nnode_id = 'gw1'\n").edge.mqtt
    assert (mqtt.host, mqtt.port, mqtt.tls) == ("127.0.0.1", 1883, False)
    endpoint = mqtt.endpoint("gw1")
    assert endpoint.identifier == "gw1" and endpoint.tls is None and endpoint.password is None


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("host = 'broker.example'", "refusing plain MQTT"),
        ("tls = true", "needs ca_file"),
        ("tls = true\nca_file = 'ca.crt'\ncert_file = 'n.crt'", "go together"),
        ("ca_file = 'ca.crt'", "tls is false"),
        ("session_expiry_s = -1", "session_expiry_s"),
        ("tsl = true", "did you mean 'tls'"),
    ],
)
def test_mqtt_mistakes_are_named(body: str, needle: str) -> None:
    err = error_of(f"[edge.mqtt]\n{body}\n")
    assert "edge.mqtt" in str(err) and needle in str(err)


def test_mqtt_plain_remote_only_when_allowed() -> None:
    mqtt = parse("[edge.mqtt]\nhost = '10.0.0.5'\nallow_plain_remote = true\n").edge.mqtt
    assert mqtt.host == "10.0.0.5" and not mqtt.tls


def test_mqtt_endpoint_reads_password_and_names_missing_files(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    mqtt = parse(f"[edge.mqtt]\npassword_file = '{pw}'\n").edge.mqtt
    endpoint = mqtt.endpoint("gw1")
    assert (endpoint.username, endpoint.password) == ("gw1", "s3cret")
    gone = parse(f"[edge.mqtt]\npassword_file = '{tmp_path / 'nope'}'\n").edge.mqtt
    with pytest.raises(ValueError, match="nope"):
        gone.endpoint("gw1")
    tls = parse(f"[edge.mqtt]\ntls = true\nca_file = '{tmp_path / 'no-ca.crt'}'\n").edge.mqtt
    with pytest.raises(ValueError, match=r"no-ca\.crt"):
        tls.endpoint("gw1")


@pytest.mark.parametrize("name", ["edge.toml", "central.toml"])
def test_the_readmes_config_snippets_parse(name: str) -> None:
    """What a user copies from the README must load (an empty model path means the shipped
    model; it was refused once)."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    start = readme.index(f"# {name}: every key is optional")
    config = parse(readme[start : readme.index("```", start)])
    if name == "edge.toml":
        assert config.edge.forecast_model == "" and config.edge.park_command == ()
    else:
        assert config.central.park_nodes is False and config.central.placement_model == ""
