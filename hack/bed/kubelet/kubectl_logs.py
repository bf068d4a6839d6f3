"""`kubectl logs` for the pod runner's pods.

kwok serves `kubectl logs` (apiserver -> kwok's kubelet port) from a CRI-format file named by a
kwok `Logs` object. A pod's containers write one plain log, .state/bed/pods/<ns>_<name>.log; this
module keeps <ns>_<name>.cri.log in step with it and creates the pod's Logs object.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container
from datetime import UTC, datetime
from pathlib import Path

from hack.bed.kubelet.api import ApiError
from hack.bed.kubelet.log import log


class KubectlLogs:
    def __init__(self, request: Callable, logdir: Path):
        self.request = request  # api.ApiClient.request
        self.logdir = logdir
        logdir.mkdir(parents=True, exist_ok=True)
        self.tails: dict[str, list] = {}  # uid -> [raw log, CRI log, offset, last activity]
        self.logs_crd = True  # kwok's Logs CRD installed

    def path(self, pod: dict) -> Path:
        """The plain log file of a pod (all its containers)."""
        md = pod["metadata"]
        return self.logdir / f"{md['namespace']}_{md['name']}.log"

    def follow(self, uid: str, logfile: Path) -> Path:
        """Start copying logfile into its CRI file, regenerated from the start (also after a runner
        restart); returns the CRI file."""
        cri = logfile.with_suffix(".cri.log")
        if uid not in self.tails:
            cri.write_bytes(b"")
            self.tails[uid] = [logfile, cri, 0, time.time()]
        return cri

    def wire(self, pod: dict, logfile: Path) -> None:
        """Follow the pod's log and create its kwok Logs object (once; 409 = exists)."""
        md = pod["metadata"]
        cri = self.follow(md["uid"], logfile)
        if not self.logs_crd:
            return
        body = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {
                "name": md["name"],
                "namespace": md["namespace"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": md["name"], "uid": md["uid"]}],
            },
            "spec": {
                "logs": [
                    {"containers": [c["name"] for c in pod["spec"]["containers"]], "logsFile": str(cri), "follow": True}
                ]
            },
        }
        try:
            self.request("POST", f"/apis/kwok.x-k8s.io/v1alpha1/namespaces/{md['namespace']}/logs", body=body)
        except ApiError as e:
            if e.status == 404:
                self.logs_crd = False
                log("kwok Logs CRD not installed: kubectl logs not wired")
            elif e.status != 409:
                log(f"creating Logs for {md['namespace']}/{md['name']} failed: {e}")

    def pump(self, live: Container[str], final: Container[str] = frozenset()) -> None:
        """Copy complete new lines (all of it for pods in `final`) into the CRI files; stop
        following a pod not in `live` 5 s after its last output."""
        t = time.time()
        for uid, tail in list(self.tails.items()):
            raw, cri, off, _ = tail
            try:
                size = raw.stat().st_size
            except OSError:
                size = 0
            if size > off:
                with open(raw, "rb") as f:
                    f.seek(off)
                    data = f.read(size - off)
                cut = len(data) if uid in final else data.rfind(b"\n") + 1
                if cut:
                    with open(cri, "ab") as f:
                        f.write(_cri_lines(data[:cut]))
                    tail[2] = off + cut
                    tail[3] = t
            if uid not in live and t - tail[3] > 5:
                self.tails.pop(uid, None)  # pod gone: stop following


def _cri_lines(data: bytes) -> bytes:
    """Plain output as CRI log lines; the runner's own "==== ... container x start/exited" lines stay out."""
    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    lines = [ln for ln in lines if not (ln.startswith(b"==== ") and b" container " in ln)]
    return b"".join(ts + b" stdout F " + ln + b"\n" for ln in lines)
