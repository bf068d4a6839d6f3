"""The pod runner's calls to the API server, as the kubelet makes them: HTTPS with the bed's admin cert.

Plain urllib rather than the kubernetes client: the runner needs a handful of verbs (a status
patch, a grace-0 delete, a list and a long-lived watch) and full control of their errors.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from hack.bed.kubelet.clock import now_iso
from hack.bed.kubelet.log import log


class ApiError(Exception):
    """A non-2xx answer; `status` is its HTTP code."""

    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): relist."""


class ApiClient:
    def __init__(self, kubeconfig: str, pki: Path):
        # the kubernetes client only reads the server address, the way kubectl does
        from kubernetes import config

        self.server = config.new_client_from_config(kubeconfig).configuration.host.rstrip("/")
        self.pki = pki
        self._ssl: ssl.SSLContext | None = None

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) of the API server, for KUBERNETES_SERVICE_HOST/PORT."""
        u = urllib.parse.urlsplit(self.server)
        return u.hostname or "", u.port or 443

    def _open(
        self, method: str, path: str, body=None, query=None, content_type: str = "application/json", timeout: float = 30
    ):
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
            ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
            self._ssl = ctx
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            url, data=data, method=method, headers={"Accept": "application/json", "Content-Type": content_type}
        )
        return urllib.request.urlopen(req, context=self._ssl, timeout=timeout)

    def request(
        self, method: str, path: str, body=None, query=None, content_type: str = "application/json", timeout: float = 30
    ):
        """Plain HTTPS call to the apiserver; raises ApiError on a non-2xx answer."""
        try:
            with self._open(method, path, body, query, content_type, timeout) as r:
                data = r.read()
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, e.read().decode(errors="replace")) from None
        return json.loads(data) if data else None

    def read_data(self, kind: str, namespace: str, name: str) -> dict[str, str]:
        """`data` of a ConfigMap (kind "configMap") or a Secret (base64, as stored)."""
        plural = "configmaps" if kind == "configMap" else "secrets"
        obj = self.request("GET", f"/api/v1/namespaces/{namespace}/{plural}/{name}")
        return (obj or {}).get("data") or {}

    def patch_status(self, pod: dict, status: dict) -> None:
        """Strategic-merge `status` into the pod; a pod gone or replaced meanwhile is only logged."""
        md = pod["metadata"]
        try:
            self.request(
                "PATCH",
                f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/status",
                body={"metadata": {"uid": md["uid"]}, "status": status},
                content_type="application/strategic-merge-patch+json",
            )
        except ApiError as e:
            if e.status not in (404, 409, 422):
                raise
            log(f"status patch of {md['namespace']}/{md['name']} failed: {e}")

    def event(self, pod: dict, reason: str, message: str, type_: str = "Normal", container: str = "") -> None:
        """Record a core/v1 Event on the pod, as a kubelet does (source component "kubelet")."""
        md = pod["metadata"]
        ref = {"kind": "Pod", "namespace": md["namespace"], "name": md["name"], "uid": md["uid"], "apiVersion": "v1"}
        if container:
            ref["fieldPath"] = f"spec.containers{{{container}}}"
        t = now_iso()
        body = {
            "metadata": {"generateName": f"{md['name']}.", "namespace": md["namespace"]},
            "involvedObject": ref,
            "reason": reason,
            "message": message[:1000],
            "type": type_,
            "source": {"component": "kubelet", "host": (pod.get("spec") or {}).get("nodeName", "")},
            "firstTimestamp": t,
            "lastTimestamp": t,
            "count": 1,
        }
        try:
            self.request("POST", f"/api/v1/namespaces/{md['namespace']}/events", body=body)
        except (ApiError, OSError) as e:  # an event is best effort, as a kubelet's recorder
            log(f"event {reason} on {md['namespace']}/{md['name']} not recorded: {e}")

    def delete_now(self, pod: dict) -> None:
        """Finalize a pod's deletion (grace 0), as a kubelet does once its containers are gone."""
        md = pod["metadata"]
        try:
            self.request(
                "DELETE",
                f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}",
                body={
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": md["uid"]},
                },
            )
            log(f"finalized deletion of {md['namespace']}/{md['name']}")
        except ApiError as e:
            if e.status not in (404, 409):
                raise

    def list_pods(self) -> tuple[list[dict], str]:
        data = self.request("GET", "/api/v1/pods", timeout=60)
        return data["items"], data["metadata"]["resourceVersion"]

    def watch_pods(self, rv: str, stop: threading.Event) -> Iterator[tuple[str, object]]:
        """Pod events (ADDED/MODIFIED/DELETED, object) from `rv` on, until `stop`; reconnects on
        errors and, when the watch expired (410), yields ("RELIST", all pods) and goes on from there."""
        while not stop.is_set():
            try:
                resp = self._open(
                    "GET",
                    "/api/v1/pods",
                    query=[
                        ("watch", "true"),
                        ("resourceVersion", rv),
                        ("allowWatchBookmarks", "true"),
                        ("timeoutSeconds", "240"),
                    ],
                    timeout=300,
                )
                with resp:
                    for line in resp:
                        if stop.is_set():
                            return
                        if not line.strip():
                            continue
                        ev = json.loads(line)
                        obj = ev.get("object") or {}
                        if ev["type"] == "ERROR":
                            if obj.get("code") == 410:
                                raise _Gone()
                            continue
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if ev["type"] != "BOOKMARK":
                            yield ev["type"], obj
            except _Gone:
                log("watch expired (410): relisting")
                try:
                    items, rv = self.list_pods()
                except Exception as e:  # noqa: BLE001 - the API server may be restarting: retry the relist
                    log(f"relist failed: {e!r}; retrying")
                    time.sleep(1)
                    continue  # rv is still the expired one: the next watch answers 410 and relists again
                yield "RELIST", items
            except Exception as e:  # noqa: BLE001 - reconnect
                if stop.is_set():
                    return
                log(f"watch error: {e!r}; reconnecting")
                time.sleep(1)
