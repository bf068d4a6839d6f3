"""trainer.etp (Megatron's expert tensor parallel size) through every part that reads it: the API's one
form, the twin's layout rule and costs, the physics, the search space, the validation message and
verl's own config loader."""

import dataclasses

import numpy as np
import pytest
from test_tuner_fixtures import job

from rltune.api.models import ModelSpec, RLConfig, TaskSpec, TrainerKnobs
from rltune.tuner import physics
from rltune.tuner.search import Space
from rltune.tuner.validation import check_spec
from rltune.twin import Infeasible
from rltune.twin.efficiency import efficiency
from rltune.twin.simulate import make_plan
from rltune.twin.training import train_cost

MOE = ModelSpec(preset="qwen3-30b-a3b").resolved()  # 128 experts of width 768
TASK = TaskSpec(promptsPerStep=128, samplesPerPrompt=8, maxPromptTokens=1024, maxResponseTokens=4096)


def _trainer(gpus: int, **trainer) -> RLConfig:
    return RLConfig.model_validate(dict(gpus=gpus, trainer=dict(recompute="full", **trainer)))


def _cost(gpus: int, **trainer):
    c = _trainer(gpus, **trainer)
    p = make_plan(MOE, TASK, "H200", 8, c)
    seqs = np.full(TASK.prompts_per_step * TASK.samples_per_prompt, 3000)
    return train_cost(MOE, seqs, "H200", 8, gpus, c, efficiency("H200"), p.reference)


def test_etp_equal_to_tp_is_the_unset_default():
    assert TrainerKnobs(tp=2, etp=2).etp is None
    assert TrainerKnobs(tp=2).expert_tp == 2 and TrainerKnobs(tp=2, etp=1).expert_tp == 1
    assert RLConfig().with_knobs({"trainer.tp": 4, "trainer.etp": 4}).trainer.etp is None


def test_the_twin_refuses_what_megatron_refuses_and_names_the_fix():
    """24 GPUs: EP8 x ETP2 (the default ETP = TP) does not divide them, EP8 x ETP1 does."""
    with pytest.raises(Infeasible, match="trainer.etp 1"):
        _cost(24, tp=2, ep=8)
    assert _cost(24, tp=2, ep=8, etp=1).training > 0


def test_experts_whole_on_a_gpu_train_faster_and_take_more_memory():
    """16 GPUs on two 8-GPU nodes, TP2 EP8: with ETP 2 the expert group spans both nodes (the
    all-to-all crosses the NIC) and each expert GEMM is half as wide; with ETP 1 it stays inside a
    node, but each GPU holds twice the expert weights."""
    split, whole = _cost(16, tp=2, ep=8), _cost(16, tp=2, ep=8, etp=1)
    assert whole.training < 0.9 * split.training
    assert whole.mem_gib > split.mem_gib
    # in one node (8 GPUs, EP4) only the GEMM width differs: ETP 1 still a little faster
    assert _cost(8, tp=2, ep=4, etp=1).training < _cost(8, tp=2, ep=4).training


def test_the_physics_shards_experts_and_routes_the_all_to_all_as_the_layout_says():
    mf, tf = physics.facts(MOE), physics.task_facts(TASK)
    k = dict(_trainer(16, tp=2, ep=8).flat(), **{"gpus": 16})
    split = physics.trainer_of(mf, tf, "H200", 16, physics.TrainerKnobs.of(k))
    whole = physics.trainer_of(mf, tf, "H200", 16, physics.TrainerKnobs.of(dict(k, **{"trainer.etp": 1})))
    assert split.feasible and whole.feasible
    assert whole.state_frac > split.state_frac  # experts over 8 GPUs, not 16
    assert whole.training < split.training  # the all-to-all inside one node
    refused = physics.trainer_of(mf, tf, "H200", 24, physics.TrainerKnobs.of(k))
    assert not refused.feasible and "ep*etp=16" in refused.reason
    # in one node only the expert GEMMs' width differs, as in the twin: whole experts a little faster
    node = dict(_trainer(8, tp=2, ep=4).flat(), **{"gpus": 8})
    assert physics.trainer_of(mf, tf, "H200", 8, physics.TrainerKnobs.of(dict(node, **{"trainer.etp": 1}))).training < (
        physics.trainer_of(mf, tf, "H200", 8, physics.TrainerKnobs.of(node)).training
    )


def test_a_change_of_expert_layout_reads_as_its_values():
    from rltune.tuner.records import config_changes

    base = _trainer(16, tp=2, ep=8)
    assert config_changes(base, base.with_knobs({"trainer.etp": 1}), 16) == {"trainer.etp": (2, 1)}
    assert config_changes(base, base.with_knobs({"trainer.tp": 1}), 16) == {"trainer.tp": (2, 1)}


def test_the_search_offers_etp_1_for_moe_models_only_once_per_layout():
    sp = Space(job())  # seed-35b-a3b, 32 B300s, baseline TP2 EP8
    assert sp.values["trainer.etp"] == [None, 1]
    base = {k: v for k, v in sp.base.items() if k.startswith("trainer.")}
    assert sp.trainer_valid(base | {"trainer.tp": 2, "trainer.etp": 1}, 32) is None
    assert sp.trainer_valid(base | {"trainer.tp": 1, "trainer.etp": None}, 32) is None
    # TP1 ETP1 is TP1 with ETP unset: one layout, enumerated once, in the form RLConfig keeps
    halves = sp.halves(("trainer.tp", "trainer.etp"))
    pairs = [(h["trainer.tp"], h["trainer.etp"]) for h in halves]
    assert (1, 1) not in pairs and pairs.count((1, None)) == 1 and (2, 1) in pairs and (2, None) in pairs
    assert len(pairs) == len(set(pairs)) == 2 * len(sp.values["trainer.tp"]) - 1
    one, other = sp.base | {"trainer.tp": 1, "trainer.etp": 1}, sp.base | {"trainer.tp": 1, "trainer.etp": None}
    assert sp.config_key(one) == sp.config_key(other)
    assert "EP*ETP 16" in sp.trainer_valid(base | {"trainer.tp": 2}, 24)
    assert sp.trainer_valid(base | {"trainer.tp": 2, "trainer.etp": 1}, 24) is None
    dense = Space(job(workload={"framework": "twin", "model": {"preset": "qwen3-32b"}, "task": {"kind": "math"}}))
    assert dense.values["trainer.etp"] == [None]


def test_a_baseline_etp_that_does_not_fit_names_the_field_and_the_value_that_does():
    raw = job().model_dump(by_alias=True, exclude_none=True)
    raw["baseline"]["trainer"]["pp"] = 2  # 16 GPUs a stage: EP8 x ETP2 = 16 fits; make it EP16
    raw["baseline"]["trainer"]["ep"] = 16
    from rltune.api.models import RLTuningJobSpec

    (p,) = check_spec(RLTuningJobSpec.model_validate(raw))
    assert p.field == "spec.baseline.trainer.etp"
    assert "set trainer.etp 1" in p.message and p.message.endswith("(valid here: trainer.etp 1)")


def test_a_fully_sharded_trainer_holds_a_shard_of_its_whole_state():
    """FSDP (verl's fsdp/fsdp2 backends) shards weights, gradients and optimizer over the trainer's
    GPUs; Megatron's distributed optimizer shards only the optimizer. Qwen3-30B-A3B on 8 GPUs: the
    whole state is ~16 bytes x 30.5B / 8 ~ 61 GB a GPU, not the ~230 GB of whole weights and grads."""
    mf = physics.facts(ModelSpec(preset="qwen3-30b-a3b").resolved())
    tf = physics.task_facts(TASK)
    t = physics.TrainerKnobs(1, 1, 1, 1, None, 8192, "full", False)
    megatron = physics.trainer_of(mf, tf, "H100", 8, t)
    fsdp = physics.trainer_of(mf, dataclasses.replace(tf, fully_sharded=True), "H100", 8, t)
    hbm = 80e9
    assert megatron.state_frac * hbm > 200e9
    assert 55e9 < fsdp.state_frac * hbm < 70e9
