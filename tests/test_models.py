"""The models an engine runs with (policies/models.py) and the per-class demand history
(core/classdemand.py): blobs verified before use, swaps that keep the model in use when the
new one is bad, and the forecast summed over classes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.classdemand import (
    BIN_S,
    KEEP_BINS,
    MAX_DEMAND,
    ClassDemand,
    peak_over_classes,
)
from edgesched.core.forecast import DemandHistory, Ewma, Forecaster
from edgesched.core.learned import N_LEARNED_FEATURES
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.policies import placement
from edgesched.policies.demand import CLASSES, class_demand
from edgesched.policies.models import (
    FORECAST,
    MAX_MODEL_BYTES,
    PLACEMENT,
    ActiveModels,
    ModelBlob,
    shipped,
)
from edgesched.policies.ortsession import ModelLoadError
from edgesched.sync.doc import PolicyDoc
from edgesched.sync.schema import ModelEntry

# --- per-class demand -----------------------------------------------------------------------


def test_bins_are_five_minute_means_per_class() -> None:
    d = ClassDemand()
    t0 = 10 * BIN_S
    assert not d.observe(t0, {"a": 2.0})
    assert not d.observe(t0 + 100, {"a": 4.0, "b": 1.0})
    assert d.histories() == {}  # nothing closed yet
    assert d.observe(t0 + BIN_S, {"a": 1.0})  # the first bin closes
    h = d.histories()
    assert h["a"].values == (3.0,) and h["b"].values == (0.5,)
    assert h["a"].end_s == t0 + BIN_S
    d.observe(t0 + 2 * BIN_S, {})
    h = d.histories()
    assert h["a"].values == (3.0, 1.0) and h["b"].values == (0.5, 0.0)


def test_a_gap_carries_the_last_mean_and_history_is_bounded() -> None:
    d = ClassDemand(keep=4)
    d.observe(0.0, {"a": 2.0})
    d.observe(3 * BIN_S, {"a": 8.0})  # two bins nobody sampled
    assert d.histories()["a"].values == (2.0, 2.0, 2.0)
    for k in range(4, 12):
        d.observe(k * BIN_S, {"a": float(k)})
    assert len(d.histories()["a"].values) == 4


def test_sums_that_overflow_are_capped_and_nan_or_negative_refused() -> None:
    d = ClassDemand()
    d.observe(0.0, {"a": 1e308, "b": float("inf")})
    d.observe(BIN_S, {})
    h = d.histories()
    assert h["a"].values == (MAX_DEMAND,) and h["b"].values == (MAX_DEMAND,)
    for bad in (float("nan"), -1.0):
        with pytest.raises(ValueError, match="must be a number >= 0"):
            d.observe(2 * BIN_S, {"a": bad})


def test_a_clock_stepping_back_is_ignored() -> None:
    d = ClassDemand()
    d.observe(1000.0, {"a": 1.0})
    assert not d.observe(10.0, {"a": 99.0})
    d.observe(1000.0 + BIN_S, {})
    assert d.histories()["a"].values == (1.0,)


def test_demand_history_round_trips_and_malformed_copies_are_refused() -> None:
    d = ClassDemand()
    for k in range(5):
        d.observe(k * BIN_S, {"x": float(k), "y": 1.0})
    back = ClassDemand.from_json(json.loads(json.dumps(d.to_json())))
    assert back.histories() == d.histories()
    bad: object
    for bad in (
        [],
        {"bins": {}},
        {"step_s": 300, "bins": {"x": [1, -1]}},
        {"step_s": 300, "bins": {"x": [1], "y": [1, 2]}},
        {"step_s": 300, "bins": {"x": "no"}, "end_s": 1},
        {"step_s": 300, "bins": {}, "end_s": "later"},
    ):
        with pytest.raises(ValueError, match="class demand"):
            ClassDemand.from_json(bad)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 5 * BIN_S),
            st.dictionaries(st.sampled_from("abc"), st.floats(0, 100), max_size=3),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_closed_bins_are_aligned_and_bounded(samples: list[tuple[float, dict[str, float]]]) -> None:
    d = ClassDemand()
    t = 0.0
    for dt, demand in samples:
        t += dt
        d.observe(t, demand)
    widths = {len(v) for v in d.bins.values()}
    assert len(widths) <= 1 and all(w <= KEEP_BINS for w in widths)
    top = max((v for _, s in samples for v in s.values()), default=0.0)
    assert all(0.0 <= v <= top + 1e-9 for values in d.bins.values() for v in values)


class Constant:
    def __init__(self, value: float) -> None:
        self.value = value

    @property
    def name(self) -> str:
        return f"constant {self.value}"

    def forecast(self, history: DemandHistory, horizon_steps: int) -> tuple[float, ...]:
        return tuple(self.value + i for i in range(horizon_steps))


def test_the_peak_sums_the_classes_step_by_step() -> None:
    h = DemandHistory(BIN_S, (1.0,), BIN_S)
    per: dict[str, Forecaster] = {"a": Constant(1.0), "b": Constant(10.0)}
    # a: 1, 2, 3; b: 10, 11, 12 -> the highest sum is the third step, 15
    assert peak_over_classes({"a": h, "b": h}, per.__getitem__) == 15.0
    assert peak_over_classes({}, per.__getitem__) is None


# --- blobs ----------------------------------------------------------------------------------


def test_a_blob_round_trips_and_a_tampered_one_is_refused() -> None:
    data = shipped(PLACEMENT).read_bytes()
    blob = ModelBlob.of(PLACEMENT, data, "v2", 5.0)
    assert ModelBlob.from_entry(PLACEMENT, blob.to_entry()) == blob
    entry = blob.to_entry()
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x01
    tampered = {**entry, "data": base64.b64encode(bytes(flipped)).decode()}
    with pytest.raises(ModelLoadError, match="does not match"):
        ModelBlob.from_entry(PLACEMENT, tampered)
    with pytest.raises(ModelLoadError, match="not base64"):
        ModelBlob.from_entry(PLACEMENT, {**entry, "data": "***"})
    with pytest.raises(ModelLoadError, match="must be strings"):
        ModelBlob.from_entry(PLACEMENT, {"sha256": 3})
    with pytest.raises(ModelLoadError, match="at most"):
        ModelBlob.of(PLACEMENT, b"x" * (MAX_MODEL_BYTES + 1))
    with pytest.raises(ModelLoadError, match="empty"):
        ModelBlob.of(PLACEMENT, b"")
    with pytest.raises(ModelLoadError, match="unknown model kind"):
        ModelBlob.of("weather", data)


# --- active models --------------------------------------------------------------------------


def models_in(tmp_path: Path, **paths: str) -> tuple[ActiveModels, list[tuple[str, str]]]:
    events: list[tuple[str, str]] = []
    models = ActiveModels(
        tmp_path / "models", paths, on_event=lambda k, s: events.append((k, s)), fallback=Ewma()
    )
    return models, events


def test_the_shipped_models_load_and_are_injected_in_learned_mode(tmp_path: Path) -> None:
    models, events = models_in(tmp_path)
    assert events == []
    assert models.forecaster is not None and models.placement is not None
    status = models.status()
    assert status[FORECAST]["source"] == "shipped" and len(status[FORECAST]["sha256"]) == 64
    learned = models.policy(PolicyConfig(mode=PolicyMode.LEARNED))
    assert learned.learned_score is models.placement
    energy = PolicyConfig(mode=PolicyMode.ENERGY)
    assert models.policy(energy) is energy


def test_a_bad_configured_file_is_refused_loudly_and_the_heuristic_serves(
    tmp_path: Path,
) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model at all")
    models, events = models_in(tmp_path, forecast=str(garbage), placement=str(shipped(FORECAST)))
    assert events == [(FORECAST, "load"), (PLACEMENT, "load")]
    assert models.forecaster is None and models.placement is None
    assert "cannot load" in models.status()[FORECAST]["refused"]
    assert "contract" in models.status()[PLACEMENT]["refused"]
    assert models.forecaster_for(64.0)(CLASSES[0]) is models.fallback
    # learned mode without a model: the core falls back decision by decision, saying so
    assert models.policy(PolicyConfig(mode=PolicyMode.LEARNED)).learned_score is None


def published(blob: ModelBlob) -> ModelEntry:
    """The policy document's entry for ``blob``, as central publishes it."""
    return ModelEntry.from_entry(blob.to_entry())


def entries(doc: PolicyDoc) -> dict[str, object]:
    """The document's ``models`` map as the engines hand it to ``ActiveModels.follow``."""
    return {kind: entry.to_entry() for kind, entry in doc.models().items()}


def test_follow_swaps_a_good_model_once_and_keeps_it_when_a_bad_one_comes(
    tmp_path: Path,
) -> None:
    models, events = models_in(tmp_path)
    weights = [0.1] * N_LEARNED_FEATURES
    other = placement.write_onnx(weights, tmp_path / "other.onnx")
    doc = PolicyDoc("policy", 7)
    good = ModelBlob.of(PLACEMENT, other.read_bytes(), "uniform")
    doc.set_model(PLACEMENT, published(good))
    assert models.follow(entries(doc)) == [PLACEMENT]
    assert models.status()[PLACEMENT]["sha256"] == good.sha256
    assert models.status()[PLACEMENT]["source"] == "central"
    assert models.follow(entries(doc)) == []  # the same hash again: nothing to do
    third = placement.write_onnx([0.2] * N_LEARNED_FEATURES, tmp_path / "third.onnx")
    doc.set_model(PLACEMENT, published(ModelBlob.of(PLACEMENT, third.read_bytes())))
    assert models.follow(entries(doc)) == [PLACEMENT]
    assert len(list((tmp_path / "models").glob("placement-*.onnx"))) == 1  # the old one pruned
    doc.set_model(PLACEMENT, published(good))
    assert models.follow(entries(doc)) == [PLACEMENT]
    in_use = models.placement
    # A forecaster published as a placement model: well-formed, wrong contract.
    wrong = ModelBlob.of(PLACEMENT, shipped(FORECAST).read_bytes(), "oops")
    doc.set_model(PLACEMENT, published(wrong))
    assert models.follow(entries(doc)) == []
    assert models.placement is in_use and events == [(PLACEMENT, "swap")]
    status = models.status()[PLACEMENT]
    assert status["sha256"] == good.sha256 and status["refused_sha256"] == wrong.sha256
    assert models.follow(entries(doc)) == [] and len(events) == 1  # not retried
    # A corrupted entry (hash mismatch) is refused before anything is written.
    doc.set_model(PLACEMENT, ModelEntry.from_entry({**good.to_entry(), "sha256": "0" * 64}))
    assert models.follow(entries(doc)) == [] and events[-1] == (PLACEMENT, "swap")
    assert models.placement is in_use
    # Unknown kinds in the document are ignored, not fatal.
    doc.set_model("weather", ModelEntry(sha256="x", data=""))
    assert "weather" in entries(doc)
    assert models.follow(entries(doc)) == []
    # A malformed entry is refused by the document itself: absent, counted, not fatal.
    doc.root("models")["weather"] = {"sha256": "x"}
    assert "weather" not in doc.models()
    assert doc.refusals.by_kind() == {"model": 1}
    assert models.follow(entries(doc)) == []


def test_check_refuses_without_touching_the_model_in_use(tmp_path: Path) -> None:
    models, events = models_in(tmp_path)
    in_use = models.forecaster
    with pytest.raises(ModelLoadError):
        models.check(ModelBlob.of(FORECAST, b"\x08\x07garbage"))
    assert models.forecaster is in_use and events == []
    assert not list((tmp_path / "models").glob(".check-*"))  # the scratch file is gone


def test_the_forecast_uses_the_model_for_known_classes_and_the_heuristic_for_others(
    tmp_path: Path,
) -> None:
    """Fed a held-out campus morning bin by bin, as an engine feeds it, the fleet forecast
    lands near what the next 15 minutes really asked for."""
    models, events = models_in(tmp_path)
    series, fleet_cpu = class_demand(seed=4242, days=1, scale=0.5)
    d = ClassDemand()
    start, end = 84, 110  # 07:00 to 09:10, the morning ramp
    for k in range(start, end + 1):
        d.observe(k * BIN_S, {c: float(series[i, k]) for i, c in enumerate(CLASSES)})
    peak = models.peak(d, fleet_cpu)
    actual = float(series[:, end : end + 3].sum(axis=0).max())
    assert peak is not None and abs(peak - actual) < 0.25 * actual, (peak, actual)
    assert events == []  # every class served by the model, no fallback
    assert models.forecaster_for(fleet_cpu)("batch") is models.fallback
    assert models.forecaster_for(fleet_cpu)(CLASSES[0]).name.startswith("onnx:")
