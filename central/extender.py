"""Central as a kube-scheduler HTTP extender (the wire types of kube-scheduler extender/v1).

kube-scheduler can call out to an *extender* after its own filter plugins (``filterVerb``) and
score plugins (``prioritizeVerb``), and can hand it the binding (``bindVerb``). This module maps
those calls onto edgesched's scheduling core so that Kubernetes pods are filtered by the same
filter chain (:data:`~edgesched.core.plugins.FILTER_CHAIN`) and ranked by the same score
plugins and policy weights central, the edge nodes and the simulator use:

* :func:`pod_to_task` turns a ``v1.Pod`` into a core :class:`~edgesched.core.model.Task`;
* :func:`filter_nodes` answers ``ExtenderArgs`` with an ``ExtenderFilterResult``;
* :func:`prioritize` answers ``ExtenderArgs`` with a ``HostPriorityList`` (scores 0..10);
* :func:`bind` checks ``ExtenderBindingArgs`` and gives the placement to record;
* :func:`routes` wraps them as aiohttp handlers for central's API (``/v1/k8s/...``).

Everything but :func:`routes` is pure: plain data in, plain data out, no I/O and no clock.

Wire names. The Go types in ``extender/v1/types.go`` carry no JSON tags, so kube-scheduler sends
and expects the Go field names: ``Pod``, ``Nodes``, ``NodeNames``, ``FailedNodes``,
``FailedAndUnresolvableNodes``, ``Error``, ``Host``, ``Score``, ``PodName``, ``PodNamespace``,
``PodUID``, ``Node``. Go's decoder matches keys case-insensitively, and so does this module for
those top-level keys; inside the Pod and NodeList the Kubernetes API's camelCase is required.

Errors. Malformed input raises :class:`ExtenderInputError` (a ``ValueError``) whose message starts
with the JSON path of the bad field, e.g.
``Pod.spec.containers[0].resources.requests.cpu: '12x' is not a quantity``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np
from aiohttp import web

from edgesched.core.model import (
    MAX_PRIORITY,
    Arch,
    Decision,
    DecisionKind,
    Node,
    Placement,
    Resources,
    ServerClass,
    Task,
)
from edgesched.core.nodetable import BoolArray, FloatArray, NodeTable, resource_vector
from edgesched.core.plugins import FILTER_CHAIN, SCORES, FilterPlugin, fits_when_empty
from edgesched.core.policy import PolicyConfig
from edgesched.rest.server import problem

#: ``extenderv1.MinExtenderPriority`` and ``MaxExtenderPriority``. kube-scheduler multiplies an
#: extender's score by its ``weight`` and by ``MaxNodeScore / MaxExtenderPriority`` (100 / 10).
MIN_EXTENDER_PRIORITY = 0
MAX_EXTENDER_PRIORITY = 10

#: Where :func:`routes` mounts the verbs; the extender's ``urlPrefix`` is ``http://<central>/v1/k8s``.
PREFIX = "/v1/k8s"

LABEL_WORKLOAD = "edgesched.io/workload"
LABEL_SERVER_CLASS = "edgesched.io/server-class"
LABEL_ARCH = "kubernetes.io/arch"
LABEL_ARCH_BETA = "beta.kubernetes.io/arch"
#: Extended resource for storage IOPS demand, in thousands of IOPS (an integer, as every
#: extended resource is in Kubernetes).
RESOURCE_IOPS_K = "edgesched.io/iops-k"
#: Extended resources counted as accelerators unless the caller configures others.
DEFAULT_ACCELERATORS: frozenset[str] = frozenset({"nvidia.com/gpu", "amd.com/gpu"})
DEFAULT_WORKLOAD = "default"

#: Kubernetes ``kubernetes.io/arch`` values (Go's GOARCH) of the architectures edgesched runs.
K8S_ARCH: Mapping[str, Arch] = {"amd64": Arch.X86_64, "arm64": Arch.ARM64}
_SERVER_CLASSES: Mapping[str, ServerClass] = {c.value: c for c in ServerClass}

_GIB = Fraction(2**30)
_EPS = 1e-9
_T = TypeVar("_T")


class ExtenderInputError(ValueError):
    """Malformed extender input. ``path`` is the JSON path of the offending field."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


class PodUnsatisfiable(ExtenderInputError):
    """A well-formed pod that no edgesched node can ever run (say, one that asks for s390x).

    :func:`filter_nodes` reports it as every candidate failing, unresolvably;
    :func:`prioritize` scores every candidate 0.
    """


# --- JSON helpers ---------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _key(path: str, key: str) -> str:
    """``path.key``, or ``path["key"]`` when the key is not a plain identifier."""
    if _IDENT.fullmatch(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key)}]"


def _describe(value: object) -> str:
    """A short quotation of a JSON value for an error message (containers by type only)."""
    if isinstance(value, str):
        text = repr(value)
    elif value is None or isinstance(value, (bool, int, float)):
        text = json.dumps(value)
    else:
        return _type_name(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _object(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ExtenderInputError(path, f"must be an object, got {_type_name(value)}")
    return value


def _opt_object(parent: Mapping[str, Any], key: str, path: str) -> dict[str, Any] | None:
    """An optional object field: missing and null both mean absent (as in Go)."""
    value = parent.get(key)
    return None if value is None else _object(value, _key(path, key))


def _array(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise ExtenderInputError(path, f"must be an array, got {_type_name(value)}")
    return value


def _opt_array(parent: Mapping[str, Any], key: str, path: str) -> list[Any]:
    value = parent.get(key)
    return [] if value is None else _array(value, _key(path, key))


def _string(value: object, path: str, *, nonempty: bool = False) -> str:
    if not isinstance(value, str):
        raise ExtenderInputError(path, f"must be a string, got {_type_name(value)}")
    if nonempty and not value:
        raise ExtenderInputError(path, "must not be empty")
    return value


def _string_map(parent: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    obj = _opt_object(parent, key, path)
    if obj is None:
        return {}
    here = _key(path, key)
    return {k: _string(v, _key(here, k)) for k, v in obj.items()}


def _go_field(obj: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    """Go's ``encoding/json`` lookup of an untagged struct field: exact key first, else any key
    equal ignoring case. Returns (found, value)."""
    if name in obj:
        return True, obj[name]
    folded = name.lower()
    for key, value in obj.items():
        if key.lower() == folded:
            return True, value
    return False, None


# --- quantities -----------------------------------------------------------------------------

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?(?P<suffix>[eEinumkKMGTP]*[+-]?[0-9]*)"
)
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIXES = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip
_INT32_MAX = 2**31 - 1
#: Quantities are rejected outside [1e-30, 1e30] (zero aside): no real request comes close,
#: and it keeps an exponent like ``1e999999999`` from costing anything.
_MAX_DECIMAL_MAGNITUDE = 30
_MAX_DIGITS = 64


def parse_quantity(text: str, path: str = "quantity") -> Fraction:
    """Parse a Kubernetes ``resource.Quantity`` string exactly.

    The grammar of ``k8s.io/apimachinery/pkg/api/resource``: an optionally signed decimal
    number (``"2"``, ``"0.5"``, ``".5"``, ``"1."``) followed by at most one suffix, either binary
    (``Ki Mi Gi Ti Pi Ei``), decimal (``n u m k M G T P E``) or a decimal exponent (``e3``,
    ``E-2``, ``e+6``). ``"1E"`` is one exa; ``"1E3"`` is one thousand, as in Kubernetes.
    Surrounding blanks are ignored (Kubernetes' JSON decoder trims them). Raises
    :class:`ExtenderInputError` naming ``path``.
    """
    stripped = text.strip(" \t\n\r")
    match = _QUANTITY.fullmatch(stripped)
    if match is None or not (match["int"] or match["frac"]):
        raise ExtenderInputError(path, f"{_describe(text)} is not a quantity")
    suffix = match["suffix"]
    if suffix in _BINARY_SUFFIXES:
        base, exponent = 2, _BINARY_SUFFIXES[suffix]
    elif suffix in _DECIMAL_SUFFIXES:
        base, exponent = 10, _DECIMAL_SUFFIXES[suffix]
    elif len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[+-]?[0-9]+", suffix[1:]):
        if len(suffix[1:].lstrip("+-").lstrip("0")) > 10:  # int32 in Kubernetes
            raise ExtenderInputError(path, f"{_describe(text)}: exponent out of range")
        base, exponent = 10, int(suffix[1:])
        if abs(exponent) > _INT32_MAX:
            raise ExtenderInputError(path, f"{_describe(text)}: exponent out of range")
    else:
        raise ExtenderInputError(path, f"{_describe(text)} is not a quantity (bad suffix)")
    int_digits = (match["int"] or "").lstrip("0")
    frac_digits = (match["frac"] or "").rstrip("0")
    mantissa_digits = int_digits + frac_digits
    if not mantissa_digits.strip("0"):
        return Fraction(0)
    if len(mantissa_digits) > _MAX_DIGITS:
        raise ExtenderInputError(path, f"{_describe(text)}: more than {_MAX_DIGITS} digits")
    # Decimal magnitude of the value, to refuse absurd sizes before computing them.
    lead = len(int_digits) if int_digits else -(len(frac_digits) - len(frac_digits.lstrip("0")))
    magnitude = lead + (exponent if base == 10 else math.ceil(exponent * math.log10(2)))
    if not -_MAX_DECIMAL_MAGNITUDE <= magnitude <= _MAX_DECIMAL_MAGNITUDE + 1:
        raise ExtenderInputError(path, f"{_describe(text)}: out of range")
    value = Fraction(int(mantissa_digits), 10 ** len(frac_digits))
    value *= Fraction(base) ** exponent
    return -value if match["sign"] == "-" else value


def _quantity(value: object, path: str) -> Fraction:
    """A quantity as it appears in JSON: a string, or (accepted by Kubernetes too) a number."""
    if value is None:
        return Fraction(0)  # Go's Quantity decodes null as zero
    if isinstance(value, str):
        return parse_quantity(value, path)
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > 128:
            raise ExtenderInputError(path, "quantity out of range")
        return parse_quantity(str(value), path)
    if isinstance(value, float) and math.isfinite(value):
        return parse_quantity(repr(value), path)
    raise ExtenderInputError(path, f"{_describe(value)} is not a quantity")


# --- Pod -> Task ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod's identity: the task id edgesched uses is ``namespace/name``."""

    namespace: str
    name: str
    uid: str

    @property
    def task_id(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_ref(pod: object, path: str = "Pod") -> PodRef:
    """The namespace, name and uid of a ``v1.Pod`` (namespace defaults to ``default``)."""
    meta = _object(_object(pod, path).get("metadata"), _key(path, "metadata"))
    mpath = _key(path, "metadata")
    name = _string(meta.get("name"), _key(mpath, "name"), nonempty=True)
    namespace = meta.get("namespace")
    ns = "default" if namespace is None else _string(namespace, _key(mpath, "namespace"))
    uid = meta.get("uid")
    return PodRef(ns or "default", name, "" if uid is None else _string(uid, _key(mpath, "uid")))


def _resource_list(container: Mapping[str, Any], path: str) -> dict[str, Fraction]:
    """A container's requests, with limits standing in for requests it does not set (the API
    server's defaulting does the same)."""
    resources = _opt_object(container, "resources", path)
    if resources is None:
        return {}
    rpath = _key(path, "resources")
    out: dict[str, Fraction] = {}
    for field in ("limits", "requests"):  # requests last: they win
        listing = _opt_object(resources, field, rpath)
        for name, value in (listing or {}).items():
            here = _key(_key(rpath, field), name)
            if not name:
                raise ExtenderInputError(here, "empty resource name")
            q = _quantity(value, here)
            if q < 0:
                raise ExtenderInputError(here, f"{_describe(value)} is negative")
            out[name] = q
    return out


def _check_integers(
    requests: Mapping[str, Fraction], names: Collection[str], path: str, field: str = "requests"
) -> None:
    for name, q in requests.items():
        if name in names and q.denominator != 1:
            raise ExtenderInputError(
                _key(_key(_key(path, "resources"), field), name),
                f"{float(q):g} is not a whole number (extended resources are integers)",
            )


def _add(into: dict[str, Fraction], other: Mapping[str, Fraction]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, Fraction(0)) + v


def _max(into: dict[str, Fraction], other: Mapping[str, Fraction]) -> None:
    for k, v in other.items():
        into[k] = max(into.get(k, Fraction(0)), v)


def pod_requests(
    pod: object, accelerators: Collection[str] = DEFAULT_ACCELERATORS
) -> dict[str, Fraction]:
    """The pod's effective requests, computed as kube-scheduler does (``PodRequests``).

    Regular containers add up; sidecars (init containers with ``restartPolicy: Always``) add to
    them; each other init container needs its own requests plus the sidecars started before it,
    and the pod needs the larger of the two. Pod-level ``spec.resources.requests`` for CPU and
    memory take precedence, and ``spec.overhead`` is added last.
    """
    spec = _object(_object(pod, "Pod").get("spec"), "Pod.spec")
    integers = {*accelerators, RESOURCE_IOPS_K}
    containers = _array(spec.get("containers"), "Pod.spec.containers")
    if not containers:
        raise ExtenderInputError("Pod.spec.containers", "a pod has at least one container")
    total: dict[str, Fraction] = {}
    for i, c in enumerate(containers):
        path = f"Pod.spec.containers[{i}]"
        reqs = _resource_list(_object(c, path), path)
        _check_integers(reqs, integers, path)
        _add(total, reqs)
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for i, c in enumerate(_opt_array(spec, "initContainers", "Pod.spec")):
        path = f"Pod.spec.initContainers[{i}]"
        obj = _object(c, path)
        reqs = _resource_list(obj, path)
        _check_integers(reqs, integers, path)
        policy = obj.get("restartPolicy")
        if policy is not None:
            _string(policy, _key(path, "restartPolicy"))
        if policy == "Always":
            _add(total, reqs)
            _add(sidecars, reqs)
            _max(init_peak, sidecars)
        else:
            needs = dict(sidecars)
            _add(needs, reqs)
            _max(init_peak, needs)
    _max(total, init_peak)
    pod_level = _opt_object(spec, "resources", "Pod.spec")
    if pod_level is not None:
        reqs = _resource_list({"resources": pod_level}, "Pod.spec")
        for name in ("cpu", "memory"):
            if name in reqs:
                total[name] = reqs[name]
    overhead = _opt_object(spec, "overhead", "Pod.spec")
    for name, value in (overhead or {}).items():
        here = _key("Pod.spec.overhead", name)
        q = _quantity(value, here)
        if q < 0:
            raise ExtenderInputError(here, f"{_describe(value)} is negative")
        total[name] = total.get(name, Fraction(0)) + q
    return total


_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


def _term_allows(
    term: Mapping[str, Any],
    path: str,
    keys: Collection[str],
    domain: Mapping[str, _T],
    strict_values: bool,
) -> frozenset[_T]:
    """What one required node-selector term lets through, restricted to ``keys``."""
    allowed = frozenset(domain.values())
    expressions = _opt_array(term, "matchExpressions", path)
    fields = _opt_array(term, "matchFields", path)
    if not expressions and not fields:
        return frozenset()  # an empty term matches no node
    for j, raw in enumerate(expressions):
        epath = f"{path}.matchExpressions[{j}]"
        expr = _object(raw, epath)
        key = _string(expr.get("key"), f"{epath}.key", nonempty=True)
        op = _string(expr.get("operator"), f"{epath}.operator")
        if op not in _OPERATORS:
            raise ExtenderInputError(
                f"{epath}.operator", f"{op!r} is not one of {', '.join(sorted(_OPERATORS))}"
            )
        values = [
            _string(v, f"{epath}.values[{k}]")
            for k, v in enumerate(_opt_array(expr, "values", epath))
        ]
        if key not in keys:
            continue
        mapped: set[_T] = set()
        for k, v in enumerate(values):
            if v in domain:
                mapped.add(domain[v])
            elif strict_values and op in ("In", "NotIn"):
                raise ExtenderInputError(
                    f"{epath}.values[{k}]", f"{v!r} is not one of {', '.join(domain)}"
                )
        if op == "In":
            allowed &= mapped
        elif op == "NotIn":
            allowed -= mapped
        elif op in ("DoesNotExist", "Gt", "Lt"):
            allowed = frozenset()  # every edgesched node carries the label, never an integer
    for j, raw in enumerate(fields):
        fpath = f"{path}.matchFields[{j}]"
        expr = _object(raw, fpath)
        _string(expr.get("key"), f"{fpath}.key", nonempty=True)
        _string(expr.get("operator"), f"{fpath}.operator")
    return allowed


def _label_constraint(
    spec: Mapping[str, Any],
    keys: tuple[str, ...],
    domain: Mapping[str, _T],
    strict_values: bool,
) -> tuple[frozenset[_T] | None, str]:
    """The values of a node label a pod admits, from ``nodeSelector`` and required node
    affinity (None: unconstrained), and the path that constrains it."""
    allowed: frozenset[_T] | None = None
    where = "Pod.spec"
    selector = _string_map(spec, "nodeSelector", "Pod.spec")
    for key in keys:
        if key in selector:
            value = selector[key]
            where = _key("Pod.spec.nodeSelector", key)
            if value in domain:
                picked = frozenset({domain[value]})
            elif strict_values:
                raise ExtenderInputError(where, f"{value!r} is not one of {', '.join(domain)}")
            else:
                picked = frozenset()
            allowed = picked if allowed is None else allowed & picked
    affinity = _opt_object(spec, "affinity", "Pod.spec")
    node_affinity = (
        None if affinity is None else _opt_object(affinity, "nodeAffinity", "Pod.spec.affinity")
    )
    apath = "Pod.spec.affinity.nodeAffinity"
    required = (
        None
        if node_affinity is None
        else _opt_object(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution", apath)
    )
    if required is not None:
        rpath = f"{apath}.requiredDuringSchedulingIgnoredDuringExecution"
        terms = _opt_array(required, "nodeSelectorTerms", rpath)
        union: frozenset[_T] = frozenset()
        constrains = False
        for i, raw in enumerate(terms):
            tpath = f"{rpath}.nodeSelectorTerms[{i}]"
            term = _object(raw, tpath)
            union |= _term_allows(term, tpath, keys, domain, strict_values)
            constrains |= any(
                isinstance(e, dict) and e.get("key") in keys
                for e in _opt_array(term, "matchExpressions", tpath)
            )
        if constrains:
            where = f"{rpath}.nodeSelectorTerms"
            allowed = union if allowed is None else allowed & union
    return allowed, where


def pod_to_task(pod: object, *, accelerators: Collection[str] = DEFAULT_ACCELERATORS) -> Task:
    """Map a ``v1.Pod`` (its JSON as kube-scheduler sends it) to a core task.

    * ``id``: ``namespace/name`` (see :func:`pod_ref` for the uid);
    * ``demand``: the pod's effective requests (:func:`pod_requests`): ``cpu`` in cores,
      ``memory`` in GiB, the sum of the ``accelerators`` extended resources
      (``nvidia.com/gpu`` and ``amd.com/gpu`` by default) and ``edgesched.io/iops-k``;
      other resources (``ephemeral-storage``, hugepages, other extended resources) are
      Kubernetes' business and are ignored here;
    * ``priority``: ``spec.priority`` clamped to [0, MAX_PRIORITY];
    * ``workload``: the ``edgesched.io/workload`` label (``default`` when absent or empty);
    * ``archs``: from ``kubernetes.io/arch`` in ``nodeSelector`` or in required node affinity
      (``amd64`` → x86_64, ``arm64`` → arm64);
    * ``server_classes``: from ``edgesched.io/server-class``, the same way.

    Raises :class:`ExtenderInputError` naming the JSON path of a malformed field, and
    :class:`PodUnsatisfiable` for a pod no edgesched node can run (no supported architecture).
    """
    root = _object(pod, "Pod")
    ref = pod_ref(root)
    meta = _object(root.get("metadata"), "Pod.metadata")
    spec = _object(root.get("spec"), "Pod.spec")
    labels = _string_map(meta, "labels", "Pod.metadata")
    requests = pod_requests(root, accelerators)
    demand = Resources(
        cpu=float(requests.get("cpu", Fraction(0))),
        mem_gib=float(requests.get("memory", Fraction(0)) / _GIB),
        accel=int(sum((requests[k] for k in requests if k in accelerators), Fraction(0))),
        iops_k=float(requests.get(RESOURCE_IOPS_K, Fraction(0))),
    )
    raw_priority = spec.get("priority")
    if raw_priority is None:
        priority = 0
    elif isinstance(raw_priority, int) and not isinstance(raw_priority, bool):
        priority = min(max(raw_priority, 0), MAX_PRIORITY)
    else:
        raise ExtenderInputError(
            "Pod.spec.priority", f"{_describe(raw_priority)} is not an integer"
        )
    archs, arch_path = _label_constraint(spec, (LABEL_ARCH, LABEL_ARCH_BETA), K8S_ARCH, False)
    if archs is not None and not archs:
        raise PodUnsatisfiable(
            arch_path, f"admits no architecture of edgesched nodes ({', '.join(K8S_ARCH)})"
        )
    classes, class_path = _label_constraint(spec, (LABEL_SERVER_CLASS,), _SERVER_CLASSES, True)
    if classes is not None and not classes:
        raise PodUnsatisfiable(class_path, "admits no edgesched server class")
    return Task(
        id=ref.task_id,
        workload=labels.get(LABEL_WORKLOAD) or DEFAULT_WORKLOAD,
        priority=priority,
        demand=demand,
        archs=frozenset() if archs is None or archs == frozenset(Arch) else archs,
        server_classes=(
            frozenset() if classes is None or classes == frozenset(ServerClass) else classes
        ),
    )


# --- ExtenderArgs ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """Parsed ``extenderv1.ExtenderArgs``. Exactly one of ``node_names`` (nodeCacheCapable) and
    ``node_list`` (the ``v1.NodeList`` as sent) is set; ``candidates`` are the names in order."""

    pod: Mapping[str, Any]
    node_names: tuple[str, ...] | None
    node_list: Mapping[str, Any] | None
    node_items: tuple[Mapping[str, Any], ...]
    candidates: tuple[str, ...]


def parse_extender_args(args: object) -> ExtenderArgs:
    """Check an ``ExtenderArgs`` payload; raises :class:`ExtenderInputError` naming the field."""
    obj = _object(args, "ExtenderArgs")
    found, pod = _go_field(obj, "Pod")
    if not found or pod is None:
        raise ExtenderInputError("Pod", "missing")
    pod = _object(pod, "Pod")
    _, names_raw = _go_field(obj, "NodeNames")
    _, nodes_raw = _go_field(obj, "Nodes")
    if names_raw is not None and nodes_raw is not None:
        raise ExtenderInputError(
            "NodeNames", "both Nodes and NodeNames are set; kube-scheduler sends exactly one"
        )
    seen: set[str] = set()

    def unique(name: str, path: str) -> str:
        if name in seen:
            raise ExtenderInputError(path, f"node {name!r} is listed twice")
        seen.add(name)
        return name

    if names_raw is not None:
        names = tuple(
            unique(_string(n, f"NodeNames[{i}]", nonempty=True), f"NodeNames[{i}]")
            for i, n in enumerate(_array(names_raw, "NodeNames"))
        )
        return ExtenderArgs(pod, names, None, (), names)
    if nodes_raw is None:
        raise ExtenderInputError("NodeNames", "neither Nodes nor NodeNames is set")
    node_list = _object(nodes_raw, "Nodes")
    items = tuple(
        _object(item, f"Nodes.items[{i}]")
        for i, item in enumerate(_opt_array(node_list, "items", "Nodes"))
    )
    candidates: list[str] = []
    for i, item in enumerate(items):
        meta = _object(item.get("metadata"), f"Nodes.items[{i}].metadata")
        path = f"Nodes.items[{i}].metadata.name"
        candidates.append(unique(_string(meta.get("name"), path, nonempty=True), path))
    return ExtenderArgs(pod, None, node_list, items, tuple(candidates))


# --- filter and prioritize ------------------------------------------------------------------

NOT_EDGESCHED = "edgesched: not an edgesched node"


@dataclass(slots=True)
class _Evaluation:
    table: NodeTable
    task: Task
    demand: FloatArray
    masks: list[tuple[FilterPlugin, BoolArray]]  # each stage of the chain, in order
    feasible: BoolArray


def _evaluate(
    task: Task, fleet: Mapping[str, Node], policy: PolicyConfig, placements: Iterable[Placement]
) -> _Evaluation:
    """Run the core's filter chain over the whole fleet, as a scheduling cycle would."""
    running = [p for p in placements if p.task.id != task.id]  # a retried pod is not counted twice
    table = NodeTable.build(
        tuple(fleet.values()), running, (policy.accel_reserve_cpu, policy.accel_reserve_mem_gib)
    )
    demand = resource_vector(task.demand)
    masks = FILTER_CHAIN.evaluate(table, task, demand)
    feasible = np.ones(len(table), dtype=np.bool_)
    for _, mask in masks:
        feasible &= mask
    return _Evaluation(table, task, demand, masks, feasible)


def filter_nodes(
    args: object,
    fleet: Mapping[str, Node],
    policy: PolicyConfig,
    *,
    placements: Iterable[Placement] = (),
    accelerators: Collection[str] = DEFAULT_ACCELERATORS,
) -> dict[str, Any]:
    """Answer kube-scheduler's filter call with an ``ExtenderFilterResult``.

    ``fleet`` maps edgesched node ids (= Kubernetes node names) to nodes; ``placements`` is what
    central knows runs where, so free capacity is right. A candidate edgesched does not know is
    unresolvable. The others go through the core's filter chain in order, and a node is
    reported under the first stage it fails: in ``FailedAndUnresolvableNodes`` when no
    preemption can help (a stage the chain declares not resolvable: parked or waking, wrong
    architecture, class not allowed; or a pod larger than the whole node), else in
    ``FailedNodes``. Reasons are the same short phrase on every node, so
    kube-scheduler's "0/N nodes are available: ..." message counts them.

    With ``NodeNames`` in, the passing names come back in ``NodeNames`` and ``Nodes`` is null;
    with ``Nodes`` in, the passing node objects come back unchanged in ``Nodes``.
    """
    parsed = parse_extender_args(args)
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    known = [n for n in parsed.candidates if n in fleet]
    for name in parsed.candidates:
        if name not in fleet:
            unresolvable[name] = NOT_EDGESCHED
    passing: set[str] = set()
    try:
        task = pod_to_task(parsed.pod, accelerators=accelerators)
    except PodUnsatisfiable as e:
        for name in known:
            unresolvable[name] = f"edgesched: pod {e.detail}"
        known = []
    if known:
        ev = _evaluate(task, fleet, policy, placements)
        table = ev.table
        fits_empty = fits_when_empty(table, ev.demand)
        for name in known:
            row = table.index[fleet[name].id]
            if ev.feasible[row]:
                passing.add(name)
                continue
            for stage, mask in ev.masks:
                if mask[row]:
                    continue
                if not stage.resolvable:
                    unresolvable[name] = f"edgesched: {stage.why}"
                elif not fits_empty[row]:
                    unresolvable[name] = "edgesched: pod is larger than the node"
                else:
                    failed[name] = f"edgesched: {stage.why}"
                break
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }
    if parsed.node_names is not None:
        result["NodeNames"] = [n for n in parsed.node_names if n in passing]
    else:
        node_list = dict(parsed.node_list or {})
        node_list["items"] = [
            item
            for item, name in zip(parsed.node_items, parsed.candidates, strict=True)
            if name in passing
        ]
        result["Nodes"] = node_list
    return result


def prioritize(
    args: object,
    fleet: Mapping[str, Node],
    policy: PolicyConfig,
    *,
    placements: Iterable[Placement] = (),
    accelerators: Collection[str] = DEFAULT_ACCELERATORS,
) -> list[dict[str, Any]]:
    """Answer kube-scheduler's prioritize call with a ``HostPriorityList`` (scores 0..10).

    Each feasible candidate gets the core's weighted score (the policy mode's score plugins and
    weights, normalized as in a scheduling cycle). The node the core itself would choose (the
    highest score, ties to the lowest node id) gets 10; every other node gets
    ``round(10 * score / best)`` capped at 9, so edgesched's choice wins outright whenever
    kube-scheduler's own scores do not disagree. Candidates that are unknown or infeasible get 0.
    The list follows the order of the candidates.
    """
    parsed = parse_extender_args(args)
    scores = dict.fromkeys(parsed.candidates, MIN_EXTENDER_PRIORITY)
    known = [n for n in parsed.candidates if n in fleet]
    try:
        task = pod_to_task(parsed.pod, accelerators=accelerators)
    except PodUnsatisfiable:
        known = []
    if known:
        ev = _evaluate(task, fleet, policy, placements)
        table = ev.table
        weights = policy.effective_weights
        total = np.zeros(len(table), dtype=np.float64)
        for name in sorted(weights):
            total += weights[name] * SCORES[name].fn(table, task, ev.demand)
        total /= max(sum(weights.values()), _EPS)
        rows = sorted((table.index[fleet[n].id], n) for n in known)
        rows = [(row, name) for row, name in rows if ev.feasible[row]]
        if rows:
            # The core's choice: the highest total, ties to the lowest row (= lowest node id).
            best_row, best_name = max(rows, key=lambda r: (float(total[r[0]]), -r[0]))
            top = float(total[best_row])
            for row, name in rows:
                ratio = float(total[row]) / top if top > _EPS else 1.0
                runner_up = min(math.floor(10 * ratio + 0.5), MAX_EXTENDER_PRIORITY - 1)
                scores[name] = max(runner_up, MIN_EXTENDER_PRIORITY)
            scores[best_name] = MAX_EXTENDER_PRIORITY
    return [{"Host": name, "Score": scores[name]} for name in parsed.candidates]


# --- bind -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class K8sBinding:
    """A pod kube-scheduler asks the extender to bind, to node ``node_id``."""

    pod: PodRef
    node_id: str

    @property
    def task_id(self) -> str:
        return self.pod.task_id

    def decision(self, at: float) -> Decision:
        """The placement as a core decision, for central's store and decision log."""
        return Decision(
            DecisionKind.PLACE,
            self.node_id,
            f"kube-scheduler bound pod {self.pod.task_id} (uid {self.pod.uid}) via the extender",
            at,
            task_id=self.task_id,
        )


def bind(args: object, fleet: Mapping[str, Node]) -> tuple[K8sBinding | None, dict[str, str]]:
    """Check ``ExtenderBindingArgs`` and return (binding, ``ExtenderBindingResult``).

    Malformed args (a missing or non-string ``PodName``, ``PodNamespace``, ``PodUID`` or
    ``Node``) raise :class:`ExtenderInputError` naming the field. A node edgesched does not know
    gives ``(None, {"Error": ...})``. Otherwise the result is ``{"Error": ""}`` and the binding
    says what to record.

    How central uses it: with ``bindVerb`` set, kube-scheduler does *not* bind the pod itself;
    it waits for the extender's answer and treats ``Error: ""`` as "the pod is bound". So the
    caller must, before answering, (1) create the ``v1.Binding`` through the Kubernetes API
    (``POST /api/v1/namespaces/{PodNamespace}/pods/{PodName}/binding``) and (2) record the
    placement (``binding.decision(now)``) in its store, and answer ``{"Error": "<why>"}`` if
    either fails, so kube-scheduler forgets the assumed pod and retries. Central has no
    Kubernetes API client today, so :func:`routes` answers every bind with an error unless it is
    given a ``binder``; the recommended configuration leaves ``bindVerb`` unset.
    """
    obj = _object(args, "ExtenderBindingArgs")
    values: dict[str, str] = {}
    for name in ("PodName", "PodNamespace", "PodUID", "Node"):
        found, value = _go_field(obj, name)
        if not found or value is None:
            raise ExtenderInputError(name, "missing")
        values[name] = _string(value, name, nonempty=name != "PodUID")
    ref = PodRef(values["PodNamespace"], values["PodName"], values["PodUID"])
    node = values["Node"]
    if node not in fleet:
        return None, {"Error": f"node {node!r} is not an edgesched node"}
    return K8sBinding(ref, fleet[node].id), {"Error": ""}


# --- aiohttp routes -------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Binds a pod through the Kubernetes API and records the placement; raises on failure.
Binder = Callable[[K8sBinding], Awaitable[None]]

NO_BINDER = (
    "edgesched central does not bind pods: it has no Kubernetes API access "
    "(leave bindVerb unset in the extender configuration)"
)


async def _json_body(request: web.Request) -> tuple[object, web.Response | None]:
    """The request's JSON, or a problem response (413 too large, 400 not JSON)."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        return None, problem(413, "Payload Too Large", e.text or "request body too large")
    try:
        return json.loads(raw), None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, deep nesting
        return None, problem(400, "Bad Request", f"the body is not JSON: {e}")


def _bad_request(e: ValueError) -> web.Response:
    field = e.path if isinstance(e, ExtenderInputError) else None
    return problem(400, "Bad Request", str(e), field)


def routes(
    get_fleet: Callable[[], Mapping[str, Node]],
    get_policy: Callable[[], PolicyConfig],
    *,
    get_placements: Callable[[], Iterable[Placement]] | None = None,
    binder: Binder | None = None,
    accelerators: Collection[str] = DEFAULT_ACCELERATORS,
    prefix: str = PREFIX,
) -> list[tuple[str, str, Handler]]:
    """aiohttp ``(method, path, handler)`` triples for ``POST {prefix}/filter``,
    ``{prefix}/prioritize`` and ``{prefix}/bind``.

    Wire them with ``for method, path, handler in routes(...): app.router.add_route(method,
    path, handler)``. A malformed body gets 400 ``application/problem+json`` (RFC 9457, with
    ``field`` naming the JSON path); kube-scheduler treats any non-200 answer as the extender
    failing (skipped when ``ignorable: true``). ``get_placements`` gives what runs where (free
    capacity); ``binder`` makes ``bind`` real (see :func:`bind`), without it every bind answers
    an error.
    """

    def placements() -> Iterable[Placement]:
        return () if get_placements is None else get_placements()

    async def filter_handler(request: web.Request) -> web.StreamResponse:
        body, error = await _json_body(request)
        if error is not None:
            return error
        try:
            result = filter_nodes(
                body, get_fleet(), get_policy(), placements=placements(), accelerators=accelerators
            )
        except ValueError as e:
            return _bad_request(e)
        return web.json_response(result)

    async def prioritize_handler(request: web.Request) -> web.StreamResponse:
        body, error = await _json_body(request)
        if error is not None:
            return error
        try:
            result = prioritize(
                body, get_fleet(), get_policy(), placements=placements(), accelerators=accelerators
            )
        except ValueError as e:
            return _bad_request(e)
        return web.json_response(result)

    async def bind_handler(request: web.Request) -> web.StreamResponse:
        body, error = await _json_body(request)
        if error is not None:
            return error
        try:
            record, result = bind(body, get_fleet())
        except ValueError as e:
            return _bad_request(e)
        if record is not None:
            if binder is None:
                result = {"Error": NO_BINDER}
            else:
                try:
                    await binder(record)
                except Exception as e:  # reported to kube-scheduler, which retries the pod
                    result = {"Error": f"binding {record.task_id} to {record.node_id} failed: {e}"}
        return web.json_response(result)

    base = prefix.rstrip("/")
    return [
        ("POST", f"{base}/filter", filter_handler),
        ("POST", f"{base}/prioritize", prioritize_handler),
        ("POST", f"{base}/bind", bind_handler),
    ]
