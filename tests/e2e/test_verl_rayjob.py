"""A verl job end to end on the test bed, through KubeRay: the operator (a subprocess) profiles the
command the user runs today and two search trials, each as a RayJob whose real Ray head and worker
pods (two 8-GPU kwok B300 nodes) run the trial command through the metrics bridge; the operator
scores every trial from Prometheus and writes a winner whose full command composes in verl 0.9.1's
own Hydra config.

What runs instead of GPU training: hack/verl-standin/main_ppo.py, which composes the overrides with
verl's real Hydra config (a key verl would refuse fails the trial) and prints the recorded verl
0.9.1 log with its timings rescaled to the twin's step time for the configuration.

Also: on the bed without KubeRay (operator and CRDs removed, then restored) the job waits with
RayAvailable=False (KubeRayMissing) and no trial pod is created."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from test_operator import job, kubectl, operator, wait  # noqa: F401 - the operator fixture

import bed as bedlib
from hack.bed import kuberay
from rltune.adapters.registry import adapter_for
from rltune.adapters.verl_loader import compose

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.bed, pytest.mark.slow]

FROZEN = [
    "placement",
    "trainerGpus",
    "gpus",
    "weightSync",
    "async.staleness",
    "async.partialRollout",
    "async.staleFraction",
    "trainer.cp",
    "trainer.microBatchTokens",
    "trainer.recompute",
    "trainer.offload",
    "rollout.tp",
    "rollout.expertParallel",
    "rollout.cudaGraphs",
    "rollout.fp8",
    "rollout.maxNumBatchedTokens",
]


def verl_job(name: str = "verl-bed") -> dict:
    command = [
        "python3",
        str(ROOT / "hack/verl-standin/main_ppo.py"),
        "--config-name=ppo_trainer",
        "data.train_files=/data/gsm8k.parquet",
        "data.train_batch_size=64",
        "data.max_prompt_length=512",
        "data.max_response_length=2048",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.max_num_seqs=32",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=8",
        "trainer.logger=[console]",
    ]
    return {
        "apiVersion": "rltune.io/v1alpha1",
        "kind": "RLTuningJob",
        "metadata": {"name": name},
        "spec": {
            "workload": {
                "framework": "verl",
                "image": "verlai/verl:0.9.1",  # a Ray image on the bed (hack/images.yaml)
                "command": command,
                "env": [{"name": "RLTUNE_STANDIN_MODEL", "value": "qwen2.5-7b"}],
                "model": {"preset": "qwen2.5-7b"},
                "task": {
                    "kind": "math",
                    "promptsPerStep": 64,
                    "samplesPerPrompt": 8,
                    "maxPromptTokens": 512,
                    "maxResponseTokens": 2048,
                },
            },
            "resources": {"gpuType": "B300", "gpuBudget": 16, "gpusPerNode": 8},
            "constraints": {"maxStaleness": 0},
            "searchSpace": {
                "knobs": {"rollout.gpuMemoryUtilization": [0.3, 0.8], "rollout.maxNumSeqs": [32, 256]},
                "frozen": FROZEN,
            },
            # one trial at a time: two Ray heads on one machine would share the GCS port (docs/testbed.md)
            "budget": {
                "maxTrials": 2,
                "parallelTrials": 1,
                "stepsPerTrial": 3,
                "warmupSteps": 1,
                "confirmSteps": 0,
                "trialTimeoutSeconds": 600,
                "scheduleTimeoutSeconds": 300,
                "metricsTimeoutSeconds": 120,
            },
        },
    }


def apply(env, ns, doc) -> None:
    kubectl(env, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))


def resources(env, ns, kind) -> list[dict]:
    r = kubectl(env, "get", kind, "-n", ns, "-o", "json", check=False)
    return json.loads(r.stdout)["items"] if r.returncode == 0 else []


def condition(st: dict, ctype: str) -> dict:
    return next((c for c in st.get("conditions", []) if c["type"] == ctype), {})


@pytest.fixture
def kuberay_running(bed):
    if not kuberay.enabled():
        pytest.skip("the bed runs without KubeRay (RLTUNE_BED_KUBERAY=0)")


def test_verl_job_on_rayjobs_end_to_end(bed, namespace, operator, kuberay_running):  # noqa: F811
    env, start, log = operator
    op = start()
    t0 = time.time()
    apply(env, namespace, verl_job())
    seen: set[str] = set()

    def finished():
        assert op.poll() is None, f"operator exited: {log.read_text()[-3000:]}"
        seen.update(r["metadata"]["name"] for r in resources(env, namespace, "rayjobs.ray.io"))
        st = (job(env, namespace, "verl-bed") or {}).get("status") or {}
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    st = wait(finished, 900, "the verl job to finish", interval=2)
    wall = time.time() - t0
    trials = st.get("trials", [])
    print(
        f"\nverl job {st.get('phase')} in {wall:.0f} s; RayJobs {sorted(seen)}; trials "
        + ", ".join(f"{t['id']} {t['state']} {t.get('measuredSeconds')}" for t in trials)
    )
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)[:4000]
    assert st["framework"] == "verl 0.9.1 (fsdp)"
    assert {"trainer.tp", "trainer.pp", "trainer.ep"} <= {d["knob"] for d in st["droppedKnobs"]}
    assert condition(st, "RayAvailable").get("status") == "True"
    # every trial ran as a RayJob and was scored from what the bridge pushed
    assert {t["id"] for t in trials} <= {n.rsplit("-", 1)[1] for n in seen} and len(trials) == 3
    assert all(t["state"] in ("Succeeded", "Rejected") and t["measuredSeconds"] > 0 for t in trials), trials
    base = next(t for t in trials if t["kind"] == "baseline")
    assert len({t["measuredSeconds"] for t in trials}) > 1  # configurations differ, as the twin says
    best = st["best"]
    assert best["speedup"] > 1.0 and best["trial"] != base["id"]
    # the winner: a full verl command that verl's own config loads, with the winning values
    cmd = best["command"]
    assert cmd[1].endswith("hack/verl-standin/main_ppo.py") and "--config-name=ppo_trainer" in cmd
    assert all(o in cmd for o in best["overrides"]) and best["overrides"]
    cfg = compose(cmd)
    knobs = adapter_for("verl").read(cmd)
    for k, v in best["config"].items():
        assert knobs[k] == v, (k, knobs[k], v)
    assert int(cfg.data.train_batch_size) == 64 and cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-7B-Instruct"
    # every RayJob and its pods are gone once the job has finished
    wait(lambda: not resources(env, namespace, "rayjobs.ray.io"), 60, "the RayJobs to be deleted")
    wait(
        lambda: not [p for p in resources(env, namespace, "pods") if "rltune.io/trial" in p["metadata"]["labels"]],
        120,
        "the trial pods to be deleted",
    )


def test_without_kuberay_a_verl_job_waits_and_says_why(bed, namespace, operator, kuberay_running):  # noqa: F811
    """KubeRay is taken off the bed for the duration of the test (operator and CRDs) and put back."""
    env, start, log = operator
    kuberay.switch(False)
    try:
        start()
        apply(env, namespace, verl_job("verl-nokuberay"))
        st = wait(
            lambda: (
                (s := (job(env, namespace, "verl-nokuberay") or {}).get("status") or {})
                and condition(s, "RayAvailable").get("reason") == "KubeRayMissing"
                and s
            ),
            60,
            "RayAvailable=False",
        )
        assert st["phase"] == "Pending" and condition(st, "RayAvailable")["status"] == "False"
        assert "install the KubeRay operator" in condition(st, "RayAvailable")["message"]
        time.sleep(5)
        assert not bedlib.pod_creations(bed, namespace), "a trial pod was created without KubeRay"
    finally:
        kuberay.switch(True)
