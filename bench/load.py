"""Many RLTuningJobs at once on one shared GPU pool, with and without Kueue, on the test bed.

`make bench-load` (or `.venv/bin/python -m bench.load [--jobs 50] [--nodes 100] [--quota 512] ...`):

1. adds a private kwok pool of `--nodes` B300 nodes with `--gpus-per-node` GPUs (tainted, so only the
   bench's trial pods land there; removed at the end);
2. for each mode (`--modes kueue,plain`): a fresh namespace, a fresh operator (a subprocess,
   `python -m rltune.controller`, as the audited user rltune-operator, like bench/api_rate.py), and
   `--jobs` small twin jobs applied at once; with Kueue a ResourceFlavor, one ClusterQueue whose
   nvidia.com/gpu quota (`--quota`) is smaller than the pool, and LocalQueue `lq` that every job names
   (spec.resources.queueName); without, no queue (Kueue, if installed, ignores such pods);
3. while the jobs run, a watch on the namespace's trial pods keeps the GPUs held by scheduled,
   not-terminated trial pods, in total and per job, and checks every event against the quota (Kueue
   run), the pool and each job's gpuBudget; a watch on the jobs records when each trial's result
   (a terminal state) first appears in the job's status; the operator's RSS and CPU time are
   sampled from /proc every second; a progress line every `--progress` seconds;
4. reports: the jobs' phases, the peaks, the operator's peak RSS and CPU seconds, its API requests
   per second (the apiserver's audit log, user rltune-operator, over the run), the latency from a
   trial's rank-0 pod end to its result in status (p50/p99), the wall time; a table of the runs side
   by side, and out/bench-load.json.

Job shapes cycle through `--shapes` (baseline GPUs:gpuBudget; every trial uses the baseline's GPUs,
so a budget twice the baseline runs two trials at once): 8:8, 8:16, 16:32, 32:64, 64:64 - trials of
1 to 8 pods. Each job: `--max-trials` trials (parallelTrials 2), `--steps` steps per trial,
`--confirm-steps` (0: no confirmation run). Exits 1 if a job did not finish or a check failed.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path

import yaml

from bench import api_rate
from bench.paths import ROOT, STATE
from hack import demo
from hack.bed import kueue, lifecycle, pki, pools, processes
from hack.bed.paths import AUDIT_LOG, KUBECONFIG

EXAMPLE = ROOT / "examples" / "twin-demo.yaml"
TAINT = "rltune.io/bench-pool"
ACTIVE = ("Pending", "Running", "Scoring")
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- objects
def parse_shapes(s: str) -> list[tuple[int, int]]:
    out = []
    for part in s.split(","):
        g, b = part.split(":")
        out.append((int(g), int(b)))
    return out


def job_docs(ns: str, args: argparse.Namespace, pool: str, queue: str | None) -> list[dict]:
    base = yaml.safe_load(EXAMPLE.read_text())
    base["metadata"]["namespace"] = ns
    shapes = parse_shapes(args.shapes)
    out = []
    for i in range(args.jobs):
        gpus, budget = shapes[i % len(shapes)]
        d = copy.deepcopy(base)
        d["metadata"]["name"] = f"load-{i:03d}"
        s = d["spec"]
        r = s["resources"]
        r.update(gpuBudget=budget, gpusPerNode=args.gpus_per_node, nodeSelector={"rltune.io/pool": pool})
        r["tolerations"] = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
        if queue:
            r["queueName"] = queue
        s["baseline"]["gpus"] = gpus
        s["budget"].update(
            maxTrials=args.max_trials,
            parallelTrials=min(2, args.max_trials),
            stepsPerTrial=args.steps,
            warmupSteps=1,
            confirmSteps=args.confirm_steps,
            maxFailedTrials=args.max_trials + 2,
            trialTimeoutSeconds=1800,
            scheduleTimeoutSeconds=3600,  # without Kueue, pods wait for the pool in kube-scheduler
            metricsTimeoutSeconds=600,
        )
        out.append(d)
    return out


def make_pool(core, pool: str, nodes: int, gpus_per_node: int) -> None:
    """`nodes` kwok B300 nodes <pool>-<i>, tainted rltune.io/bench-pool (only the bench's pods go there)."""
    from kubernetes.client.rest import ApiException

    for i in range(nodes):
        node = pools.node_manifest(pool, i, "B300", gpus_per_node, "224", "4Ti")
        node["spec"]["taints"].append({"key": TAINT, "value": pool, "effect": "NoSchedule"})
        try:
            core.create_node(node)
        except ApiException as e:
            if e.status != 409:
                raise
    pools.create(core, pool, "B300", nodes=nodes, gpus_per_node=gpus_per_node, timeout=300)


# ----------------------------------------------------------------------------- watches
class Watcher:
    """A background watch from the resourceVersion of a list, resumed from the last one seen when the
    stream ends; on 410 Gone it lists again (reset(items) rebuilds the state). on_event runs under a lock."""

    def __init__(self, list_fn, *args, **kw):
        from kubernetes import watch

        self.lock = threading.Lock()
        self._fn, self._args, self._kw = list_fn, args, kw  # the list function itself: stream reads its return type
        self._stop = False
        self.errors = 0
        self._w = watch.Watch()
        self._relist()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _relist(self) -> None:
        first = self._fn(*self._args, **self._kw)
        if isinstance(first, dict):
            self._rv, items = first["metadata"]["resourceVersion"], first["items"]
        else:
            self._rv, items = first.metadata.resource_version, first.items
        with self.lock:
            self.reset(items)

    def _run(self):
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        while not self._stop:
            try:
                kw = dict(self._kw, resource_version=self._rv, timeout_seconds=300)
                for ev in self._w.stream(self._fn, *self._args, **kw):
                    obj = ev["object"]
                    rv = obj["metadata"]["resourceVersion"] if isinstance(obj, dict) else obj.metadata.resource_version
                    self._rv = rv or self._rv
                    with self.lock:
                        self.on_event(ev["type"], obj, time.time())
            except ApiException as e:
                self.errors += 1
                if e.status == 410:
                    self._relist()
            except Exception:  # noqa: BLE001 - resume from the last resourceVersion
                self.errors += 1
                if self._stop:
                    return
                time.sleep(0.5)
            self._w = watch.Watch()

    def stop(self):
        self._stop = True
        self._w.stop()

    def reset(self, items) -> None:
        for o in items:
            self.on_event("ADDED", o, time.time())

    def on_event(self, kind: str, obj, now: float) -> None:
        raise NotImplementedError


def pod_gpus(p) -> int:
    return sum(int(((c.resources and c.resources.requests) or {}).get("nvidia.com/gpu", 0)) for c in p.spec.containers)


def terminated_at(p) -> datetime | None:
    """When the pod's container terminated (all containers: the last), None while one still runs."""
    sts = p.status.container_statuses or []
    if not sts or any(not (s.state and s.state.terminated) for s in sts):
        return None
    ends = [s.state.terminated.finished_at for s in sts if s.state.terminated.finished_at]
    return max(ends) if ends else datetime.now().astimezone()


class GpuLedger(Watcher):
    """GPUs of scheduled (bound), not-terminated trial pods: total, per job and per trial; peaks and
    violations against the quota, the pool and each job's budget, checked on every event."""

    def __init__(self, core, ns: str, budgets: dict[str, int], limit: int, limit_name: str, pool: int):
        self.budgets, self.limit, self.limit_name, self.pool = budgets, limit, limit_name, pool
        self.live: dict[str, tuple[str, str, int]] = {}  # pod -> (job, trial, gpus)
        self.trial_pods: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)  # (job, trial) -> pod -> gpus
        self.peak = 0
        self.trial_over_quota = 0  # events where whole trials holding a pod added up to more than the quota
        self.peak_trial_gpus = 0  # all GPUs of every trial that has a pod held (what Kueue reserves for it)
        self.peak_trials = 0
        self.peak_job: dict[str, int] = defaultdict(int)
        self.violations: list[str] = []
        self.rank0_end: dict[tuple[str, str], tuple[float, float]] = {}  # (job, trial) -> (terminated, seen)
        self.pods_seen: set[str] = set()
        super().__init__(core.list_namespaced_pod, ns, label_selector="rltune.io/job")

    def reset(self, items) -> None:
        self.live.clear()
        super().reset(items)

    def on_event(self, kind: str, p, now: float) -> None:
        name = p.metadata.name
        labels = p.metadata.labels or {}
        job, trial = labels.get("rltune.io/job", ""), labels.get("rltune.io/trial", "")
        self.pods_seen.add(name)
        end = terminated_at(p)
        if labels.get("rltune.io/rank") == "0" and end is not None and (job, trial) not in self.rank0_end:
            self.rank0_end[(job, trial)] = (end.timestamp(), now)
        held = (
            kind != "DELETED"
            and p.spec.node_name
            and p.status.phase in (None, "Pending", "Running")
            and end is None
            and not p.metadata.deletion_timestamp
        )
        if kind != "DELETED":
            self.trial_pods[(job, trial)][name] = pod_gpus(p)
        if held:
            self.live[name] = (job, trial, pod_gpus(p))
        else:
            self.live.pop(name, None)
        total = sum(g for _, _, g in self.live.values())
        trials = {(j, t) for j, t, _ in self.live.values()}
        trial_total = sum(sum(self.trial_pods[k].values()) for k in trials)
        self.peak = max(self.peak, total)
        self.peak_trial_gpus = max(self.peak_trial_gpus, trial_total)
        self.peak_trials = max(self.peak_trials, len(trials))
        stamp = time.strftime("%H:%M:%S", time.localtime(now))
        if total > self.limit:
            self.violations.append(f"{stamp} {total} GPUs held by pods > {self.limit_name} {self.limit}")
        if total > self.pool:
            self.violations.append(f"{stamp} {total} GPUs held by pods > pool {self.pool}")
        if self.limit_name == "quota" and trial_total > self.limit:
            # not a violation: Kueue releases the quota of a pod group's pods that already succeeded
            # (the twin's ranks > 0 exit at once), so whole trials may add up to more than the quota
            self.trial_over_quota += 1
        if job:
            held_job = sum(g for j, _, g in self.live.values() if j == job)
            trials_job = sum(sum(self.trial_pods[k].values()) for k in trials if k[0] == job)
            self.peak_job[job] = max(self.peak_job[job], held_job, trials_job)
            if max(held_job, trials_job) > self.budgets.get(job, 10**9):
                self.violations.append(
                    f"{stamp} job {job}: {held_job} GPUs held by pods, {trials_job} by its trials "
                    f"> gpuBudget {self.budgets[job]}"
                )

    def held(self) -> int:
        with self.lock:
            return sum(g for _, _, g in self.live.values())


class JobWatch(Watcher):
    """The jobs' latest status, and when each trial's terminal state was first seen."""

    def __init__(self, custom, ns: str):
        self.jobs: dict[str, dict] = {}
        self.result_seen: dict[tuple[str, str], tuple[float, str, str]] = {}  # -> (seen, state, finishedAt)
        super().__init__(custom.list_namespaced_custom_object, "rltune.io", "v1alpha1", ns, "rltuningjobs")

    def on_event(self, kind: str, o: dict, now: float) -> None:
        name = o["metadata"]["name"]
        if kind == "DELETED":
            return
        self.jobs[name] = o
        for t in (o.get("status") or {}).get("trials") or []:
            key = (name, t.get("id", ""))
            if t.get("state") and t["state"] not in ACTIVE and key not in self.result_seen:
                self.result_seen[key] = (now, t["state"], t.get("finishedAt") or "")

    def snapshot(self) -> tuple[Counter, int]:
        with self.lock:
            phases = Counter((j.get("status") or {}).get("phase") or "New" for j in self.jobs.values())
            trials = [t for j in self.jobs.values() for t in (j.get("status") or {}).get("trials") or []]
            running = sum(t.get("state") == "Running" for t in trials)
        return phases, running


# ----------------------------------------------------------------------------- operator sampling
class ProcSampler:
    """The operator's RSS (peak, MiB) and CPU seconds (user+system) from /proc, every second."""

    def __init__(self, pid: int):
        self.pid, self.peak_rss, self.cpu_s, self._stop = pid, 0.0, 0.0, False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def sample(self) -> None:
        rss = demo.rss_mib(self.pid)
        if rss is not None:
            self.peak_rss = max(self.peak_rss, rss)
        try:
            f = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            self.cpu_s = (int(f[11]) + int(f[12])) / CLK_TCK  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError):
            pass

    def _run(self):
        while not self._stop:
            self.sample()
            time.sleep(1)

    def stop(self):
        self._stop = True
        self.sample()


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)  # nearest rank
    return round(xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))], 2)


# ----------------------------------------------------------------------------- one run
def run_mode(mode: str, args: argparse.Namespace, env: dict, core, custom, pool: str) -> dict:
    queued = mode == "kueue"
    ns = f"rltune-load-{mode}-{uuid.uuid4().hex[:5]}"
    demo.ensure_namespace(env, ns)
    pool_gpus = args.nodes * args.gpus_per_node
    queue_docs = kueue.queue_objects(ns, args.quota) if queued else []
    if queued:
        demo.kubectl(env, "apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in queue_docs))
        deadline = time.time() + 60
        while True:
            r = demo.kubectl(env, "get", "clusterqueue", f"cq-{ns}", "-o", "json", check=False)
            conds = (json.loads(r.stdout).get("status") or {}).get("conditions") or [] if r.returncode == 0 else []
            if any(c["type"] == "Active" and c["status"] == "True" for c in conds):
                break
            if time.time() > deadline:
                raise SystemExit(f"ClusterQueue cq-{ns} not Active after 60 s")
            time.sleep(1)
    docs = job_docs(ns, args, pool, "lq" if queued else None)
    budgets = {d["metadata"]["name"]: d["spec"]["resources"]["gpuBudget"] for d in docs}
    limit, limit_name = (args.quota, "quota") if queued else (pool_gpus, "pool")
    ledger = GpuLedger(core, ns, budgets, limit, limit_name, pool_gpus)
    jobs = JobWatch(custom, ns)
    op_env = dict(env, KUBECONFIG=str(pki.operator_kubeconfig()))
    # the bench's jobs tolerate its pool's taint: the admin allows it (chart value podSecurity.allowedTolerationKeys)
    op_env["RLTUNE_POD_SECURITY"] = json.dumps({"allowedTolerationKeys": ["nvidia.com/gpu", TAINT]})
    op_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]))
    log = STATE / f"load-{ns}.log"
    offset = AUDIT_LOG.stat().st_size
    t0 = time.time()
    op = demo.start_operator(op_env, log, namespaces=(ns,), metrics_port=0)
    sampler = ProcSampler(op.pid)
    out: dict = {"mode": mode, "namespace": ns, "jobs": args.jobs, "operator_log": str(log)}
    print(f"\n== {mode}: {args.jobs} jobs in {ns}" + (f", ClusterQueue quota {args.quota} GPUs" if queued else ""))
    try:
        demo.kubectl(env, "apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs))
        t_applied = time.time()
        last = 0.0
        while True:
            phases, running = jobs.snapshot()
            done = phases.get("Succeeded", 0) + phases.get("Failed", 0)
            now = time.time()
            if now - last >= args.progress or done == args.jobs:
                last = now
                print(
                    f"[{mode} +{now - t0:4.0f}s] jobs finished {done}/{args.jobs} "
                    f"({', '.join(f'{k} {v}' for k, v in sorted(phases.items()))}); trials running {running}; "
                    f"GPUs held {ledger.held()} (peak {ledger.peak}); operator RSS {demo.rss_mib(op.pid) or 0:.0f} MiB",
                    flush=True,
                )
            if done == args.jobs:
                break
            if op.poll() is not None:
                raise SystemExit(f"operator exited (rc {op.poll()}); see {log}")
            if now - t0 > args.timeout:
                print(f"timed out after {args.timeout} s; see {log}")
                break
            time.sleep(1)
        t1 = time.time()
        sampler.stop()
        time.sleep(2)  # results written at the end: let both watches catch up
        ledger.stop()
        jobs.stop()
        events = api_rate.operator_requests(AUDIT_LOG, offset, t0, t1)
        by_kind = Counter(api_rate.describe(e) for e in events)
        lat, lat_pod_seen, lat_noticed = [], [], []
        for key, (seen, _state, finished) in jobs.result_seen.items():
            if key not in ledger.rank0_end:
                continue  # torn down before its pod ended, or never ran
            end, end_seen = ledger.rank0_end[key]
            lat.append(seen - end)
            lat_pod_seen.append(seen - end_seen)
            if finished:
                lat_noticed.append(datetime.fromisoformat(finished.replace("Z", "+00:00")).timestamp() - end)
        phases, _ = jobs.snapshot()
        trial_states = Counter(s for _, s, _ in jobs.result_seen.values())
        out.update(
            wall_seconds=round(t1 - t_applied, 1),
            phases=dict(phases),
            all_finished=phases.get("Succeeded", 0) + phases.get("Failed", 0) == args.jobs,
            all_succeeded=phases.get("Succeeded", 0) == args.jobs,
            trials=len(jobs.result_seen),
            trial_states=dict(trial_states),
            trial_pods=len(ledger.pods_seen),
            peak_gpus=ledger.peak,
            peak_trial_gpus=ledger.peak_trial_gpus,
            trial_gpus_over_quota_events=ledger.trial_over_quota,
            peak_trials_at_once=ledger.peak_trials,
            limit=limit,
            limit_name=limit_name,
            pool_gpus=pool_gpus,
            peak_gpus_vs_budget=max((ledger.peak_job[j] / b for j, b in budgets.items()), default=0),
            violations=ledger.violations[:50],
            violation_count=len(ledger.violations),
            watch_restarts=ledger.errors + jobs.errors,
            operator_peak_rss_mib=round(sampler.peak_rss, 1),
            operator_cpu_seconds=round(sampler.cpu_s, 1),
            operator_cpu_percent=round(100 * sampler.cpu_s / max(t1 - t0, 1e-9), 1),
            api_requests=len(events),
            api_requests_per_second=round(len(events) / (t1 - t0), 2),
            api_requests_by_kind={f"{v} {r}": n for (v, r), n in by_kind.most_common(12)},
            result_latency_samples=len(lat),
            result_latency_p50=pct(lat, 50),
            result_latency_p99=pct(lat, 99),
            result_latency_from_pod_seen_p50=pct(lat_pod_seen, 50),
            result_latency_from_pod_seen_p99=pct(lat_pod_seen, 99),
            finished_at_lag_p50=pct(lat_noticed, 50),
            finished_at_lag_p99=pct(lat_noticed, 99),
        )
        print(
            f"{mode}: {out['phases']} in {out['wall_seconds']} s; peak GPUs held {ledger.peak} ({limit_name} {limit}); "
            f"{len(ledger.violations)} violations; {out['api_requests_per_second']} API requests/s"
        )
        for v in ledger.violations[:5]:
            print(f"  VIOLATION {v}")
    finally:
        sampler.stop()
        ledger.stop()
        jobs.stop()
        demo.kubectl(env, "delete", "rltuningjobs", "--all", "-n", ns, "--wait=true", "--timeout=300s", check=False)
        demo.stop_operator(op)
        # the pool must be empty before the next run
        deadline = time.time() + 180
        while core.list_namespaced_pod(ns).items and time.time() < deadline:
            time.sleep(2)
        for d in reversed(queue_docs):
            kind, name = d["kind"].lower(), d["metadata"]["name"]
            extra = ["-n", ns] if kind == "localqueue" else []
            demo.kubectl(env, "delete", kind, name, *extra, "--ignore-not-found", "--timeout=60s", check=False)
        demo.kubectl(env, "delete", "namespace", ns, "--wait=false", check=False)
    return out


# ----------------------------------------------------------------------------- report
ROWS = [
    ("wall time, s (apply -> all finished)", "wall_seconds"),
    ("jobs Succeeded / Failed", lambda r: f"{r['phases'].get('Succeeded', 0)} / {r['phases'].get('Failed', 0)}"),
    ("trials with a result", "trials"),
    ("trial pods", "trial_pods"),
    ("peak GPUs held by pods (limit)", lambda r: f"{r['peak_gpus']} ({r['limit_name']} {r['limit']})"),
    ("peak GPUs of trials holding pods", "peak_trial_gpus"),
    ("peak trials holding GPUs", "peak_trials_at_once"),
    ("max job peak / gpuBudget", lambda r: f"{r['peak_gpus_vs_budget']:.2f}"),
    ("violations (quota, pool, budget)", "violation_count"),
    ("operator peak RSS, MiB", "operator_peak_rss_mib"),
    ("operator CPU s (% of one core)", lambda r: f"{r['operator_cpu_seconds']} ({r['operator_cpu_percent']}%)"),
    ("operator API requests / s", "api_requests_per_second"),
    ("pod end -> result in status p50, s", "result_latency_p50"),
    ("pod end -> result in status p99, s", "result_latency_p99"),
    ("pod end -> finishedAt p50 / p99, s", lambda r: f"{r['finished_at_lag_p50']} / {r['finished_at_lag_p99']}"),
]


def table(runs: list[dict]) -> str:
    lines = [f"{'':40s}" + "".join(f"{r['mode']:>22s}" for r in runs)]
    for label, key in ROWS:
        vals = [key(r) if callable(key) else r.get(key) for r in runs]
        lines.append(f"{label:40s}" + "".join(f"{str(v):>22s}" for v in vals))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50, help="RLTuningJobs per run (default 50)")
    ap.add_argument("--nodes", type=int, default=100, help="kwok B300 nodes of the shared pool (default 100)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--quota", type=int, default=512, help="the ClusterQueue's nvidia.com/gpu quota (default 512)")
    ap.add_argument("--shapes", default="8:8,8:16,16:32,32:64,64:64", help="baseline GPUs:gpuBudget, cycled")
    ap.add_argument("--max-trials", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="stepsPerTrial (one warm-up)")
    ap.add_argument("--confirm-steps", type=int, default=0)
    ap.add_argument("--modes", default="kueue,plain", help="kueue, plain or both (default kueue,plain)")
    ap.add_argument("--timeout", type=float, default=1500, help="seconds per run before giving up")
    ap.add_argument("--progress", type=float, default=15, help="seconds between progress lines")
    ap.add_argument("--json", default=str(ROOT / "out" / "bench-load.json"))
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in ("kueue", "plain") for m in modes):
        ap.error("--modes: kueue and/or plain")
    if not lifecycle.is_up():
        lifecycle.up(wait=True)
    if "kueue" in modes and not (kueue.enabled() and processes.running_pid(kueue.NAME)):
        raise SystemExit("Kueue is off on this bed: hack/testbed.py kueue on (or --modes plain)")
    env = api_rate.bed_env()
    demo.apply_crd(env)
    from kubernetes import client, config

    api = config.new_client_from_config(str(KUBECONFIG))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    pool = f"rlt-load-{uuid.uuid4().hex[:4]}"
    t = time.time()
    make_pool(core, pool, args.nodes, args.gpus_per_node)
    print(f"pool {pool}: {args.nodes} B300 nodes x {args.gpus_per_node} GPUs Ready in {time.time() - t:.0f} s")
    runs = []
    try:
        for mode in modes:
            runs.append(run_mode(mode, args, env, core, custom, pool))
    finally:
        pools.delete(core, pool)
    shape = {k: getattr(args, k) for k in ("jobs", "nodes", "gpus_per_node", "quota", "shapes", "max_trials", "steps")}
    shape["confirm_steps"] = args.confirm_steps
    print(f"\n{args.jobs} jobs ({args.shapes}; maxTrials {args.max_trials}, {args.steps} steps), {args.nodes} nodes")
    print(table(runs))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"shape": shape, "runs": runs}, indent=1))
    print(f"wrote {args.json}")
    ok = all(r["all_finished"] and not r["violation_count"] for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
