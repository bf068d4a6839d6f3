"""`make demo` (test-bed tooling, not part of the rltune package): install rltune with its Helm
chart on the local test bed and tune
examples/twin-demo.yaml end to end; `make demo-down` removes it again.

The Makefile brings the bed up first (`make cluster-up`); this script runs `helm upgrade --install`
(the chart's CRD, ServiceAccount, RBAC, settings and the operator Deployment, which the bed's pod
runner runs as a pod under its ServiceAccount), applies the job, shows its progress every few
seconds, and ends with the real `kubectl get rltuningjobs` and the winning configuration. A second
run upgrades the release in place and re-runs the job. The helpers (kubectl, start_operator, ...)
are shared with the e2e tests.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from hack.bed import binaries, network, paths  # `hack` is installed with the project (pyproject.toml)

REPO = Path(__file__).resolve().parents[1]

CRD = REPO / "crds" / "rltuningjobs.yaml"
CHART = REPO / "helm" / "rltune"
EXAMPLE = REPO / "examples" / "twin-demo.yaml"
RELEASE, RELEASE_NS = "rltune", "rltune-system"


def bed_env() -> dict[str, str]:
    """Environment for kubectl, helm and the operator, pointed at the local test bed."""
    env = dict(os.environ)
    env.setdefault("KUBECONFIG", str(paths.KUBECONFIG))
    env.setdefault("RLTUNE_PROMETHEUS_URL", network.PROMETHEUS_URL)
    env.setdefault("RLTUNE_PUSHGATEWAY_URL", network.PUSHGATEWAY_URL)
    env["PATH"] = f"{binaries.bin_dir(build=False)}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "operator"), env.get("PYTHONPATH", "")]))
    return env


def best_so_far(st: dict) -> str:
    """The best measured speed-up among finished trials, before the winner is confirmed ("~" marks it)."""
    base = (st.get("baseline") or {}).get("stepSeconds")
    times = [
        t["measuredSeconds"]
        for t in st.get("trials", [])
        if t.get("id") != "baseline" and t.get("state") == "Succeeded" and t.get("measuredSeconds")
    ]
    return f"~{base / min(times):.2f}x" if base and times else "-"


def kubectl(env: dict, *args: str, check: bool = True, input: Optional[str] = None) -> subprocess.CompletedProcess:
    r = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, input=input)
    if check and r.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {r.stderr.strip()}")
    return r


def wait_crd_established(env: dict, name: str, timeout: float = 60.0, kubectl_bin: str = "kubectl") -> None:
    """Poll until the CRD's Established condition is True. (`kubectl wait --for=condition=...` fails
    outright instead of waiting when it reads the CRD before the API server has set any condition.)"""
    deadline = time.monotonic() + timeout
    query = '{.status.conditions[?(@.type=="Established")].status}'
    while True:
        r = subprocess.run(
            [kubectl_bin, "get", "crd", name, "-o", f"jsonpath={query}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if r.returncode == 0 and r.stdout.strip() == "True":
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"CRD {name} not Established after {timeout:.0f} s: {r.stderr.strip() or r.stdout}")
        time.sleep(0.2)


def apply_crd(env: dict) -> None:
    kubectl(env, "apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_crd_established(env, "rltuningjobs.rltune.io")


def helm_install(
    env: dict,
    release: str,
    namespace: str,
    watch: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
    timeout: str = "180s",
) -> None:
    """`helm upgrade --install` of the chart, pointed at the bed's Prometheus and Pushgateway, and
    wait until the operator's Deployment is available."""
    args = [
        "helm",
        "upgrade",
        "--install",
        release,
        str(CHART),
        "-n",
        namespace,
        "--create-namespace",
        "--set",
        f"prometheus.url={env['RLTUNE_PROMETHEUS_URL']}",
        "--set",
        f"pushgateway.url={env['RLTUNE_PUSHGATEWAY_URL']}",
        "--wait",
        "--timeout",
        timeout,
    ]
    if watch:
        args += ["--set", "watchNamespaces={" + ",".join(watch) + "}"]
    args += list(extra)
    r = subprocess.run(args, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"helm upgrade --install failed: {r.stderr.strip() or r.stdout.strip()}")


def operator_pod(env: dict, release: str, namespace: str) -> Optional[dict]:
    r = kubectl(
        env, "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={release}", "-o", "json", check=False
    )
    pods = [
        p
        for p in json.loads(r.stdout or '{"items": []}')["items"]
        if not p["metadata"].get("deletionTimestamp")
        and not (p["metadata"].get("annotations") or {}).get("helm.sh/hook")
    ]
    return pods[0] if pods else None


def pod_pid(pod: dict) -> Optional[int]:
    """The pid the bed's pod runner started for a pod (for its RSS)."""
    for f in (REPO / ".state" / "bed" / "runner").glob(f"{pod['metadata']['uid']}_*.json"):
        try:
            return int(json.loads(f.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None
    return None


def metrics_key_file() -> Path:
    """The secret an operator started here signs trial metrics with (the chart makes its own Secret)."""
    import secrets

    path = REPO / ".state" / "operator-metrics-key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path


def start_operator(
    env: dict, log_path: Path, namespaces: tuple[str, ...] = (), metrics_port: int = 18080, liveness_port: int = 0
) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "rltune.controller",
        "--metrics-port",
        str(metrics_port),
        "--liveness-port",
        str(liveness_port),
    ]
    for ns in namespaces:
        cmd += ["--namespace", ns]
    if not env.get("RLTUNE_METRICS_KEY_FILE"):  # one key per checkout: trials survive an operator restart
        env = dict(env, RLTUNE_METRICS_KEY_FILE=str(metrics_key_file()))
    f = open(log_path, "ab")
    f.write(f"==== {time.strftime('%H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
    f.flush()
    return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)


def stop_operator(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def rss_mib(pid: int) -> Optional[float]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def group_rss_mib(pgid: int) -> Optional[float]:
    """RSS of a process group (a pod's container: the runner's shell wrapper and the operator)."""
    total = None
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if int((p / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
        except (OSError, IndexError, ValueError):
            continue
        r = rss_mib(int(p.name))
        if r is not None:
            total = (total or 0.0) + r
    return total


def get_job(env: dict, ns: str, name: str) -> Optional[dict]:
    r = kubectl(env, "get", "rltuningjob", name, "-n", ns, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def ensure_namespace(env: dict, ns: str) -> None:
    r = kubectl(env, "get", "namespace", ns, check=False)
    if r.returncode != 0:
        kubectl(env, "create", "namespace", ns)
    for _ in range(60):  # pods are refused until the namespace's default ServiceAccount exists
        if kubectl(env, "get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0:
            return
        time.sleep(0.5)


def changed_knobs(job: dict) -> list[tuple[str, object, object]]:
    from rltune.api.models import RLTuningJobSpec
    from rltune.tuner.records import config_changes, config_from_diff

    spec = RLTuningJobSpec.model_validate(job["spec"])
    best = (job.get("status") or {}).get("best") or {}
    winner = config_from_diff(spec.baseline, best.get("config") or {})
    return [(k, a, b) for k, (a, b) in sorted(config_changes(spec.baseline, winner, spec.resources.gpu_budget).items())]


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="hack/demo.py")
    p.add_argument("--namespace", default="rltune-demo")
    p.add_argument("--file", default=str(EXAMPLE))
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--keep", action="store_true", help="keep the job (and the operator's log) afterwards")
    p.add_argument("--down", action="store_true", help="remove the demo: its jobs, the Helm release, the namespaces")
    a = p.parse_args(argv)
    if a.down:
        return down(a.namespace)
    env = bed_env()
    ns = a.namespace
    name = __import__("yaml").safe_load(Path(a.file).read_text())["metadata"]["name"]

    # Helm installs crds/ only when the CRD is missing and never upgrades it: apply the chart's copy
    # first, as docs/install.md tells users to before every upgrade
    print(f"==> kubectl apply --server-side -f {CRD.relative_to(REPO)}")
    apply_crd(env)
    ensure_namespace(env, ns)
    print(f"==> helm upgrade --install {RELEASE} {CHART.relative_to(REPO)} -n {RELEASE_NS} (watching {ns})")
    helm_install(env, RELEASE, RELEASE_NS, watch=(ns,))
    pod = operator_pod(env, RELEASE, RELEASE_NS)
    if pod is None:
        print("!! the chart's operator pod did not appear")
        return 1
    log = REPO / ".state" / "bed" / "pods" / f"{RELEASE_NS}_{pod['metadata']['name']}.log"
    print(
        f"==> operator pod {RELEASE_NS}/{pod['metadata']['name']} runs as ServiceAccount "
        f"{pod['spec'].get('serviceAccountName')} (log: {log.relative_to(REPO)})"
    )
    if get_job(env, ns, name):
        print(f"==> deleting the previous {ns}/{name}")
        kubectl(env, "delete", "rltuningjob", name, "-n", ns, "--wait=false", check=False)
    try:
        for _ in range(120):  # a previous job's finalizer is handled by the operator
            if not get_job(env, ns, name):
                break
            time.sleep(0.5)
        t0 = time.time()
        kubectl(env, "apply", "-n", ns, "-f", a.file)
        print(f"==> applied {Path(a.file).relative_to(REPO) if Path(a.file).is_absolute() else a.file} as {ns}/{name}")
        first_pod, last_line, peak_rss = None, "", 0.0
        job: Optional[dict] = None
        while time.time() - t0 < a.timeout:
            pod = operator_pod(env, RELEASE, RELEASE_NS) or pod
            if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
                print(f"!! the operator pod ended ({pod['status']['phase']}); see {log}")
                return 1
            job = get_job(env, ns, name)
            st = (job or {}).get("status") or {}
            if first_pod is None:
                r = kubectl(env, "get", "pods", "-n", ns, "-l", f"rltune.io/job={name}", "-o", "name", check=False)
                if r.stdout.strip():
                    first_pod = time.time() - t0
            pid = pod_pid(pod)
            peak_rss = max(peak_rss, (group_rss_mib(pid) if pid else None) or 0.0)
            running = [t["id"] for t in st.get("trials", []) if t.get("state") in ("Pending", "Running", "Scoring")]
            line = (
                f"[{time.time() - t0:6.1f}s] phase={st.get('phase', '-'):<10} trials={st.get('trialsDone', '-'):<6}"
                f" best={st.get('speedup') or best_so_far(st):<7}"
                f" bottleneck={(st.get('baseline') or {}).get('bottleneck') or '-'}"
                f" running={','.join(running) or '-'}"
            )
            if line.split("] ", 1)[1] != last_line:
                print(line, flush=True)
                last_line = line.split("] ", 1)[1]
            if st.get("phase") in ("Succeeded", "Failed"):
                break
            time.sleep(3)
        wall = time.time() - t0
        print()
        print(kubectl(env, "get", "rltuningjobs", "-n", ns).stdout)
        st = (job or {}).get("status") or {}
        print(f"phase {st.get('phase')}: {st.get('message')}")
        base = st.get("baseline") or {}
        if base:
            print(
                f"baseline: {base.get('stepSeconds')} s/step on {base.get('gpus')} GPUs, "
                f"bottleneck {base.get('bottleneck')}"
            )
            for e in base.get("evidence") or []:
                print(f"  - {e}")
        best = st.get("best")
        if best:
            print(
                f"winner {best['trial']}: {best['stepSeconds']} s/step, {best['speedup']:.2f}x faster, "
                f"{best['gpus']} GPUs, {best['gpuSecondsPerStep']} GPU-s/step, "
                f"{'confirmed' if best.get('confirmed') else 'unconfirmed'}"
            )
            print("changed knobs (baseline -> winner):")
            for k, b, v in changed_knobs(job):
                print(f"  {k:<32} {b!s:>10} -> {v}")
            print("overrides: " + " ".join(best.get("overrides") or []))
        print("trials:")
        for t in st.get("trials") or []:
            pred, meas = t.get("predictedSeconds"), t.get("measuredSeconds")
            print(
                f"  {t['id']:<9} {t.get('kind', ''):<8} {t.get('state', ''):<18} "
                f"forecast {pred if pred is not None else '-':>9}  measured {meas if meas is not None else '-':>9}"
                f"  {(t.get('reason') or '')[:70]}"
            )
        print(f"forecast error (median, relative): {st.get('forecastError')}")
        print(
            f"timings: first trial pod {first_pod:.1f}s after apply"
            if first_pod is not None
            else "timings: no trial pod seen",
            end="",
        )
        print(f"; job {st.get('phase')} after {wall:.0f}s; operator peak RSS {peak_rss:.0f} MiB")
        return 0 if st.get("phase") == "Succeeded" else 1
    finally:
        print(f"==> the operator stays installed (helm release {RELEASE_NS}/{RELEASE}); `make demo-down` removes it")


def down(namespace: str) -> int:
    """`make demo-down`: the demo's jobs first (while the operator can still remove its finalizer),
    then the Helm release and the namespaces. The CRD stays (Helm never deletes crds/)."""
    env = bed_env()
    kubectl(env, "delete", "rltuningjobs", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
    r = subprocess.run(
        ["helm", "uninstall", RELEASE, "-n", RELEASE_NS, "--wait"], env=env, capture_output=True, text=True
    )
    print(r.stdout.strip() or r.stderr.strip())
    for n in (namespace, RELEASE_NS):
        kubectl(env, "delete", "namespace", n, "--ignore-not-found", "--wait=false", check=False)
    print(f"==> removed the demo (release {RELEASE_NS}/{RELEASE}, namespaces {namespace} and {RELEASE_NS})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
