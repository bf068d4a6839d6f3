"""The tenant-attack corpus (tests/tenant_attacks/, its README says the format): every attack a
tenant who may create an RLTuningJob in their own namespace could try, applied to the bed with the
operator installed by the Helm chart and running as its ServiceAccount (the API server enforces
the chart's RBAC and its ValidatingAdmissionPolicy), watching an attacker and a victim namespace
that both enforce the restricted Pod Security Standard.

For each case the test asserts the declared outcome (refused at apply, refused by a condition
naming the field, or run) and that the harm did not happen: a fake metadata server on the loopback
whose answers carry a marker gets no request and the marker is in no status or event; series an
attacker pod pushes under the victim's labels score nothing; sidecars run restricted; a decoy
Service survives; a valid job gets its baseline pod within seconds while oversized search spaces
are refused; trials are fenced by a NetworkPolicy (the bed has no NetworkPolicy controller: the
test checks the object the API server holds); refusals name no node. The table (attack, outcome,
seconds from apply) is printed and written to .state/e2e/tenant-attacks.md.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

import bed as bedlib
from hack import demo
from loopback import Loopback, Quiet

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "tenant_attacks"
EXAMPLE = ROOT / "examples" / "twin-demo.yaml"
MARKER = "AKIA-RLTUNE-MARKER-5c1e"  # in every answer of the fake metadata server
VALID_JOB_POD_S = 20.0  # a valid job's baseline pod, from apply, while oversized jobs are refused
SPOOF_SECONDS = 0.001
HARM_CHECKS = (
    "none",
    "no-request",
    "spoof-ignored",
    "sidecar-restricted",
    "decoy-survives",
    "valid-job-fast",
    "fenced",
    "no-node-names",
)
# every attack of the issue has at least one case
REQUIRED = {
    "metadata-url-prometheus",
    "metadata-url-path-fragment",
    "pushgateway-delete",
    "promql-injection",
    "spoof-victim-scores",
    "sidecar",
    "patch-delete-trial",
    "nfs-volume",
    "projected-sa-token",
    "priority-class",
    "toleration-everything",
    "runtime-and-scheduler",
    "decoy-service",
    "oversized-search-space",
    "trial-fenced",
    "node-layout-leak",
}

pytestmark = [pytest.mark.bed, pytest.mark.slow]


@dataclass
class Case:
    stem: str
    attack: str
    expect: dict
    harm: str
    side: str  # attacker | victim
    job: dict
    copies: int = 1
    ns: str = ""
    applied_at: float = 0.0
    stderr: str = ""
    seconds: float | None = None
    outcome: str = ""
    message: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.job["metadata"]["name"]


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _ranges(text: str) -> str:
    def ints(m):
        a, step, n = int(m.group(1)), int(m.group(2)), int(m.group(3))
        return ", ".join(str(a + i * step) for i in range(n))

    def floats(m):
        a, step, n = float(m.group(1)), float(m.group(2)), int(m.group(3))
        return ", ".join(f"{a + i * step:.4f}" for i in range(n))

    text = re.sub(r"@@RANGE:(\d+):(\d+):(\d+)@@", ints, text)
    return re.sub(r"@@RANGE_F:([\d.]+):([\d.]+):(\d+)@@", floats, text)


def base_job() -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["budget"].update(maxTrials=2, parallelTrials=2, confirmSteps=0, stepsPerTrial=3)
    doc["spec"]["workload"]["env"] = [{"name": "RLTUNE_TWIN_SECONDS_PER_STEP", "value": "0.5"}]
    return doc


def load_cases(metadata_url: str = "http://127.0.0.1:1") -> list[Case]:
    out = []
    for p in sorted(CASES.glob("*.yaml")):
        raw = yaml.safe_load(_ranges(p.read_text().replace("@@METADATA_URL@@", metadata_url)))
        assert set(raw) <= {"attack", "expect", "harm", "namespace", "job", "copies"}, p.name
        assert raw.get("attack") and raw.get("expect") and raw.get("job"), f"{p.name}: attack, expect and job"
        assert raw["expect"]["outcome"] in ("apply", "condition", "runs"), p.name
        assert raw.get("harm") in HARM_CHECKS, f"{p.name}: harm must be one of {HARM_CHECKS}"
        out.append(
            Case(
                stem=p.stem,
                attack=raw["attack"],
                expect=raw["expect"],
                harm=raw["harm"],
                side=raw.get("namespace", "attacker"),
                job=_merge(base_job(), raw["job"]),
                copies=int(raw.get("copies", 1)),
            )
        )
    return out


def test_corpus_is_well_formed():
    cases = load_cases()
    assert REQUIRED <= {c.stem for c in cases}, REQUIRED - {c.stem for c in cases}
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    for c in cases:
        if c.expect["outcome"] != "runs":
            assert c.expect.get("contains"), f"{c.stem}: a refusal must name the field"


# ----------------------------------------------------------------------------- the bed's parts


class MetadataServer(Loopback):
    """A fake cloud metadata service on the loopback: every answer carries MARKER."""

    def __init__(self):
        self.requests: list[str] = []
        outer = self

        class H(Quiet):
            def _any(self):
                outer.requests.append(f"{self.command} {self.path}")
                body = json.dumps({"AccessKeyId": MARKER, "SecretAccessKey": MARKER, "Token": MARKER}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_DELETE = _any  # noqa: N815

        super().__init__(H)


class Recorder:
    """Polls both namespaces: every pod and NetworkPolicy as first seen (trial pods are short-lived)."""

    def __init__(self, bed, namespaces: list[str]):
        from kubernetes import client

        self.core = bed.core()
        self.net = client.NetworkingV1Api(bed.api_client())
        self.namespaces = namespaces
        self.pods: dict[tuple[str, str], dict] = {}
        self.pod_seen: dict[tuple[str, str], float] = {}
        self.policies: dict[tuple[str, str], dict] = {}
        self.stopping = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        api = self.core.api_client
        while not self.stopping:
            for ns in self.namespaces:
                try:
                    for p in self.core.list_namespaced_pod(ns).items:
                        k = (ns, p.metadata.name)
                        if k not in self.pods:
                            self.pods[k] = api.sanitize_for_serialization(p)
                            self.pod_seen[k] = time.time()
                    for n in self.net.list_namespaced_network_policy(ns).items:
                        self.policies.setdefault((ns, n.metadata.name), api.sanitize_for_serialization(n))
                except Exception:  # noqa: BLE001 - a missed poll is retried
                    pass
            time.sleep(0.3)

    def stop(self):
        self.stopping = True
        self.t.join(5)


def spoof_body(ns: str, job: str) -> str:
    """A 1 ms step for steps 0-11, in the text format with the contract's own HELP/TYPE lines
    (the Pushgateway refuses a family whose type or help differs from the one it holds)."""
    from rltune.api import metrics

    lines = []
    for contract, value in (("step_duration_seconds", SPOOF_SECONDS), ("step_warmup", 0), ("step_reward_mean", 1)):
        n = metrics.name(contract)
        lines += [f"# HELP {n} {metrics.STEP_METRICS[contract]}", f"# TYPE {n} gauge"]
        for step in range(12):
            lab = f'namespace="{ns}",rltune_job="{job}",trial="%s",step="{step}"'
            lines.append(f"{n}{{{lab}}} {value}")
    return "\n".join(lines) + "\n"


SPOOFER = """
import os, time, urllib.request
pgw, ns, job = os.environ["PGW"], os.environ["VICTIM_NS"], os.environ["VICTIM_JOB"]
trials = ["baseline"] + [f"t{i}" for i in range(1, 9)] + [f"c{i}" for i in range(1, 12)]
body = os.environ["BODY"]  # the contract's HELP and TYPE lines, as the Pushgateway wants them consistent
t_end = time.time() + float(os.environ["SECONDS"])
n = 0
while time.time() < t_end:
    for t in trials:
        # its own group beside the victim's (extra grouping label): the query used to select both
        url = f"{pgw}/metrics/job/rltune-trial/namespace/{ns}/rltune_job/{job}/trial/{t}/instance/attacker"
        req = urllib.request.Request(url, data=(body % ((t,) * (body.count("%s")))).encode(), method="POST")
        try:
            urllib.request.urlopen(req, timeout=5).read()
            n += 1
        except Exception as e:
            print("push failed:", e, flush=True)
    time.sleep(0.5)
print("pushed", n, flush=True)
""".replace("{SPOOF}", str(SPOOF_SECONDS))


def _kubectl(env, *args, input=None, timeout=120):
    return subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, input=input, timeout=timeout)


@pytest.fixture
def release(bed, core):
    """The chart in its own namespace, watching an attacker and a victim namespace (both restricted)."""
    env = bedlib.chart_env(bed)
    restricted = {"pod-security.kubernetes.io/enforce": "restricted"}
    sys_ns, attacker, victim = bedlib.unique("rltune-sys"), bedlib.unique("team-a"), bedlib.unique("team-b")
    for ns in (sys_ns, attacker, victim):
        core.create_namespace({"metadata": {"name": ns, "labels": restricted}})
    name = "rl" + sys_ns[-6:]
    demo.helm_install(env, name, sys_ns, watch=(attacker, victim))
    yield env, name, sys_ns, attacker, victim
    for ns in (attacker, victim):
        _kubectl(env, "delete", "rltuningjobs", "--all", "-n", ns, "--wait=true", "--timeout=90s")
    subprocess.run(["helm", "uninstall", name, "-n", sys_ns, "--wait"], env=env, capture_output=True, timeout=120)
    for ns in (sys_ns, attacker, victim):
        _kubectl(env, "delete", "namespace", ns, "--wait=false")


def _conditions(status: dict) -> dict:
    return {c.get("type"): c for c in status.get("conditions") or []}


def _settled(c: Case, status: dict) -> bool:
    if c.expect["outcome"] == "condition":
        cond = _conditions(status).get(c.expect["type"]) or {}
        return cond.get("status") == "False" or status.get("phase") == "Failed"
    return status.get("phase") in ("Succeeded", "Failed")


def _judge(c: Case, status: dict) -> None:
    exp = c.expect
    if exp["outcome"] == "apply":
        if c.outcome != "apply":
            c.problems.append(f"accepted at apply (phase {status.get('phase')})")
        else:
            missing = [s for s in exp.get("contains", []) if s not in c.stderr]
            if missing:
                c.problems.append(f"apply error lacks {missing}: {c.stderr[:600]}")
        return
    if c.outcome == "apply":
        c.problems.append(f"refused at apply: {c.stderr[:600]}")
        return
    if exp["outcome"] == "condition":
        cond = _conditions(status).get(exp["type"]) or {}
        c.outcome = f"{exp['type']}={cond.get('status')}/{cond.get('reason')}"
        c.message = cond.get("message") or ""
        if cond.get("status") != "False":
            c.problems.append(f"no {exp['type']}=False; phase {status.get('phase')}, message {status.get('message')}")
        if exp.get("reason") and cond.get("reason") != exp["reason"]:
            c.problems.append(f"reason {cond.get('reason')}, expected {exp['reason']}")
        missing = [s for s in exp.get("contains", []) if s not in c.message]
        if missing:
            c.problems.append(f"message lacks {missing}: {c.message[:600]}")
        if exp["type"] == "SpecValid" and status.get("trials"):
            c.problems.append(f"{len(status['trials'])} trial(s) recorded for a job refused before any pod")
        return
    c.outcome = f"ran: {status.get('phase')}"
    c.message = status.get("message") or ""
    if status.get("phase") != "Succeeded":
        c.problems.append(f"did not succeed: phase {status.get('phase')}: {c.message[:400]}")


def test_tenant_attacks(bed, core, release):
    env, name, sys_ns, attacker, victim = release
    meta = MetadataServer()
    cases = load_cases(meta.url)
    for c in cases:
        c.ns = attacker if c.side == "attacker" else victim
    by_stem = {c.stem: c for c in cases}
    rec = Recorder(bed, [attacker, victim])
    pod = bedlib.wait_for(lambda: demo.operator_pod(env, name, sys_ns), 60, what="the operator pod")
    sa = pod["spec"]["serviceAccountName"]
    spoofer = None
    try:
        # a decoy: another workload's Service whose name the job `web`'s baseline trial would use
        decoy = by_stem["decoy-service"]
        core.create_namespaced_service(
            decoy.ns,
            {
                "metadata": {"name": f"{decoy.name}-baseline", "labels": {"app": "web"}},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
            },
        )
        # the attacker's pod: pushes a 1 ms step for every trial id of the victim's job, all along
        spoof = by_stem["spoof-victim-scores"]
        pod_env = [
            {"name": "PGW", "value": bed.pushgateway_url},
            {"name": "VICTIM_NS", "value": spoof.ns},
            {"name": "VICTIM_JOB", "value": spoof.name},
            {"name": "SECONDS", "value": "240"},
            {"name": "BODY", "value": spoof_body(spoof.ns, spoof.name)},
        ]
        manifest = bedlib.python_pod("spoofer", SPOOFER, env=pod_env)
        manifest["spec"]["securityContext"] = {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        manifest["spec"]["containers"][0]["securityContext"] = {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
        spoofer = core.create_namespaced_pod(attacker, manifest)

        # apply every case (and the copies: eight oversized jobs, one per operator worker)
        jobs: list[tuple[Case, dict]] = []
        for c in cases:
            for i in range(c.copies):
                doc = copy.deepcopy(c.job)
                if i:
                    doc["metadata"]["name"] = f"{c.name}-{i + 1}"
                jobs.append((c, doc))

        def apply(item):
            c, doc = item
            t0 = time.time()
            r = _kubectl(env, "apply", "-n", c.ns, "-f", "-", input=yaml.safe_dump(doc))
            if doc["metadata"]["name"] == c.name:
                c.applied_at = time.time()
                if r.returncode != 0:
                    c.outcome, c.stderr, c.seconds = "apply", r.stderr or r.stdout, time.time() - t0

        # the oversized jobs first, so that the valid jobs meet an operator busy with them
        jobs.sort(key=lambda j: j[0].harm != "valid-job-fast")
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(apply, jobs))

        from kubernetes import client

        api = client.CustomObjectsApi(bed.api_client())
        pending = {(c.ns, c.name): c for c in cases if c.outcome != "apply"}
        statuses: dict[tuple[str, str], dict] = {}
        deadline = time.time() + 300
        while pending and time.time() < deadline:
            for ns in (attacker, victim):
                for it in api.list_namespaced_custom_object("rltune.io", "v1alpha1", ns, "rltuningjobs")["items"]:
                    k = (ns, it["metadata"]["name"])
                    statuses[k] = it.get("status") or {}
                    c = pending.get(k)
                    if c is not None and _settled(c, statuses[k]):
                        c.seconds = time.time() - c.applied_at
                        del pending[k]
            time.sleep(0.5)
        for c in cases:
            _judge(c, statuses.get((c.ns, c.name), {}))
        for c in pending.values():
            c.problems.append("not settled within 300 s")

        # ---------------------------------------------------------------- the harm that did not happen
        events = []
        for ns in (attacker, victim):
            events += json.loads(_kubectl(env, "get", "events", "-n", ns, "-o", "json").stdout)["items"]
        every_word = json.dumps(list(statuses.values())) + json.dumps([e.get("message") for e in events])
        for c in cases:
            st = statuses.get((c.ns, c.name), {})
            if c.harm == "no-request":
                if meta.requests:
                    c.problems.append(f"the metadata server got {meta.requests[:5]}")
                if MARKER in every_word:
                    c.problems.append("the metadata server's marker is in a status or an event")
            elif c.harm == "spoof-ignored":
                measured = [t.get("measuredSeconds") for t in st.get("trials") or [] if t.get("measuredSeconds")]
                if not measured or min(measured) <= 10 * SPOOF_SECONDS:
                    c.problems.append(f"spoofed step times scored: measured {measured}")
                best = (st.get("best") or {}).get("stepSeconds") or 0
                if best <= 10 * SPOOF_SECONDS:
                    c.problems.append(f"status.best is the spoof: {st.get('best')}")
                warned = [e for e in events if e.get("reason") == "UnsignedMetrics" and c.name in json.dumps(e)]
                if not warned:
                    c.problems.append("no UnsignedMetrics event on the victim's job")
            elif c.harm == "sidecar-restricted":
                pods = [p for (ns, n), p in rec.pods.items() if ns == c.ns and n.startswith(c.name + "-")]
                if not pods:
                    c.problems.append("no pod of the job seen")
                for p in pods:
                    spec = p["spec"]
                    for ct in spec.get("initContainers", []) + spec["containers"]:
                        sc = ct.get("securityContext") or {}
                        ok = (
                            sc.get("allowPrivilegeEscalation") is False
                            and "ALL" in ((sc.get("capabilities") or {}).get("drop") or [])
                            and (sc.get("runAsNonRoot") or (spec.get("securityContext") or {}).get("runAsNonRoot"))
                        )
                        if not ok:
                            c.problems.append(
                                f"pod {p['metadata']['name']} container {ct['name']} not restricted: {sc}"
                            )
            elif c.harm == "valid-job-fast":
                valid = by_stem["sidecar"]  # a valid job in the same namespace, applied after the oversized ones
                seen = [t for (ns, n), t in rec.pod_seen.items() if ns == valid.ns and n.startswith(valid.name + "-")]
                took = min(seen) - valid.applied_at if seen else None
                c.message += f" (valid job's baseline pod after {took:.1f} s)" if took is not None else ""
                if took is None or took > VALID_JOB_POD_S:
                    c.problems.append(f"the valid job {valid.name} got its first pod after {took} s")
            elif c.harm == "fenced":
                pols = [p for (ns, n), p in rec.policies.items() if ns == c.ns and n.startswith(c.name + "-")]
                if not pols:
                    c.problems.append("no NetworkPolicy for the job's trials")
                for p in pols:
                    sel = p["spec"]["podSelector"].get("matchLabels") or {}
                    if sel.get("rltune.io/job") != c.name or not sel.get("rltune.io/trial"):
                        c.problems.append(f"NetworkPolicy {p['metadata']['name']} selects {sel}")
                    if "Ingress" not in p["spec"].get("policyTypes", []):
                        c.problems.append(f"NetworkPolicy {p['metadata']['name']} does not fence ingress")
            elif c.harm == "no-node-names":
                for n in core.list_node().items:
                    if n.metadata.name in c.message:
                        c.problems.append(f"the message names node {n.metadata.name}")
                        break

        # deleting the jobs deletes only what they own
        for ns in (attacker, victim):
            _kubectl(env, "delete", "rltuningjobs", "--all", "-n", ns, "--wait=true", "--timeout=120s", timeout=150)
        if meta.requests:  # a job-named Pushgateway would have got its DELETE now
            by_stem["pushgateway-delete"].problems.append(f"requests to the job-named endpoint: {meta.requests[:5]}")
        try:
            core.read_namespaced_service(f"{decoy.name}-baseline", decoy.ns)
        except Exception as e:  # noqa: BLE001
            decoy.problems.append(f"the decoy Service is gone after the job was deleted: {e}")

        # the ValidatingAdmissionPolicy, the backstop of rltune's own check: a pod the namespace's Pod
        # Security admits (restricted) but with a scheduler of its own, created as the operator's
        # ServiceAccount, is refused by the policy
        bad = copy.deepcopy(manifest)
        bad["metadata"]["name"] = "own-scheduler-as-operator"
        bad["spec"]["schedulerName"] = "my-scheduler"
        bad["spec"]["automountServiceAccountToken"] = False  # (the default token volume is refused too)
        r = _kubectl(
            env, "create", "-n", attacker, "-f", "-", f"--as=system:serviceaccount:{sys_ns}:{sa}", input=json.dumps(bad)
        )
        admission = r.returncode != 0 and "rltune admission policy" in r.stderr and "schedulerName" in r.stderr
    finally:
        rec.stop()
        meta.close()
        if spoofer is not None:
            core.delete_namespaced_pod("spoofer", attacker, grace_period_seconds=0)

    table = _table(cases)
    out = Path(bed.state_dir).parent / "e2e" / "tenant-attacks.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"# Tenant-attack corpus ({time.strftime('%Y-%m-%d %H:%M:%S')})\n\n{table}\n\n## Messages\n\n"
        + "\n".join(f"- **{c.stem}**: {(c.stderr or c.message).strip()[:600]}" for c in cases)
        + "\n"
    )
    print("\n" + table)
    problems = [f"{c.stem}: {p}" for c in cases for p in c.problems]
    if not admission:
        problems.append(f"a privileged pod created as the operator's ServiceAccount was not refused: {r.stderr}")
    assert not problems, "\n".join(problems)


def _table(cases: list[Case]) -> str:
    rows = ["| case | attack | outcome | seconds from apply | harm check | result |", "|---|---|---|---|---|---|"]
    for c in cases:
        secs = f"{c.seconds:.1f}" if c.seconds is not None else "-"
        result = "ok" if not c.problems else "FAIL"
        rows.append(f"| {c.stem} | {c.attack[:90]} | {c.outcome} | {secs} | {c.harm} | {result} |")
    return "\n".join(rows)
