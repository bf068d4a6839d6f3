"""Admission through Kueue (https://kueue.sigs.k8s.io, read against v0.17.0's source).

When a job has a queue (`spec.resources.queueName`, else the chart's `kueue.defaultQueue`), every
trial is one Kueue workload, admitted all-or-nothing:

- Trial pods (controller/pods.py) form a Kueue pod group: label `kueue.x-k8s.io/queue-name`, label
  `kueue.x-k8s.io/pod-group-name` = the trial's deterministic name (`<job>-<trial>`, also its
  headless Service's), annotation `kueue.x-k8s.io/pod-group-total-count` = its number of pods,
  and `kueue.x-k8s.io/retriable-in-group: "false"` (Kueue otherwise waits for replacements of
  failed pods, holding the quota; rltune never replaces one).
  Kueue's pod webhook adds the scheduling gate `kueue.x-k8s.io/admission`; Kueue removes it from
  every pod of the group once the ClusterQueue's quota admits the whole group.
- A RayJob trial (controller/rayjob.py) gets the queue-name label on the RayJob: Kueue's
  `ray.io/rayjob` integration suspends it until admitted (its pods do not exist meanwhile).
- `spec.resources.priorityClassName` becomes the label `kueue.x-k8s.io/priority-class`: a Kueue
  WorkloadPriorityClass (Kueue reads that label first; a pod's own priorityClassName would also
  change kube-scheduler preemption, which rltune leaves alone).

Reading: a trial whose pods carry the admission gate (or whose RayJob is suspended) waits for
admission: no schedule timeout (lifecycle: Observation.gated). Kueue evicts a pod group (preemption
by a higher priority workload, a ClusterQueue change, ...) by setting the pod condition
`TerminationTarget` (reason `WorkloadEvictedDueTo<why>`, e.g. `...Preempted`; message Kueue's) and deleting the pods
(pkg/controller/jobs/pod/pod_controller.go Stop); a RayJob it suspends again. Both are the trial's
outcome Preempted (retried once), not a failure of its configuration.

Without Kueue (no kueue.x-k8s.io/v1beta1 LocalQueue kind) or without a queue, nothing here applies.
"""

from __future__ import annotations

from typing import Optional

from ..api.models import RLTuningJobSpec
from ..settings import OperatorSettings

GROUP, VERSION, LOCALQUEUES = "kueue.x-k8s.io", "v1beta1", "localqueues"
LOCALQUEUE_KIND = "LocalQueue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
RETRIABLE_IN_GROUP = "kueue.x-k8s.io/retriable-in-group"  # "false": no replacement pods are coming
ADMISSION_GATE = "kueue.x-k8s.io/admission"
TERMINATION_TARGET = "TerminationTarget"  # Kueue's pod condition on a stopped (evicted) pod

NO_KUEUE = (
    "the job's trials go through the Kueue LocalQueue {!r} (spec.resources.queueName, else the operator's "
    "kueue.defaultQueue), and the kueue.x-k8s.io/v1beta1 LocalQueue kind is not installed: install Kueue "
    "(https://kueue.sigs.k8s.io/docs/installation/) or remove the queue; the job starts by itself once it is there"
)


def queue_for(spec: RLTuningJobSpec, settings: OperatorSettings) -> Optional[str]:
    """The LocalQueue the job's trials go through (None: no Kueue admission)."""
    return spec.resources.queue_name or settings.kueue.default_queue


def pod_group(pods: list[dict], queue: str, group: str, priority: Optional[str]) -> None:
    """Make the trial's pods one Kueue pod group (in place)."""
    for p in pods:
        md = p["metadata"]
        md["labels"][QUEUE_LABEL] = queue
        md["labels"][POD_GROUP_LABEL] = group
        if priority:
            md["labels"][PRIORITY_LABEL] = priority
        notes = md.setdefault("annotations", {})
        notes[POD_GROUP_TOTAL] = str(len(pods))
        # rltune never replaces a failed pod (a retry is a new trial, a new group): the group is
        # finished, and its quota released, once every pod ended (pod_controller.go Finished)
        notes[RETRIABLE_IN_GROUP] = "false"


def queued_rayjob(rayjob: dict, queue: str, priority: Optional[str]) -> None:
    """Put a trial's RayJob into Kueue's queue (in place)."""
    labels = rayjob["metadata"].setdefault("labels", {})
    labels[QUEUE_LABEL] = queue
    if priority:
        labels[PRIORITY_LABEL] = priority


def gated(pods: list[dict], rayjob: Optional[dict] = None) -> str:
    """The queue a trial waits in for admission ("" = it does not wait): a pod still carries the
    admission gate, or its RayJob is suspended by Kueue before it ran."""
    for p in pods:
        gates = (p.get("spec") or {}).get("schedulingGates") or []
        if any(g.get("name") == ADMISSION_GATE for g in gates):
            return (p["metadata"].get("labels") or {}).get(QUEUE_LABEL) or "?"
    if rayjob is not None:
        queue = (rayjob["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        if queue and (rayjob.get("spec") or {}).get("suspend"):
            return queue
    return ""


def evicted(pods: list[dict], rayjob: Optional[dict] = None, running: bool = False) -> str:
    """Why Kueue took the trial away ("" = it did not): a pod with Kueue's TerminationTarget
    condition, or (`running`: the trial had been admitted and ran) its RayJob suspended again."""
    for p in pods:
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == TERMINATION_TARGET and c.get("status") == "True":
                why = ": ".join(x for x in (c.get("reason"), c.get("message")) if x) or "evicted"
                return f"Kueue stopped pod {p['metadata']['name']}: {why}"[:300]
    if running and rayjob is not None:
        queue = (rayjob["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        if queue and (rayjob.get("spec") or {}).get("suspend"):
            return f"Kueue suspended RayJob {rayjob['metadata']['name']} again (workload evicted from queue {queue})"
    return ""
