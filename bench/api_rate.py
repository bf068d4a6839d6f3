"""The operator's API request rate with idle jobs, measured on the test bed from the apiserver's audit log.

`make bench-api-rate` (or `.venv/bin/python -m bench.api_rate [--jobs 50] [--waiting 5] [--window 60]`):

1. starts the operator (a subprocess, `python -m rltune.controller`, watching one fresh namespace) as
   its own user, rltune-operator (hack/testbed.py operator_kubeconfig), every request of which the
   bed's audit policy records;
2. creates `--jobs` RLTuningJobs that finish at once (the twin demo asking for a GPU type no node has:
   its baseline is refused, the job Failed) and `--waiting` jobs whose baseline pods wait for GPUs
   (a private one-node pool whose 8 GPUs a pause pod holds; scheduleTimeoutSeconds 3600);
3. once every job is settled, counts the operator's requests over `--window` seconds and prints them
   per verb and resource (watches: the ones started in the window);
4. deletes one waiting job and measures the time from `kubectl delete` until no pod of it is left.

`--operator-root DIR` runs the operator of another checkout (e.g. `git worktree add /tmp/rltune-head
HEAD`: the code before a change) with this checkout's virtualenv.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import yaml

from bench.paths import ROOT, STATE
from hack import demo
from hack.bed import lifecycle, pki, pools
from hack.bed.network import PROMETHEUS_URL, PUSHGATEWAY_URL
from hack.bed.paths import AUDIT_LOG, KUBECONFIG

EXAMPLE = ROOT / "examples" / "twin-demo.yaml"


def bed_env() -> dict[str, str]:
    bins = subprocess.run([str(ROOT / "hack" / "binaries.sh"), "--print"], capture_output=True, text=True).stdout
    env = dict(os.environ)
    env.update(
        KUBECONFIG=str(KUBECONFIG),
        RLTUNE_PROMETHEUS_URL=PROMETHEUS_URL,
        RLTUNE_PUSHGATEWAY_URL=PUSHGATEWAY_URL,
        PATH=f"{bins.strip()}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    return env


def job_docs(ns: str, jobs: int, waiting: int, pool: str) -> list[dict]:
    base = yaml.safe_load(EXAMPLE.read_text())
    base["metadata"]["namespace"] = ns
    out = []
    for i in range(jobs):  # finished: no node has H100s, the baseline is refused at once
        d = copy.deepcopy(base)
        d["metadata"]["name"] = f"done-{i:03d}"
        d["spec"]["resources"]["gpuType"] = "H100"
        out.append(d)
    for i in range(waiting):  # waiting for GPUs: 8-GPU baselines on a pool whose GPUs are all taken
        d = copy.deepcopy(base)
        d["metadata"]["name"] = f"wait-{i:03d}"
        s = d["spec"]
        s["resources"]["nodeSelector"] = {"rltune.io/pool": pool}
        s["resources"]["tolerations"] = [{"key": "rltune.io/bench-pool", "operator": "Exists", "effect": "NoSchedule"}]
        s["baseline"]["gpus"] = 8
        s["resources"]["gpuBudget"] = 8
        s["budget"]["scheduleTimeoutSeconds"] = 3600
        out.append(d)
    return out


def blocker_pod(ns: str, pool: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-holder", "namespace": ns},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
            "nodeSelector": {"rltune.io/pool": pool},
            "tolerations": [{"operator": "Exists"}],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
        },
    }


def operator_requests(path: Path, offset: int, t0: float, t1: float):
    """(event, objectRef) of the operator user's requests received between t0 and t1 (epoch seconds),
    one per request (its last audit stage)."""
    by_id: dict[str, dict] = {}
    with open(path, errors="replace") as f:
        f.seek(offset)
        for line in f:
            if pki.OPERATOR_USER not in line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if (ev.get("user") or {}).get("username") != pki.OPERATOR_USER:
                continue
            try:
                t = datetime.fromisoformat(ev.get("requestReceivedTimestamp", "")).timestamp()
            except ValueError:
                continue
            if t0 <= t < t1:
                by_id[ev["auditID"]] = ev
    return list(by_id.values())


def describe(ev: dict) -> tuple[str, str]:
    ref = ev.get("objectRef") or {}
    res = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    if ref.get("apiGroup"):
        res += f".{ref['apiGroup']}"
    uri = ev.get("requestURI", "")
    verb = ev.get("verb", "")
    if "dryRun=" in uri:
        verb += " (dry run)"
    return verb, res or urlparse(uri).path


def job_of(ev: dict) -> str:
    """The RLTuningJob a request is about: its name, or the rltune.io/job label it selects by."""
    ref = ev.get("objectRef") or {}
    if ref.get("resource") == "rltuningjobs" and ref.get("name"):
        return ref["name"]
    sel = parse_qs(urlparse(ev.get("requestURI", "")).query).get("labelSelector", [""])[0]
    for part in unquote(sel).split(","):
        if part.startswith("rltune.io/job="):
            return part.split("=", 1)[1]
    return ""


def table(events: list[dict], window: float) -> str:
    c = Counter(describe(e) for e in events)
    lines = [f"{'verb':22s} {'resource':36s} {'requests':>8s} {'per s':>8s}"]
    for (verb, res), n in sorted(c.items(), key=lambda kv: -kv[1]):
        lines.append(f"{verb:22s} {res:36s} {n:8d} {n / window:8.2f}")
    lines.append(f"{'total':59s} {len(events):8d} {len(events) / window:8.2f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict:
    if not lifecycle.is_up():
        lifecycle.up(wait=True)
    env = bed_env()
    demo.apply_crd(env)
    root = Path(args.operator_root).resolve()
    ns = f"rltune-apirate-{uuid.uuid4().hex[:6]}"
    pool = f"rlt-bench-{uuid.uuid4().hex[:4]}"
    from kubernetes import client, config

    core = client.CoreV1Api(config.new_client_from_config(str(KUBECONFIG)))
    demo.ensure_namespace(env, ns)
    node = pools.node_manifest(pool, 0, "B300", 8, "224", "4Ti")
    node["spec"]["taints"].append({"key": "rltune.io/bench-pool", "value": pool, "effect": "NoSchedule"})
    core.create_node(node)
    pools.create(core, pool, "B300", nodes=1, gpus_per_node=8)
    core.create_namespaced_pod(ns, blocker_pod(ns, pool))
    op_env = dict(env, KUBECONFIG=str(pki.operator_kubeconfig()))
    # the bench's jobs tolerate its pool's taint: the admin allows it (chart value podSecurity.allowedTolerationKeys)
    op_env["RLTUNE_POD_SECURITY"] = json.dumps({"allowedTolerationKeys": ["nvidia.com/gpu", "rltune.io/bench-pool"]})
    op_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "operator"), os.environ.get("PYTHONPATH", "")]))
    log = STATE / f"api-rate-{ns}.log"
    op = demo.start_operator(op_env, log, namespaces=(ns,), metrics_port=0)
    out: dict = {"namespace": ns, "operator_root": str(root), "jobs": args.jobs, "waiting": args.waiting}
    try:
        time.sleep(3)
        docs = job_docs(ns, args.jobs, args.waiting, pool)
        demo.kubectl(env, "apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs))

        def settled() -> bool:
            items = json.loads(demo.kubectl(env, "get", "rltuningjobs", "-n", ns, "-o", "json").stdout)["items"]
            done = sum(
                (i.get("status") or {}).get("phase") == "Failed" for i in items if i["metadata"]["name"][:4] == "done"
            )
            pods = core.list_namespaced_pod(ns, label_selector="rltune.io/job").items
            waiting = {p.metadata.labels["rltune.io/job"] for p in pods}
            return done == args.jobs and len(waiting) == args.waiting

        deadline = time.time() + 300
        while not settled():
            if op.poll() is not None or time.time() > deadline:
                raise SystemExit(f"jobs did not settle (operator rc {op.poll()}); see {log}")
            time.sleep(2)
        time.sleep(args.settle)
        offset = AUDIT_LOG.stat().st_size
        t0 = time.time()
        time.sleep(args.window)
        t1 = time.time()
        time.sleep(1)  # the audit log is written synchronously; a request still in flight ends now
        events = operator_requests(AUDIT_LOG, offset, t0, t1)
        per_job = Counter(job_of(e) for e in events)
        out["requests"] = len(events)
        out["per_second"] = round(len(events) / (t1 - t0), 3)
        out["finished_jobs_requests"] = sum(n for j, n in per_job.items() if j.startswith("done-"))
        out["waiting_jobs_requests"] = sum(n for j, n in per_job.items() if j.startswith("wait-"))
        out["other_requests"] = per_job.get("", 0)
        print(f"\noperator {root}: {args.jobs} finished + {args.waiting} waiting jobs, {t1 - t0:.0f} s window")
        print(table(events, t1 - t0))
        print(
            f"by job: finished jobs {out['finished_jobs_requests']}, waiting jobs {out['waiting_jobs_requests']}, "
            f"not about one job (watches, kopf) {out['other_requests']}"
        )
        if args.waiting:
            victim = "wait-000"
            t0 = time.time()
            demo.kubectl(env, "delete", "rltuningjob", victim, "-n", ns, "--wait=false")
            while core.list_namespaced_pod(ns, label_selector=f"rltune.io/job={victim}").items:
                if time.time() - t0 > 180:
                    break
                time.sleep(0.2)
            out["delete_seconds"] = round(time.time() - t0, 1)
            print(f"kubectl delete rltuningjob {victim} (pods Pending) -> no trial pod left: {out['delete_seconds']} s")
    finally:
        demo.kubectl(env, "delete", "rltuningjobs", "--all", "-n", ns, "--wait=true", "--timeout=120s", check=False)
        demo.stop_operator(op)
        demo.kubectl(env, "delete", "namespace", ns, "--wait=false", check=False)
        pools.delete(core, pool)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50, help="finished jobs (default 50)")
    ap.add_argument("--waiting", type=int, default=5, help="jobs whose pods wait for GPUs (default 5)")
    ap.add_argument("--window", type=float, default=60.0, help="seconds counted (default 60)")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after the jobs settled, before counting")
    ap.add_argument("--operator-root", default=str(ROOT), help="checkout whose operator runs (default: this one)")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    out = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
