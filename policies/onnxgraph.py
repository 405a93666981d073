"""Building small ONNX graphs with the ``onnx`` package (no torch).

:func:`save` turns a graph into a checked ``.onnx`` file (opset 17, IR 8, the contract's
metadata): the shipped models are written by it. :func:`write_mlp` / :func:`random_mlp` write
MLPs of a given shape for tests and benchmarks (inference latency; models that load but
break a contract)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: The producer name of the models `edgesched policies train` writes.
PRODUCER = "edgesched policies train"


def save(
    graph: Any, path: Path, props: Mapping[str, str] | None = None, producer: str = ""
) -> Path:
    """``graph`` (an ``onnx`` GraphProto) as a checked model at ``path``, with ``props`` as
    its metadata (the contract a runtime checks) and ``producer`` as its producer name."""
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if producer:
        model.producer_name = producer
    if props:
        helper.set_model_props(model, dict(props))
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def write_mlp(path: Path, weights: Sequence[tuple[np.ndarray, np.ndarray]]) -> Path:
    """An MLP ``x -> (Gemm, Relu)* -> Gemm -> y``; ``weights`` are (W [in, out], b [out]).

    Input ``x`` is float32 ``[N, in]``, output ``y`` float32 ``[N, out]`` of the last layer.
    """
    from onnx import TensorProto, helper, numpy_helper

    if not weights:
        raise ValueError("an MLP needs at least one layer")
    nodes, inits = [], []
    current = "x"
    for i, (w, b) in enumerate(weights):
        w32, b32 = np.asarray(w, np.float32), np.asarray(b, np.float32)
        if w32.ndim != 2 or b32.shape != (w32.shape[1],):
            raise ValueError(f"layer {i}: W must be [in, out] and b [out]")
        inits += [numpy_helper.from_array(w32, f"W{i}"), numpy_helper.from_array(b32, f"b{i}")]
        out = "y" if i == len(weights) - 1 else f"h{i}"
        gemm_out = out if i == len(weights) - 1 else f"g{i}"
        nodes.append(helper.make_node("Gemm", [current, f"W{i}", f"b{i}"], [gemm_out]))
        if i < len(weights) - 1:
            nodes.append(helper.make_node("Relu", [gemm_out], [out]))
        current = out
    n_in, n_out = int(weights[0][0].shape[0]), int(weights[-1][0].shape[1])
    graph = helper.make_graph(
        nodes,
        "edgesched_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n_out])],
        inits,
    )
    return save(graph, path)


def random_mlp(path: Path, sizes: Sequence[int], seed: int = 0) -> Path:
    """An untrained MLP with the given layer sizes (e.g. 32, 64, 1), seeded."""
    rng = np.random.default_rng(seed)
    layers = [
        (rng.normal(0, 1 / np.sqrt(a), (a, b)), np.zeros(b)) for a, b in itertools.pairwise(sizes)
    ]
    return write_mlp(path, layers)
