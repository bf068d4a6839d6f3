"""The bed's node pools: kwok nodes with the GPU Feature Discovery labels of a GPU type, from
hack/pools.yaml at `up` (RLTUNE_POOLS_FILE, RLTUNE_GPU_TYPE, RLTUNE_GPU_NODES, RLTUNE_GPUS_PER_NODE
override it), and made by tests and benches with `create(api, name, ...)`."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

from hack.bed import kwok, paths

# GPU Feature Discovery labels per GPU type, as recorded from public dumps of real GFD output
# (hack/gfd/labels.yaml names the source of every value).
GFD_FIXTURE = paths.HACK / "gfd" / "labels.yaml"


@functools.cache
def gpu_types() -> dict[str, dict]:
    """{type: entry}: entry["labels"] are the node labels, entry["taint"] the GPU taint."""
    import yaml

    doc = yaml.safe_load(GFD_FIXTURE.read_text())
    return {name: dict(entry, taint=dict(doc["taint"])) for name, entry in doc["types"].items()}


def load() -> list[dict]:
    import yaml

    path = Path(os.environ.get("RLTUNE_POOLS_FILE", str(paths.HACK / "pools.yaml")))
    pools = yaml.safe_load(path.read_text())["pools"]
    gpu = next((p for p in pools if p.get("gpuType")), None)
    if gpu is not None:
        if os.environ.get("RLTUNE_GPU_TYPE"):
            gpu["gpuType"] = os.environ["RLTUNE_GPU_TYPE"]
            gpu["name"] = os.environ["RLTUNE_GPU_TYPE"].lower()
        if os.environ.get("RLTUNE_GPU_NODES"):
            gpu["nodes"] = int(os.environ["RLTUNE_GPU_NODES"])
        if os.environ.get("RLTUNE_GPUS_PER_NODE"):
            gpu["gpusPerNode"] = int(os.environ["RLTUNE_GPUS_PER_NODE"])
    return pools


def node_manifest(pool: str, index: int, gpu_type: str | None, gpus_per_node: int, cpu: str, memory: str) -> dict:
    name = f"{pool}-{index}"
    labels = {
        "type": "kwok",
        "rltune.io/pool": pool,
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/exclude-from-external-load-balancers": "true",
    }
    capacity = {"cpu": str(cpu), "memory": str(memory), "pods": "110", "ephemeral-storage": "7Ti"}
    taints = []
    if gpu_type:
        info = gpu_types().get(gpu_type.upper())
        if info is None:
            raise ValueError(f"unknown GPU type {gpu_type!r}; known: {sorted(gpu_types())}")
        # exactly the recorded GFD labels (hack/gfd/labels.yaml); gpu.count is what GFD counts
        labels.update({k: str(v) for k, v in info["labels"].items()})
        labels["nvidia.com/gpu.count"] = str(gpus_per_node)
        capacity["nvidia.com/gpu"] = str(gpus_per_node)
        taints.append(dict(info["taint"]))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {kwok.NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": taints},
        "status": {"capacity": capacity, "allocatable": dict(capacity), "phase": "Pending"},
    }


def create(
    api,
    name: str,
    gpu_type: str | None = "B300",
    nodes: int = 8,
    gpus_per_node: int = 8,
    cpu: str = "224",
    memory: str = "4Ti",
    wait_ready: bool = True,
    timeout: float = 60.0,
) -> list[str]:
    """Create (idempotently) `nodes` kwok nodes named <name>-<i>. `api` is a
    kubernetes.client.CoreV1Api. Returns the node names; waits until kwok marks them Ready."""
    from kubernetes.client.rest import ApiException

    names = []
    for i in range(nodes):
        body = node_manifest(name, i, gpu_type, gpus_per_node, cpu, memory)
        names.append(body["metadata"]["name"])
        try:
            api.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
    if wait_ready:
        deadline = time.time() + timeout
        while True:
            ready = 0
            for n in api.list_node(label_selector=f"rltune.io/pool={name}").items:
                conds = {c.type: c.status for c in (n.status.conditions or [])}
                taints = [t.key for t in (n.spec.taints or [])]
                if conds.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints:
                    ready += 1
            if ready >= nodes:
                break
            if time.time() > deadline:
                raise TimeoutError(f"pool {name}: {ready}/{nodes} nodes Ready after {timeout}s")
            time.sleep(0.25)
    return names


def delete(api, name: str) -> None:
    api.delete_collection_node(label_selector=f"rltune.io/pool={name}")
