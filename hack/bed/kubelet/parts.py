"""What the pod runner's collaborators share: its clients and tables, built once per runner.

The runner (runner.py) reconciles pods and ticks; init_containers, readiness, exits and deletion each
own one part of a pod's life and act on these parts. `pods` and `restart_at` are the runner's own
tables: the latest object of every pod it runs, and when to restart which container.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hack.bed.kubelet.api import ApiClient
from hack.bed.kubelet.invoke import Invoker
from hack.bed.kubelet.kubectl_logs import KubectlLogs
from hack.bed.kubelet.log import log
from hack.bed.kubelet.probes import Prober
from hack.bed.kubelet.process_table import Proc, ProcessTable
from hack.bed.kubelet.sandbox import PodSandboxes
from hack.bed.kubelet.scrape_targets import ScrapeTargets
from hack.bed.kubelet.status import StatusWriter

MAX_GRACE = 30.0  # the longest grace period a container gets before SIGKILL (a deletion, a failed probe)


def backoff(restarts: int) -> float:
    """Seconds before restarting a container that exited `restarts` times before (1, 2, ... 30)."""
    return min(30.0, 1.0 * 2 ** min(restarts, 5))


@dataclass
class Parts:
    state: Path
    api: ApiClient
    procs: ProcessTable  # "<uid>_<container>" -> Proc
    logs: KubectlLogs
    targets: ScrapeTargets
    status: StatusWriter
    invoker: Invoker
    sandboxes: PodSandboxes
    prober: Prober  # probes of running main containers
    pods: dict[str, dict] = field(default_factory=dict)  # uid -> latest pod object (mapped pods only)
    restart_at: dict[str, float] = field(default_factory=dict)  # container key -> when to restart

    @classmethod
    def build(cls, kubeconfig: str, state: Path) -> Parts:
        api = ApiClient(kubeconfig, state / "pki")
        return cls(
            state=state,
            api=api,
            procs=ProcessTable(state / "runner"),
            logs=KubectlLogs(api.request, state / "pods"),
            targets=ScrapeTargets(state / "prometheus" / "targets"),
            status=StatusWriter(api.patch_status),
            invoker=Invoker(api.read_data, state),
            sandboxes=PodSandboxes(state, api.request, *api.address, log),
            prober=Prober(log),
        )

    def forget(self, key: str) -> None:
        """Drop a container: its probes, its process record, its pod's sandbox once it was the last."""
        self.prober.remove(key)
        p = self.procs.forget(key)
        if p is not None and not self.procs.of_pod(p.rec["uid"]):
            self.sandboxes.forget(p.rec["uid"])
        self.restart_at.pop(key, None)

    def being_deleted(self, p: Proc) -> bool:
        pod = self.pods.get(p.rec["uid"])
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))
