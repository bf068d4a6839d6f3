"""The CRD is generated from the pydantic models; the checked-in copy must not drift, and the status
must stay well under etcd's 1 MiB object limit at the largest budget."""

from __future__ import annotations

import json
import pathlib

import yaml

from rltune.api import crdgen
from rltune.api.metrics import PHASES
from rltune.api.models import Budget, RLTuningJobSpec
from rltune.api.status import BaselineStatus, BestStatus, Condition, RLTuningJobStatus, TrialStatus

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "rltuningjobs.yaml"


def test_checked_in_crd_matches_models():
    assert CRD_FILE.exists(), "crds/rltuningjobs.yaml is missing: run `make crd`"
    assert CRD_FILE.read_text() == crdgen.render(), (
        "crds/rltuningjobs.yaml drifted from operator/rltune/api/: run `make crd` and commit the result"
    )


def _schema():
    return crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_structural_schema_shape():
    s = _schema()
    text = json.dumps(s)
    for bad in ('"$ref"', '"anyOf"', '"$defs"', '"title"', '"const"', '"allOf"', '"oneOf"'):
        assert bad not in text, bad
    assert not crdgen.missing_descriptions(s["properties"]["spec"], "spec")
    assert not crdgen.missing_descriptions(s["properties"]["status"], "status")
    for path, node in crdgen._walk(s):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        if node.get("type") == "object" and path:
            assert (
                "properties" in node
                or "additionalProperties" in node
                or node.get("x-kubernetes-preserve-unknown-fields")
                or path == ".metadata"
            ), path


def test_preserve_unknown_fields_only_where_free_form():
    s = _schema()
    free = sorted(p for p, n in crdgen._walk(s) if n.get("x-kubernetes-preserve-unknown-fields"))
    assert free == sorted(
        [
            ".spec.workload.scenario",
            ".spec.resources.tolerations[]",
            ".spec.resources.podTemplate",
            ".spec.searchSpace.knobs.*[]",
            ".status.trials[].config",
            ".status.best.config",
            ".status.poolOffer.config",
        ]
    )


def test_crd_names_and_columns():
    c = crdgen.crd()
    assert c["metadata"]["name"] == "rltuningjobs.rltune.io"
    names = c["spec"]["names"]
    assert names["kind"] == "RLTuningJob" and names["shortNames"] == ["rltj"] and "rltune" in names["categories"]
    v = c["spec"]["versions"][0]
    assert v["subresources"] == {"status": {}}
    cols = [col["name"] for col in v["additionalPrinterColumns"]]
    assert cols == ["Phase", "Bottleneck", "Trials", "Speedup", "Best Step", "GPUs", "Age"]
    spec = v["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = json.dumps(spec)
    for needle in ("self == oldSelf", "warmupSteps", "parallelTrials", "baseline.gpus", "trainerGpus"):
        assert needle in rules


def test_example_specs_validate():
    for f in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and doc.get("kind") == "RLTuningJob":
                RLTuningJobSpec.model_validate(doc["spec"])


def _big_status(n: int) -> RLTuningJobStatus:
    now = "2025-01-01T00:00:00Z"
    summary = {f"phase.{p}": 123.456789 for p in PHASES}
    summary |= {
        k: 1234.5678
        for k in (
            "stepSeconds",
            "stepStd",
            "steps",
            "reward",
            "rewardStd",
            "staleness",
            "logprobMismatch",
            "kvUsage",
            "preemptions",
            "generatedTokens",
            "trainedTokens",
            "gpuSecondsPerStep",
        )
    }
    config = {
        "rollout.tp": 2,
        "rollout.gpuMemoryUtilization": 0.85,
        "rollout.maxNumSeqs": 1024,
        "rollout.maxNumBatchedTokens": 32768,
        "rollout.cudaGraphs": True,
        "trainer.tp": 2,
        "trainer.microBatchTokens": 32768,
        "async.staleness": 1,
        "placement": "disaggregated",
        "trainerGpus": 8,
    }
    trials = [
        TrialStatus(
            id=f"t{i}",
            kind="search",
            config=config,
            gpus=64,
            steps=100,
            predicted_seconds=321.5,
            predicted_std=12.25,
            measured_seconds=301.125,
            objective=301.125,
            state="Rejected",
            reason="gate logprobMismatch: 0.0712 > limit 0.05 (mean over 99 scored steps)",
            gates={"staleness": True, "logprobMismatch": False, "reward": True, "steps": True},
            summary=summary,
            created_at=now,
            started_at=now,
            finished_at=now,
        )
        for i in range(1, n + 1)
    ]
    conds = [
        Condition(
            type=t, status="True", reason="Reason", message="m" * 200, last_transition_time=now, observed_generation=3
        )
        for t in ("SpecValid", "Progressing", "Complete", "Failed")
    ]
    return RLTuningJobStatus(
        observed_generation=3,
        phase="Succeeded",
        message="x" * 300,
        conditions=conds,
        baseline=BaselineStatus(
            state="Succeeded",
            step_seconds=600.0,
            breakdown=dict.fromkeys(summary, 1.0),
            bottleneck="generation_tail",
            evidence=["e" * 150] * 16,
        ),
        trials=trials,
        best=BestStatus(
            trial="t7",
            config=config,
            step_seconds=200.0,
            speedup=3.0,
            gpus=64,
            gpu_seconds_per_step=12800.0,
            confirmed=True,
            overrides=[f"actor_rollout_ref.rollout.knob_{i}=value" for i in range(20)],
        ),
        forecast_error=0.057,
        trials_done=f"{n}/{n}",
        speedup="3.00x",
        next_trial=n + 10,
    )


def test_status_size_bound_at_max_trials():
    n = next(m.le for m in Budget.model_fields["max_trials"].metadata if hasattr(m, "le"))
    status = _big_status(n + 5)  # + baseline and confirmation runs
    size = len(json.dumps(status.dump()))
    assert size < 400 * 1024, f"status at {n} trials is {size} bytes: compact the trial records"
    # and it round-trips through the model the operator reads back
    assert RLTuningJobStatus.model_validate(status.dump()) == status
