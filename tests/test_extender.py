"""The kube-scheduler extender: Pod mapping, quantities, filter, prioritize, bind and routes.

Payloads are shaped as kube-scheduler sends them: ``json.Marshal`` of the untagged Go structs in
``k8s.io/kube-scheduler/extender/v1`` (so ``"Pod"``, ``"Nodes"``, ``"NodeNames"``, with nil
pointers as ``null``), carrying a ``v1.Pod`` and a ``v1.NodeList`` as the API server serves them.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesched.central.extender import (
    LABEL_ARCH,
    LABEL_SERVER_CLASS,
    MAX_EXTENDER_PRIORITY,
    NO_BINDER,
    NOT_EDGESCHED,
    ExtenderInputError,
    K8sBinding,
    PodUnsatisfiable,
    bind,
    filter_nodes,
    parse_quantity,
    pod_ref,
    pod_requests,
    pod_to_task,
    prioritize,
    routes,
)
from edgesched.core.model import (
    MAX_PRIORITY,
    Arch,
    DecisionKind,
    Node,
    NodeState,
    Placement,
    PowerModel,
    Resources,
    ServerClass,
    Task,
)
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.scheduler import ClusterView, schedule

Json = dict[str, Any]

# --- the fleet -------------------------------------------------------------------------------

ARM = PowerModel(idle_w=40, peak_w=160, parked_w=5)
X86 = PowerModel(idle_w=90, peak_w=320, parked_w=10)
AI = PowerModel(idle_w=250, peak_w=1400, parked_w=20)


def fleet_nodes() -> list[Node]:
    return [
        Node("edge-arm-01", Arch.ARM64, ServerClass.GENERAL, Resources(48, 192), ARM, perf=0.8),
        Node("edge-arm-02", Arch.ARM64, ServerClass.GENERAL, Resources(48, 192), ARM, perf=0.8),
        Node("edge-x86-01", Arch.X86_64, ServerClass.GENERAL, Resources(32, 128), X86),
        Node("edge-x86-02", Arch.X86_64, ServerClass.GENERAL, Resources(32, 128), X86),
        Node("ai-x86-01", Arch.X86_64, ServerClass.AI_ACCELERATOR, Resources(64, 512, 8), AI),
        Node(
            "sto-x86-01",
            Arch.X86_64,
            ServerClass.STORAGE_DENSE,
            Resources(32, 128, 0, 2000),
            X86,
        ),
    ]


@pytest.fixture
def fleet() -> dict[str, Node]:
    return {n.id: n for n in fleet_nodes()}


NAMES = [n.id for n in fleet_nodes()]
K8S_ARCH = {Arch.ARM64: "arm64", Arch.X86_64: "amd64"}

# --- Kubernetes objects as the API server serves them ------------------------------------------


def k8s_pod(
    name: str = "vision-7d9f8b6c5-x2k4q",
    namespace: str = "campus",
    *,
    containers: list[Json] | None = None,
    init_containers: list[Json] | None = None,
    node_selector: dict[str, str] | None = None,
    affinity: Json | None = None,
    priority: int | None = 1000,
    workload: str | None = "face-recognition",
    overhead: dict[str, str] | None = None,
) -> Json:
    """A Pending pod, as kube-scheduler holds it (defaults applied by the API server)."""
    labels = {"app": "vision", "pod-template-hash": "7d9f8b6c5"}
    if workload is not None:
        labels["edgesched.io/workload"] = workload
    if containers is None:
        containers = [
            container("vision", {"cpu": "1500m", "memory": "2Gi"}, {"memory": "3Gi"}),
            container("metrics", {"cpu": "100m", "memory": "64Mi"}, {"cpu": "200m"}),
        ]
    spec: Json = {
        "volumes": [
            {
                "name": "kube-api-access-8xq2n",
                "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
            }
        ],
        "containers": containers,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "securityContext": {},
        "schedulerName": "edgesched",
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        "priorityClassName": "campus-critical",
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if priority is not None:
        spec["priority"] = priority
    if init_containers is not None:
        spec["initContainers"] = init_containers
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    if affinity is not None:
        spec["affinity"] = affinity
    if overhead is not None:
        spec["overhead"] = overhead
    return {
        "metadata": {
            "name": name,
            "generateName": "vision-7d9f8b6c5-",
            "namespace": namespace,
            "uid": "5c8f1d2e-0b7a-4c3e-9d61-2f4a8b9c0e11",
            "resourceVersion": "184467",
            "creationTimestamp": "2024-05-14T07:00:02Z",
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "vision-7d9f8b6c5",
                    "uid": "0d6a3f27-5a8e-4d0c-8f2b-6b1e9f3c7a55",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2024-05-14T07:00:02Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {}}},
                }
            ],
        },
        "spec": spec,
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def container(
    name: str,
    requests: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
    **extra: Any,
) -> Json:
    resources: Json = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {
        "name": name,
        "image": f"registry.campus.local/{name}:1.4.2",
        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
        "env": [{"name": "LOG_LEVEL", "value": "info"}],
        "resources": resources,
        "volumeMounts": [
            {
                "name": "kube-api-access-8xq2n",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        **extra,
    }


def k8s_node(node: Node) -> Json:
    arch = K8S_ARCH[node.arch]
    capacity = {
        "cpu": str(int(node.capacity.cpu)),
        "memory": f"{int(node.capacity.mem_gib * 1024 * 1024)}Ki",
        "ephemeral-storage": "479670088Ki",
        "pods": "110",
    }
    if node.capacity.accel:
        capacity["nvidia.com/gpu"] = str(node.capacity.accel)
    return {
        "metadata": {
            "name": node.id,
            "uid": f"uid-{node.id}",
            "resourceVersion": "183990",
            "creationTimestamp": "2024-04-02T09:12:44Z",
            "labels": {
                "beta.kubernetes.io/arch": arch,
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch,
                "kubernetes.io/hostname": node.id,
                "kubernetes.io/os": "linux",
                "edgesched.io/server-class": node.server_class.value,
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"]},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": "2024-05-14T06:59:51Z",
                    "lastTransitionTime": "2024-04-02T09:13:20Z",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.20.0.11"},
                {"type": "Hostname", "address": node.id},
            ],
            "nodeInfo": {
                "architecture": arch,
                "operatingSystem": "linux",
                "kubeletVersion": "v1.30.1",
                "containerRuntimeVersion": "containerd://1.7.13",
            },
            "images": [{"names": ["registry.campus.local/vision:1.4.2"], "sizeBytes": 81234567}],
        },
    }


def args_names(pod: Json, names: list[str]) -> Json:
    """ExtenderArgs with nodeCacheCapable: true."""
    return {"Pod": pod, "Nodes": None, "NodeNames": list(names)}


def args_nodes(pod: Json, nodes: list[Node]) -> Json:
    """ExtenderArgs with nodeCacheCapable: false (v1.NodeList with empty ListMeta)."""
    return {
        "Pod": pod,
        "Nodes": {"metadata": {}, "items": [k8s_node(n) for n in nodes]},
        "NodeNames": None,
    }


def arch_affinity(operator: str, *values: str) -> Json:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/arch",
                                "operator": operator,
                                "values": list(values),
                            }
                        ]
                    }
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 50,
                    "preference": {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/zone",
                                "operator": "In",
                                "values": ["a"],
                            }
                        ]
                    },
                }
            ],
        }
    }


# --- quantities --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", Fraction(0)),
        ("2", Fraction(2)),
        ("500m", Fraction(1, 2)),
        ("1500m", Fraction(3, 2)),
        ("0.5", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("1.", Fraction(1)),
        ("+3", Fraction(3)),
        ("-250m", Fraction(-1, 4)),
        ("100n", Fraction(1, 10**7)),
        ("7u", Fraction(7, 10**6)),
        ("1k", Fraction(1000)),
        ("1M", Fraction(10**6)),
        ("1G", Fraction(10**9)),
        ("2T", Fraction(2 * 10**12)),
        ("1P", Fraction(10**15)),
        ("1E", Fraction(10**18)),
        ("1Ki", Fraction(1024)),
        ("512Mi", Fraction(512 * 2**20)),
        ("1Gi", Fraction(2**30)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("3Ti", Fraction(3 * 2**40)),
        ("1Pi", Fraction(2**50)),
        ("1Ei", Fraction(2**60)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),  # an exponent, not exa followed by junk
        ("1e+3", Fraction(1000)),
        ("25e-2", Fraction(1, 4)),
        ("1.5e1", Fraction(15)),
        ("007", Fraction(7)),
        ("0.000", Fraction(0)),
        (" 4Gi ", Fraction(4 * 2**30)),  # Kubernetes' JSON decoder trims blanks
        ("129974272", Fraction(129974272)),
        ("1e-00003", Fraction(1, 1000)),
    ],
)
def test_quantity_table(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    ["", " ", "12x", "1K", "1kb", "1 Gi", "Gi", ".", "+", "-", "e3", "1e", "1e3.5", "1..2",
     "1.2.3", "0x10", "1Mi2", "1m3", "∞", "١", "1e99", "1e-99", "1" * 70, "1ki", "1gi",
     "1e" + "9" * 5000, "1e4294967296"],
)  # fmt: skip
def test_quantity_rejects(text: str) -> None:
    with pytest.raises(ExtenderInputError) as err:
        parse_quantity(text, "Pod.spec.containers[0].resources.requests.cpu")
    assert str(err.value).startswith("Pod.spec.containers[0].resources.requests.cpu: ")
    assert err.value.path == "Pod.spec.containers[0].resources.requests.cpu"


SUFFIXES: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    **{s: Fraction(2**p) for s, p in {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50}.items()},
}


@st.composite
def quantities(draw: st.DrawFn) -> tuple[str, Fraction]:
    """Format a number in one of Kubernetes' notations, with the exact value it stands for."""
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole = draw(st.integers(0, 10**9))
    frac = draw(st.text("0123456789", max_size=6))
    dotted = draw(st.booleans())
    mantissa = f"{whole}.{frac}" if dotted or frac else str(whole)
    value = Fraction(f"{whole}.{frac or '0'}")
    if draw(st.booleans()):
        suffix = draw(st.sampled_from(sorted(SUFFIXES)))
        scale = SUFFIXES[suffix]
    else:
        exp = draw(st.integers(-12, 12))
        suffix = draw(st.sampled_from(["e", "E"])) + draw(st.sampled_from(["", "+"])) + str(exp)
        if exp < 0:
            suffix = suffix.replace("+", "")
        scale = Fraction(10) ** exp
    value *= scale
    return f"{sign}{mantissa}{suffix}", -value if sign == "-" else value


@given(quantities())
def test_quantity_round_trip(case: tuple[str, Fraction]) -> None:
    text, value = case
    assert parse_quantity(text) == value


@given(st.integers(0, 10**12), st.sampled_from(["m", "", "k", "Mi", "Gi"]))
def test_quantity_round_trip_from_value(n: int, suffix: str) -> None:
    value = n * SUFFIXES[suffix]
    assert parse_quantity(f"{n}{suffix}") == value
    assert parse_quantity(json.loads(json.dumps(f"{n}{suffix}"))) == value


@given(st.text(max_size=12))
def test_quantity_never_raises_anything_but_value_error(text: str) -> None:
    try:
        value = parse_quantity(text)
    except ExtenderInputError:
        return
    assert isinstance(value, Fraction)


# --- Pod -> Task -------------------------------------------------------------------------------


def test_pod_to_task_maps_a_realistic_pod() -> None:
    pod = k8s_pod(node_selector={"kubernetes.io/arch": "arm64", "kubernetes.io/os": "linux"})
    task = pod_to_task(pod)
    assert task.id == "campus/vision-7d9f8b6c5-x2k4q"
    assert task.workload == "face-recognition"
    assert task.priority == 999  # 1000 clamped to MAX_PRIORITY
    # 1500m + 100m of CPU; 2Gi + 64Mi of memory (the metrics sidecar's limit only raises limits)
    assert task.demand == Resources(cpu=1.6, mem_gib=2 + 64 / 1024, accel=0, iops_k=0)
    assert task.archs == frozenset({Arch.ARM64})
    assert task.server_classes == frozenset()
    ref = pod_ref(pod)
    assert (ref.namespace, ref.name, ref.uid) == (
        "campus",
        "vision-7d9f8b6c5-x2k4q",
        "5c8f1d2e-0b7a-4c3e-9d61-2f4a8b9c0e11",
    )
    assert ref.task_id == task.id


def test_requests_follow_kube_scheduler_with_init_containers_sidecars_and_overhead() -> None:
    pod = k8s_pod(
        containers=[container("app", {"cpu": "1", "memory": "1Gi"})],
        init_containers=[
            container("migrate", {"cpu": "3", "memory": "256Mi"}),  # alone: 3 CPUs at peak
            container("proxy", {"cpu": "500m", "memory": "128Mi"}, restartPolicy="Always"),
            container("warm", {"cpu": "2", "memory": "2Gi"}),  # 2 + the 0.5 sidecar
        ],
        overhead={"cpu": "250m", "memory": "120Mi"},
    )
    req = pod_requests(pod)
    # containers + sidecar = 1.5 CPU; init peak = max(3, 0.5, 2.5) = 3; then + 0.25 overhead
    assert req["cpu"] == Fraction(13, 4)
    # memory: containers + sidecar = 1152Mi, init peak = max(256, 128, 2176) = 2176Mi, + 120Mi
    assert req["memory"] == (2176 + 120) * 2**20
    assert pod_to_task(pod).demand.cpu == 3.25


def test_limits_stand_in_for_missing_requests_and_gpus_count_as_accelerators() -> None:
    pod = k8s_pod(
        containers=[
            container("trainer", {"cpu": "8", "memory": "32Gi"}, {"nvidia.com/gpu": "2"}),
            container("helper", {"cpu": "1", "amd.com/gpu": 1, "memory": "1G"}),
            container("tpu", {"example.com/tpu": "4", "ephemeral-storage": "10Gi"}),
        ]
    )
    task = pod_to_task(pod)
    assert task.demand.accel == 3
    assert task.demand.cpu == 9
    assert task.demand.mem_gib == pytest.approx(32 + 1e9 / 2**30)
    assert pod_to_task(pod, accelerators={"example.com/tpu"}).demand.accel == 4


def test_json_numbers_are_quantities_too() -> None:
    pod = k8s_pod(containers=[container("c", {"cpu": 0.5, "memory": 1073741824, "pods": None})])
    assert pod_to_task(pod).demand == Resources(cpu=0.5, mem_gib=1.0)


def test_iops_extended_resource() -> None:
    pod = k8s_pod(containers=[container("db", {"cpu": "4", "edgesched.io/iops-k": "200"})])
    assert pod_to_task(pod).demand.iops_k == 200


@pytest.mark.parametrize(
    ("priority", "expected"), [(None, 0), (0, 0), (-10, 0), (250, 250), (2000001000, MAX_PRIORITY)]
)
def test_priority_is_clamped(priority: int | None, expected: int) -> None:
    assert pod_to_task(k8s_pod(priority=priority)).priority == expected


def test_workload_defaults() -> None:
    assert pod_to_task(k8s_pod(workload=None)).workload == "default"
    assert pod_to_task(k8s_pod(workload="")).workload == "default"


@pytest.mark.parametrize(
    ("affinity", "selector", "archs"),
    [
        (arch_affinity("In", "arm64"), None, {Arch.ARM64}),
        (arch_affinity("In", "amd64", "arm64"), None, set()),  # both: unconstrained
        (arch_affinity("NotIn", "amd64"), None, {Arch.ARM64}),
        (arch_affinity("NotIn", "s390x"), None, set()),
        (arch_affinity("In", "amd64", "s390x"), None, {Arch.X86_64}),
        (arch_affinity("Exists"), None, set()),
        (arch_affinity("In", "amd64", "arm64"), {"kubernetes.io/arch": "amd64"}, {Arch.X86_64}),
        (None, {"beta.kubernetes.io/arch": "arm64"}, {Arch.ARM64}),
        (None, {"disktype": "ssd"}, set()),
    ],
)
def test_arch_constraints(
    affinity: Json | None, selector: dict[str, str] | None, archs: set[Arch]
) -> None:
    task = pod_to_task(k8s_pod(affinity=affinity, node_selector=selector))
    assert task.archs == frozenset(archs)


def test_node_selector_terms_are_ored() -> None:
    affinity = arch_affinity("In", "arm64")
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    terms.append({"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}]})
    assert pod_to_task(k8s_pod(affinity=affinity)).archs == frozenset()  # second term: any arch
    terms[1] = {"matchExpressions": [{"key": LABEL_ARCH, "operator": "In", "values": ["amd64"]}]}
    assert pod_to_task(k8s_pod(affinity=affinity)).archs == frozenset()  # arm64 or amd64


def test_server_class_from_node_selector() -> None:
    pod = k8s_pod(node_selector={"edgesched.io/server-class": "ai-accelerator"})
    assert pod_to_task(pod).server_classes == frozenset({ServerClass.AI_ACCELERATOR})


@pytest.mark.parametrize(
    ("selector", "affinity"),
    [({"kubernetes.io/arch": "s390x"}, None), (None, arch_affinity("In", "ppc64le"))],
)
def test_a_pod_no_edgesched_arch_can_run_is_unsatisfiable(
    selector: dict[str, str] | None, affinity: Json | None
) -> None:
    with pytest.raises(PodUnsatisfiable) as err:
        pod_to_task(k8s_pod(node_selector=selector, affinity=affinity))
    assert "admits no architecture of edgesched nodes (amd64, arm64)" in str(err.value)


# --- filter ------------------------------------------------------------------------------------

RESULT_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


def test_filter_arm64_only_pod_drops_x86_nodes_with_the_reason(fleet: dict[str, Node]) -> None:
    pod = k8s_pod(node_selector={"kubernetes.io/arch": "arm64"})
    result = filter_nodes(args_names(pod, NAMES), fleet, PolicyConfig())
    assert set(result) == RESULT_KEYS
    assert result["Nodes"] is None and result["Error"] == ""
    assert result["NodeNames"] == ["edge-arm-01", "edge-arm-02"]
    assert result["FailedNodes"] == {}
    assert result["FailedAndUnresolvableNodes"] == {
        n: "edgesched: wrong architecture or no image"
        for n in ("edge-x86-01", "edge-x86-02", "ai-x86-01", "sto-x86-01")
    }
    json.dumps(result)  # the answer is JSON as it stands


def test_filter_gpu_pod_fits_only_accelerator_nodes(fleet: dict[str, Node]) -> None:
    pod = k8s_pod(
        containers=[container("trainer", {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"})],
        workload="ai-training",
    )
    result = filter_nodes(args_names(pod, NAMES), fleet, PolicyConfig())
    assert result["NodeNames"] == ["ai-x86-01"]
    assert result["FailedNodes"] == {}
    # 2 GPUs exceed every other node's capacity (0): preemption cannot help there
    assert set(result["FailedAndUnresolvableNodes"]) == set(NAMES) - {"ai-x86-01"}
    assert set(result["FailedAndUnresolvableNodes"].values()) == {
        "edgesched: pod is larger than the node"
    }


def test_filter_unknown_nodes_are_unresolvable(fleet: dict[str, Node]) -> None:
    names = ["k8s-master-0", "edge-x86-01", "laptop"]
    result = filter_nodes(args_names(k8s_pod(), names), fleet, PolicyConfig())
    assert result["NodeNames"] == ["edge-x86-01"]
    assert result["FailedAndUnresolvableNodes"] == {
        "k8s-master-0": NOT_EDGESCHED,
        "laptop": NOT_EDGESCHED,
    }


def test_filter_oversized_pod_fails_everywhere_with_reasons(fleet: dict[str, Node]) -> None:
    pod = k8s_pod(containers=[container("huge", {"cpu": "96", "memory": "1Ti"})])
    result = filter_nodes(args_names(pod, NAMES), fleet, PolicyConfig())
    assert result["NodeNames"] == []
    assert result["FailedAndUnresolvableNodes"] == dict.fromkeys(
        NAMES, "edgesched: pod is larger than the node"
    )


def test_filter_counts_what_runs_and_full_nodes_are_resolvable(fleet: dict[str, Node]) -> None:
    busy = Task("campus/other", "video", 10, Resources(cpu=30, mem_gib=8))
    placements = [Placement(busy, "edge-x86-01", 0.0)]
    pod = k8s_pod(containers=[container("c", {"cpu": "4", "memory": "1Gi"})])
    names = ["edge-x86-01", "edge-x86-02"]
    result = filter_nodes(args_names(pod, names), fleet, PolicyConfig(), placements=placements)
    assert result["NodeNames"] == ["edge-x86-02"]
    assert result["FailedNodes"] == {"edge-x86-01": "edgesched: insufficient resources"}
    assert result["FailedAndUnresolvableNodes"] == {}
    # a pod retried after central recorded it is not counted against itself
    same = Task("campus/vision-7d9f8b6c5-x2k4q", "video", 10, Resources(cpu=30))
    again = filter_nodes(
        args_names(pod, names), fleet, PolicyConfig(), placements=[Placement(same, names[0], 0)]
    )
    assert again["NodeNames"] == names


def test_filter_parked_node_is_unresolvable(fleet: dict[str, Node]) -> None:
    n = fleet["edge-x86-02"]
    parked = Node(n.id, n.arch, n.server_class, n.capacity, n.power, state=NodeState.PARKED)
    fleet["edge-x86-02"] = parked
    result = filter_nodes(args_names(k8s_pod(), ["edge-x86-02"]), fleet, PolicyConfig())
    assert result["FailedAndUnresolvableNodes"] == {
        "edge-x86-02": "edgesched: not ready (parked or waking)"
    }


def test_filter_unsatisfiable_pod_fails_every_node(fleet: dict[str, Node]) -> None:
    pod = k8s_pod(node_selector={"kubernetes.io/arch": "s390x"})
    result = filter_nodes(args_names(pod, [*NAMES[:2], "mainframe"]), fleet, PolicyConfig())
    assert result["NodeNames"] == []
    assert result["FailedAndUnresolvableNodes"]["mainframe"] == NOT_EDGESCHED
    assert result["FailedAndUnresolvableNodes"]["edge-arm-01"].startswith(
        "edgesched: pod admits no architecture"
    )


def test_filter_with_a_node_list_returns_the_original_node_objects(fleet: dict[str, Node]) -> None:
    pod = k8s_pod(node_selector={"kubernetes.io/arch": "amd64"})
    args = args_nodes(pod, fleet_nodes())
    sent = copy.deepcopy(args)
    result = filter_nodes(args, fleet, PolicyConfig())
    assert args == sent  # the input is not modified
    assert result["NodeNames"] is None
    kept = result["Nodes"]["items"]
    assert [n["metadata"]["name"] for n in kept] == [
        "edge-x86-01",
        "edge-x86-02",
        "ai-x86-01",
        "sto-x86-01",
    ]
    assert kept == [k8s_node(fleet[n["metadata"]["name"]]) for n in kept]
    assert result["Nodes"]["metadata"] == {}
    assert set(result["FailedAndUnresolvableNodes"]) == {"edge-arm-01", "edge-arm-02"}


def test_go_style_case_insensitive_keys(fleet: dict[str, Node]) -> None:
    result = filter_nodes({"pod": k8s_pod(), "nodenames": ["edge-x86-01"]}, fleet, PolicyConfig())
    assert result["NodeNames"] == ["edge-x86-01"]


# --- prioritize --------------------------------------------------------------------------------


def core_choice(fleet: dict[str, Node], task: Task, policy: PolicyConfig) -> str:
    result = schedule(ClusterView(tuple(fleet.values())), [task], policy)
    (place,) = result.of_kind(DecisionKind.PLACE)
    return place.node_id


@pytest.mark.parametrize("mode", list(PolicyMode))
def test_prioritize_top_score_is_the_cores_choice(fleet: dict[str, Node], mode: PolicyMode) -> None:
    policy = PolicyConfig(mode=mode)
    pod = k8s_pod(containers=[container("c", {"cpu": "4", "memory": "8Gi"})])
    ranked = prioritize(args_names(pod, NAMES), fleet, policy)
    assert [h["Host"] for h in ranked] == NAMES
    scores = {h["Host"]: h["Score"] for h in ranked}
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values())
    best = core_choice(fleet, pod_to_task(pod), policy)
    assert scores[best] == MAX_EXTENDER_PRIORITY
    assert sorted(scores.values()).count(MAX_EXTENDER_PRIORITY) == 1
    # deterministic, and independent of the candidates' order
    again = prioritize(args_names(pod, list(reversed(NAMES))), fleet, policy)
    assert {h["Host"]: h["Score"] for h in again} == scores
    with_list = prioritize(args_nodes(pod, fleet_nodes()), fleet, policy)
    assert with_list == ranked


def test_prioritize_ties_go_to_the_lowest_node_id(fleet: dict[str, Node]) -> None:
    pod = k8s_pod(containers=[container("c", {"cpu": "1", "memory": "1Gi"})])
    ranked = prioritize(args_names(pod, ["edge-x86-02", "edge-x86-01"]), fleet, PolicyConfig())
    assert ranked == [{"Host": "edge-x86-02", "Score": 9}, {"Host": "edge-x86-01", "Score": 10}]


def test_prioritize_energy_mode_prefers_efficient_arm(fleet: dict[str, Node]) -> None:
    pod = k8s_pod(containers=[container("c", {"cpu": "2", "memory": "2Gi"})])
    ranked = prioritize(args_names(pod, NAMES), fleet, PolicyConfig(mode=PolicyMode.ENERGY))
    scores = {h["Host"]: h["Score"] for h in ranked}
    assert max(scores, key=lambda n: (scores[n], n)) in ("edge-arm-01", "edge-arm-02")
    assert scores["ai-x86-01"] < scores["edge-arm-01"]


def test_prioritize_unknown_and_infeasible_nodes_score_zero(fleet: dict[str, Node]) -> None:
    pod = k8s_pod(node_selector={"kubernetes.io/arch": "arm64"})
    ranked = prioritize(
        args_names(pod, ["edge-x86-01", "nope", "edge-arm-02"]), fleet, PolicyConfig()
    )
    assert ranked == [
        {"Host": "edge-x86-01", "Score": 0},
        {"Host": "nope", "Score": 0},
        {"Host": "edge-arm-02", "Score": 10},
    ]
    s390 = k8s_pod(node_selector={"kubernetes.io/arch": "s390x"})
    assert {h["Score"] for h in prioritize(args_names(s390, NAMES), fleet, PolicyConfig())} == {0}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(Arch)),
            st.sampled_from(list(ServerClass)),
            st.integers(1, 64),
            st.integers(0, 4),
            st.floats(0.5, 2.0),
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 16),
    st.integers(0, 2),
    st.sampled_from(list(PolicyMode)),
)
def test_prioritize_agrees_with_the_core(
    shapes: list[tuple[Arch, ServerClass, int, int, float]],
    cpu: int,
    gpus: int,
    mode: PolicyMode,
) -> None:
    fleet = {
        f"n{i:02d}": Node(f"n{i:02d}", arch, cls, Resources(cores, cores * 4, acc), X86, perf=perf)
        for i, (arch, cls, cores, acc, perf) in enumerate(shapes)
    }
    requests = {"cpu": str(cpu), "memory": f"{cpu}Gi"}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    pod = k8s_pod(containers=[container("c", requests)])
    policy = PolicyConfig(mode=mode)
    names = list(fleet)
    random.Random(cpu).shuffle(names)
    ranked = prioritize(args_names(pod, names), fleet, policy)
    assert [h["Host"] for h in ranked] == names
    scores = {h["Host"]: h["Score"] for h in ranked}
    assert all(0 <= s <= MAX_EXTENDER_PRIORITY for s in scores.values())
    passing = filter_nodes(args_names(pod, names), fleet, policy)["NodeNames"]
    if passing:
        best = core_choice(fleet, pod_to_task(pod), policy)
        assert best in passing
        assert [n for n, s in scores.items() if s == MAX_EXTENDER_PRIORITY] == [best]
    else:
        assert set(scores.values()) == {0}
    assert all(scores[n] == 0 for n in names if n not in passing)


# --- bind --------------------------------------------------------------------------------------

BINDING = {
    "PodName": "vision-7d9f8b6c5-x2k4q",
    "PodNamespace": "campus",
    "PodUID": "5c8f1d2e-0b7a-4c3e-9d61-2f4a8b9c0e11",
    "Node": "edge-arm-01",
}


def test_bind_returns_the_record_and_an_empty_error(fleet: dict[str, Node]) -> None:
    record, result = bind(BINDING, fleet)
    assert result == {"Error": ""}
    assert isinstance(record, K8sBinding)
    assert record.task_id == "campus/vision-7d9f8b6c5-x2k4q" and record.node_id == "edge-arm-01"
    assert record.pod.uid == BINDING["PodUID"]
    decision = record.decision(at=12.5)
    assert decision.kind is DecisionKind.PLACE and decision.task_id == record.task_id
    assert decision.node_id == "edge-arm-01" and decision.at == 12.5


def test_bind_to_an_unknown_node_is_an_error_result(fleet: dict[str, Node]) -> None:
    record, result = bind({**BINDING, "Node": "k8s-master-0"}, fleet)
    assert record is None
    assert result == {"Error": "node 'k8s-master-0' is not an edgesched node"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"PodName": None}, "PodName"),
        ({"PodName": ""}, "PodName"),
        ({"PodNamespace": 7}, "PodNamespace"),
        ({"PodUID": ["x"]}, "PodUID"),
        ({"Node": True}, "Node"),
        ({"Node": None}, "Node"),
    ],
)
def test_bind_rejects_malformed_args(fleet: dict[str, Node], change: Json, field: str) -> None:
    args = {k: v for k, v in {**BINDING, **change}.items() if v is not None}
    with pytest.raises(ExtenderInputError) as err:
        bind(args, fleet)
    assert err.value.path == field and str(err.value).startswith(f"{field}: ")


def test_bind_rejects_a_non_object(fleet: dict[str, Node]) -> None:
    with pytest.raises(ValueError, match="ExtenderBindingArgs: must be an object"):
        bind(["PodName"], fleet)


# --- malformed input ---------------------------------------------------------------------------


def _set(path: list[str | int], value: Any) -> Callable[[Json], None]:
    def apply(args: Json) -> None:
        target: Any = args
        for step in path[:-1]:
            target = target[step]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value

    return apply


_DELETE = object()
TERMS = (
    "Pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms"
)


def required_terms(terms: Any) -> Json:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }


C0: list[str | int] = ["Pod", "spec", "containers", 0]


@pytest.mark.parametrize(
    ("mutate", "path", "detail"),
    [
        (_set([*C0, "resources", "requests", "cpu"], "12x"),
         "Pod.spec.containers[0].resources.requests.cpu", "'12x' is not a quantity"),
        (_set([*C0, "resources", "requests", "memory"], "-1Gi"),
         "Pod.spec.containers[0].resources.requests.memory", "is negative"),
        (_set([*C0, "resources", "limits", "memory"], {"a": 1}),
         "Pod.spec.containers[0].resources.limits.memory", "is not a quantity"),
        (_set([*C0, "resources", "requests", "nvidia.com/gpu"], "500m"),
         'Pod.spec.containers[0].resources.requests["nvidia.com/gpu"]', "not a whole number"),
        (_set([*C0, "resources", "requests", "cpu"], 10**50),
         "Pod.spec.containers[0].resources.requests.cpu", "out of range"),
        (_set([*C0, "resources", "requests", "cpu"], float("nan")),
         "Pod.spec.containers[0].resources.requests.cpu", "NaN is not a quantity"),
        (_set([*C0, "resources"], "lots"), "Pod.spec.containers[0].resources", "must be an object"),
        (_set(["Pod", "spec", "containers", 1], 3), "Pod.spec.containers[1]", "must be an object"),
        (_set(["Pod", "spec", "containers"], []), "Pod.spec.containers", "at least one container"),
        (_set(["Pod", "spec", "containers"], _DELETE), "Pod.spec.containers", "must be an array"),
        (_set(["Pod", "spec", "initContainers"], {}),
         "Pod.spec.initContainers", "must be an array"),
        (_set(["Pod", "spec", "priority"], "high"), "Pod.spec.priority", "is not an integer"),
        (_set(["Pod", "spec", "priority"], 5.5), "Pod.spec.priority", "is not an integer"),
        (_set(["Pod", "spec", "priority"], True), "Pod.spec.priority", "is not an integer"),
        (_set(["Pod", "spec", "overhead"], {"cpu": "x"}),
         "Pod.spec.overhead.cpu", "not a quantity"),
        (_set(["Pod", "spec", "nodeSelector"], {"kubernetes.io/arch": 64}),
         'Pod.spec.nodeSelector["kubernetes.io/arch"]', "must be a string"),
        (_set(["Pod", "spec", "nodeSelector"], {"edgesched.io/server-class": "gpu"}),
         'Pod.spec.nodeSelector["edgesched.io/server-class"]', "'gpu' is not one of"),
        (_set(["Pod", "spec", "affinity"], required_terms(
            [{"matchExpressions": [{"key": LABEL_ARCH, "operator": "Equals", "values": ["x"]}]}])),
         f"{TERMS}[0].matchExpressions[0].operator", "'Equals' is not one of"),
        (_set(["Pod", "spec", "affinity"], required_terms("arm64")), TERMS, "must be an array"),
        (_set(["Pod", "spec", "affinity"], required_terms(
            [{"matchExpressions": [{"key": LABEL_ARCH, "operator": "In", "values": "arm64"}]}])),
         f"{TERMS}[0].matchExpressions[0].values", "must be an array"),
        (_set(["Pod", "spec", "affinity"], required_terms(
            [{"matchExpressions": [{"key": LABEL_SERVER_CLASS, "operator": "In",
                                    "values": ["gpu"]}]}])),
         f"{TERMS}[0].matchExpressions[0].values[0]", "'gpu' is not one of"),
        (_set(["Pod", "metadata", "labels"], {"edgesched.io/workload": None}),
         'Pod.metadata.labels["edgesched.io/workload"]', "must be a string"),
        (_set(["Pod", "metadata", "name"], _DELETE), "Pod.metadata.name", "must be a string"),
        (_set(["Pod", "metadata", "namespace"], 3), "Pod.metadata.namespace", "must be a string"),
        (_set(["Pod", "metadata"], None), "Pod.metadata", "must be an object"),
        (_set(["Pod", "spec"], []), "Pod.spec", "must be an object"),
        (_set(["Pod"], None), "Pod", "missing"),
        (_set(["Pod"], "pod"), "Pod", "must be an object"),
        (_set(["NodeNames"], None), "NodeNames", "neither Nodes nor NodeNames"),
        (_set(["NodeNames"], "edge-arm-01"), "NodeNames", "must be an array"),
        (_set(["NodeNames", 1], 5), "NodeNames[1]", "must be a string"),
        (_set(["NodeNames", 1], "edge-arm-01"), "NodeNames[1]", "listed twice"),
        (_set(["Nodes"], {"items": []}), "NodeNames", "both Nodes and NodeNames"),
    ],
)  # fmt: skip
def test_malformed_payloads_name_the_path(
    fleet: dict[str, Node], mutate: Callable[[Json], None], path: str, detail: str
) -> None:
    args = args_names(k8s_pod(), ["edge-arm-01", "edge-x86-01"])
    mutate(args)
    for verb in (filter_nodes, prioritize):
        with pytest.raises(ExtenderInputError) as err:
            verb(args, fleet, PolicyConfig())
        assert err.value.path == path
        assert str(err.value).startswith(f"{path}: ") and detail in str(err.value)


@pytest.mark.parametrize(
    ("nodes", "path"),
    [
        ({"metadata": {}, "items": [{"metadata": {}}]}, "Nodes.items[0].metadata.name"),
        ({"items": [{}]}, "Nodes.items[0].metadata"),
        ({"items": ["edge-arm-01"]}, "Nodes.items[0]"),
        ({"items": {}}, "Nodes.items"),
        ([], "Nodes"),
    ],
)
def test_malformed_node_lists_name_the_path(fleet: dict[str, Node], nodes: Any, path: str) -> None:
    with pytest.raises(ExtenderInputError) as err:
        filter_nodes({"Pod": k8s_pod(), "Nodes": nodes, "NodeNames": None}, fleet, PolicyConfig())
    assert err.value.path == path


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["500m", "1Gi", "arm64", "In", "Always", "nvidia.com/gpu", "edge-arm-01"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "Pod",
                    "Nodes",
                    "NodeNames",
                    "metadata",
                    "spec",
                    "name",
                    "containers",
                    "resources",
                    "requests",
                    "limits",
                    "cpu",
                    "memory",
                    "items",
                    "priority",
                    "nodeSelector",
                    "key",
                    "affinity",
                    "nodeAffinity",
                    "operator",
                    "values",
                    "labels",
                    "initContainers",
                ]
            )
            | st.text(max_size=6),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)


def _call_all(args: Any, fleet: dict[str, Node]) -> None:
    for verb in (filter_nodes, prioritize):
        with contextlib.suppress(ValueError):
            verb(args, fleet, PolicyConfig())
    with contextlib.suppress(ValueError):
        bind(args, fleet)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_fuzz_random_json_only_raises_value_error(args: Any) -> None:
    _call_all(args, {n.id: n for n in fleet_nodes()})


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_a_realistic_payload_with_one_field_replaced(data: st.DataObject) -> None:
    """Replace one value anywhere in a realistic payload with random JSON."""
    args = args_names(
        k8s_pod(
            affinity=arch_affinity("In", "arm64"),
            init_containers=[container("init", {"cpu": "1"}, restartPolicy="Always")],
            overhead={"cpu": "100m"},
        ),
        NAMES,
    )
    slots: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in list(items):
            slots.append((node, key))
            if isinstance(value, (dict, list)):
                walk(value)

    walk(args)
    parent, key = data.draw(st.sampled_from(slots))
    parent[key] = data.draw(json_values)
    _call_all(args, {n.id: n for n in fleet_nodes()})


# --- the aiohttp routes over real HTTP ---------------------------------------------------------


async def _client(
    fleet: dict[str, Node], binder: Any = None, max_size: int = 1024**2
) -> TestClient[web.Request, web.Application]:
    app = web.Application(client_max_size=max_size)
    for method, path, handler in routes(lambda: fleet, PolicyConfig, binder=binder):
        app.router.add_route(method, path, handler)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client


async def test_routes_answer_with_the_wire_shapes(fleet: dict[str, Node]) -> None:
    client = await _client(fleet)
    try:
        pod = k8s_pod(node_selector={"kubernetes.io/arch": "arm64"})
        r = await client.post("/v1/k8s/filter", json=args_names(pod, NAMES))
        assert r.status == 200 and r.content_type == "application/json"
        body = await r.json()
        assert set(body) == RESULT_KEYS and body["NodeNames"] == ["edge-arm-01", "edge-arm-02"]
        r = await client.post("/v1/k8s/filter", json=args_nodes(pod, fleet_nodes()))
        body = await r.json()
        assert body["NodeNames"] is None and len(body["Nodes"]["items"]) == 2
        r = await client.post("/v1/k8s/prioritize", json=args_names(pod, NAMES))
        assert r.status == 200
        ranked = await r.json()
        assert [h["Host"] for h in ranked] == NAMES
        assert {h["Host"]: h["Score"] for h in ranked}["edge-arm-01"] == 10
        r = await client.post("/v1/k8s/bind", json=BINDING)
        assert r.status == 200 and await r.json() == {"Error": NO_BINDER}
        r = await client.post("/v1/k8s/bind", json={**BINDING, "Node": "elsewhere"})
        assert await r.json() == {"Error": "node 'elsewhere' is not an edgesched node"}
    finally:
        await client.close()


async def test_bind_route_calls_the_binder(fleet: dict[str, Node]) -> None:
    bound: list[K8sBinding] = []

    async def binder(record: K8sBinding) -> None:
        if record.node_id == "edge-x86-01":
            raise RuntimeError("apiserver said 409 Conflict")
        bound.append(record)

    client = await _client(fleet, binder)
    try:
        r = await client.post("/v1/k8s/bind", json=BINDING)
        assert await r.json() == {"Error": ""}
        assert [b.task_id for b in bound] == ["campus/vision-7d9f8b6c5-x2k4q"]
        r = await client.post("/v1/k8s/bind", json={**BINDING, "Node": "edge-x86-01"})
        error = (await r.json())["Error"]
        assert r.status == 200 and "409 Conflict" in error
    finally:
        await client.close()


async def test_routes_turn_bad_bodies_into_problem_details(fleet: dict[str, Node]) -> None:
    client = await _client(fleet, max_size=64 * 1024)
    try:
        bad_pod = args_names(k8s_pod(), NAMES)
        bad_pod["Pod"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "12x"
        r = await client.post("/v1/k8s/filter", json=bad_pod)
        assert r.status == 400 and r.content_type == "application/problem+json"
        problem = await r.json()
        assert problem["status"] == 400 and problem["title"] == "Bad Request"
        assert problem["field"] == "Pod.spec.containers[0].resources.requests.cpu"
        assert problem["detail"].endswith("'12x' is not a quantity") and problem["type"]
        r = await client.post("/v1/k8s/bind", json={"PodName": "p"})
        assert r.status == 400 and (await r.json())["field"] == "PodNamespace"
        r = await client.post("/v1/k8s/prioritize", data=b"{not json")
        assert r.status == 400 and r.content_type == "application/problem+json"
        assert "field" not in await r.json()
        r = await client.post("/v1/k8s/filter", data=b"[" * 100_000 + b"]" * 100_000)
        assert r.status in (400, 413)
        r = await client.post("/v1/k8s/filter", data=b"\xff\xfe")
        assert r.status == 400
        r = await client.post("/v1/k8s/filter", data=b"x" * (128 * 1024))
        assert r.status == 413 and r.content_type == "application/problem+json"
        rng = random.Random(7)
        bodies = [b"", b"null", b"[]", b"{}", b'{"Pod": {}}', b'{"NodeNames": []}', b"1e999"]
        for _ in range(40):
            doc = args_names(k8s_pod(), NAMES)
            target: Any = doc["Pod"]["spec"]
            key = rng.choice(list(target))
            target[key] = rng.choice([None, 1, "x", [], {}, [{}], {"a": {}}, -1.5, True])
            bodies.append(json.dumps(doc).encode())
        for body in bodies:
            for verb in ("filter", "prioritize", "bind"):
                r = await client.post(f"/v1/k8s/{verb}", data=body)
                assert r.status in (200, 400), (verb, body[:80], r.status)
                if r.status == 400:
                    assert r.content_type == "application/problem+json"
    finally:
        await client.close()
