"""One onnxruntime session per model file, refused loudly when the file is unusable."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ModelLoadError(Exception):
    """The model file cannot be used; the message says why."""


def open_session(path: Path) -> Any:
    """A one-thread CPU session for ``path`` (edge gateways are small), or ModelLoadError."""
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - onnxruntime is a dependency
        raise ModelLoadError(f"onnxruntime is not installed: {exc}") from exc
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise ModelLoadError(f"{path}: cannot load: {exc}".splitlines()[0]) from exc


def metadata(session: Any) -> dict[str, str]:
    """The model's ``metadata_props`` (contract name, feature order, ...)."""
    return dict(session.get_modelmeta().custom_metadata_map)


def open_contract(path: Path, contract: str, key: str, order: str) -> Any:
    """A session for ``path`` whose metadata names ``contract`` and lists ``order`` under
    ``key`` (the inputs' meaning, in order); ModelLoadError naming the mismatch otherwise."""
    session = open_session(path)
    meta = metadata(session)
    if meta.get("edgesched.contract") != contract:
        raise ModelLoadError(
            f"{path}: contract {meta.get('edgesched.contract')!r}, expected {contract!r}"
        )
    if meta.get(key) != order:
        raise ModelLoadError(f"{path}: {key} {meta.get(key)!r} does not match this build")
    return session
