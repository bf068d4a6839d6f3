"""Nothing invalid ever becomes a pod: every RLTuningJob of tests/invalid_jobs/ is applied with
`kubectl apply` to one namespace the operator (a subprocess) watches. Each case is refused by the
API server with a message naming the field, or accepted and then marked within seconds with a
condition naming the field (SpecValid/PodsSchedulable False, or Failed True) and phase Failed.
Afterwards the API server's audit log must show no pod and no service created (HTTP 201, dry runs
excluded) in the namespace, and the operator's log no traceback.

A case file's first line says how it must be caught:
    # expect: apply <substring> [<substring> ...]
        kubectl apply fails and its stderr holds every substring (the field, as spec.<path>);
    # expect: condition <Type>[|<Type>] <substring> [<substring> ...]
        the job is accepted, then gets condition Type (Failed: status True, any other type: status
        False) whose message holds every substring, and phase Failed.
`# kind:` groups cases for the summary, `# mistake:` says what the case gets wrong. A value
`@@OVERSIZE:N@@` is expanded to an image-like string of N characters (a 1 MiB spec is not stored in
git). The summary table (kind, case, how caught, seconds from apply to condition) is printed and
written to .state/e2e/invalid-corpus.md."""

from __future__ import annotations

import re
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

import bed as bedlib
from hack import demo

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "invalid_jobs"
CONDITION_TIMEOUT_S = 30.0  # apply -> condition, per case ("within seconds"; generous for 2 cores)
SETTLE_S = 4.0  # after the last condition: time for a late pod creation to show up

pytestmark = [pytest.mark.bed, pytest.mark.slow]

_HEADER = re.compile(r"^# expect: (apply|condition) (.+)$")
_OVERSIZE = re.compile(r"@@OVERSIZE:(\d+)@@")


@dataclass
class Case:
    stem: str
    name: str  # metadata.name
    kind: str
    mistake: str
    how: str  # apply | condition
    types: tuple[str, ...]  # condition types accepted (how == condition)
    needles: tuple[str, ...]  # substrings the message must hold
    text: str  # the manifest, markers expanded
    # results
    applied_at: float | None = None
    stderr: str = ""
    caught: str = ""  # what happened, e.g. "apply", "SpecValid/InvalidSpec", "not caught"
    message: str = ""
    seconds: float | None = None
    status: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _expand(text: str) -> str:
    def big(m: re.Match) -> str:
        n = int(m.group(1))
        prefix = "registry.example.com/"
        return prefix + "a" * (n - len(prefix))

    return _OVERSIZE.sub(big, text)


def load_cases() -> list[Case]:
    out = []
    for p in sorted(CASES.glob("*.yaml")):
        raw = p.read_text()
        lines = raw.splitlines()
        m = _HEADER.match(lines[0])
        assert m, f"{p.name}: first line must be '# expect: apply|condition ...', not {lines[0]!r}"
        meta = dict(re.match(r"^# (\w+): (.*)$", ln).groups() for ln in lines[1:3] if re.match(r"^# (\w+): ", ln))
        assert meta.get("kind") and meta.get("mistake"), f"{p.name}: needs '# kind:' and '# mistake:' lines"
        words = m.group(2).split()
        if m.group(1) == "condition":
            types, needles = tuple(words[0].split("|")), tuple(words[1:])
        else:
            types, needles = (), tuple(words)
        assert needles, f"{p.name}: the expect line names no field"
        doc = yaml.safe_load(raw)
        assert doc["kind"] == "RLTuningJob", p.name
        out.append(
            Case(
                stem=p.stem,
                name=doc["metadata"]["name"],
                kind=meta["kind"],
                mistake=meta["mistake"],
                how=m.group(1),
                types=types,
                needles=needles,
                text=_expand(raw),
            )
        )
    return out


def test_corpus_is_well_formed():
    """At least 30 cases, unique names, every kind of the issue present (cheap: no bed needed)."""
    cases = load_cases()
    assert len(cases) >= 30, len(cases)
    names = Counter(c.name for c in cases)
    assert not [n for n, k in names.items() if k > 1], names
    kinds = {c.kind for c in cases}
    for k in (
        "wrong-type",
        "out-of-range",
        "unknown-enum",
        "contradiction",
        "no-valid-config",
        "cluster",
        "unknown-preset",
        "oversized",
        "pod-security",
    ):
        assert k in kinds, f"no case of kind {k}"


# ----------------------------------------------------------------------------- the bed run


def _kubectl_apply(env: dict, ns: str, text: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["kubectl", "apply", "-n", ns, "-f", "-"], env=env, capture_output=True, text=True, input=text, timeout=120
    )


def _cond_status_wanted(ctype: str) -> str:
    return "True" if ctype == "Failed" else "False"


def _failure_signal(status: dict) -> dict | None:
    """The first condition that says the job will not run (None while none does)."""
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    for t in ("SpecValid", "PodsSchedulable"):
        if (conds.get(t) or {}).get("status") == "False":
            return conds[t]
    if (conds.get("Failed") or {}).get("status") == "True":
        return conds["Failed"]
    return None


def _judge(c: Case, status: dict) -> None:
    """Fill c.caught/c.message/c.problems from the job's status (accepted cases)."""
    conds = {x.get("type"): x for x in status.get("conditions") or []}
    hit = next((conds[t] for t in c.types if (conds.get(t) or {}).get("status") == _cond_status_wanted(t)), None)
    sig = hit or _failure_signal(status)
    if sig is None:
        trials = status.get("trials") or []
        c.caught = "not caught"
        c.message = f"phase {status.get('phase') or '-'}, {len(trials)} trial(s)" + (
            f", message: {status.get('message')}" if status.get("message") else ""
        )
        c.problems.append(f"accepted and not marked within {CONDITION_TIMEOUT_S:.0f}s: {c.message}")
        return
    c.caught = f"{sig['type']}={sig.get('status')}/{sig.get('reason')}"
    c.message = sig.get("message") or ""
    if c.how == "apply":
        c.problems.append(f"declared 'apply' but accepted, then {c.caught}: {c.message}")
        return
    if hit is None:
        c.problems.append(f"expected condition {'|'.join(c.types)}, got {c.caught}: {c.message}")
        return
    missing = [n for n in c.needles if n not in c.message]
    if missing:
        c.problems.append(f"{c.caught} message lacks {missing}: {c.message!r}")
    if status.get("phase") != "Failed":
        c.problems.append(f"phase {status.get('phase')!r}, not Failed ({c.caught})")


def _audit(bed, ns: str) -> tuple[Counter, Counter]:
    """(created, refused): real (not dry-run) pod/service creations in ns answered 201 / >= 400,
    keyed by (resource, name)."""
    created, refused = Counter(), Counter()
    for ev, ref in bedlib.audit_events(bed, ns):
        if ev.get("verb") != "create" or ref.get("subresource") or ref.get("resource") not in ("pods", "services"):
            continue
        if "dryRun=" in ev.get("requestURI", ""):
            continue
        code = (ev.get("responseStatus") or {}).get("code")
        key = (ref.get("resource"), ref.get("name") or "?")
        if code == 201:
            created[key] += 1
        elif code and code >= 400:
            refused[key] += 1
    return created, refused


def _tracebacks(text: str, ns: str) -> Counter:
    """'<job>: <last line of the exception>' for each traceback in the operator's log."""
    out: Counter = Counter()
    job = "?"
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        m = re.search(rf"{re.escape(ns)}/([a-z0-9-]+)", ln)
        if m and not ln.startswith(" "):
            job = m.group(1)
        if ln.startswith("Traceback"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                j += 1
            last = lines[j] if j < len(lines) else "?"
            out[f"{job}: {last[:160]}"] += 1
    return out


def _owner(name: str, cases: list[Case]) -> str:
    """The case a pod/service name belongs to (trial objects are named <job>-<trial>...)."""
    best = max((c for c in cases if name.startswith(c.name)), key=lambda c: len(c.name), default=None)
    return best.stem if best else "?"


_CEL = re.compile(r'Invalid value: "(object|string|integer|number|array|boolean)": (?!.*in body )')


def _layer(c: Case) -> str:
    """Which layer caught the case: the CRD schema, a CEL rule, the API server's field validation,
    the operator's own validation, its check of the cluster's nodes, or the API server's verdict
    on a trial pod (a server-side dry run)."""
    if c.caught == "apply":
        if "unknown field" in c.stderr:
            return "field validation"
        lines = [ln for ln in c.stderr.splitlines() if c.needles[0] in ln] or c.stderr.splitlines()
        return "CEL" if any(_CEL.search(ln) for ln in lines) else "schema"
    if c.caught.startswith("SpecValid"):
        return "operator validation"
    if c.caught.startswith("PodsSchedulable") or "NoMatchingNodes" in c.caught:
        return "cluster check"
    if "PodRejected" in c.caught:
        return "API server (pod dry run)"
    return "-"


def _table(cases: list[Case]) -> str:
    rows = ["| kind | case | expected | how caught | layer | seconds | result |", "|---|---|---|---|---|---|---|"]
    # seconds: apply -> condition for accepted cases; kubectl's round trip for refusals
    for c in sorted(cases, key=lambda c: (c.kind, c.stem)):
        exp = "apply" if c.how == "apply" else "|".join(c.types)
        secs = f"{c.seconds:.1f}" if c.seconds is not None else "-"
        rows.append(
            f"| {c.kind} | {c.stem} | {exp} | {c.caught} | {_layer(c)} | {secs} | {'FAIL' if c.problems else 'ok'} |"
        )
    return "\n".join(rows)


def _report(cases: list[Case], extra: list[str]) -> str:
    kinds = Counter(c.kind for c in cases)
    ok = sum(1 for c in cases if not c.problems)
    timed = sorted(c.seconds for c in cases if c.seconds is not None and c.caught != "apply")
    out = [
        f"# Invalid RLTuningJob corpus ({time.strftime('%Y-%m-%d %H:%M:%S')})",
        "",
        f"{ok}/{len(cases)} cases handled as declared. Cases per kind: "
        + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
        + ".",
        f"Caught at apply: {sum(1 for c in cases if c.caught == 'apply')}; by a condition: "
        f"{sum(1 for c in cases if c.caught not in ('apply', 'not caught', ''))}"
        + (f" (apply -> condition: median {timed[len(timed) // 2]:.1f}s, max {timed[-1]:.1f}s)" if timed else "")
        + ".",
        "",
        "Layers per kind: "
        + "; ".join(
            f"{k}: " + ", ".join(f"{lay} {n}" for lay, n in Counter(_layer(c) for c in cases if c.kind == k).items())
            for k in sorted(kinds)
        )
        + ".",
        "",
        _table(cases),
        "",
        "## Messages",
        "",
    ]
    for c in sorted(cases, key=lambda c: (c.kind, c.stem)):
        msg = c.stderr.strip() if c.caught == "apply" else c.message
        if len(msg) > 600:
            msg = msg[:600] + f"... ({len(msg)} chars)"
        out.append(f"- **{c.stem}** ({c.mistake}): {msg}")
        for p in c.problems:
            out.append(f"  - FAIL: {p[:1200]}")
    if extra:
        out += ["", "## Other failures", ""] + [f"- {e[:2000]}" for e in extra]
    return "\n".join(out) + "\n"


def test_invalid_corpus(bed, namespace):
    from kubernetes import client
    from test_operator import env_for  # tests/e2e/test_operator.py

    cases = load_cases()
    env = env_for(bed)
    demo.apply_crd(env)
    e2e_dir = Path(bed.state_dir).parent / "e2e"
    log = e2e_dir / f"operator-{namespace}.log"
    op = demo.start_operator(env, log, namespaces=(namespace,), metrics_port=0)
    extra: list[str] = []
    try:
        time.sleep(3)  # let kopf start its watch, so the times below are the operator's, not its start-up

        def apply(c: Case) -> None:
            t0 = time.time()
            r = _kubectl_apply(env, namespace, c.text)
            if r.returncode == 0:
                c.applied_at = time.time()
            else:
                c.stderr = r.stderr or r.stdout
                c.caught = "apply"
                c.seconds = time.time() - t0  # the refusal's round trip (kubectl included)
                if c.how == "apply":
                    missing = [n for n in c.needles if n not in c.stderr]
                    if missing:
                        c.problems.append(f"refused at apply, but stderr lacks {missing}: {c.stderr.strip()[:1500]}")
                else:
                    c.problems.append(
                        f"declared condition {'|'.join(c.types)}, but refused at apply: {c.stderr.strip()[:1500]}"
                    )

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(apply, cases))

        # accepted ones: poll all jobs together until each shows a failure signal or its time is up
        api = client.CustomObjectsApi(bed.api_client())
        pending = {c.name: c for c in cases if c.applied_at is not None}
        statuses: dict[str, dict] = {}
        while pending:
            items = api.list_namespaced_custom_object("rltune.io", "v1alpha1", namespace, "rltuningjobs")["items"]
            now = time.time()
            for it in items:
                c = pending.get(it["metadata"]["name"])
                if c is None:
                    continue
                st = it.get("status") or {}
                statuses[c.name] = st
                if _failure_signal(st) is not None:
                    c.seconds = now - c.applied_at
                    del pending[c.name]
            for name, c in list(pending.items()):
                if now - c.applied_at > CONDITION_TIMEOUT_S:
                    del pending[name]
            assert op.poll() is None, f"operator exited ({op.returncode}): {log.read_text(errors='replace')[-3000:]}"
            time.sleep(0.25)
        time.sleep(SETTLE_S)
        # judge on the latest status (a condition may have become more specific since first seen)
        items = api.list_namespaced_custom_object("rltune.io", "v1alpha1", namespace, "rltuningjobs")["items"]
        latest = {it["metadata"]["name"]: it.get("status") or {} for it in items}
        for c in cases:
            if c.applied_at is not None:
                c.status = latest.get(c.name, statuses.get(c.name, {}))
                _judge(c, c.status)

        # no pod, no service: from the API server's audit log
        created, refused = _audit(bed, namespace)
        by_case: dict[str, list[str]] = {}
        for (res, name), n in created.items():
            by_case.setdefault(_owner(name, cases), []).append(f"{res[:-1]} {name}" + (f" x{n}" if n > 1 else ""))
        for c in cases:
            if c.stem in by_case:
                c.problems.append(f"created (HTTP 201): {', '.join(sorted(by_case.pop(c.stem)))}")
        if by_case:
            extra.append(f"pods/services created that belong to no case: {by_case}")
        tries = Counter()
        for (res, name), n in refused.items():
            if res == "pods":
                tries[_owner(name, cases)] += n
        for c in cases:
            if tries.get(c.stem, 0) > 1:
                c.problems.append(
                    f"{tries[c.stem]} refused pod creations: the API server's refusal must end the job, not be retried"
                )
        text = log.read_text(errors="replace") if log.exists() else ""
        if "Traceback" in text:
            i = text.index("Traceback")
            extra.append(
                f"operator log {log} holds {text.count('Traceback')} traceback(s): "
                + "; ".join(f"{k} x{n}" for k, n in _tracebacks(text, namespace).most_common())
                + f"\nfirst:\n{text[max(0, i - 300) : i + 2500]}"
            )
    finally:
        # delete the jobs while the operator runs, so kopf takes its finalizer off them
        subprocess.run(
            ["kubectl", "delete", "rltuningjobs", "--all", "-n", namespace, "--wait=true", "--timeout=90s"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        demo.stop_operator(op)

    report = _report(cases, extra)
    e2e_dir.mkdir(parents=True, exist_ok=True)
    (e2e_dir / "invalid-corpus.md").write_text(report)
    print("\n" + _table(cases))
    print(f"(full report with messages: {e2e_dir / 'invalid-corpus.md'})")
    failures = [f"{c.stem} [{c.kind}]: {p}" for c in cases for p in c.problems] + extra
    assert not failures, f"{len(failures)} problem(s) in the invalid corpus:\n" + "\n".join(
        f"- {f[:1500]}" for f in failures
    )
