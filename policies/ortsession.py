"""One onnxruntime session per model file, refused loudly when the file is unusable.

Every session of both tiers is opened here with one configuration, :func:`session_options`,
tuned for a small gateway's memory: the models are tiny MLPs (0.5-11 KB) run on one row at a
time, so no memory arena (it grows in chunks and never gives them back), no memory pattern
(pre-planned buffers per input shape), sequential execution with one intra- and one inter-op
thread (no thread pool, no spinning). Graph optimisations stay at onnxruntime's default (the
level changed nothing measurable in memory, and it could change the results' last bits).
``bench/bench_edge_footprint.py`` measures it against onnxruntime's defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnxruntime


class ModelLoadError(Exception):
    """The model file cannot be used; the message says why."""


def session_options() -> onnxruntime.SessionOptions:
    """The options of every session: one thread, no arena, no memory pattern (see above)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.log_severity_level = 3
    return options


def open_session(path: Path) -> Any:
    """A one-thread CPU session for ``path`` (edge gateways are small), or ModelLoadError."""
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - onnxruntime is a dependency
        raise ModelLoadError(f"onnxruntime is not installed: {exc}") from exc
    options = session_options()
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
