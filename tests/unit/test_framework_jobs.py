"""A verl job as the operator sees it: the command is the baseline, the search is narrowed to what
verl can run (and says so in the status), trials are KubeRay RayJobs, and the winner is a command
verl's own Hydra config loads."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from test_lifecycle import drive

from rltune.adapters import registry
from rltune.adapters.verl_loader import compose
from rltune.api.models import RLTuningJobSpec, knob_paths
from rltune.api.status import Phase
from rltune.controller import rayjob
from rltune.controller.podspec import GPU_RESOURCE, LABEL_JOB, LABEL_RANK, LABEL_TRIAL
from rltune.settings import OperatorSettings
from rltune.tuner.search import Space
from rltune.tuner.validation import check_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/verl-dapo-b300.yaml"


def raw_spec() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())["spec"]


def spec_of(raw: dict) -> RLTuningJobSpec:
    return registry.resolve(RLTuningJobSpec.model_validate(raw))


def test_the_command_is_the_baseline():
    spec = spec_of(raw_spec())
    b = spec.baseline
    assert (b.trainer.tp, b.trainer.ep, b.trainer.recompute, b.trainer.micro_batch_tokens) == (2, 8, "full", 24576)
    assert (b.rollout.tp, b.rollout.gpu_memory_utilization, b.gpus, b.placement) == (2, 0.6, 16, "colocated")


def test_an_explicit_baseline_that_contradicts_the_command_names_both():
    raw = raw_spec()
    raw["baseline"] = {"rollout": {"tp": 4}}
    with pytest.raises(ValueError, match=r"spec.baseline.rollout.tp \(4\) contradicts the command.*sets 2"):
        spec_of(raw)
    raw["baseline"] = {"rollout": {"tp": 2}}  # agreeing is fine
    assert spec_of(raw).baseline.rollout.tp == 2


def test_a_command_that_is_not_verl_is_refused():
    raw = raw_spec()
    raw["workload"]["command"] = ["python", "-m", "rltune.trial"]
    with pytest.raises(ValueError, match="spec.workload.command: .*does not run a verl 0.9.1 entry point"):
        spec_of(raw)
    raw["workload"].pop("command")
    with pytest.raises(ValueError, match="spec.workload.command: a verl job needs the command"):
        spec_of(raw)


def test_the_task_must_agree_with_the_command():
    raw = raw_spec()
    raw["workload"]["task"]["promptsPerStep"] = 256
    with pytest.raises(ValueError, match=r"spec.workload.task.promptsPerStep \(256\) contradicts the command.*512"):
        spec_of(raw)


def test_knobs_verl_cannot_express_are_pinned_and_listed():
    raw = raw_spec()
    cmd = raw["workload"]["command"]
    # the FSDP backend has no tensor/pipeline/expert parallel trainer
    raw["workload"]["command"] = [
        c for c in cmd if "megatron" not in c and "override_transformer" not in c and "recompute" not in c
    ]
    spec = spec_of(raw)
    cov = registry.coverage(spec)
    assert cov.backend == "fsdp" and cov.version == "0.9.1"
    assert {"trainer.tp", "trainer.pp", "trainer.ep"} <= {d.knob for d in cov.dropped}
    space = Space(spec)
    for knob in ("trainer.tp", "trainer.pp", "trainer.ep"):
        assert space.values[knob] == [spec.baseline.flat()[knob]]
    assert "selective" not in space.values["trainer.recompute"]  # FSDP: none or full only
    # verl's fractional staleness is searched only where verl can run it
    assert set(space.values["async.staleFraction"]) == {None, 0.1, 0.25, 0.5, 1.0}
    raw["searchSpace"] = {"knobs": {"trainer.tp": [1, 2]}}
    problems = [str(p) for p in check_spec(spec_of(raw))]
    assert any(p.startswith("spec.searchSpace.knobs.trainer.tp: verl cannot run this knob") for p in problems)


def test_the_twin_searches_a_fractional_staleness_only_when_listed_and_the_reference_loop_refuses_it():
    raw = raw_spec()
    raw["workload"] = {"framework": "twin", "model": raw["workload"]["model"], "task": raw["workload"]["task"]}
    spec = RLTuningJobSpec.model_validate(raw)
    assert Space(spec).values["async.staleFraction"] == [None]
    raw["searchSpace"] = {"knobs": {"async.staleFraction": [0.1, 0.3]}}
    twin = RLTuningJobSpec.model_validate(raw)
    assert not [p for p in check_spec(twin) if "staleFraction" in str(p)]
    assert set(Space(twin).values["async.staleFraction"]) == {0.1, 0.3}
    raw["workload"]["framework"] = "reference"
    problems = [str(p) for p in check_spec(RLTuningJobSpec.model_validate(raw))]
    assert any("spec.searchSpace.knobs.async.staleFraction: reference cannot run this knob" in p for p in problems)


def test_a_baseline_verl_would_refuse_is_a_spec_problem():
    raw = raw_spec()
    raw["workload"]["command"] = [
        c.replace("ppo_max_token_len_per_gpu=24576", "ppo_max_token_len_per_gpu=8192")
        for c in raw["workload"]["command"]
    ]
    problems = [str(p) for p in check_spec(spec_of(raw))]
    assert any(p.startswith("spec.workload.command:") and "ppo_max_token_len_per_gpu" in p for p in problems), problems


def test_a_verl_job_ends_with_a_command_verl_loads():
    """The lifecycle on a made-up cluster: status names the adapter and the dropped knobs, and the
    winner's full command composes in verl 0.9.1's own Hydra config with the winning values."""
    raw = raw_spec()
    raw["budget"] |= {"maxTrials": 4, "parallelTrials": 2, "confirmSteps": 6}
    spec = spec_of(raw)
    status, events = drive(spec)
    assert status.phase == Phase.SUCCEEDED, status.message
    assert status.framework == "verl 0.9.1 (megatron)"
    assert {d.knob for d in status.dropped_knobs} >= {"cpu.rolloutThreads", "cpu.trainerThreads"}
    assert any(e.reason == "KnobsDropped" for e in events)
    best = status.best
    assert best.command[:3] == ["python3", "-m", "verl.trainer.main_ppo"] or best.mode != "hybrid-engine"
    assert all(o in best.command for o in best.overrides)
    assert not any(o.startswith("rltune.") for o in best.command)
    cfg = compose(best.command)  # raises if verl would not load it
    knobs = registry.adapter_for("verl").read(best.command)
    winner = spec.baseline.with_knobs(best.config).flat()
    for k, v in knobs.items():
        if k not in ("gpus", "trainerGpus"):
            assert winner[k] == v, (k, winner[k], v)
    assert int(cfg.data.max_response_length) == 20480  # the user's own overrides survive


def test_a_trial_is_a_rayjob_on_the_gpu_pool():
    spec = spec_of(raw_spec())
    owner = {"apiVersion": "rltune.io/v1alpha1", "kind": "RLTuningJob", "name": "j", "uid": "u", "controller": True}
    settings = OperatorSettings(bridgeImage="example.com/rltune/trial:9")
    m = rayjob.rayjob_manifest("ns", "j", owner, spec, "t3", spec.baseline, 5, "http://pgw:9091", settings)
    assert (m["apiVersion"], m["kind"], m["metadata"]["name"]) == ("ray.io/v1", "RayJob", "j-t3")
    assert m["metadata"]["labels"][LABEL_JOB] == "j" and m["metadata"]["labels"][LABEL_TRIAL] == "t3"
    assert m["metadata"]["ownerReferences"][0]["uid"] == "u"
    s = m["spec"]
    assert s["shutdownAfterJobFinishes"] and s["submissionMode"] == "K8sJobMode"
    assert s["activeDeadlineSeconds"] == spec.budget.trial_timeout_seconds
    assert s["submitterConfig"]["backoffLimit"] == rayjob.SUBMITTER_RETRIES > 2  # beyond KubeRay's default
    head = s["rayClusterSpec"]["headGroupSpec"]["template"]
    workers = s["rayClusterSpec"]["workerGroupSpecs"]
    assert len(workers) == 1 and workers[0]["replicas"] == 1  # 16 GPUs on 8-GPU nodes: head + 1 worker
    for tpl in (head, workers[0]["template"]):
        c = tpl["spec"]["containers"][0]
        assert c["resources"]["requests"][GPU_RESOURCE] == "8" and c["image"] == spec.workload.image
        assert tpl["spec"]["affinity"]["nodeAffinity"] and tpl["metadata"]["labels"][LABEL_TRIAL] == "t3"
        assert tpl["spec"]["securityContext"]["runAsNonRoot"] is True
    assert head["metadata"]["labels"][LABEL_RANK] == "0"
    init = head["spec"]["initContainers"][0]
    assert init["image"] == "example.com/rltune/trial:9" and "--install" in init["command"]
    ep = s["entrypoint"]
    assert "rltune.adapters.bridge" in ep and "--trial t3" in ep and "http://pgw:9091" in ep
    assert "trainer.total_training_steps=5" in ep and "verl.trainer.main_ppo" in ep and "--gpus 16" in ep
    assert "--names " not in ep  # (--namespace is there)
    named = spec.model_copy(
        update={"metrics": spec.metrics.model_copy(update={"names": {"step_duration_seconds": "s"}})}
    )
    ep = rayjob.rayjob_manifest("ns", "j", owner, named, "t3", spec.baseline, 5, "http://pgw:9091", settings)["spec"]
    assert """--names '{"step_duration_seconds":"s"}'""" in ep["entrypoint"]
    pods = rayjob.pods_of(m)
    assert [p["metadata"]["labels"].get(LABEL_RANK) for p in pods] == ["0", "worker"]


def test_rayjob_outcome():
    assert rayjob.outcome({"status": {"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete"}}) == (True, "")
    ok, why = rayjob.outcome({"status": {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "message": "boom"}})
    assert not ok and "boom" in why
    assert rayjob.outcome({"status": {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}}) == (False, "")
    assert rayjob.outcome(None) == (False, "")


def test_job_podtemplate_reaches_every_ray_pod():
    raw = copy.deepcopy(raw_spec())
    raw["resources"]["podTemplate"] = {
        "containers": [{"name": "trial", "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}]
    }
    spec = spec_of(raw)
    m = rayjob.rayjob_manifest("ns", "j", None, spec, "t1", spec.baseline, 3, "http://pgw:9091", OperatorSettings())
    for p in rayjob.pods_of(m):
        assert {"name": "NCCL_DEBUG", "value": "WARN"} in p["spec"]["containers"][0]["env"]


@pytest.mark.parametrize("example", ["verl-dapo-b300.yaml", "openrlhf-grpo-b300.yaml"])
def test_the_examples_load_with_the_frameworks_own_loaders(example):
    """Each example's baseline command, and its first trial's command, load in the framework's own
    config loader (verl: Hydra compose; OpenRLHF: train_ppo_ray's real parser and asserts)."""
    from test_adapter_openrlhf import parse

    raw = yaml.safe_load((EXAMPLE.parent / example).read_text())["spec"]
    spec = spec_of(raw)
    assert check_spec(spec) == []
    for cmd in (registry.user_command(spec), registry.framework_command(spec, spec.baseline, steps=3).argv):
        if spec.workload.framework == "verl":
            cfg = compose(cmd)
            assert int(cfg.data.train_batch_size) == spec.workload.task.prompts_per_step
        else:
            entry = cmd.index("openrlhf.cli.train_ppo_ray")
            args = parse(cmd[entry + 1 :])
            assert args is not None


def test_rltune_frameworks_prints_each_adapters_coverage(capsys):
    from rltune.cli import main

    assert main(["frameworks"]) == 0
    out = capsys.readouterr().out
    for fw in registry.FRAMEWORKS:
        ad = registry.adapter_for(fw)
        for backend in ad.backends:
            rules = ad.rules(backend)
            assert set(knob_paths()) <= set(rules)  # every canonical knob has a treatment
            n = {
                t: sum(1 for r in rules.values() if str(r.treatment) == t) for t in ("mapped", "transformed", "refused")
            }
            head = f"{fw} {ad.version}, backend {backend}: {n['mapped']} mapped, {n['transformed']} transformed"
            assert head in out


def test_expert_parallel_on_a_one_gpu_verl_replica_is_a_problem():
    """verl sets expert_parallel_size = tp x dp: at rollout.tp 1 the flag is lost, so such a
    configuration is never proposed (its status would claim a setting the command does not carry)."""
    spec = spec_of(raw_spec())
    assert spec.workload.model.resolved().is_moe
    ad = registry.adapter_for("verl")
    one = spec.baseline.with_knobs({"rollout.tp": 1, "rollout.expertParallel": True})
    two = spec.baseline.with_knobs({"rollout.tp": 2, "rollout.expertParallel": True})
    assert any("one-GPU replica" in p for p in ad.problems(spec, one, spec.workload.command))
    assert not any("one-GPU replica" in p for p in ad.problems(spec, two, spec.workload.command))
    space = Space(spec)
    assert space.framework_problem(one.flat() | {"gpus": one.gpus or 16}) is not None
