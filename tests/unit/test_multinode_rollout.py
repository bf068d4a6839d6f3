"""Rollout replicas that span nodes (GitHub issue 17): a DeepSeek-V3-sized MoE whose weights do not
fit in one node's GPUs is tunable. The knob ranges grow past the node only when the model needs it,
the search's rules accept whole-node replicas, the forecaster's physics charges the collectives that
cross the NICs (and not those inside an NVL72 rack), and a tuning run on the twin finds a faster
configuration where the knob ranges of one node gave nothing that fits."""

import pytest

from bench.oracle import true_objective
from bench.run import measured_baseline, run_rltune
from rltune.api.hardware import gpu
from rltune.api.models import RLTuningJobSpec
from rltune.api.status import TrialState
from rltune.tuner import physics
from rltune.tuner.knobs import BY_PATH, MAX_REPLICA_NODES
from rltune.tuner.search import Space
from rltune.tuner.validation import check_spec


def _spec(preset="deepseek-v3", gpu_type="H200", gpn=8, budget=128, rollout_tp=16, **space) -> RLTuningJobSpec:
    return RLTuningJobSpec.model_validate(
        {
            "workload": {
                "framework": "twin",
                "model": {"preset": preset},
                "task": {
                    "kind": "math",
                    "promptsPerStep": 256,
                    "samplesPerPrompt": 16,
                    "maxPromptTokens": 1024,
                    "maxResponseTokens": 16384,
                },
                "scenario": {"noise": 0.03},
            },
            "resources": {"gpuType": gpu_type, "gpuBudget": budget, "gpusPerNode": gpn},
            "baseline": {
                "gpus": budget,
                "placement": "colocated",
                "trainer": {"tp": 2, "pp": 4, "ep": 32, "etp": 1, "microBatchTokens": 16384, "recompute": "full"},
                "rollout": {"tp": rollout_tp, "expertParallel": True, "gpuMemoryUtilization": 0.75},
            },
            "searchSpace": {"frozen": ["rollout.fp8"], **space},
            "constraints": {"maxStaleness": 1},
            "budget": {"maxTrials": 8, "stepsPerTrial": 4, "warmupSteps": 1, "trialTimeoutSeconds": 86400},
        }
    )


def _values(path, spec):
    return BY_PATH[path].values(spec, spec.workload.model.resolved())


def test_rollout_tp_grows_past_the_node_only_when_the_weights_need_it():
    # 671B in bf16 is 168 GB per GPU at TP 8: more than an H200 holds; whole nodes up to the first TP
    # that leaves half the GPU to the KV cache (32), and never partial nodes
    big = _values("rollout.tp", _spec())
    assert big[:4] == [1, 2, 4, 8] and 16 in big and 32 in big
    assert all(t % 8 == 0 for t in big if t > 8) and max(big) <= MAX_REPLICA_NODES * 8
    # GB200 nodes hold 4 GPUs: replicas of 8 and 16 GPUs are whole multiples of the node
    rack = _values("rollout.tp", _spec(gpu_type="GB200", gpn=4))
    assert {8, 16} <= set(rack) and all(t % 4 == 0 for t in rack if t > 4)
    # a model that fits a node keeps the node's range (the spaces of the benchmark's jobs are unchanged)
    assert _values("rollout.tp", _spec(preset="qwen3-30b-a3b", gpu_type="B300", rollout_tp=2)) == [1, 2, 4, 8]


def test_trainer_ranges_widen_only_for_a_model_whose_state_does_not_fit():
    wide, narrow = _spec(), _spec(preset="qwen3-30b-a3b", gpu_type="B300", rollout_tp=2)
    assert 32 in _values("trainer.ep", wide) and 8 in _values("trainer.pp", wide)
    assert max(_values("trainer.ep", narrow)) == 16 and _values("trainer.pp", narrow) == [1, 2, 4]


def test_the_search_accepts_whole_node_replicas_and_names_the_fix_for_partial_ones():
    sp = Space(_spec())
    r = {"rollout.tp": 16, "rollout.expertParallel": True}
    assert sp.rollout_valid(r, 64) is None
    assert "part of a node" in sp.rollout_valid(dict(r, **{"rollout.tp": 12}), 48)
    assert "too many nodes" in sp.rollout_valid(dict(r, **{"rollout.tp": 128}), 128)
    problems = check_spec(_spec(gpu_type="GB200", gpn=4, rollout_tp=8))
    assert not any(p.field == "spec.baseline.rollout.tp" for p in problems)
    bad = _spec(gpn=8, budget=48, rollout_tp=12)
    found = [p for p in check_spec(bad) if p.field == "spec.baseline.rollout.tp"]
    assert found and "whole number" in found[0].message and "valid here" in found[0].message


def _gen_seconds(gpu_type: str, gpn: int, tp: int) -> float:
    spec = _spec(gpu_type=gpu_type, gpn=gpn)
    mf = physics.facts_cached(spec.workload.model.resolved())
    tf = physics.task_facts_cached(spec.workload.task)
    reach = gpu(gpu_type).nvlink_reach(gpn)
    knobs = physics.RolloutKnobs(tp, True, 0.85, 256, 8192, True, True, False)
    ro = physics.rollout_part(mf, tf, gpu_type, 64, knobs, reach)
    assert ro.feasible, ro.reason
    return ro.bulk + ro.tail


def test_physics_charges_the_nics_for_a_replica_spanning_nodes_not_the_rack():
    # GB200 and B200 share compute and HBM figures within 4%: at TP 4 (inside a node either way) they
    # differ only by that; at TP 16 the B200 replica crosses two NIC boundaries, the GB200 one stays
    # inside the rack's NVLink domain
    inside = _gen_seconds("B200", 8, 8) / _gen_seconds("GB200", 4, 8)
    across = _gen_seconds("B200", 8, 16) / _gen_seconds("GB200", 4, 16)
    assert across > inside * 1.02
    # the same replica on nodes of 8 H200s: TP 16 crosses the NICs, and its collectives cost more than
    # its own NVLink collectives at TP 8 would (but it does not cost a multiple of the step)
    h8, h16 = _gen_seconds("H200", 8, 8), _gen_seconds("H200", 8, 16)
    assert 0.5 * h8 < h16 < 2.0 * h8


def test_inside_a_node_the_reach_changes_nothing():
    a = _gen_seconds("B300", 8, 8)
    mf = physics.facts_cached(_spec().workload.model.resolved())
    tf = physics.task_facts_cached(_spec().workload.task)
    b = physics.rollout_part(mf, tf, "B300", 64, physics.RolloutKnobs(8, True, 0.85, 256, 8192, True, True, False), 72)
    assert b.bulk + b.tail == pytest.approx(a, rel=1e-12)


@pytest.fixture(scope="module")
def tuned():
    spec = _spec()
    rn, base = measured_baseline("dsv3-h200-span", spec)
    return spec, rn, base, run_rltune(rn, base, 8, seed=0)


def test_a_model_too_big_for_one_node_gets_tuned_across_nodes(tuned):
    spec, rn, base, res = tuned
    # on one node (TP <= 8) the twin runs out of rollout memory: the knob ranges of one node could not
    # tune this job at all
    one_node = spec.baseline.with_knobs({"rollout.tp": 8, "rollout.gpuMemoryUtilization": 0.9})
    assert true_objective(spec, one_node) is None or not true_objective(spec, one_node)[0]
    done = [r for r in res["history"] if r.state == TrialState.SUCCEEDED]
    assert len(done) >= 4
    assert all(r.config.rollout.tp > 8 for r in done)  # every measured replica spans nodes
    best = min(r.summary.step_time_mean for r in done)
    assert base.summary.step_time_mean / best > 1.3
    assert res["forecast_error"] is not None and res["forecast_error"] < 0.2


def test_the_twin_and_the_physics_agree_on_what_crossing_costs(tuned):
    """The forecaster's physics and the twin both make TP 32 (four nodes) slower to generate than
    TP 16 on the same GPUs at the same memory share: more replicas are lost than the halved weight
    reads win, and the collectives cross more NICs."""
    spec, rn, *_ = tuned
    m, budget = spec.workload.model.resolved(), spec.resources.gpu_budget
    cfg16 = spec.baseline.with_knobs({"rollout.gpuMemoryUtilization": 0.85})
    cfg32 = cfg16.with_knobs({"rollout.tp": 32})
    twin16, twin32 = (rn.run(c, f"x{c.rollout.tp}", 5)[0].phases["generation"] for c in (cfg16, cfg32))
    fc16, fc32 = (
        physics.breakdown(m, spec.workload.task, "H200", 8, physics.Knobs.of(c.flat()), budget).phases["generation"]
        for c in (cfg16, cfg32)
    )
    assert (twin32 > twin16) == (fc32 > fc16)
