"""The knob catalog: every canonical performance knob the tuner may move.

Each knob has a type, a default range (used when the job's searchSpace does not list values),
the default it takes in `RLConfig`, a validity rule (checked per configuration in
`rltune.tuner.search.validity`) and a note on what it trades. Algorithm parameters (the job's
TaskSpec: prompts per step, samples per prompt, lengths, learning rate, loss) are not knobs and
are never changed.

Ranges are deliberately modest: the default product of all ranges is what `rltune plan`
enumerates, so it must stay in the tens of thousands of valid configurations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..api.models import ModelArch, RLTuningJobSpec


@dataclass(frozen=True)
class Knob:
    path: str
    type: str  # int | float | bool | enum
    default: Any
    values: Callable[[RLTuningJobSpec, ModelArch], list]  # default candidate values for a job
    rule: str  # validity rule, human-readable (enforced in search.validity)
    trades: str  # what moving it trades
    moe_only: bool = False


def _pow2_upto(n: int, start: int = 1) -> list[int]:
    out, v = [], start
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _rollout_tp(spec: RLTuningJobSpec, m: ModelArch) -> list[int]:
    return [t for t in _pow2_upto(spec.resources.gpus_per_node) if m.heads % t == 0]


def _trainer_tp(spec: RLTuningJobSpec, m: ModelArch) -> list[int]:
    return [t for t in _pow2_upto(spec.resources.gpus_per_node) if m.heads % t == 0]


def _trainer_ep(spec: RLTuningJobSpec, m: ModelArch) -> list[int]:
    if not m.is_moe:
        return [1]
    return [e for e in (1, 2, 4, 8, 16) if m.experts % e == 0 and e <= spec.resources.gpu_budget]


CATALOG: list[Knob] = [
    Knob("placement", "enum", "colocated", lambda s, m: ["colocated", "disaggregated"],
         "disaggregated needs at least one node per side",
         "colocated time-shares every GPU between rollout and trainer (no idle GPUs, no overlap); "
         "disaggregated splits the pool so rollout and training can overlap under staleness >= 1"),
    Knob("trainerGpus", "int", None, lambda s, m: [],  # derived from gpus by search (fractions of the pool)
         "disaggregated only; whole nodes; 1/4..3/4 of the configuration's GPUs",
         "more trainer GPUs shorten training but leave fewer rollout replicas"),
    Knob("trainer.tp", "int", 1, _trainer_tp,
         "divides heads; <= GPUs per node; tp*pp*cp divides the trainer GPUs",
         "shards weights and activations (memory) at the price of all-reduce traffic"),
    Knob("trainer.pp", "int", 1, lambda s, m: [1, 2, 4],
         "<= layers/4; tp*pp*cp divides the trainer GPUs",
         "shards layers (memory) at the price of the pipeline bubble (PP-1)/(m+PP-1)"),
    Knob("trainer.cp", "int", 1, lambda s, m: [1],
         "divides the trainer GPUs with tp*pp",
         "splits long sequences (activation memory) at the price of ring attention traffic"),
    Knob("trainer.ep", "int", 1, _trainer_ep,
         "MoE only; divides the routed experts; <= trainer GPUs / (pp*cp)",
         "shards experts (memory, fewer expert weights per GPU) at the price of all-to-all traffic",
         moe_only=True),
    Knob("trainer.microBatchTokens", "int", 16384, lambda s, m: [8192, 16384, 32768],
         ">= max prompt + response tokens is not required (dynamic batch packs), activation memory must fit",
         "bigger micro-batches raise GEMM efficiency and shrink the pipeline bubble, cost activation memory"),
    Knob("trainer.recompute", "enum", "selective", lambda s, m: ["none", "selective", "full"],
         "activation memory must fit",
         "full recompute adds ~1/3 forward compute but frees almost all activation memory"),
    Knob("trainer.offload", "bool", False, lambda s, m: [False, True],
         "none", "offloading optimizer state frees GPU memory but slows every update"),
    Knob("rollout.tp", "int", 1, _rollout_tp,
         "divides heads; <= GPUs per node; divides the rollout GPUs; weights/tp must fit in the memory share",
         "bigger TP: lower per-token latency (long tail) but fewer replicas and more all-reduce per token"),
    Knob("rollout.expertParallel", "bool", False, lambda s, m: [False, True],
         "MoE only", "expert parallel replaces TP all-reduce of expert layers by all-to-all", moe_only=True),
    Knob("rollout.gpuMemoryUtilization", "float", 0.5, lambda s, m: [0.5, 0.6, 0.7, 0.8, 0.9],
         "weights/tp + activation peak must fit under it; colocated: the trainer must fit in the rest while it sleeps",
         "more KV cache (more concurrent sequences, fewer preemptions) against memory for everything else"),
    Knob("rollout.maxNumSeqs", "int", 256, lambda s, m: [128, 256, 512, 1024],
         "none", "more concurrent sequences raise decode throughput until KV capacity runs out (preemption)"),
    Knob("rollout.maxNumBatchedTokens", "int", 8192, lambda s, m: [8192, 16384],
         "none", "bigger chunked-prefill budget speeds prefill, costs activation memory and decode latency"),
    Knob("rollout.cudaGraphs", "bool", True, lambda s, m: [True],
         "none", "CUDA graphs remove decode launch overhead at the price of some memory"),
    Knob("rollout.fp8", "bool", False, lambda s, m: [False, True],
         "none", "FP8 rollout weights halve weight reads (faster decode) but raise the log-prob mismatch"),
    Knob("async.staleness", "int", 0, lambda s, m: list(range(0, s.constraints.max_staleness + 1)),
         "<= constraints.maxStaleness", "lets rollout overlap training (and the long tail) at the price of off-policy samples"),
    Knob("async.partialRollout", "bool", False, lambda s, m: [False, True],
         "needs staleness >= 1", "cuts the long tail by resuming long generations under the next policy"),
    Knob("weightSync", "enum", "nccl", lambda s, m: ["nccl", "checkpoint-engine"],
         "none", "checkpoint-engine streams weights in buckets over every NIC; disk is slow but simple"),
    # Real mode on CPUs: only moved when the job lists values (no GPU physics speaks to them, so
    # the forecaster cannot rank them: trials measure them).
    Knob("cpu.rolloutThreads", "int", None, lambda s, m: [],
         "real mode (gpuType CPU) only; listed values only",
         "more threads speed vLLM's decode, leave fewer cores to the trainer when they overlap"),
    Knob("cpu.trainerThreads", "int", None, lambda s, m: [],
         "real mode (gpuType CPU) only; listed values only",
         "more threads speed the torch update, leave fewer cores to the rollout when they overlap"),
]
CPU_KNOBS = ("cpu.rolloutThreads", "cpu.trainerThreads")

BY_PATH = {k.path: k for k in CATALOG}
# Knobs that never move unless the job lists them explicitly (real-mode CPU split, GPU count).
SEARCHABLE = [k.path for k in CATALOG]


def catalog_table() -> list[dict]:
    """The catalog as rows (for docs and `rltune plan --knobs`)."""
    return [dict(path=k.path, type=k.type, default=k.default, rule=k.rule, trades=k.trades,
                 moe_only=k.moe_only) for k in CATALOG]
