"""The OpenRLHF adapter: canonical knobs <-> `python3 -m openrlhf.cli.train_ppo_ray` options (0.11.2).

Checked against OpenRLHF 0.11.2's own argument parser (openrlhf/cli/train_ppo_ray.py, built inside
`if __name__ == "__main__"`; tests/unit/test_adapter_openrlhf.py runs that real parser on every
command this module renders). 0.11.2 spells its options with dots (`--vllm.tensor_parallel_size`);
the old underscored names (`--vllm_tensor_parallel_size`) are gone. Booleans are argparse
`store_true` flags: present = true, absent = false; `--flag=true` is an argparse error, so a flag the
configuration turns off is removed from the user's command, never rendered as `=false`.

One entry point serves every mode: train_ppo_ray picks `PPOTrainerAsync` when
`--train.async_enable` is given (train() "Select trainer by mode") and the plain `PPOTrainer`
otherwise. The only trainer backend is DeepSpeed (`get_strategy` -> `DeepspeedStrategy`).

Modes (FrameworkCommand.mode):
- colocate-all: placement colocated, staleness 0: `--train.colocate_all` puts the DeepSpeed models
  and the vLLM engines in one placement group (train(): `pg if colocate_all and not async_enable`);
  actor GPUs must equal vllm num_engines * tensor_parallel_size (assert in train()).
- disaggregated: placement disaggregated, staleness 0: vLLM engines get their own GPUs.
- async: staleness >= 1: `--train.async_enable --train.async_queue_size N` (separate pools: with
  async, colocate_all colocates only the DeepSpeed models, never vLLM).
- async-partial-rollout: plus `--train.partial_rollout_enable` (parser: requires async_enable).

Staleness: the async trainer (trainer/ppo_trainer_async.py) hands out `async_queue_size` slot tokens;
the generator takes one before generating a batch and the trainer returns it when it takes a batch
off the queue, before training on it; weights are broadcast after each train step, never during a
generation (VLLMLock). A batch is therefore generated at most `async_queue_size` policy versions
before the trainer trains on it: canonical async.staleness = N >= 1 is `--train.async_enable
--train.async_queue_size N`; 0 is the synchronous trainer.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from ..api.models import RLConfig, RLTuningJobSpec
from .base import FrameworkCommand, KnobRule, Treatment

ENTRY = ("python3", "-m", "openrlhf.cli.train_ppo_ray")
MODULE = "openrlhf.cli.train_ppo_ray"
BACKEND = "deepspeed"
SOURCE = "openrlhf/cli/train_ppo_ray.py"

# OpenRLHF 0.11.2's parser defaults of the options this module reads (train_ppo_ray.py, `__main__`);
# the tests compare this table with the real parser's defaults.
DEFAULTS: dict[str, Any] = {
    "--actor.num_nodes": 1,
    "--actor.num_gpus_per_node": 8,
    "--ref.num_nodes": 1,
    "--ref.num_gpus_per_node": 8,
    "--critic.num_nodes": 1,
    "--critic.num_gpus_per_node": 8,
    "--reward.num_nodes": 1,
    "--reward.num_gpus_per_node": 8,
    "--vllm.num_engines": None,
    "--vllm.tensor_parallel_size": 1,
    "--vllm.gpu_memory_utilization": 0.95,
    "--vllm.sync_backend": "nccl",
    "--ds.tensor_parallel_size": 1,
    "--ds.ring_attn_size": 1,
    "--ds.ring_attn_head_stride": 1,
    "--ds.param_dtype": "bf16",
    "--train.max_tokens_per_gpu": 16192,
    "--train.async_queue_size": 1,
    "--train.batch_size": 128,
    "--train.micro_batch_size": 1,
    "--rollout.batch_size": 1024,
    "--rollout.micro_batch_size": 1,
    "--rollout.n_samples_per_prompt": 1,
    "--rollout.vllm_generate_batch_size": None,
    "--algo.kl.init_coef": 0.01,
    "--algo.advantage.estimator": "gae",
    "--data.max_len": 2048,
}
# store_true options this module sets or removes (all default False in 0.11.2)
FLAGS = frozenset(
    {
        "--train.colocate_all",
        "--train.colocate_actor_ref",
        "--train.async_enable",
        "--train.partial_rollout_enable",
        "--train.dynamic_batch_enable",
        "--ds.packing_samples",
        "--vllm.enforce_eager",
        "--vllm.enable_sleep",
        "--ds.enable_sleep",
        "--ds.adam_offload",
        "--actor.gradient_checkpointing_enable",
        "--ckpt.load_enable",
        "--ckpt.save_hf",
    }
)

# where a short trial writes what OpenRLHF always saves at the end (train(): actor_model.async_save_model())
TRIAL_DIR = "/tmp/rltune-trial"

_R, _T, _X = Treatment.MAPPED, Treatment.TRANSFORMED, Treatment.REFUSED
PACKING = "--ds.packing_samples"
_PLACEMENT_KEYS = (
    "--train.colocate_all",
    "--vllm.enable_sleep",
    "--ds.enable_sleep",
    "--train.colocate_actor_ref",
    "--actor.num_nodes",
    "--actor.num_gpus_per_node",
    "--ref.num_nodes",
    "--ref.num_gpus_per_node",
    "--critic.num_nodes",
    "--critic.num_gpus_per_node",
    "--reward.num_nodes",
    "--reward.num_gpus_per_node",
    "--vllm.num_engines",
)
_RULES = (
    KnobRule(
        "placement",
        _T,
        _PLACEMENT_KEYS,
        "colocated = --train.colocate_all (DeepSpeed models and vLLM engines share one placement group; "
        "--vllm.enable_sleep and --ds.enable_sleep added when the user's command was not colocated) and "
        "actor GPUs = vllm num_engines * tensor_parallel_size; disaggregated = no colocate_all, vLLM engines on "
        "the GPUs the trainer does not use, the reference model on the actor's GPUs (--train.colocate_actor_ref). "
        "Colocated needs staleness 0: with --train.async_enable OpenRLHF colocates only the DeepSpeed models "
        "(train_ppo_ray.py train(): create_vllm_engines gets the shared placement group only without async)",
    ),
    KnobRule(
        "gpus",
        _T,
        ("--actor.num_nodes", "--actor.num_gpus_per_node", "--vllm.num_engines"),
        "colocated: actor GPUs = gpus = num_engines * rollout.tp; disaggregated: actor GPUs = trainerGpus, "
        "num_engines = (gpus - trainerGpus) / rollout.tp; GPUs over gpusPerNode as whole nodes "
        "(--actor.num_nodes x --actor.num_gpus_per_node)",
    ),
    KnobRule(
        "trainerGpus",
        _T,
        ("--actor.num_nodes", "--actor.num_gpus_per_node", "--vllm.num_engines"),
        "disaggregated: the actor's GPUs (num_nodes x num_gpus_per_node; ref/critic/reward groups sized alike); "
        "the rest serve vLLM engines",
    ),
    KnobRule(
        "trainer.tp",
        _R,
        ("--ds.tensor_parallel_size",),
        "DeepSpeed AutoTP (get_train_ds_config tensor_parallel.autotp_size; DeepspeedStrategy asserts bf16)",
    ),
    KnobRule(
        "trainer.pp",
        _X,
        (),
        "OpenRLHF 0.11.2 trains with DeepSpeed ZeRO only (utils/deepspeed/deepspeed.py: device mesh dp x sp x tp); "
        "train_ppo_ray.py has no pipeline-parallel option",
    ),
    KnobRule(
        "trainer.cp",
        _R,
        ("--ds.ring_attn_size",),
        "ring attention (sequence parallel) group size; the parser turns on --ds.packing_samples; needs the "
        "ring_flash_attn package",
    ),
    KnobRule(
        "trainer.ep",
        _X,
        (),
        "no expert-parallel option in train_ppo_ray.py (--ds.experts_implementation only picks the MoE kernel); "
        "DeepSpeed's mesh is dp x sp x tp",
    ),
    KnobRule("trainer.etp", _X, (), "no expert-parallel option in train_ppo_ray.py (see trainer.ep)"),
    KnobRule(
        "trainer.microBatchTokens",
        _T,
        ("--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", "--rollout.max_tokens_per_gpu", PACKING),
        "a token budget needs dynamic batching: --train.dynamic_batch_enable --train.max_tokens_per_gpu N (the "
        "log-prob passes' --rollout.max_tokens_per_gpu follows it where the command leaves it unset, and the "
        "parser turns --ds.packing_samples on with it); a command without it batches by --train.micro_batch_size "
        "samples: read as that many sequences of --data.max_len tokens, and kept unless the plan changes the size",
    ),
    KnobRule(
        "trainer.recompute",
        _T,
        ("--actor.gradient_checkpointing_enable",),
        "none = flag absent; selective/full = --actor.gradient_checkpointing_enable (HF gradient checkpointing "
        "recomputes every layer: there is no selective mode, so only none and full are searched)",
    ),
    KnobRule(
        "trainer.offload",
        _R,
        ("--ds.adam_offload",),
        "offloads the Adam optimizer state only (get_ds_train_config passes offload=False for the parameters)",
    ),
    KnobRule(
        "rollout.tp",
        _T,
        ("--vllm.tensor_parallel_size", "--vllm.num_engines"),
        "the engines' TP; --vllm.num_engines = rollout GPUs / TP follows",
    ),
    KnobRule(
        "rollout.expertParallel",
        _X,
        (),
        "create_vllm_engines (trainer/ray/vllm_engine.py) builds the engine arguments itself and passes no "
        "enable_expert_parallel; train_ppo_ray.py has no option for it",
    ),
    KnobRule("rollout.gpuMemoryUtilization", _R, ("--vllm.gpu_memory_utilization",), ""),
    KnobRule(
        "rollout.maxNumSeqs",
        _X,
        (),
        "create_vllm_engines passes no max_num_seqs (vLLM's default applies); train_ppo_ray.py has no option",
    ),
    KnobRule(
        "rollout.maxNumBatchedTokens",
        _X,
        (),
        "create_vllm_engines passes no max_num_batched_tokens (vLLM's default applies); no option",
    ),
    KnobRule(
        "rollout.cudaGraphs",
        _T,
        ("--vllm.enforce_eager",),
        "inverted: cudaGraphs false = --vllm.enforce_eager present, true = absent",
    ),
    KnobRule(
        "rollout.fp8",
        _X,
        (),
        "create_vllm_engines always serves dtype bfloat16 with no quantization argument; no option",
    ),
    KnobRule(
        "async.staleness",
        _T,
        ("--train.async_enable", "--train.async_queue_size"),
        "0 = synchronous PPOTrainer (both removed); N >= 1 = --train.async_enable --train.async_queue_size N: "
        "the generator may run N batches ahead of the trainer (ppo_trainer_async.py rollout_slots), so a batch "
        "lags the policy by at most N versions",
    ),
    KnobRule(
        "async.partialRollout",
        _R,
        ("--train.partial_rollout_enable",),
        "needs staleness >= 1 (the parser asserts --train.async_enable): vLLM pause/resume at weight sync",
    ),
    KnobRule(
        "async.staleFraction",
        _X,
        (),
        "OpenRLHF bounds staleness by whole batches (--train.async_queue_size) only; no fractional bound",
    ),
    KnobRule(
        "weightSync",
        _R,
        ("--vllm.sync_backend",),
        "only nccl: rank 0 broadcasts to the engines (CUDA IPC instead under colocate-all, ppo_actor.py "
        "use_cuda_ipc); checkpoint-engine and disk have no counterpart",
    ),
    KnobRule(
        "cpu.rolloutThreads",
        _X,
        (),
        "OpenRLHF runs on CUDA GPUs only (DeepSpeed on cuda device meshes, vLLM engines on Ray GPU bundles)",
    ),
    KnobRule("cpu.trainerThreads", _X, (), "OpenRLHF runs on CUDA GPUs only"),
)
RULES: dict[str, KnobRule] = {r.knob: r for r in _RULES}

# canonical values OpenRLHF itself runs for the refused knobs (a configuration asking for another is a problem)
_REFUSED_FIXED = {
    "trainer.pp": 1,
    "trainer.ep": 1,
    "trainer.etp": None,
    "rollout.expertParallel": False,
    "rollout.fp8": False,
    "async.staleFraction": None,
}


# --------------------------------------------------------------------------- command parsing


def _split(command: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """(entry point argv, the options after it). Raises ValueError if no train_ppo_ray entry is found."""
    cmd = list(command)
    for i, tok in enumerate(cmd):
        if tok == "-m" and i + 1 < len(cmd) and cmd[i + 1] == MODULE:
            return tuple(cmd[: i + 2]), cmd[i + 2 :]
        if tok.endswith("train_ppo_ray.py"):
            return tuple(cmd[: i + 1]), cmd[i + 1 :]
    if not cmd or cmd[0].startswith("--"):
        return ENTRY, cmd
    raise ValueError(
        f"spec.workload.command: found no OpenRLHF PPO entry point ({' '.join(ENTRY)}, or a path to "
        f"train_ppo_ray.py) in {' '.join(cmd)[:200]!r}: give the command that starts train_ppo_ray and its options"
    )


def _groups(options: Sequence[str]) -> list[tuple[Optional[str], list[str]]]:
    """The options as (name, tokens) groups in order: `--name v ...`, `--name=v` or a bare flag.
    Tokens before the first option form a group named None (kept as they are)."""
    out: list[tuple[Optional[str], list[str]]] = []
    for tok in options:
        if tok.startswith("--"):
            out.append((tok.split("=", 1)[0], [tok]))
        elif out:
            out[-1][1].append(tok)
        else:
            out.append((None, [tok]))
    return out


def _values(tokens: list[str]) -> list[str]:
    head = tokens[0]
    return ([head.split("=", 1)[1]] if "=" in head else []) + tokens[1:]


def _options(options: Sequence[str]) -> dict[str, Any]:
    """Option name -> its last value as the user wrote it (a bare flag -> True; several values -> list)."""
    out: dict[str, Any] = {}
    for name, tokens in _groups(options):
        if name is None:
            continue
        vals = _values(tokens)
        out[name] = True if not vals else vals[0] if len(vals) == 1 else vals
    return out


class _Opts:
    """Typed access to the user's options, falling back on OpenRLHF 0.11.2's defaults."""

    def __init__(self, options: Sequence[str]):
        self.raw = _options(options)

    def has(self, name: str) -> bool:
        return name in self.raw

    def flag(self, name: str) -> bool:
        v = self.raw.get(name, False)
        return v is True or (isinstance(v, str) and v.lower() in ("true", "1"))

    def get(self, name: str, conv=str) -> Any:
        v = self.raw.get(name, DEFAULTS.get(name))
        if v is None or v is True:
            return DEFAULTS.get(name) if v is True else None
        try:
            return conv(v)
        except (TypeError, ValueError):
            return DEFAULTS.get(name)

    def int(self, name: str) -> Optional[int]:
        return self.get(name, lambda v: int(float(v)))

    def float(self, name: str) -> Optional[float]:
        return self.get(name, float)

    # which model groups the command runs (train_ppo_ray.py train())
    def has_ref(self) -> bool:
        return (self.float("--algo.kl.init_coef") or 0) > 0

    def has_critic(self) -> bool:
        return self.get("--algo.advantage.estimator") == "gae"

    def has_reward_model(self) -> bool:
        return not self.has("--reward.remote_url") and not self.has("--train.agent_func_path")

    def batch(self, spec: RLTuningJobSpec) -> tuple[int, int]:
        """(prompts per step, samples per prompt): the command's, else the task's (command() writes the task's)."""
        task = spec.workload.task
        rbs = self.int("--rollout.batch_size") if self.has("--rollout.batch_size") else task.prompts_per_step
        n = self.int("--rollout.n_samples_per_prompt") if self.has("--rollout.n_samples_per_prompt") else None
        return rbs or task.prompts_per_step, n or task.samples_per_prompt

    def actor_gpus(self) -> int:
        return self.group_gpus("actor")

    def group_gpus(self, group: str) -> int:
        return (self.int(f"--{group}.num_nodes") or 1) * (self.int(f"--{group}.num_gpus_per_node") or 1)

    def side_groups(self) -> tuple[str, ...]:
        """The model groups the command runs on GPUs of their own, beside the actor's and the vLLM
        engines' (train_ppo_ray.py train(): a RayActorGroup without a shared placement group). Under
        --train.colocate_all every DeepSpeed model shares the actor's GPUs (with async too)."""
        if self.flag("--train.colocate_all"):
            return ()
        out = []
        if self.has_ref() and not self.flag("--train.colocate_actor_ref"):
            out.append("ref")
        if self.has_critic():
            out.append("critic")
        if self.has_reward_model() and not (self.has_critic() and self.flag("--train.colocate_critic_reward")):
            out.append("reward")
        return tuple(out)

    def side_gpus(self) -> int:
        """The GPUs of `side_groups`: counted with the trainer's, kept at the user's sizes."""
        return sum(self.group_gpus(g) for g in self.side_groups())

    def micro_batch_tokens(self) -> int:
        """The tokens one training micro-batch holds per GPU: the dynamic budget, else the fixed
        micro-batch of --train.micro_batch_size sequences of at most --data.max_len tokens."""
        if self.flag("--train.dynamic_batch_enable"):
            return self.int("--train.max_tokens_per_gpu")
        return (self.int("--train.micro_batch_size") or 1) * self.int("--data.max_len")


def _shape(gpus: int, gpn: int) -> tuple[int, int]:
    """(num_nodes, num_gpus_per_node) of a group of `gpus` GPUs on nodes of `gpn` GPUs."""
    return (1, gpus) if gpus <= gpn else (math.ceil(gpus / gpn), gpn)


def _fmt(v: Any) -> str:
    return repr(v) if isinstance(v, float) else str(v)


# --------------------------------------------------------------------------- the adapter


class OpenRLHFAdapter:
    framework = "openrlhf"
    version = "0.11.2"
    backends = ("deepspeed",)  # the trainer backends the mapping covers

    def entry_problem(self, command: Sequence[str]) -> Optional[str]:
        try:
            _split(command)
        except ValueError as e:
            return str(e).removeprefix("spec.workload.command: ")
        return None

    def read_task(self, command: Sequence[str]) -> dict[str, int]:
        """The task shape the command sets (TaskSpec field -> value). One RL step is one rollout batch of
        --rollout.batch_size prompts; a prompt is truncated to --data.max_len - --rollout.max_new_tokens
        (utils/agent.py SingleTurnAgentExecutor: max_initial_length = max_length - max_tokens)."""
        _, options = _split(command)
        o = _Opts(options)
        out: dict[str, int] = {}
        # what the command runs, OpenRLHF's defaults included (--rollout.batch_size 1024,
        # --rollout.n_samples_per_prompt 1): a task that says otherwise does not describe the run
        out["promptsPerStep"] = o.int("--rollout.batch_size")
        out["samplesPerPrompt"] = o.int("--rollout.n_samples_per_prompt")
        if o.has("--rollout.max_new_tokens") and o.int("--rollout.max_new_tokens"):
            out["maxResponseTokens"] = o.int("--rollout.max_new_tokens")
        if "maxResponseTokens" in out and o.has("--data.max_len") and o.int("--data.max_len"):
            prompt = o.int("--data.max_len") - out["maxResponseTokens"]
            if prompt >= 1:
                out["maxPromptTokens"] = prompt
        return out

    def backend(self, command: Sequence[str]) -> str:
        return BACKEND  # train_ppo_ray.py trains with DeepSpeed only (utils/utils.py get_strategy)

    def rules(self, backend: str) -> dict[str, KnobRule]:
        if backend != BACKEND:
            raise ValueError(f"OpenRLHF {self.version} has only the {BACKEND} trainer backend, not {backend!r}")
        return dict(RULES)

    # ----------------------------------------------------------------- read

    def read(self, command: Sequence[str]) -> dict[str, Any]:
        _, options = _split(command)
        o = _Opts(options)
        asynchronous = o.flag("--train.async_enable")
        colocated = o.flag("--train.colocate_all") and not asynchronous
        out: dict[str, Any] = {
            "trainer.tp": o.int("--ds.tensor_parallel_size"),
            "trainer.cp": o.int("--ds.ring_attn_size"),
            "trainer.recompute": "full" if o.flag("--actor.gradient_checkpointing_enable") else "none",
            "trainer.offload": o.flag("--ds.adam_offload"),
            "rollout.tp": o.int("--vllm.tensor_parallel_size"),
            "rollout.gpuMemoryUtilization": o.float("--vllm.gpu_memory_utilization"),
            "rollout.cudaGraphs": not o.flag("--vllm.enforce_eager"),
            "async.staleness": (o.int("--train.async_queue_size") or 1) if asynchronous else 0,
            "async.partialRollout": o.flag("--train.partial_rollout_enable"),
            "placement": "colocated" if colocated else "disaggregated",
        }
        out["trainer.microBatchTokens"] = o.micro_batch_tokens()
        if o.get("--vllm.sync_backend") == "nccl":
            out["weightSync"] = "nccl"
        engines = o.int("--vllm.num_engines")
        if engines:
            actor = o.actor_gpus()
            rollout = engines * (o.int("--vllm.tensor_parallel_size") or 1)
            if colocated:
                out["gpus"] = actor
            else:  # the trainer's GPUs are the actor's and those of the groups beside it
                out["gpus"] = actor + o.side_gpus() + rollout
                out["trainerGpus"] = actor + o.side_gpus()
        return out

    # ----------------------------------------------------------------- values

    def values(self, knob: str, spec: RLTuningJobSpec) -> Optional[list]:
        rule = RULES.get(knob)
        if rule is None or rule.treatment == Treatment.REFUSED:
            return None  # refused: the search pins it to the baseline
        if knob == "trainer.recompute":
            return ["none", "full"]
        if knob == "weightSync":
            return ["nccl"]
        return None  # async.staleness: any queue size >= 1 runs (ppo_trainer_async.py only refuses <= 0)

    # ----------------------------------------------------------------- layout

    def _pools(self, spec: RLTuningJobSpec, config: RLConfig, o: "_Opts") -> tuple[int, int, int]:
        """(gpus, the actor's GPUs, rollout GPUs) of a configuration: disaggregated, the trainer's GPUs
        less those of the model groups the command runs beside the actor (`_Opts.side_groups`)."""
        lay = spec.layout(config)
        if lay.colocated:
            return lay.gpus, lay.trainer, lay.rollout
        return lay.gpus, lay.trainer - o.side_gpus(), lay.rollout

    def _mode(self, config: RLConfig) -> str:
        if config.async_.staleness >= 1:
            return "async-partial-rollout" if config.async_.partial_rollout else "async"
        return "colocate-all" if config.placement == "colocated" else "disaggregated"

    # ----------------------------------------------------------------- problems

    def problems(self, spec: RLTuningJobSpec, config: RLConfig, command: Sequence[str]) -> list[str]:
        try:
            _, options = _split(command)
        except ValueError as e:
            return [str(e)]
        o = _Opts(options)
        out: list[str] = []
        flat = config.flat()
        for knob, fixed in _REFUSED_FIXED.items():
            if flat[knob] != fixed:
                out.append(
                    f"{knob} = {flat[knob]!r}: OpenRLHF {self.version} cannot run it ({RULES[knob].note}); "
                    f"use {fixed!r}"
                )
        if config.weight_sync != "nccl":
            out.append(f"weightSync = {config.weight_sync!r}: {RULES['weightSync'].note}; use nccl")
        if config.cpu is not None and (config.cpu.rollout_threads or config.cpu.trainer_threads):
            out.append("cpu.*: OpenRLHF runs on CUDA GPUs only; unset cpu.rolloutThreads/trainerThreads")

        gpn = spec.resources.gpus_per_node
        gpus, trainer, rollout = self._pools(spec, config, o)
        stale = config.async_.staleness
        rtp, ttp, tcp = config.rollout.tp, config.trainer.tp, config.trainer.cp
        if config.placement == "colocated":
            if stale >= 1:
                out.append(
                    f"placement colocated with async.staleness {stale}: with --train.async_enable OpenRLHF colocates "
                    "only the DeepSpeed models and starts the vLLM engines on GPUs of their own (train_ppo_ray.py "
                    "train(); the parser also refuses --vllm.enable_sleep with async): use placement disaggregated "
                    "or async.staleness 0"
                )
            if gpus % rtp:
                out.append(
                    f"--vllm.num_engines * --vllm.tensor_parallel_size must equal --actor.num_nodes * "
                    f"--actor.num_gpus_per_node under --train.colocate_all (assert in train_ppo_ray.py train()): "
                    f"rollout.tp {rtp} does not divide the {gpus} GPUs; pick a rollout.tp that divides gpus"
                )
        else:
            if config.trainer_gpus is None:
                out.append(
                    "placement disaggregated needs trainerGpus (the actor's GPUs; the rest serve vLLM engines): "
                    "set trainerGpus"
                )
            if rollout < 1:
                out.append(
                    f"trainerGpus ({trainer}) leaves no GPU of the {gpus} for the vLLM engines "
                    "(--vllm.num_engines would be 0): lower trainerGpus or raise gpus"
                )
            elif rollout % rtp:
                out.append(
                    f"--vllm.num_engines = rollout GPUs / --vllm.tensor_parallel_size: rollout.tp {rtp} does not "
                    f"divide the {rollout} rollout GPUs (gpus {gpus} - trainerGpus {trainer}): change rollout.tp, "
                    "gpus or trainerGpus"
                )
            extra = [
                what
                for what, used in (
                    ("a critic (--algo.advantage.estimator gae)", o.has_critic()),
                    (
                        "a reward model on GPUs (--reward.model_name_or_path without --reward.remote_url)",
                        o.has_reward_model(),
                    ),
                )
                if used
            ]
            if extra and o.flag("--train.colocate_all"):
                out.append(
                    f"the command runs {' and '.join(extra)} on the actor's GPUs (--train.colocate_all); a "
                    "disaggregated configuration gives them GPUs of their own (RayActorGroup without a placement "
                    "group in train()), which the command does not size: keep placement colocated, or size them in "
                    "the command (--critic.num_nodes/--critic.num_gpus_per_node, --reward.* likewise) without "
                    "--train.colocate_all"
                )
            if trainer < 1:
                out.append(
                    f"trainerGpus ({trainer + o.side_gpus()}) leaves no GPU for the actor beside the "
                    f"{o.side_gpus()} of {', '.join(o.side_groups())} (kept at the command's sizes): raise trainerGpus"
                )
        if trainer > gpn and trainer % gpn:
            out.append(
                f"the actor's {trainer} GPUs span nodes but are not whole nodes of {gpn}: --actor.num_nodes x "
                "--actor.num_gpus_per_node cannot express it; use a multiple of gpusPerNode (trainerGpus, or gpus "
                "when colocated)"
            )
        if trainer < 1:
            pass  # no actor GPUs: said above
        elif trainer % (ttp * tcp):
            out.append(
                f"--ds.tensor_parallel_size ({ttp}) * --ds.ring_attn_size ({tcp}) must divide the actor's "
                f"{trainer} GPUs (DeepspeedStrategy.setup_distributed: device mesh dp x sp x tp): change trainer.tp, "
                "trainer.cp or the trainer GPUs"
            )
        else:
            dp = trainer // (ttp * tcp)
            tbs = o.int("--train.batch_size") or 1
            if tbs % dp:
                out.append(
                    f"--train.batch_size ({tbs}) must be a multiple of the data-parallel size {dp} (actor GPUs "
                    f"{trainer} / (trainer.tp {ttp} * trainer.cp {tcp})): DeepSpeed's train_batch_size = micro x "
                    "accumulation x dp, and dynamic batching splits it per dp rank (replay_buffer.py): change "
                    "trainer.tp, trainer.cp or the trainer GPUs"
                )
            rbs, n = o.batch(spec)
            rmb = o.int("--rollout.micro_batch_size") or 1
            if n * rbs // rmb < dp:
                out.append(
                    f"--rollout.n_samples_per_prompt * --rollout.batch_size // --rollout.micro_batch_size "
                    f"({n} * {rbs} // {rmb}) must be >= actor GPUs // ring_attn_size // tensor_parallel_size ({dp}) "
                    f"(assert at the end of {SOURCE} __main__): use fewer trainer GPUs or a larger trainer.tp/cp"
                )
        if ttp > 1 and o.get("--ds.param_dtype") != "bf16":
            out.append(
                f"trainer.tp {ttp} needs --ds.param_dtype bf16 (DeepspeedStrategy asserts it for tensor parallel "
                "training): use trainer.tp 1 or bf16"
            )
        if tcp > 1:
            stride = o.int("--ds.ring_attn_head_stride") or 1
            heads = spec.workload.model.merged().get("heads")
            if heads and heads % stride:
                out.append(
                    f"--ds.ring_attn_head_stride ({stride}) must divide the model's {heads} heads for ring attention "
                    "(trainer.cp > 1): change the stride in the command or use trainer.cp 1"
                )
        if config.async_.partial_rollout and stale < 1:
            out.append(
                "async.partialRollout needs async.staleness >= 1: the parser asserts '--train.partial_rollout_enable "
                "requires --train.async_enable': raise staleness or turn partial rollout off"
            )
        vgb = o.int("--rollout.vllm_generate_batch_size")
        rbs, _ = o.batch(spec)
        if stale == 0 and vgb and vgb > rbs:
            out.append(
                f"--rollout.vllm_generate_batch_size ({vgb}) > --rollout.batch_size ({rbs}) requires "
                "--train.async_enable (parser assert): use async.staleness >= 1 or lower vllm_generate_batch_size"
            )
        task = spec.workload.task
        for opt, want, field in (
            ("--rollout.batch_size", task.prompts_per_step, "promptsPerStep"),
            ("--rollout.n_samples_per_prompt", task.samples_per_prompt, "samplesPerPrompt"),
        ):
            if o.has(opt) and o.int(opt) != want:
                out.append(
                    f"{opt} {o.int(opt)} in the command contradicts spec.workload.task.{field} ({want}): the task "
                    f"must describe the run; make them equal"
                )
        return out

    # ----------------------------------------------------------------- command

    def _overrides(self, spec: RLTuningJobSpec, config: RLConfig, o: _Opts) -> dict[str, Any]:
        """Option -> value (True: flag present; None: option removed)."""
        gpn = spec.resources.gpus_per_node
        gpus, trainer, rollout = self._pools(spec, config, o)
        colocated = config.placement == "colocated"
        stale = config.async_.staleness
        nodes, per_node = _shape(trainer, gpn)
        ov: dict[str, Any] = {
            "--ds.tensor_parallel_size": config.trainer.tp,
            "--ds.ring_attn_size": config.trainer.cp,
            "--actor.gradient_checkpointing_enable": config.trainer.recompute != "none" or None,
            "--ds.adam_offload": config.trainer.offload or None,
            "--vllm.tensor_parallel_size": config.rollout.tp,
            "--vllm.gpu_memory_utilization": config.rollout.gpu_memory_utilization,
            "--vllm.enforce_eager": (not config.rollout.cuda_graphs) or None,
            "--train.async_enable": stale >= 1 or None,
            "--train.async_queue_size": stale if stale >= 1 else None,
            "--train.partial_rollout_enable": config.async_.partial_rollout or None,
            "--vllm.sync_backend": config.weight_sync,
            "--actor.num_nodes": nodes,
            "--actor.num_gpus_per_node": per_node,
            "--vllm.num_engines": max(rollout // config.rollout.tp, 0),
        }
        if o.flag("--train.dynamic_batch_enable") or config.trainer.micro_batch_tokens != o.micro_batch_tokens():
            # a fixed micro-batch stays as the user wrote it unless the plan changes its size
            ov["--train.dynamic_batch_enable"] = True
            ov["--train.max_tokens_per_gpu"] = config.trainer.micro_batch_tokens
        was_colocated = o.flag("--train.colocate_all") and not o.flag("--train.async_enable")
        if colocated:
            ov["--train.colocate_all"] = True
            if not was_colocated:  # switching to colocated: time-share memory as OpenRLHF's colocated examples do
                ov["--vllm.enable_sleep"] = True
                ov["--ds.enable_sleep"] = True
        elif stale >= 1 and o.flag("--train.async_enable") and o.flag("--train.colocate_all"):
            pass  # async under --train.colocate_all colocates the DeepSpeed models only: the user's own layout
        else:
            ov["--train.colocate_all"] = None
            ov["--vllm.enable_sleep"] = None
            ov["--ds.enable_sleep"] = None
            if o.has_ref() and "ref" not in o.side_groups():
                ov["--train.colocate_actor_ref"] = True
        # the other model groups live on the actor's GPUs (the colocation asserts want equal shapes),
        # but those the command runs beside the actor keep their own sizes when disaggregated
        beside = () if colocated else o.side_groups()
        for group, used in (("ref", o.has_ref()), ("critic", o.has_critic()), ("reward", o.has_reward_model())):
            if used and group not in beside:
                ov[f"--{group}.num_nodes"] = nodes
                ov[f"--{group}.num_gpus_per_node"] = per_node
        # the task's batch shape where the user's command leaves OpenRLHF's defaults
        task = spec.workload.task
        if not o.has("--rollout.batch_size"):
            ov["--rollout.batch_size"] = task.prompts_per_step
        if not o.has("--rollout.n_samples_per_prompt"):
            ov["--rollout.n_samples_per_prompt"] = task.samples_per_prompt
        return ov

    @staticmethod
    def _apply(options: Sequence[str], ov: dict[str, Any]) -> list[str]:
        """The user's options with every option of `ov` replaced exactly once (in place of its first
        occurrence, else appended); None removes it, True renders a bare flag."""
        out: list[str] = []
        done: set[str] = set()

        def render(name: str) -> list[str]:
            v = ov[name]
            if v is None or v is False:
                return []
            if v is True:
                return [name]
            if isinstance(v, (list, tuple)):
                return [name, *map(_fmt, v)]
            return [name, _fmt(v)]

        for name, tokens in _groups(options):
            if name in ov:
                if name not in done:
                    out += render(name)
                    done.add(name)
                continue
            out += tokens
        for name in ov:
            if name not in done:
                out += render(name)
        return out

    def command(self, spec: RLTuningJobSpec, config: RLConfig, command: Sequence[str]) -> FrameworkCommand:
        entry, options = _split(command)
        o = _Opts(options)
        overrides = self._apply(options, self._overrides(spec, config, o))
        return FrameworkCommand(self._mode(config), entry, tuple(overrides))

    def trial_command(
        self, spec: RLTuningJobSpec, config: RLConfig, command: Sequence[str], steps: int
    ) -> FrameworkCommand:
        """One RL step of OpenRLHF is one rollout batch (--rollout.batch_size prompts): `steps` steps are
        --data.max_samples = steps * rollout batch size with --train.num_episodes 1 (ppo_trainer.py
        prepare_datasets keeps the first max_samples prompts; the loop ends when they are used up).
        No evaluation (--eval.steps -1), no checkpoints (--ckpt.save_steps -1, no --ckpt.load_enable), and
        the final model save that train() always does goes to a scratch directory; console logging every
        step (--logger.logging_steps 1; `Global step N: {...}` lines), no wandb or TensorBoard."""
        if steps < 1:
            raise ValueError(f"a trial needs at least one step, got {steps}")
        entry, options = _split(command)
        o = _Opts(options)
        ov = self._overrides(spec, config, o)
        rbs, _ = o.batch(spec)
        ov |= {
            "--data.max_samples": steps * rbs,
            "--train.num_episodes": 1,
            "--eval.steps": -1,
            "--ckpt.save_steps": -1,
            "--ckpt.load_enable": None,
            "--ckpt.save_hf": None,
            "--ckpt.path": f"{TRIAL_DIR}/ckpt",
            "--ckpt.output_dir": f"{TRIAL_DIR}/output",
            "--logger.logging_steps": 1,
            "--logger.wandb.key": None,
            "--logger.tensorboard_dir": None,
        }
        return FrameworkCommand(self._mode(config), entry, tuple(self._apply(options, ov)))


# the registry looks the instance up by the framework's name (registry.adapter_for)
openrlhf = OpenRLHFAdapter()
ADAPTER = openrlhf
