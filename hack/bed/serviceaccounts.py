"""ServiceAccounts for bed components that run as a pod of theirs would (KubeRay, Kueue): the RBAC
that binds one to its ClusterRole, and a kubeconfig with its token."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from hack.bed import clients, network, paths, processes


def rbac(ns: str, sa: str, role: str) -> str:
    """Namespace, ServiceAccount, its non-expiring token Secret, and a binding to ClusterRole `role`."""
    return f"""apiVersion: v1
kind: Namespace
metadata: {{name: {ns}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {sa}, namespace: {ns}}}
---
apiVersion: v1
kind: Secret
type: kubernetes.io/service-account-token
metadata:
  name: {sa}-token
  namespace: {ns}
  annotations: {{kubernetes.io/service-account.name: {sa}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {sa}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}
subjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]
"""


def kubeconfig(bins: Path, namespace: str, sa: str, out: Path) -> None:
    """A kubeconfig with the ServiceAccount's token (its `<sa>-token` Secret), like a pod of it has."""

    def token() -> str:
        raw = clients.kubectl(bins, "-n", namespace, "get", "secret", f"{sa}-token", "-o", "json")
        return base64.b64decode(json.loads(raw).get("data", {}).get("token", "")).decode()

    processes.wait_for(f"{sa} ServiceAccount token", token, 30)
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "rltune-bed",
                "cluster": {
                    "server": network.APISERVER_URL,
                    "certificate-authority-data": base64.b64encode((paths.PKI / "ca.crt").read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": sa, "user": {"token": token()}}],
        "contexts": [{"name": sa, "context": {"cluster": "rltune-bed", "user": sa, "namespace": namespace}}],
        "current-context": sa,
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(cfg))
    tmp.chmod(0o600)
    tmp.replace(out)
