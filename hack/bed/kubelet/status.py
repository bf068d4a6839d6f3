"""The pod runner's status writer: container statuses, pod phase and conditions, as a kubelet reports them.

The status is rebuilt from the cached pod and patched whole for `containerStatuses` (a strategic
merge by container name); the cached copy is updated so the next patch builds on it.
"""

from __future__ import annotations

from hack.bed.kubelet.clock import now_iso


def container_statuses(pod: dict) -> dict[str, dict]:
    return {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses", []) or []}


def terminated(rec: dict, lost: bool = False) -> dict:
    """The `terminated` state of a finished container record (process_table.ProcessTable.finish)."""
    return {
        "terminated": {
            "exitCode": rec["exitCode"],
            "reason": rec["reason"],
            "startedAt": rec["startedAt"],
            "finishedAt": rec["finishedAt"],
            **({"message": "process lost while the pod runner was down"} if lost else {}),
        }
    }


def final_states(pod: dict, recs: dict[str, dict], finished_at: str) -> tuple[str, dict[str, dict]]:
    """Phase and container states of a pod whose mapped containers (`recs`: name -> finished record)
    are all done: Succeeded when every one exited 0; unmapped sidecars count as Completed."""
    phase = "Succeeded" if all(r["exitCode"] == 0 for r in recs.values()) else "Failed"
    states = {
        c["name"]: {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": finished_at}}
        for c in pod["spec"]["containers"]
        if c["name"] not in recs
    }
    states.update({name: terminated(r) for name, r in recs.items()})
    return phase, states


def _conditions(status: str, reason: str | None, t: str) -> list[dict]:
    extra = {"reason": reason} if reason else {}
    return [{"type": kind, "status": status, **extra, "lastTransitionTime": t} for kind in ("Ready", "ContainersReady")]


def status_patch(
    pod: dict,
    cname: str,
    state: dict,
    ready: bool,
    restart_count: int = 0,
    last_state: dict | None = None,
    phase: str | None = None,
    all_states: dict | None = None,
    t: str | None = None,
    started: bool | None = None,
) -> dict:
    """The status patch that sets container `cname` to `state` (and the others named in
    `all_states`), with the pod's phase and Ready conditions where they change. `started`: whether
    its startup probe passed (default: running; a kubelet says false until a startupProbe passed)."""
    statuses = container_statuses(pod)
    out = []
    for c in pod["spec"]["containers"]:
        s = dict(statuses.get(c["name"]) or {"name": c["name"], "image": c["image"], "imageID": "", "restartCount": 0})
        if c["name"] == cname:
            s.update({"state": state, "ready": ready, "restartCount": restart_count})
            s["started"] = ("running" in state) and (started is None or started)
            if last_state is not None:
                s["lastState"] = last_state
        elif all_states and c["name"] in all_states:
            s.update({"state": all_states[c["name"]], "ready": False, "started": False})
        out.append(s)
    status: dict = {"containerStatuses": out}
    t = t or now_iso()
    all_ready = all(s.get("ready") for s in out)
    if phase:
        status["phase"] = phase
        status["conditions"] = _conditions("False", "PodCompleted" if phase == "Succeeded" else "PodFailed", t)
    elif not all_ready:
        status["conditions"] = _conditions("False", "ContainersNotReady", t)
    elif restart_count or not pod_ready(pod):
        status["conditions"] = _conditions("True", None, t)
    return status


def pod_ready(pod: dict) -> bool:
    """The pod's Ready condition as last written."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def merge_conditions(pod: dict, conditions: list[dict]) -> None:
    """Apply `conditions` to the cached pod as the API server's strategic merge does (by type)."""
    st = pod.setdefault("status", {})
    by_type = {c.get("type"): c for c in st.get("conditions") or []}
    for c in conditions:
        by_type[c["type"]] = {**by_type.get(c["type"], {}), **{k: v for k, v in c.items() if v is not None}}
    st["conditions"] = list(by_type.values())


class StatusWriter:
    """Writes status patches through `patch_status(pod, status)` (api.ApiClient.patch_status)."""

    def __init__(self, patch_status):
        self.patch_status = patch_status

    def patch(self, pod: dict, status: dict) -> None:
        """Patch `status` as built above and keep the cached pod in step."""
        self.patch_status(pod, status)
        st = pod.setdefault("status", {})
        for k, v in status.items():
            st[k] = v

    def patch_container(
        self,
        pod: dict,
        cname: str,
        state: dict,
        ready: bool,
        restart_count: int = 0,
        last_state: dict | None = None,
        phase: str | None = None,
        all_states: dict | None = None,
        started: bool | None = None,
    ) -> None:
        status = status_patch(pod, cname, state, ready, restart_count, last_state, phase, all_states, started=started)
        self.patch_status(pod, status)
        # keep our cached copy current so later patches build on it
        pod.setdefault("status", {})["containerStatuses"] = status["containerStatuses"]
        if phase:
            pod["status"]["phase"] = phase
        if "conditions" in status:
            merge_conditions(pod, status["conditions"])


# ---------------------------------------------------------------------------------- init containers
def _init_conditions(initialized: bool, ready: bool, t: str, pending: list[str], phase: str | None) -> list[dict]:
    """Initialized / Ready / ContainersReady as a kubelet reports them around init containers."""
    out = []
    if initialized:  # None: strategic merge removes the reason/message of the False condition
        out.append({"type": "Initialized", "status": "True", "reason": None, "message": None, "lastTransitionTime": t})
    else:
        out.append(
            {
                "type": "Initialized",
                "status": "False",
                "reason": "ContainersNotInitialized",
                "message": f"containers with incomplete status: [{' '.join(pending)}]",
                "lastTransitionTime": t,
            }
        )
    reason = None if ready else ("PodFailed" if phase == "Failed" else "ContainersNotReady")
    for kind in ("Ready", "ContainersReady"):
        c = {"type": kind, "status": "True" if ready else "False", "reason": reason, "lastTransitionTime": t}
        out.append(c)
    return out


def init_status_patch(
    pod: dict,
    states: dict[str, dict],
    phase: str = "Pending",
    t: str | None = None,
) -> dict:
    """The status of a pod whose init containers run: `states` maps init container names to their
    new container status fields (state, restartCount, lastState, ready); the others keep theirs
    (reset to waiting when they still hold kwok's made-up "Completed"). Main containers wait
    (PodInitializing); the pod is Pending (or Failed), not Initialized, not Ready."""
    t = t or now_iso()
    current = {s["name"]: s for s in (pod.get("status") or {}).get("initContainerStatuses", []) or []}
    begun = pod_initializing(pod)
    inits, pending = [], []
    for c in pod["spec"].get("initContainers") or []:
        s = dict(current.get(c["name"]) or {}) if begun else {}
        s.setdefault("name", c["name"])
        s.setdefault("image", c["image"])
        s.setdefault("imageID", "")
        s.setdefault("restartCount", 0)
        s.setdefault("ready", False)
        s.setdefault("state", {"waiting": {"reason": "PodInitializing"}})
        s.update(states.get(c["name"]) or {})
        s["started"] = "running" in s["state"]
        if (s["state"].get("terminated") or {}).get("exitCode") != 0:
            pending.append(c["name"])
        inits.append(s)
    mains = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {"waiting": {"reason": "PodInitializing"}},
        }
        for c in pod["spec"]["containers"]
    ]
    return {
        "phase": phase,
        "initContainerStatuses": inits,
        "containerStatuses": mains,
        "conditions": _init_conditions(False, False, t, pending, phase),
    }


def initialized_patch(
    pod: dict, probed: set[str] = frozenset(), starting: set[str] = frozenset(), t: str | None = None
) -> dict:
    """Init containers done: the main containers start, Running; Ready unless a container in
    `probed` waits for a readiness or startup probe (probes.py); `started` false for the ones in
    `starting` (a startup probe to pass)."""
    t = t or now_iso()
    mains = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": c["name"] not in probed,
            "started": c["name"] not in starting,
            "restartCount": 0,
            "state": {"running": {"startedAt": t}},
        }
        for c in pod["spec"]["containers"]
    ]
    ready = not any(c["name"] in probed for c in pod["spec"]["containers"])
    return {"phase": "Running", "containerStatuses": mains, "conditions": _init_conditions(True, ready, t, [], None)}


def pod_initializing(pod: dict) -> bool:
    """The runner took over the pod's init phase (Initialized=False, as a kubelet reports it while
    init containers run; kwok's pod-ready stage leaves such a pod alone)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Initialized":
            return c.get("status") == "False"
    return False
