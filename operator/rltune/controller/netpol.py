"""A trial's NetworkPolicy: its pods admit ingress only from the trial's own pods, the KubeRay
operator and Prometheus (networking.k8s.io/v1; https://kubernetes.io/docs/concepts/services-networking/network-policies/).

Why: a verl/OpenRLHF trial's Ray head serves the Ray dashboard on 0.0.0.0:8265 (KubeRay's submitter
pod runs `ray job submit --address http://<head-svc>:8265` across pods), and the dashboard's job API
runs any code it is sent without authentication; a multi-pod trial's ranks rendezvous on MASTER_PORT
(pods.py) as openly. Without a policy any pod of the cluster can reach them.

Ray's own token authentication (Ray >= 2.52: RAY_AUTH_MODE=token, the token in RAY_AUTH_TOKEN;
https://docs.ray.io/en/latest/ray-security/token-auth.html) is not turned on: it needs every client
of the dashboard to send the token, and the KubeRay operator is one. KubeRay v1.5.0 (the release the
test bed pins, hack/binaries.sh) has no RayCluster `authOptions`, gives its submitter pod no token and
polls the dashboard itself (rayjob_controller.go, GetJobInfo) with a client that sends no
Authorization header (utils/dashboardclient), so a RayJob whose Ray cluster demands a token never
leaves Running there. KubeRay >= v1.5.1 does it end to end (`rayClusterSpec.authOptions.mode: token`:
a per-RayCluster Secret, RAY_AUTH_TOKEN on the head, workers and submitter, its dashboard client
reading the Secret), but also demands `rayClusterSpec.rayVersion` >= 2.52.0, the Ray of the user's
image, which rltune cannot know. So the dashboard stays on 0.0.0.0 and this policy is the fence.

The policy selects the trial's pods by their labels (rltune.io/job + rltune.io/trial, which every
trial pod carries: ranks, Ray head and workers, KubeRay's submitter with rltune.io/rank=submitter),
so "the trial's own pods" include the submitter. Peers from other namespaces (the KubeRay operator,
Prometheus) come from the chart's `networkPolicy` values. It takes effect only where the cluster's
network plugin enforces NetworkPolicies; the chart's `networkPolicy.enabled: false` turns it off.
"""

from __future__ import annotations

from typing import Optional

from ..settings import NetworkPeer, NetworkPolicySettings
from . import pods, podspec

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"


def policy_name(job: str, trial: str) -> str:
    return pods.service_name(job, trial)


def _peer(peer: NetworkPeer) -> dict:
    """A NetworkPolicyPeer for pods of other namespaces: namespaceSelector {} is every namespace
    (a podSelector alone would mean the policy's own namespace only)."""
    return {
        "namespaceSelector": {"matchLabels": dict(peer.namespace_selector)},
        "podSelector": {"matchLabels": dict(peer.pod_selector)},
    }


def trial_policy(
    namespace: str, job: str, trial: str, owner: Optional[dict], settings: NetworkPolicySettings
) -> Optional[dict]:
    """The NetworkPolicy of one trial (None when the chart turned them off)."""
    if not settings.enabled:
        return None
    selector = podspec.trial_selector(job, trial)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": policy_name(job, trial),
            "namespace": namespace,
            "labels": selector | {"app.kubernetes.io/name": "rltune-trial", "app.kubernetes.io/managed-by": "rltune"},
            "ownerReferences": [dict(owner)] if owner else [],
        },
        "spec": {
            "podSelector": {"matchLabels": dict(selector)},
            "policyTypes": ["Ingress"],  # egress stays open: the Pushgateway, images, the framework's downloads
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": dict(selector)}}]},  # ranks, Ray head/workers, submitter
                {"from": [_peer(settings.kuberay)]},  # KubeRay polls the head's dashboard
                {"from": [_peer(settings.prometheus)]},  # scrapes of the trial's own metrics endpoints
            ],
        },
    }
