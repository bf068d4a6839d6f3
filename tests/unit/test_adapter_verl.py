"""The verl adapter (rltune/adapters/verl.py) against verl 0.9.1's own Hydra configs.

Round trip: the rendered command is composed with verl's configs (hydra.compose on the config
directory and config name of the mode's entry point, exactly the overrides the command passes),
the knobs are read back from the composed config and compared with the RLConfig, for each
trainer backend (fsdp, fsdp2, megatron) and each mode (hybrid engine, separate rollout,
one-step-off, fully-async). Hydra refuses an override of a key the config lacks, so composing
also checks the override grammar. verl and hydra-core must be installed (hack/setup.sh): a
missing one fails these tests, it does not skip them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import os
from pathlib import Path

import hydra
import pytest
import yaml
from omegaconf import OmegaConf

from rltune.adapters.base import Treatment
from rltune.adapters.verl import (
    FULLY_ASYNC,
    HYBRID,
    MODULES,
    ONE_STEP,
    SEPARATE,
    Verl,
    _Cmd,
    split_override,
    verl,
)
from rltune.adapters.verl_loader import compose
from rltune.api.models import RLConfig, RLTuningJobSpec, knob_paths

VERL_ROOT = os.path.dirname(importlib.util.find_spec("verl").origin)
VERL_VERSION = importlib.metadata.version("verl")

BASE = [
    "data.train_files=/data/train.parquet",
    "data.train_batch_size=512",
    "data.max_prompt_length=1024",
    "data.max_response_length=4096",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.rollout.name=vllm",
    "trainer.logger=[console,wandb]",
]
MAIN = ["python3", "-m", "verl.trainer.main_ppo"]
COMMANDS = {
    "fsdp": MAIN + BASE,
    "fsdp2": MAIN + BASE + ["actor_rollout_ref.actor.strategy=fsdp2"],
    "megatron": MAIN + ["--config-name=ppo_megatron_trainer"] + BASE,
}


def spec_for(command: list[str], **constraints) -> RLTuningJobSpec:
    return RLTuningJobSpec.model_validate(
        {
            "workload": {
                "framework": "verl",
                "command": command[:3],
                "args": command[3:],
                "model": {"preset": "qwen2.5-7b"},
                "task": {"promptsPerStep": 512, "maxPromptTokens": 1024, "maxResponseTokens": 4096},
            },
            "resources": {"gpuType": "H200", "gpuBudget": 16, "gpusPerNode": 8},
            "constraints": constraints or {"maxStaleness": 2},
        }
    )


def config_for(backend: str, mode: str) -> RLConfig:
    megatron = backend == "megatron"
    knobs = {
        "gpus": 16,
        "trainer": {
            "tp": 2 if megatron else 1,
            "pp": 2 if megatron else 1,
            "cp": 2,
            "ep": 1,
            "microBatchTokens": 32768,
            "recompute": "full",
            "offload": True,
        },
        "rollout": {
            "tp": 4,
            "gpuMemoryUtilization": 0.7,
            "maxNumSeqs": 512,
            "maxNumBatchedTokens": 16384,
            "cudaGraphs": False,
            "fp8": True,
        },
    }
    if megatron and mode == ONE_STEP:
        knobs["trainer"]["recompute"] = "selective"
    if mode != HYBRID:
        knobs |= {"placement": "disaggregated", "trainerGpus": 8}
    if mode == ONE_STEP:
        knobs |= {"async": {"staleness": 1}, "weightSync": "checkpoint-engine"}
    if mode == FULLY_ASYNC:
        knobs |= {"async": {"staleness": 2, "partialRollout": True}}
    return RLConfig.model_validate(knobs)


def compose_command(argv: list[str], mode: str):
    """verl's composed config for `argv` (the mode's config dir, the --config-name the argv names)."""
    assert _Cmd(argv).mode == mode
    return compose(argv)


BACKEND_SYNC = {"naive": "nccl", "nccl": "nccl", "kimi_ckpt_engine": "checkpoint-engine"}


def knobs_of(cfg, backend: str, mode: str) -> dict:
    """The canonical knobs a composed verl config runs with (independent of the adapter's read)."""
    ar = cfg.actor_rollout_ref
    out: dict = {}
    if backend == "megatron":
        meg, ref = ar.actor.megatron, ar.ref.megatron
        for knob, key in (
            ("tp", "tensor_model_parallel_size"),
            ("pp", "pipeline_model_parallel_size"),
            ("cp", "context_parallel_size"),
            ("ep", "expert_model_parallel_size"),
            ("etp", "expert_tensor_parallel_size"),
        ):
            out[f"trainer.{knob}"] = meg[key]
            assert ref[key] == meg[key], f"ref.megatron.{key} disagrees with the actor's"
        otc = meg.override_transformer_config
        out["trainer.recompute"] = otc.recompute_granularity or "none"
        if otc.recompute_granularity == "full":
            assert (otc.recompute_method, otc.recompute_num_layers) == ("uniform", 1)
        out["trainer.offload"] = meg.param_offload and meg.optimizer_offload
        assert "fsdp_config" not in ar.actor
    else:
        assert ar.actor.strategy == backend and ar.ref.strategy == backend
        out["trainer.tp"] = out["trainer.pp"] = out["trainer.ep"] = 1
        out["trainer.etp"] = None
        out["trainer.cp"] = ar.actor.ulysses_sequence_parallel_size
        assert ar.ref.ulysses_sequence_parallel_size == out["trainer.cp"]
        out["trainer.recompute"] = "full" if ar.model.enable_gradient_checkpointing else "none"
        f = ar.actor.fsdp_config
        out["trainer.offload"] = f.param_offload and f.optimizer_offload and ar.ref.fsdp_config.param_offload
        assert "megatron" not in ar.actor
    assert ar.actor.use_dynamic_bsz and ar.rollout.log_prob_use_dynamic_bsz
    out["trainer.microBatchTokens"] = ar.actor.ppo_max_token_len_per_gpu
    r = ar.rollout
    out["rollout.tp"] = r.tensor_model_parallel_size
    out["rollout.expertParallel"] = r.expert_parallel_size > 1
    out["rollout.gpuMemoryUtilization"] = r.gpu_memory_utilization
    out["rollout.maxNumSeqs"] = r.max_num_seqs
    out["rollout.maxNumBatchedTokens"] = r.max_num_batched_tokens
    out["rollout.cudaGraphs"] = not r.enforce_eager
    out["rollout.fp8"] = r.quantization == "fp8"
    out["weightSync"] = BACKEND_SYNC[r.checkpoint_engine.backend]
    out["placement"] = "colocated" if ar.hybrid_engine else "disaggregated"
    trainer = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    if mode == HYBRID:
        out["gpus"], out["trainerGpus"] = trainer, None
        out.update({"async.staleness": 0, "async.partialRollout": False, "async.staleFraction": None})
        assert "async_training" not in cfg
    else:
        out["trainerGpus"] = trainer
        out["gpus"] = trainer + cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node
    if mode == ONE_STEP:
        out.update({"async.staleness": 1, "async.partialRollout": False, "async.staleFraction": None})
        assert "async_training" not in cfg
    if mode in (SEPARATE, FULLY_ASYNC):
        s = cfg.async_training.staleness_threshold
        out["async.staleness"] = math.ceil(s)
        out["async.staleFraction"] = s if 0 < s <= 1 else None
        out["async.partialRollout"] = cfg.async_training.partial_rollout
        assert cfg.data.train_batch_size == 0  # fully_async_rollouter.py asserts it
        n = ar.actor.ppo_mini_batch_size * cfg.async_training.require_batches
        assert n * cfg.async_training.trigger_parameter_sync_step == 512  # the same prompts per weight sync
    else:
        assert cfg.data.train_batch_size == 512
    return out


def test_verl_version():
    print(f"verl {VERL_VERSION} (adapter checked against {Verl.version})")
    assert VERL_VERSION == Verl.version == "0.9.1"
    assert hydra.__version__.startswith("1.3")


# --------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("mode", [HYBRID, SEPARATE, ONE_STEP, FULLY_ASYNC])
@pytest.mark.parametrize("backend", ["fsdp", "fsdp2", "megatron"])
def test_round_trip(backend, mode):
    command = COMMANDS[backend]
    spec, config = spec_for(command), config_for(backend, mode)
    assert verl.backend(command) == backend
    assert verl.problems(spec, config, command) == []
    fc = verl.command(spec, config, command)
    assert fc.mode == mode
    assert fc.entry[:3] == ("python3", "-m", MODULES[mode])
    assert fc.entry[3] == f"--config-name={Verl.config_name(mode, backend)}"
    keys = [split_override(t)[0] for t in fc.overrides]
    assert len(keys) == len(set(keys)), "a key is written twice"
    assert not [k for k in keys if k.startswith("rltune.")]
    assert "data.train_files=/data/train.parquet" in fc.overrides  # the user's own overrides are kept
    cfg = compose_command(fc.argv, mode)
    want = {k: v for k, v in config.flat().items() if k != "cpu"}
    assert knobs_of(cfg, backend, mode) == want
    # the adapter's own inverse agrees
    got = verl.read(fc.argv)
    assert {k: got[k] for k in got} == {k: want[k] for k in got}
    # the trial command composes too, with its step count and no checkpoints or validation
    trial = verl.trial_command(spec, config, command, steps=5)
    tcfg = compose_command(trial.argv, mode)
    assert tcfg.trainer.total_training_steps == 5
    assert (tcfg.trainer.save_freq, tcfg.trainer.test_freq, tcfg.trainer.val_before_train) == (-1, -1, False)
    assert list(tcfg.trainer.logger) == ["console", "wandb"]
    if mode in (SEPARATE, FULLY_ASYNC):
        assert tcfg.rollout.total_rollout_steps == 5 * 512
    assert knobs_of(tcfg, backend, mode) == want


@pytest.mark.parametrize("mode", [HYBRID, ONE_STEP, FULLY_ASYNC])
def test_round_trip_megatron_by_model_engine(mode):
    """`model_engine=megatron` on ppo_trainer selects Megatron too; the override is kept and composes
    with every mode's (non-megatron-named) config."""
    command = MAIN + ["model_engine=megatron"] + BASE
    assert verl.backend(command) == "megatron"
    spec, config = spec_for(command), config_for("megatron", mode)
    fc = verl.command(spec, config, command)
    assert fc.entry[3] == f"--config-name={Verl.config_name(mode, 'fsdp')}"
    assert "model_engine=megatron" in fc.overrides
    cfg = compose_command(fc.argv, mode)
    assert cfg.actor_rollout_ref.actor.strategy == "megatron"
    assert knobs_of(cfg, "megatron", mode) == {k: v for k, v in config.flat().items() if k != "cpu"}


def test_round_trip_stale_fraction_and_partial():
    command = COMMANDS["fsdp"]
    spec = spec_for(command)
    config = config_for("fsdp", HYBRID).with_knobs(
        {"placement": "disaggregated", "trainerGpus": 8, "async.staleness": 1, "async.staleFraction": 0.5}
    )
    fc = verl.command(spec, config, command)
    assert fc.mode == FULLY_ASYNC
    cfg = compose_command(fc.argv, FULLY_ASYNC)
    assert cfg.async_training.staleness_threshold == 0.5 and cfg.async_training.partial_rollout is False
    assert knobs_of(cfg, "fsdp", FULLY_ASYNC) == {k: v for k, v in config.flat().items() if k != "cpu"}


# --------------------------------------------------------------------------- modes and entry points


def fully_async_command() -> list[str]:
    return [
        "python3",
        "-m",
        "verl.experimental.fully_async_policy.fully_async_main",
        "--config-name=fully_async_ppo_megatron_trainer",
        "data.train_files=/data/train.parquet",
        "data.train_batch_size=0",
        "data.gen_batch_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.hybrid_engine=False",
        "async_training.staleness_threshold=0.25",
        "async_training.trigger_parameter_sync_step=4",
        "async_training.require_batches=2",
        "async_training.partial_rollout=True",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=8",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
        "rltune.trainer.tp=2",
    ]


def test_read_fully_async_command():
    command = fully_async_command()
    assert verl.backend(command) == "megatron"
    got = verl.read(command)
    assert got["placement"] == "disaggregated"
    assert (got["async.staleness"], got["async.staleFraction"], got["async.partialRollout"]) == (1, 0.25, True)
    assert (got["gpus"], got["trainerGpus"], got["weightSync"]) == (16, 8, "nccl")
    assert got["trainer.recompute"] == "none" and got["rollout.tp"] == 2  # verl's defaults


def test_leaving_fully_async_switches_entry_and_drops_its_keys():
    command = fully_async_command()
    spec = spec_for(command)
    config = RLConfig().with_knobs({"gpus": 16, "trainer.recompute": "selective"})
    fc = verl.command(spec, config, command)
    assert fc.mode == HYBRID
    assert fc.entry == ("python3", "-m", "verl.trainer.main_ppo", "--config-name=ppo_megatron_trainer")
    keys = {split_override(t)[0]: split_override(t)[1] for t in fc.overrides}
    assert not [k for k in keys if k.startswith(("async_training.", "rollout.", "rltune."))]
    assert "data.gen_batch_size" not in keys
    # the prompts per step the fully-async command ran (32 * 2 * 4) become main_ppo's train batch
    assert keys["data.train_batch_size"] == "256"
    assert keys["actor_rollout_ref.hybrid_engine"] == "True"
    assert keys["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "naive"
    cfg = compose_command(fc.argv, HYBRID)
    assert cfg.data.train_batch_size == 256 and cfg.actor_rollout_ref.hybrid_engine is True


def test_staying_fully_async_keeps_the_users_trigger_and_batch():
    command = fully_async_command()
    spec = spec_for(command)
    config = RLConfig.model_validate(
        {"gpus": 16, "placement": "disaggregated", "trainerGpus": 8, "async": {"staleness": 2}}
    )
    fc = verl.command(spec, config, command)
    assert fc.mode == FULLY_ASYNC
    assert fc.entry == (
        "python3",
        "-m",
        "verl.experimental.fully_async_policy.fully_async_main",
        "--config-name=fully_async_ppo_megatron_trainer",
    )
    assert "async_training.require_batches=2" in fc.overrides
    assert "async_training.trigger_parameter_sync_step=4" in fc.overrides
    cfg = compose_command(fc.argv, FULLY_ASYNC)
    assert cfg.async_training.staleness_threshold == 2.0 and cfg.data.train_batch_size == 0
    trial = verl.trial_command(spec, config, command, steps=3)
    assert "rollout.total_rollout_steps=768" in trial.overrides  # 3 steps * 32 * 2 * 4 prompts


@pytest.mark.parametrize(
    "knobs, mode",
    [
        ({}, HYBRID),
        ({"placement": "disaggregated", "trainerGpus": 8}, SEPARATE),
        ({"placement": "disaggregated", "trainerGpus": 8, "async.staleness": 1}, ONE_STEP),
        ({"placement": "disaggregated", "trainerGpus": 8, "async.staleness": 2}, FULLY_ASYNC),
        (
            {"placement": "disaggregated", "trainerGpus": 8, "async.staleness": 1, "async.partialRollout": True},
            FULLY_ASYNC,
        ),
        (
            {"placement": "disaggregated", "trainerGpus": 8, "async.staleness": 1, "async.staleFraction": 1.0},
            FULLY_ASYNC,
        ),
    ],
)
def test_mode_rules(knobs, mode):
    command = COMMANDS["fsdp"]
    fc = verl.command(
        spec_for(command), RLConfig().with_knobs({"gpus": 16, "trainer.recompute": "full"} | knobs), command
    )
    assert fc.mode == mode and fc.entry[2] == MODULES[mode]
    # read inverts the mode
    got = verl.read(fc.argv)
    for k, v in knobs.items():
        assert got[k] == v, k


def test_script_entry_and_flags_are_kept():
    command = ["python", "verl/trainer/main_ppo.py", "--config-name", "ppo_trainer", "hydra.run.dir=/tmp/x"] + BASE
    spec = spec_for(command)
    fc = verl.command(spec, RLConfig().with_knobs({"gpus": 16, "trainer.recompute": "full"}), command)
    assert fc.entry == ("python", "verl/trainer/main_ppo.py", "--config-name=ppo_trainer")
    assert "hydra.run.dir=/tmp/x" in fc.overrides
    one = RLConfig().with_knobs(
        {"gpus": 16, "trainer.recompute": "full", "placement": "disaggregated", "trainerGpus": 8, "async.staleness": 1}
    )
    fc = verl.command(spec, one, command)
    assert fc.entry == ("python", "-m", MODULES[ONE_STEP], "--config-name=one_step_off_ppo_trainer")


def test_user_overrides_replaced_not_duplicated():
    command = COMMANDS["megatron"] + [
        "actor_rollout_ref.rollout.max_num_seqs=64",
        "+actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4",
        "actor_rollout_ref.actor.megatron.optimizer_offload=True",
    ]
    spec = spec_for(command)
    config = RLConfig().with_knobs({"gpus": 16, "trainer.tp": 2, "rollout.maxNumSeqs": 1024})
    fc = verl.command(spec, config, command)
    keys = [split_override(t)[0] for t in fc.overrides]
    assert len(keys) == len(set(keys))
    assert "actor_rollout_ref.rollout.max_num_seqs=1024" in fc.overrides
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.5" in fc.overrides
    assert "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2" in fc.overrides  # kept in agreement
    # offload unchanged from the user's (partial) offload: the user's own keys stay as written
    config = config.with_knobs({"trainer.offload": True})
    fc = verl.command(spec, config, command)
    assert "actor_rollout_ref.actor.megatron.optimizer_offload=True" in fc.overrides
    assert not [t for t in fc.overrides if t.startswith("actor_rollout_ref.actor.megatron.param_offload")]
    compose_command(fc.argv, HYBRID)


# --------------------------------------------------------------------------- each knob's keys


def _keys(backend: str, config: RLConfig) -> dict[str, str]:
    command = COMMANDS[backend]
    fc = verl.command(spec_for(command), config, command)
    return dict(split_override(t) for t in fc.overrides)


@pytest.mark.parametrize(
    "backend, knob, value, expected",
    [
        ("megatron", "trainer.tp", 4, {"actor_rollout_ref.actor.megatron.tensor_model_parallel_size": "4"}),
        ("megatron", "trainer.pp", 2, {"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": "2"}),
        ("megatron", "trainer.cp", 2, {"actor_rollout_ref.actor.megatron.context_parallel_size": "2"}),
        ("megatron", "trainer.ep", 1, {"actor_rollout_ref.actor.megatron.expert_model_parallel_size": "1"}),
        (
            "megatron",
            "trainer.recompute",
            "full",
            {
                "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity": "full",
                "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method": "uniform",
                "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers": "1",
            },
        ),
        (
            "megatron",
            "trainer.recompute",
            "selective",
            {"actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity": "selective"},
        ),
        (
            "megatron",
            "trainer.recompute",
            "none",
            {"actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity": "null"},
        ),
        (
            "megatron",
            "trainer.offload",
            True,
            {
                "actor_rollout_ref.actor.megatron.param_offload": "True",
                "actor_rollout_ref.actor.megatron.optimizer_offload": "True",
            },
        ),
        ("fsdp", "trainer.cp", 2, {"actor_rollout_ref.actor.ulysses_sequence_parallel_size": "2"}),
        ("fsdp", "trainer.recompute", "none", {"actor_rollout_ref.model.enable_gradient_checkpointing": "False"}),
        ("fsdp2", "trainer.recompute", "full", {"actor_rollout_ref.model.enable_gradient_checkpointing": "True"}),
        (
            "fsdp",
            "trainer.offload",
            True,
            {
                "actor_rollout_ref.actor.fsdp_config.param_offload": "True",
                "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "True",
                "actor_rollout_ref.ref.fsdp_config.param_offload": "True",
            },
        ),
        (
            "fsdp",
            "trainer.microBatchTokens",
            32768,
            {
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "32768",
                "actor_rollout_ref.actor.use_dynamic_bsz": "True",
            },
        ),
        ("fsdp", "rollout.tp", 4, {"actor_rollout_ref.rollout.tensor_model_parallel_size": "4"}),
        ("fsdp", "rollout.gpuMemoryUtilization", 0.8, {"actor_rollout_ref.rollout.gpu_memory_utilization": "0.8"}),
        ("fsdp", "rollout.maxNumSeqs", 128, {"actor_rollout_ref.rollout.max_num_seqs": "128"}),
        ("fsdp", "rollout.maxNumBatchedTokens", 16384, {"actor_rollout_ref.rollout.max_num_batched_tokens": "16384"}),
        ("fsdp", "rollout.cudaGraphs", False, {"actor_rollout_ref.rollout.enforce_eager": "True"}),
        ("fsdp", "rollout.fp8", True, {"actor_rollout_ref.rollout.quantization": "fp8"}),
        ("fsdp", "rollout.fp8", False, {"actor_rollout_ref.rollout.quantization": "null"}),
        ("fsdp", "gpus", 8, {"trainer.nnodes": "1", "trainer.n_gpus_per_node": "8"}),
        ("fsdp", "gpus", 16, {"trainer.nnodes": "2", "trainer.n_gpus_per_node": "8"}),
        ("fsdp", "gpus", 4, {"trainer.nnodes": "1", "trainer.n_gpus_per_node": "4"}),
    ],
)
def test_knob_keys(backend, knob, value, expected):
    base = {"gpus": 16, "trainer.recompute": "full" if backend != "megatron" else "selective"}
    keys = _keys(backend, RLConfig().with_knobs(base | {knob: value}))
    assert {k: keys.get(k) for k in expected} == expected
    family = "fsdp_config" if backend == "megatron" else ".megatron."
    assert not [k for k in keys if family in k], "Megatron and FSDP keys mixed"


def test_expert_parallel_and_pools():
    command = COMMANDS["fsdp"] + ["actor_rollout_ref.rollout.data_parallel_size=2"]
    fc = verl.command(
        spec_for(command), RLConfig().with_knobs({"gpus": 16, "rollout.tp": 2, "rollout.expertParallel": True}), command
    )
    assert "actor_rollout_ref.rollout.expert_parallel_size=4" in fc.overrides  # tp * dp (RolloutConfig asserts)
    config = RLConfig().with_knobs(
        {"gpus": 16, "placement": "disaggregated", "trainerGpus": 8, "async.staleness": 1, "weightSync": "nccl"}
    )
    keys = dict(split_override(t) for t in verl.command(spec_for(COMMANDS["fsdp"]), config, COMMANDS["fsdp"]).overrides)
    assert {
        k: keys[k] for k in ("trainer.nnodes", "trainer.n_gpus_per_node", "rollout.nnodes", "rollout.n_gpus_per_node")
    } == {
        "trainer.nnodes": "1",
        "trainer.n_gpus_per_node": "8",
        "rollout.nnodes": "1",
        "rollout.n_gpus_per_node": "8",
    }
    assert keys["actor_rollout_ref.hybrid_engine"] == "False"
    assert keys["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "nccl"


# --------------------------------------------------------------------------- rules, values, refusal


@pytest.mark.parametrize("backend", ["fsdp", "fsdp2", "megatron"])
def test_rules_cover_every_knob(backend):
    rules = verl.rules(backend)
    assert set(knob_paths()) <= set(rules)
    for knob, rule in rules.items():
        assert rule.knob == knob
        if rule.treatment == Treatment.REFUSED:
            assert not rule.keys and rule.note, knob
        else:
            assert rule.keys, knob
        wrong = "fsdp_config" if backend == "megatron" else "megatron"
        assert not [k for k in rule.keys if wrong in k], (knob, rule.keys)
    assert rules["cpu.rolloutThreads"].treatment == Treatment.REFUSED
    assert rules["rollout.cudaGraphs"].treatment == Treatment.TRANSFORMED
    assert rules["placement"].treatment == Treatment.TRANSFORMED
    refused = {k for k, r in rules.items() if r.treatment == Treatment.REFUSED}
    if backend == "megatron":
        assert refused == {"cpu", "cpu.rolloutThreads", "cpu.trainerThreads"}
    else:
        assert refused == {
            "cpu",
            "cpu.rolloutThreads",
            "cpu.trainerThreads",
            "trainer.tp",
            "trainer.pp",
            "trainer.ep",
            "trainer.etp",
        }


def test_values():
    fsdp, meg = spec_for(COMMANDS["fsdp"]), spec_for(COMMANDS["megatron"])
    assert verl.values("trainer.tp", fsdp) == [1] and verl.values("trainer.tp", meg) is None
    assert verl.values("trainer.recompute", fsdp) == ["none", "full"]
    assert verl.values("trainer.recompute", meg) == ["none", "selective", "full"]
    assert verl.values("weightSync", fsdp) == ["nccl", "checkpoint-engine"]
    assert verl.values("async.staleness", fsdp) == [0, 1, 2]
    assert verl.values("async.staleness", spec_for(COMMANDS["fsdp"], maxStaleness=0)) == [0]
    assert verl.values("async.staleFraction", spec_for(COMMANDS["fsdp"], maxStaleness=0)) == [None]
    assert None in verl.values("async.staleFraction", fsdp)
    assert verl.values("cpu.trainerThreads", fsdp) == []
    assert verl.values("rollout.maxNumSeqs", fsdp) is None


# --------------------------------------------------------------------------- problems


def _problems(backend: str, **knobs) -> list[str]:
    command = COMMANDS[backend]
    base = {"gpus": 16, "trainer.recompute": "full" if backend != "megatron" else "selective"}
    return verl.problems(spec_for(command), RLConfig().with_knobs(base | knobs), command)


@pytest.mark.parametrize(
    "backend, knobs, needle",
    [
        ("fsdp", {"trainer.microBatchTokens": 4096}, "ppo_max_token_len_per_gpu"),
        ("megatron", {"trainer.microBatchTokens": 4096}, "ppo_max_token_len_per_gpu"),
        ("megatron", {"trainer.tp": 4, "trainer.pp": 4, "gpus": 8}, "tensor_model_parallel_size"),
        ("megatron", {"trainer.tp": 8}, "attention heads"),
        ("megatron", {"trainer.ep": 2}, "expert_model_parallel_size"),
        ("fsdp", {"trainer.tp": 2}, "trainer.tp=2"),
        ("fsdp", {"trainer.recompute": "selective"}, "enable_gradient_checkpointing"),
        ("fsdp", {"trainer.cp": 8}, "ulysses_sequence_parallel_size"),
        ("fsdp", {"async.staleness": 1}, "placement=colocated"),
        ("fsdp", {"weightSync": "checkpoint-engine"}, "in-process"),
        ("fsdp", {"placement": "disaggregated"}, "trainerGpus"),
        ("fsdp", {"placement": "disaggregated", "trainerGpus": 8, "weightSync": "disk"}, "checkpoint_engine backend"),
        ("fsdp", {"placement": "disaggregated", "trainerGpus": 8, "async.partialRollout": True}, "partialRollout"),
        ("fsdp", {"gpus": 12}, "whole number"),
        ("fsdp", {"placement": "disaggregated", "trainerGpus": 11}, "same share of every node"),
        ("fsdp", {"rollout.tp": 8}, "tensor_model_parallel_size (8)"),
        ("fsdp", {"gpus": 24, "rollout.tp": 12}, "not whole nodes"),
        ("fsdp", {"rollout.expertParallel": True}, "MoE"),
    ],
)
def test_problems(backend, knobs, needle):
    found = _problems(backend, **knobs)
    assert any(needle in p for p in found), found


def test_no_problems_for_a_sound_configuration():
    assert _problems("fsdp") == []
    assert _problems("megatron", **{"trainer.tp": 2, "trainer.pp": 2}) == []


def test_problem_for_a_batch_fully_async_cannot_split():
    command = (
        MAIN + [t for t in BASE if "ppo_mini_batch_size" not in t] + ["actor_rollout_ref.actor.ppo_mini_batch_size=96"]
    )
    config = RLConfig().with_knobs(
        {"gpus": 16, "trainer.recompute": "full", "placement": "disaggregated", "trainerGpus": 8, "async.staleness": 2}
    )
    assert any("trigger_parameter_sync_step" in p for p in verl.problems(spec_for(command), config, command))


def test_composed_config_is_plain_data():
    """The composed config resolves (every interpolation the rendered keys feed is valid)."""
    command = COMMANDS["megatron"]
    fc = verl.command(spec_for(command), config_for("megatron", FULLY_ASYNC), command)
    OmegaConf.to_container(compose_command(fc.argv, FULLY_ASYNC), resolve=True)


def test_expert_tensor_parallel_reaches_verl_and_comes_back():
    """trainer.etp on a Megatron MoE job: read from the user's command, written for the actor and the
    reference it sets, composed by verl's own configs; a layout Megatron-core would refuse is named."""
    moe = ["actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B"]
    user = (
        COMMANDS["megatron"]
        + moe
        + [
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8",
            "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
            "actor_rollout_ref.ref.megatron.expert_tensor_parallel_size=1",
        ]
    )
    got = verl.read(user)
    assert (got["trainer.tp"], got["trainer.ep"], got["trainer.etp"]) == (2, 8, 1)
    assert verl.read(COMMANDS["megatron"])["trainer.etp"] is None  # verl's default: null (= the dense TP)
    spec = spec_for(user).model_copy(deep=True)
    spec.workload.model = spec.workload.model.model_copy(update={"preset": "qwen3-30b-a3b"})
    spec.resources.gpu_budget = 24
    for etp, want in ((1, 1), (None, None)):
        config = RLConfig.model_validate(
            {"gpus": 16, "trainer": {"tp": 2, "ep": 8, "etp": etp, "microBatchTokens": 16384}}
        )
        assert verl.problems(spec, config, user) == []
        cfg = compose_command(verl.command(spec, config, user).argv, HYBRID)
        meg, ref = cfg.actor_rollout_ref.actor.megatron, cfg.actor_rollout_ref.ref.megatron
        assert meg.expert_tensor_parallel_size == want and ref.expert_tensor_parallel_size == want
    # 24 GPUs: EP8 x ETP2 (null = TP 2) does not divide them; EP8 x ETP1 does
    wide = RLConfig.model_validate({"gpus": 24, "trainer": {"tp": 2, "ep": 8, "microBatchTokens": 16384}})
    (problem,) = verl.problems(spec, wide, user)
    assert "expert_tensor_parallel_size (2)" in problem and "set trainer.etp 1" in problem
    assert verl.problems(spec, wide.with_knobs({"trainer.etp": 1}), user) == []


# --------------------------------------------------------------------------- issue 58: real launch scripts


def _overrides(cmd) -> dict:
    return dict(split_override(t) for t in cmd.overrides if split_override(t)[0])


def test_a_layout_sharing_every_node_is_accepted_and_written_per_node():
    """verl's one-step-off 4+12: trainer 2 x 6 and rollout 2 x 2 on two 8-GPU nodes."""
    config = RLConfig().with_knobs(
        {"gpus": 16, "trainer.recompute": "full", "placement": "disaggregated", "trainerGpus": 12, "async.staleness": 1}
    )
    command = COMMANDS["fsdp"]
    assert verl.problems(spec_for(command), config, command) == []
    w = _overrides(verl.command(spec_for(command), config, command))
    assert (w["trainer.nnodes"], w["trainer.n_gpus_per_node"], w["rollout.nnodes"], w["rollout.n_gpus_per_node"]) == (
        "2",
        "6",
        "2",
        "2",
    )


def test_offload_read_and_written_through_megatrons_own_optimizer_option():
    """`+...override_optimizer_config.optimizer_cpu_offload=True` offloads the optimizer too: the
    baseline reads offload on, and a plan turning it off turns that option off as well."""
    opt = "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload"
    command = COMMANDS["megatron"] + [f"+{opt}=True"]
    assert verl.read(command)["trainer.offload"] is True
    config = RLConfig().with_knobs({"gpus": 16, "trainer.offload": False})
    cmd = verl.command(spec_for(command), config, command)
    assert _overrides(cmd)[opt] == "False"
    assert [t for t in cmd.overrides if opt in t] == [f"++{opt}=False"]  # added to verl's empty dict, once


def test_a_fixed_micro_batch_is_read_as_its_tokens_and_kept():
    """No dynamic batching: the baseline's microBatchTokens is ppo_micro_batch_size_per_gpu x (max prompt
    + response), and a plan that keeps it does not turn dynamic batching on."""
    command = [t for t in COMMANDS["fsdp"] if "use_dynamic_bsz" not in t and "ppo_max_token_len" not in t] + [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"
    ]
    spec = spec_for(command)
    read = verl.read(command)
    given = dict(split_override(t) for t in command if "=" in t)
    seq = int(given["data.max_prompt_length"]) + int(given["data.max_response_length"])
    assert read["trainer.microBatchTokens"] == 2 * seq
    same = RLConfig().with_knobs(read | {"gpus": 16})
    assert "actor_rollout_ref.actor.use_dynamic_bsz" not in _overrides(verl.command(spec, same, command))
    bigger = same.with_knobs({"trainer.microBatchTokens": 4 * seq})
    assert _overrides(verl.command(spec, bigger, command))["actor_rollout_ref.actor.use_dynamic_bsz"] == "True"


def test_the_run_length_is_carried_into_fully_async_and_back():
    """trainer.total_training_steps x prompts per step becomes rollout.total_rollout_steps (fully-async's
    rollouter counts prompts), and back; the ignored key is not left behind."""
    command = COMMANDS["fsdp"] + ["trainer.total_training_steps=100"]
    spec = spec_for(command)
    fa = RLConfig().with_knobs(
        {"gpus": 16, "trainer.recompute": "full", "placement": "disaggregated", "trainerGpus": 8, "async.staleness": 2}
    )
    w = _overrides(verl.command(spec, fa, command))
    assert w["rollout.total_rollout_steps"] == str(100 * 512)
    assert "trainer.total_training_steps" not in w
    assert w["algorithm.rollout_correction.bypass_mode"] == "False"  # the hybrid run's setting, not fully-async's
    back_cmd = list(verl.command(spec, fa, command).argv)
    hybrid = RLConfig().with_knobs({"gpus": 16, "trainer.recompute": "full"})
    w2 = _overrides(verl.command(spec_for(back_cmd), hybrid, back_cmd))
    assert w2["trainer.total_training_steps"] == "100" and w2["data.train_batch_size"] == "512"
    assert w2["algorithm.rollout_correction.bypass_mode"] == "False"


def test_any_listed_stale_fraction_verl_runs_is_searched_and_others_refused_by_name():
    """verl takes any staleness_threshold in (0, 1]: a job's listed 0.3 is searched, not left out
    because it is not one of the default candidates (issue 62); 0 is refused, naming the range."""
    from rltune import admission
    from rltune.tuner.search import Space

    root = Path(__file__).resolve().parents[2]
    raw = yaml.safe_load((root / "examples" / "verl-dapo-b300.yaml").read_text())["spec"]
    raw["searchSpace"] = {"knobs": {"async.staleFraction": [0.3, 0.7]}}
    assert Space(admission.admit(raw)).values["async.staleFraction"] == [0.3, 0.7]
    raw["searchSpace"] = {"knobs": {"async.staleFraction": [0.3, 0]}}
    with pytest.raises(admission.Refused, match=r"verl cannot run \[0\]: use values in \(0, 1\]"):
        admission.admit(raw)
