"""Pure parts of the operator that need no cluster: trial pod manifests, the compact status
encodings (config diff, summary), override rendering, the PromQL selector and spec validation.

The reconciler's lifecycle (profiling, search within the GPU budget, failures, restarts without
duplicate pods, invalid specs) runs against the real test bed in tests/integration/test_reconciler.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rltune.adapters.render import render_overrides
from rltune.api.models import RLConfig, RLTuningJobSpec
from rltune.controller import pods as pod_manifests
from rltune.controller import prom
from rltune.controller.reconcile import InvalidSpec, validate_spec
from rltune.tuner import records
from rltune.tuner.summary import TrialSummary

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "twin-demo.yaml"


def demo_spec() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())["spec"]


def test_pod_manifests_multi_node():
    spec = RLTuningJobSpec.model_validate(demo_spec())
    cfg = spec.baseline.with_knobs({"gpus": 16})
    pods, svc = pod_manifests.trial_manifests("ns", "twin-demo", {"uid": "u"}, spec, "t1", cfg, 4, 1, "http://pgw")
    assert [p["metadata"]["name"] for p in pods] == ["twin-demo-t1-0", "twin-demo-t1-1"]
    assert svc and svc["spec"]["clusterIP"] == "None"
    c = pods[1]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["RLTUNE_RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["MASTER_ADDR"].startswith("twin-demo-t1-0.")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    terms = pods[0]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms[0]["matchExpressions"][0]["values"] == [
        "NVIDIA-B300-SXM6-AC"
    ]  # every known B300 string (test_pods.py)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pods[0]["spec"]["tolerations"]
    assert pods[0]["spec"]["restartPolicy"] == "Never"
    long = pod_manifests.pod_name("a" * 80, "t123", 0)
    assert len(long) <= 63 and long == pod_manifests.pod_name("a" * 80, "t123", 0)


def test_config_diff_round_trip():
    base = RLConfig()
    cfg = base.with_knobs({"rollout.maxNumSeqs": 1024, "gpus": 16, "placement": "disaggregated", "trainerGpus": 8})
    diff = records.config_diff(base, cfg)
    assert diff == {"rollout.maxNumSeqs": 1024, "gpus": 16, "placement": "disaggregated", "trainerGpus": 8}
    assert records.config_from_diff(base, diff) == cfg


def test_summary_round_trip():
    s = TrialSummary(
        steps=3,
        total_steps=4,
        step_time_mean=10.0,
        step_time_std=1.0,
        phases={"generation": 8.0},
        rewards=[0.1, 0.2, 0.3],
        nan=False,
    )
    assert records.unflatten_summary(records.flatten_summary(s, keep_rewards=True)) == s


def test_render_canonical():
    """rltune's own workloads: the changed knobs as sorted canonical path=value (frameworks: adapters)."""
    out = render_overrides("twin", {"rollout.maxNumSeqs": 512, "rollout.cudaGraphs": True})
    assert out == ["rollout.cudaGraphs=true", "rollout.maxNumSeqs=512"]
    # a knob the winner leaves unset (its default) is written as YAML writes it, not as Python's None
    assert render_overrides("twin", {"trainer.etp": None}) == ["trainer.etp=null"]


def test_promql_selector():
    """The instant-query selector (executed against the real Prometheus in test_reconciler.py)."""
    q = prom.trial_query("ns", "j", "t1", {"step_duration_seconds": "my_step_seconds"})
    assert q.startswith('{__name__=~"') and 'namespace="ns"' in q and 'rltune_job="j"' in q and 'trial="t1"' in q
    assert "my_step_seconds" in q and "rltune_step_duration_seconds" not in q and "rltune_step_warmup" in q
    assert 'namespace="a\\"b"' in prom.trial_query('a"b', "j", "t1")  # label values are escaped


def test_validate_spec_type_error_names_field():
    """A wrongly typed field. The real CRD rejects this before it reaches the operator (a structural
    schema check no CRD version lacks), so it cannot reach the reconciler on a real API server; the
    validation function that would report it is checked here directly. Cross-field rules that an
    older CRD may lack are tested for real in test_reconciler.py::test_invalid_spec_condition_names_field."""
    raw = demo_spec()
    raw["budget"]["stepsPerTrial"] = "many"
    with pytest.raises(InvalidSpec, match=r"spec\.budget\.stepsPerTrial"):
        validate_spec(raw)
    raw = demo_spec()
    raw["baseline"].update({"placement": "disaggregated", "trainerGpus": 16})
    with pytest.raises(InvalidSpec, match=r"spec\.baseline\.trainerGpus"):
        validate_spec(raw)
