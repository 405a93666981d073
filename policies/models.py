"""The ONNX models an engine runs with, and swapping them at run time from central.

Both tiers hold one :class:`ActiveModels`: the per-class demand forecaster (contract
``edgesched.forecast.per-class/2``) and the learned placement score (``edgesched.placement.
score/1``). Each starts from a file: the config's path, else the model shipped in this package.

Central replaces either at run time: an admin uploads a file (``PUT /v1/models/{kind}``),
central loads it to check it against the contract, then writes it into the fleet policy
document as a :class:`ModelBlob` (base64 bytes and their sha256). Every node follows the
document, a node cut off when it changed on heal, and its replica survives restarts in SQLite:
:meth:`ActiveModels.follow` verifies the hash, writes the file under ``<state>/models/``,
loads it and swaps it in. A blob that fails any check is *refused*: the model in use stays,
with an error log line, the ``on_event(kind, "swap")`` count (a metric) and the reason in
:meth:`ActiveModels.status`. A model that fails at load time leaves the heuristic in place the
same way (``"load"``). Nothing falls back silently.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgesched.core.classdemand import ClassDemand, peak_over_classes
from edgesched.core.forecast import Ewma, Forecaster
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.policies.demand import CLASSES, ClassForecaster
from edgesched.policies.ortsession import ModelLoadError
from edgesched.policies.placement import OnnxPlacementScore

log = logging.getLogger("edgesched.policies.models")

FORECAST = "forecast"
PLACEMENT = "placement"
KINDS = (FORECAST, PLACEMENT)
#: Largest model central sends through the policy document (the shipped ones are 0.5-11 KB).
MAX_MODEL_BYTES = 1 << 20
_SHIPPED = {FORECAST: "demand15.onnx", PLACEMENT: "placement-score.onnx"}


def shipped(kind: str) -> Path:
    """The model of ``kind`` shipped with this package."""
    return Path(__file__).with_name(_SHIPPED[_check_kind(kind)])


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ModelLoadError(f"unknown model kind {kind!r}: one of {', '.join(KINDS)}")
    return kind


@dataclass(frozen=True, slots=True)
class ModelBlob:
    """One model file as central publishes it: its bytes, their sha256 and a display name."""

    kind: str
    data: bytes
    sha256: str
    name: str = ""
    set_at: float = 0.0

    @classmethod
    def of(cls, kind: str, data: bytes, name: str = "", set_at: float = 0.0) -> ModelBlob:
        """A blob for ``data``; ModelLoadError for an unknown kind, empty or oversized file."""
        _check_kind(kind)
        if not data:
            raise ModelLoadError("the model file is empty")
        if len(data) > MAX_MODEL_BYTES:
            raise ModelLoadError(f"the model is {len(data)} bytes; at most {MAX_MODEL_BYTES}")
        return cls(kind, bytes(data), hashlib.sha256(data).hexdigest(), name[:128], set_at)

    def to_entry(self) -> dict[str, object]:
        """The JSON value stored in the policy document."""
        return {
            "sha256": self.sha256,
            "size": len(self.data),
            "name": self.name,
            "set_at": self.set_at,
            "data": base64.b64encode(self.data).decode("ascii"),
        }

    @classmethod
    def from_entry(cls, kind: str, entry: Mapping[str, Any]) -> ModelBlob:
        """Decode and verify a document entry; ModelLoadError naming what is wrong."""
        _check_kind(kind)
        sha, data = entry.get("sha256"), entry.get("data")
        if not isinstance(sha, str) or not isinstance(data, str):
            raise ModelLoadError(f"{kind} model entry: sha256 and data must be strings")
        if len(data) > 2 * MAX_MODEL_BYTES:
            raise ModelLoadError(f"{kind} model entry: data is too large")
        try:
            raw = base64.b64decode(data.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise ModelLoadError(f"{kind} model entry: data is not base64: {exc}") from exc
        blob = cls.of(kind, raw, str(entry.get("name") or ""), _number(entry.get("set_at")))
        if blob.sha256 != sha:
            raise ModelLoadError(
                f"{kind} model entry: sha256 {blob.sha256[:12]} of the data does not match "
                f"the announced {sha[:12]}"
            )
        return blob


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0


Model = ClassForecaster | OnnxPlacementScore


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What an engine runs for one kind: where it came from, or why it runs none."""

    kind: str
    source: str  # "shipped", "config", "central" or "none"
    path: str
    sha256: str
    refused: str = ""  # the last refusal (load or swap), kept until a model is accepted
    refused_sha256: str = ""

    def as_dict(self) -> dict[str, str]:
        return {
            "source": self.source,
            "path": self.path,
            "sha256": self.sha256,
            "refused": self.refused,
            "refused_sha256": self.refused_sha256,
        }


class ActiveModels:
    """The forecaster and placement score in use, swapped from central's blobs.

    ``on_event(kind, stage)`` is called for every fallback: ``"load"`` (a file refused at
    start), ``"swap"`` (a blob from central refused), ``"inference"`` (one forecast or one
    placement served by the heuristic because the model's output was unusable).
    """

    def __init__(
        self,
        models_dir: Path,
        paths: Mapping[str, str] | None = None,
        on_event: Callable[[str, str], None] | None = None,
        fallback: Forecaster | None = None,
    ) -> None:
        self.models_dir = Path(models_dir)
        self.on_event = on_event or (lambda kind, stage: None)
        self.fallback: Forecaster = fallback or Ewma()
        self.forecaster: ClassForecaster | None = None
        self.placement: OnnxPlacementScore | None = None
        self.info: dict[str, ModelInfo] = {}
        for kind in KINDS:
            configured = (paths or {}).get(kind, "")
            path = Path(configured) if configured else shipped(kind)
            source = "config" if configured else "shipped"
            try:
                self._install(kind, self._load(kind, path), ModelInfo(kind, source, str(path), ""))
            except ModelLoadError as exc:
                self._refuse(kind, "load", f"{exc}", "")

    # --- loading ---------------------------------------------------------------------------

    def _load(self, kind: str, path: Path) -> Model:
        if kind == FORECAST:
            return ClassForecaster(
                path, self.fallback, lambda why: self.on_event(kind, "inference")
            )
        return OnnxPlacementScore(path, lambda why: self.on_event(kind, "inference"))

    def _install(self, kind: str, model: Model, info: ModelInfo) -> None:
        if isinstance(model, ClassForecaster):
            self.forecaster = model
        else:
            self.placement = model
        sha = info.sha256 or _sha256_file(Path(info.path))
        self.info[kind] = replace(info, sha256=sha, refused="", refused_sha256="")
        log.info("%s model in use: %s (%s, sha256 %s)", kind, info.path, info.source, sha[:12])

    def _refuse(self, kind: str, stage: str, why: str, sha: str) -> None:
        self.on_event(kind, stage)
        current = self.info.get(kind) or ModelInfo(kind, "none", "", "")
        self.info[kind] = replace(current, refused=why, refused_sha256=sha)
        keeps = current.path or "the heuristic"
        log.error("%s model refused (%s); keeping %s", kind, why, keeps)

    def check(self, blob: ModelBlob) -> None:
        """Load ``blob`` into a scratch file to check it against its contract (central does
        this before publishing); ModelLoadError naming the mismatch."""
        path = self._write(blob, scratch=True)
        try:
            self._load(blob.kind, path)
        finally:
            path.unlink(missing_ok=True)

    def swap(self, blob: ModelBlob) -> None:
        """Put ``blob`` in use; ModelLoadError (and the model in use kept) if it is unusable."""
        try:
            path = self._write(blob)
            model = self._load(blob.kind, path)
        except (ModelLoadError, OSError) as exc:
            self._refuse(blob.kind, "swap", str(exc), blob.sha256)
            raise ModelLoadError(str(exc)) from exc
        self._install(blob.kind, model, ModelInfo(blob.kind, "central", str(path), blob.sha256))
        for old in self.models_dir.glob(f"{blob.kind}-*.onnx"):  # earlier swaps: not needed
            if old != path:
                old.unlink(missing_ok=True)

    def follow(self, entries: Mapping[str, Any]) -> list[str]:
        """Swap in what the policy document's ``models`` map names, once per new sha256;
        returns the kinds swapped. A refused blob is not retried until its hash changes."""
        swapped = []
        for kind, entry in sorted(entries.items()):
            if kind not in KINDS or not isinstance(entry, Mapping):
                log.error("policy document: ignoring model entry %r", kind)
                continue
            sha = entry.get("sha256")
            current = self.info.get(kind)
            if current is not None and sha in (current.sha256, current.refused_sha256):
                continue
            try:
                self.swap(ModelBlob.from_entry(kind, entry))
            except ModelLoadError as exc:
                if self.info[kind].refused_sha256 != sha:  # refused before reaching swap()
                    self._refuse(kind, "swap", str(exc), str(sha))
                continue
            swapped.append(kind)
        return swapped

    def _write(self, blob: ModelBlob, scratch: bool = False) -> Path:
        self.models_dir.mkdir(parents=True, exist_ok=True)
        name = f"{blob.kind}-{blob.sha256[:16]}.onnx"
        path = self.models_dir / (f".check-{os.getpid()}-{name}" if scratch else name)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as out:
            out.write(blob.data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        return path

    # --- use ---------------------------------------------------------------------------------

    def policy(self, base: PolicyConfig) -> PolicyConfig:
        """``base`` with the placement score injected when it is in ``learned`` mode."""
        if base.mode is PolicyMode.LEARNED and base.learned_score is not self.placement:
            return replace(base, learned_score=self.placement)
        return base

    def forecaster_for(self, capacity_cpu: float) -> Callable[[str], Forecaster]:
        """Per class: the ONNX model for the classes it was trained on, else the heuristic."""
        model = self.forecaster

        def pick(workload: str) -> Forecaster:
            if model is not None and workload in CLASSES and capacity_cpu > 0:
                return model.for_class(workload, capacity_cpu)
            return self.fallback

        return pick

    def peak(self, demand: ClassDemand, capacity_cpu: float) -> float | None:
        """The 15-minute peak of ``demand`` (cores), every class forecast its own way."""
        return peak_over_classes(demand.histories(), self.forecaster_for(capacity_cpu))

    def status(self) -> dict[str, dict[str, str]]:
        return {kind: self.info[kind].as_dict() for kind in KINDS if kind in self.info}

    @property
    def forecast_name(self) -> str:
        return self.forecaster.name if self.forecaster is not None else self.fallback.name


def _sha256_file(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""
