"""The Kubernetes side of the reconciler: the job, its status, trial pods and services."""

from __future__ import annotations

import functools
import json
import logging
import time
from typing import Optional

from kubernetes import client
from kubernetes.client.rest import ApiException

from ..api.crdgen import GROUP, PLURAL, VERSION
from . import kueue, netpol, podspec, rayjob
from .reconcile import Conflict, Refusal

log = logging.getLogger("rltune.controller")
NODE_CACHE_SECONDS = 10.0
DISCOVERY_CACHE_SECONDS = 60.0
OPTIONAL_KINDS = {  # kind -> (group, version, plural)
    rayjob.KIND: (rayjob.GROUP, rayjob.VERSION, rayjob.PLURAL),
    kueue.LOCALQUEUE_KIND: (kueue.GROUP, kueue.VERSION, kueue.LOCALQUEUES),
}


class KubeCluster:
    """`group`/`version`/`plural` name the job resource (default rltune.io/v1alpha1 rltuningjobs); tests
    point them at a private copy of the CRD, e.g. one without the CEL rules (a CRD older than the operator)."""

    def __init__(
        self,
        api_client: Optional[client.ApiClient] = None,
        group: str = GROUP,
        version: str = VERSION,
        plural: str = PLURAL,
    ):
        self._api = api_client
        self.group, self.version, self.plural = group, version, plural
        self._nodes: Optional[tuple[float, list[dict]]] = None
        self._served: dict[str, tuple[float, bool]] = {}  # kind -> (when asked, whether served)

    @functools.cached_property
    def api(self) -> client.ApiClient:
        """Made on first use: the operator builds its KubeCluster at start-up, before kopf has logged
        in and loaded the client configuration (in-cluster or kubeconfig)."""
        if self._api is not None:
            return self._api
        api = client.ApiClient()
        api.user_agent = "rltune-operator"  # its requests in an audit log (kopf's own: "kopf/<version>")
        return api

    @functools.cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @functools.cached_property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @functools.cached_property
    def networking(self) -> client.NetworkingV1Api:
        return client.NetworkingV1Api(self.api)

    def get_job(self, namespace: str, name: str) -> Optional[dict]:
        try:
            return self.custom.get_namespaced_custom_object(self.group, self.version, namespace, self.plural, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def write_status(self, job: dict, status: dict) -> dict:
        md = job["metadata"]
        body = {
            "apiVersion": job["apiVersion"],
            "kind": job["kind"],
            "metadata": {"name": md["name"], "namespace": md["namespace"], "resourceVersion": md["resourceVersion"]},
            "spec": job.get("spec", {}),
            "status": status,
        }
        try:
            return self.custom.replace_namespaced_custom_object_status(
                self.group, self.version, md["namespace"], self.plural, md["name"], body
            )
        except ApiException as e:
            if e.status == 409:
                raise Conflict() from e
            raise

    def list_nodes(self) -> list[dict]:
        """The cluster's nodes, cached for NODE_CACHE_SECONDS (one list per tick of every job would
        grow with the number of jobs; a node pool changes far more slowly than that)."""
        now = time.monotonic()
        if self._nodes is None or now - self._nodes[0] > NODE_CACHE_SECONDS:
            items = self.core.list_node().items
            self._nodes = (now, [self.api.sanitize_for_serialization(n) for n in items])
        return self._nodes[1]

    def refusal(self, manifest: dict) -> Optional[Refusal]:
        """Create `manifest` as a server-side dry run (strict field validation): None when the API
        server would accept it (or it exists already), else its message. Nothing is persisted."""
        kw = {"dry_run": "All", "field_validation": "Strict"}
        try:
            self._create(manifest, **kw)
            return None
        except ApiException as e:
            if e.status == 409 or e.status >= 500 or e.status == 429:
                return None  # exists already, or the server is busy: the real create decides
            try:
                body = json.loads(e.body or "{}")
            except ValueError:
                body = {}
            msg = body.get("message") or e.reason or str(e.status)
            quota = e.status == 403 and "exceeded quota" in msg
            return Refusal(msg[:800], permanent=not quota)
        except ValueError as e:  # the client library's own model validation refused the body
            return Refusal(
                "invalid (the Kubernetes client's schema check, before the API server): "
                + " ".join(str(e).split())[:760],
                permanent=True,
            )

    def list_trial_pods(self, namespace: str, job: str) -> list[dict]:
        res = self.core.list_namespaced_pod(namespace, label_selector=f"{podspec.LABEL_JOB}={job}")
        return [self.api.sanitize_for_serialization(p) for p in res.items]

    def _create(self, manifest: dict, **kw) -> None:
        ns, kind = manifest["metadata"]["namespace"], manifest["kind"]
        if kind == "Pod":
            self.core.create_namespaced_pod(ns, manifest, **kw)
        elif kind == "Service":
            self.core.create_namespaced_service(ns, manifest, **kw)
        elif kind == rayjob.KIND:
            self.custom.create_namespaced_custom_object(rayjob.GROUP, rayjob.VERSION, ns, rayjob.PLURAL, manifest, **kw)
        elif kind == netpol.KIND:
            self.networking.create_namespaced_network_policy(ns, manifest, **kw)
        else:
            raise ValueError(kind)

    def serves(self, kind: str) -> bool:
        """Whether the cluster serves an optional kind rltune can use (OPTIONAL_KINDS: KubeRay's RayJob,
        Kueue's LocalQueue); asked of API discovery once a minute per kind."""
        group, version, plural = OPTIONAL_KINDS[kind]
        now = time.monotonic()
        cached = self._served.get(kind)
        if cached is None or now - cached[0] > DISCOVERY_CACHE_SECONDS:
            try:
                found = any(r.name == plural for r in self.custom.get_api_resources(group, version).resources)
            except ApiException as e:
                if e.status != 404:
                    raise
                found = False
            self._served[kind] = cached = (now, found)
        return cached[1]

    def list_rayjobs(self, namespace: str, job: str) -> list[dict]:
        """The job's trial RayJobs ([] without KubeRay)."""
        if not self.serves(rayjob.KIND):
            return []
        res = self.custom.list_namespaced_custom_object(
            rayjob.GROUP, rayjob.VERSION, namespace, rayjob.PLURAL, label_selector=f"{podspec.LABEL_JOB}={job}"
        )
        return res.get("items", [])

    def create(self, manifest: dict) -> bool:
        try:
            self._create(manifest, field_validation="Strict")
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def delete_trial(self, namespace: str, job: str, trial: str, uid: str) -> None:
        """Deletes the trial's RayJob, pods, Service and NetworkPolicy: only objects the job (UID `uid`)
        owns. Each is found by the trial's labels, kept only where an ownerReference names the job's UID
        (a Ray pod: where its owner is the RayCluster or the submitter Job of a RayJob the job owns), and
        deleted with a precondition on its own UID: an object of the same name that someone else made
        (a Service `web-baseline` of another workload beside a job `web`), or made anew meanwhile, stays."""
        sel = f"{podspec.LABEL_JOB}={job},{podspec.LABEL_TRIAL}={trial}"
        try:
            ray_owners: set[tuple[str, str, str]] = set()  # (apiVersion, kind, name) owning the trial's Ray pods
            if self.serves(rayjob.KIND):
                # first, so that KubeRay does not re-create the pods deleted below
                res = self.custom.list_namespaced_custom_object(
                    rayjob.GROUP, rayjob.VERSION, namespace, rayjob.PLURAL, label_selector=sel
                )
                for rj in res.get("items", []):
                    md = rj.get("metadata") or {}
                    if not owned_by(md.get("ownerReferences"), uid):
                        continue
                    ray_owners.add(("batch/v1", "Job", md["name"]))  # K8sJobMode: the submitter Job, named so
                    cluster = (rj.get("status") or {}).get("rayClusterName")
                    if cluster:
                        ray_owners.add((rayjob.API_VERSION, "RayCluster", cluster))
                    _gone(
                        lambda md=md: self.custom.delete_namespaced_custom_object(
                            rayjob.GROUP,
                            rayjob.VERSION,
                            namespace,
                            rayjob.PLURAL,
                            md["name"],
                            body=_precondition(md["uid"], "Background"),
                        )
                    )
            for p in self.core.list_namespaced_pod(namespace, label_selector=sel).items:
                refs = p.metadata.owner_references or []
                mine = _owned(p, uid) or any((r.api_version, r.kind, r.name) in ray_owners for r in refs)
                if mine and p.metadata.deletion_timestamp is None:
                    _gone(
                        lambda p=p: self.core.delete_namespaced_pod(
                            p.metadata.name, namespace, body=_precondition(p.metadata.uid, grace=5)
                        )
                    )
            # the Service, then the NetworkPolicy last: a cluster without the chart's networkpolicies rule
            # (an older chart) still frees the GPUs
            for lister, deleter in (
                (self.core.list_namespaced_service, self.core.delete_namespaced_service),
                (self.networking.list_namespaced_network_policy, self.networking.delete_namespaced_network_policy),
            ):
                for o in lister(namespace, label_selector=sel).items:
                    if _owned(o, uid):
                        _gone(lambda o=o, d=deleter: d(o.metadata.name, namespace, body=_precondition(o.metadata.uid)))
        except ApiException as e:
            log.warning("tearing down %s/%s trial %s: %s", namespace, job, trial, e.reason)


def owned_by(refs: Optional[list], uid: str) -> bool:
    """Whether ownerReferences (dicts) name the owner `uid` (never true for an empty uid)."""
    return bool(uid) and any((r or {}).get("uid") == uid for r in refs or [])


def _owned(obj, uid: str) -> bool:
    """Whether a typed API object's ownerReferences name the owner `uid`."""
    return owned_by([{"uid": r.uid} for r in obj.metadata.owner_references or []], uid)


def _precondition(uid: str, propagation: Optional[str] = None, grace: Optional[int] = None) -> client.V1DeleteOptions:
    """DeleteOptions that delete the object only while it is the one that was checked (its UID)."""
    return client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=uid), propagation_policy=propagation, grace_period_seconds=grace
    )


def _gone(delete) -> None:
    """Runs a delete; already gone (404) or replaced by another object of that name (409: the UID
    precondition failed) is no error."""
    try:
        delete()
    except ApiException as e:
        if e.status not in (404, 409):
            raise
