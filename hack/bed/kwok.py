"""kwok: the fake nodes' kubelet stand-in. Its configuration is our own Stage set (hack/kwok/*.yaml,
one Stage per file) with the selector of the pods the pod runner executes filled in; its `Logs` CRD
serves `kubectl logs` of those pods."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from hack.bed import clients, images, network, paths, pki, processes

NODE_ANNOTATION = "kwok.x-k8s.io/node"  # nodes kwok manages carry it (value "fake")
STAGES = paths.HACK / "kwok"  # kwok Stage objects, one file each, in the order kwok reads them
MAPPED_IMAGES = "@MAPPED_IMAGES@"  # placeholder: the selector of pods the pod runner executes


def config() -> str:
    """kwok configuration: our own Stages (data in hack/kwok/). Pods whose image the pod runner owns
    are made Running (pod IP assigned) but never completed or deleted by kwok: the runner reports
    their exit and finalizes their deletion. Other pods get kwok's usual lifecycle."""
    rx = images.regex().replace("\\", "\\\\").replace('"', '\\"')
    mapped = f'[.spec.containers.[].image | test("{rx}")] | any'
    docs = [f.read_text().replace(MAPPED_IMAGES, mapped) for f in sorted(STAGES.glob("*.yaml"))]
    return "---\n".join(d[d.index("apiVersion:") :] for d in docs)


def logs_crd() -> dict:
    """CRD of kwok's `Logs` (kwok.x-k8s.io/v1alpha1): the pod runner creates one per pod it runs,
    naming the CRI-format log file kwok serves to `kubectl logs`."""
    open_obj = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "logs.kwok.x-k8s.io"},
        "spec": {
            "group": "kwok.x-k8s.io",
            "scope": "Namespaced",
            "names": {"kind": "Logs", "listKind": "LogsList", "plural": "logs", "singular": "logs"},
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "properties": {"spec": open_obj, "status": open_obj}}
                    },
                }
            ],
        },
    }


def ensure_logs_crd() -> None:
    req = urllib.request.Request(
        network.APISERVER_URL + "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        data=json.dumps(logs_crd()).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(req, context=pki.admin_ssl_context(), timeout=10).close()
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise

    def established() -> bool:
        code, body = clients.api_get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/logs.kwok.x-k8s.io")
        conds = json.loads(body).get("status", {}).get("conditions", []) if code == 200 else []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    processes.wait_for("kwok Logs CRD", established, 30)
