"""rltune.grpo's pure parts (task, reward, advantages, micro-batching, thread plan): no torch/vLLM needed."""

import os

import pytest

from rltune.api.models import TrialSpec
from rltune.grpo.loop import advantages, micro_batches, thread_plan
from rltune.grpo.model import qwen2_config
from rltune.grpo.task import BOS, EOS, SEP, ReverseTask


def test_reverse_task_reward():
    t = ReverseTask(max_digits=6)
    p = [BOS, 5, 6, 7, SEP]
    assert t.target(p) == [7, 6, 5, EOS]
    assert t.reward(p, [7, 6, 5, EOS]) == 1.0
    assert t.reward(p, [7, 6, 4, EOS]) == 0.75
    assert t.reward(p, [7, 6, 5, 5, EOS]) == pytest.approx(3 / 5)  # too long costs
    assert t.reward(p, []) == 0.0


def test_prompts_are_seeded_and_bounded():
    t = ReverseTask.for_budget(16, 16)
    a, b = t.prompts(3, 5, 8), t.prompts(3, 5, 8)
    assert a == b and a != t.prompts(3, 6, 8)
    assert all(p[0] == BOS and p[-1] == SEP and 5 <= len(p) <= t.max_prompt_len for p in a)
    assert ReverseTask.for_budget(6, 5).max_digits == 4
    with pytest.raises(ValueError, match="maxPromptTokens"):
        ReverseTask.for_budget(4, 16)


def test_advantages_are_group_relative():
    adv = advantages([1.0, 0.0, 0.5, 0.5], [0, 0, 1, 1])
    assert adv[0] == pytest.approx(1.0, abs=1e-4) and adv[1] == pytest.approx(-1.0, abs=1e-4)
    assert adv[2] == adv[3] == 0.0


def test_micro_batches_respect_the_token_budget():
    lengths = [10, 12, 8, 14, 9, 11]
    groups = micro_batches(lengths, 30)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert all(len(g) * max(lengths[i] for i in g) <= 30 for g in groups)
    assert micro_batches(lengths, 10_000) == [list(range(6))]
    assert micro_batches([50, 50], 10) == [[0], [1]]  # one sequence over budget still trains


def test_thread_plan():
    base = {"model": {"preset": "tiny-qwen2"}, "mode": "real"}
    s0 = TrialSpec.model_validate(base)
    s1 = TrialSpec.model_validate(base | {"config": {"async": {"staleness": 1}}})
    n = len(os.sched_getaffinity(0))
    p0, p1 = thread_plan(s0), thread_plan(s1)
    assert p0["rollout_threads"] == p0["trainer_threads"] == n
    assert p1["rollout_threads"] + p1["trainer_threads"] <= max(2, n)
    if n >= 2:
        assert set(p1["rollout_cpus"]).isdisjoint(p1["trainer_cpus"])
    s2 = TrialSpec.model_validate(base | {"config": {"cpu": {"rolloutThreads": 1, "trainerThreads": 64}}})
    p2 = thread_plan(s2)
    assert (p2["rollout_threads"], p2["trainer_threads"], p2["trainer_cpus"]) == (1, 64, None)


def test_qwen2_config_from_preset_and_rejects_moe():
    from rltune.api.models import ModelSpec

    cfg = qwen2_config(ModelSpec(preset="tiny-qwen2").resolved(), 15)
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (
        2,
        128,
        2,
        64,
    )
    with pytest.raises(ValueError, match="dense"):
        qwen2_config(
            ModelSpec(layers=2, hidden=64, heads=2, vocab=64, experts=4, activeExperts=2, expertFfn=32).resolved(), 15
        )
    with pytest.raises(ValueError, match="vocabulary"):
        qwen2_config(ModelSpec(layers=2, hidden=64, heads=2, vocab=8).resolved(), 15)


def test_cli_loads_the_cpu_example_as_a_real_trial():
    from pathlib import Path

    from rltune.grpo.__main__ import load

    ex = Path(__file__).resolve().parents[2] / "examples" / "real-grpo-cpu.yaml"
    spec = load(str(ex), steps=3, staleness=1, seed=4)
    assert spec.mode == "real" and spec.gpu_type == "CPU"
    assert (spec.steps, spec.seed, spec.config.async_.staleness) == (3, 4, 1)
    assert spec.config.rollout.max_num_seqs == 8 and spec.model.preset == "tiny-qwen2"
    ReverseTask.for_budget(spec.task.max_prompt_tokens, spec.task.max_response_tokens)


def test_the_trainer_allocator_defaults_to_expandable_segments_and_yields_to_the_user(monkeypatch):
    from rltune.grpo.loop import ALLOC_CONF, trainer_allocator

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    trainer_allocator()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == ALLOC_CONF == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")  # the user chose PyTorch's default
    trainer_allocator()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == ""
