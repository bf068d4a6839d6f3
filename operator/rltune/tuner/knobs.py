"""The knob catalog: every canonical performance knob the tuner may move, and all the search knows of one.

A knob is declared once, on RLConfig (api/models.py, read through api/knob_fields.py): its path,
type, default, bounds, group (which half of a configuration it belongs to: the search composes
rollout and trainer halves under an outer context) and layout role. The pydantic model, the CRD
and validation's bounds come from that declaration, and so does everything below that `Knob`
reads through `declared`. What only the search needs is added here: a default range (used when
the job's searchSpace does not list values), a validity rule (checked per configuration in
`Space.rollout_valid`/`Space.trainer_valid`/`Space.outer`), a note on what it trades, its feature
encoding (the distances that keep a batch of proposals diverse) and its prior in the forecaster
(how far the physics is trusted on this knob, per side of the step it changes). Modules derive
their knob lists from here. Algorithm parameters (the job's TaskSpec: prompts per step, samples
per prompt, lengths, learning rate, loss) are not knobs and are never changed.

Ranges are deliberately modest: the default product of all ranges is what `rltune plan`
enumerates, so it must stay in the tens of thousands of valid configurations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from ..api.hardware import gpu as gpu_spec
from ..api.knob_fields import DeclaredKnob, Group
from ..api.models import ModelArch, RLTuningJobSpec, declared
from .physics import model_state_bytes

# What RLConfig declares of every knob: path, type, default, bounds, group, layout role.
DECLARED: dict[str, DeclaredKnob] = declared()
# The sides of a step the forecaster calibrates separately: the rollout (generation), the trainer
# (log-prob passes and update) and the weight sync.
Side = Literal["rollout", "trainer", "sync"]


@dataclass(frozen=True)
class Knob:
    """One knob as the search sees it: what RLConfig declares of it (`declared`, and the properties
    that read it) and what only the search needs."""

    path: str
    values: Callable[[RLTuningJobSpec, ModelArch], list]  # default candidate values for a job
    rule: str  # validity rule, human-readable
    trades: str  # what moving it trades
    # feature name -> encoding of the knob's value, scaled so that one "step" of any knob is a
    # distance of about 1-2 (batch diversity)
    features: Mapping[str, Callable[[Any], float]] = field(default_factory=dict)
    # side -> log-space prior sd of this knob's correction to the physics of that side; the sides
    # a knob has a prior for are the ones whose calibration sees it
    prior_sd: Mapping[Side, float] = field(default_factory=dict)

    @property
    def declared(self) -> DeclaredKnob:
        return DECLARED[self.path]

    @property
    def group(self) -> Group:
        return self.declared.role.group

    @property
    def type(self) -> str:
        return self.declared.type

    @property
    def layout(self) -> bool:
        """The validity rules read it (a parallel layout: divides heads, GPUs, experts)."""
        return self.declared.role.layout

    @property
    def moe_only(self) -> bool:
        return self.declared.role.moe_only

    @property
    def default(self) -> Any:
        """The value a job that leaves the knob out runs with."""
        return self.declared.default


def _log2(v) -> float:
    return math.log2(v)


def _flag(v) -> float:
    return 2.0 * bool(v)


def _pow2_upto(n: int, start: int = 1) -> list[int]:
    out, v = [], start
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _tp(spec: RLTuningJobSpec, m: ModelArch) -> list[int]:
    return [t for t in _pow2_upto(spec.resources.gpus_per_node) if m.heads % t == 0]


# Past these shares of one GPU's memory a model is too big for the default ranges: rollout weights
# beyond half the HBM leave the KV cache too little room at one node's TP, trainer state beyond 60%
# leaves too little for activations at EP 16 / PP 4. Only then do the ranges grow (replicas spanning
# nodes, wider expert and pipeline parallelism), so the spaces of models that fit stay as they are.
SPAN_WEIGHT_SHARE = 0.5
WIDE_STATE_SHARE = 0.6
# A rollout replica spans at most this many nodes (vLLM serves DeepSeek-V3-sized MoEs on 2-4 nodes).
MAX_REPLICA_NODES = 8


def _rollout_tp(spec: RLTuningJobSpec, m: ModelArch) -> list[int]:
    """Powers of two up to the node; when the weights at the node's TP would take more than half a
    GPU, also whole multiples of the node up to the first TP where they take at most half, and one
    more (a replica spanning nodes: vLLM's multi-node TP, all-reduces crossing the NICs or, on
    NVL72 racks, the rack's NVLink)."""
    gpn = spec.resources.gpus_per_node
    out = _tp(spec, m)
    hbm = gpu_spec(spec.resources.gpu_type).hbm_bytes
    weights = m.params()[0] * m.bytes_per_param
    if weights / gpn <= SPAN_WEIGHT_SHARE * hbm:
        return out
    cap = min(spec.resources.gpu_budget, MAX_REPLICA_NODES * gpn)
    t, past = 2 * gpn, 0
    while t <= cap and past < 2:
        if m.heads % t == 0:
            out.append(t)
            past += weights / t <= SPAN_WEIGHT_SHARE * hbm
        t *= 2
    return out


def _state_share(spec: RLTuningJobSpec, m: ModelArch, tp: int, pp: int, ep: int) -> float:
    """Share of one GPU's memory the trainer's weights, gradients and distributed optimizer take at
    this layout on the whole budget (`physics.model_state_bytes`)."""
    budget = spec.resources.gpu_budget
    routed = m.routed_params()
    dense = m.params()[0] - routed
    dp = max(1, budget // (tp * pp))
    edp = max(1, budget // (ep * pp))
    per_gpu = model_state_bytes(dense / (tp * pp), routed / (ep * pp), dp, edp)
    return per_gpu / gpu_spec(spec.resources.gpu_type).hbm_bytes


def _wide(spec: RLTuningJobSpec, m: ModelArch) -> bool:
    """The model's trainer state does not fit comfortably at the default ranges' widest layout."""
    tp = max(_tp(spec, m) or [1])
    return _state_share(spec, m, tp, 4, 16 if m.is_moe else 1) > WIDE_STATE_SHARE


def _trainer_ep(spec: RLTuningJobSpec, m: ModelArch) -> list[int]:
    if not m.is_moe:
        return [1]
    widths = (1, 2, 4, 8, 16, 32, 64) if _wide(spec, m) else (1, 2, 4, 8, 16)
    return [e for e in widths if m.experts % e == 0 and e <= spec.resources.gpu_budget]


def _trainer_pp(spec: RLTuningJobSpec, m: ModelArch) -> list[int]:
    return [1, 2, 4, 8, 16] if _wide(spec, m) else [1, 2, 4]


CATALOG: list[Knob] = [
    Knob(
        "placement",
        lambda s, m: ["colocated", "disaggregated"],
        "disaggregated needs at least one node per side",
        "colocated time-shares every GPU between rollout and trainer (no idle GPUs, no overlap); "
        "disaggregated splits the pool so rollout and training can overlap under staleness >= 1",
        features={"place": lambda v: 2.0 if v == "disaggregated" else 0.0},
        # placement does not change how fast a rollout runs (only what overlaps it, which the
        # composition models): near-certain physics there
        prior_sd={"rollout": 0.08, "trainer": 0.15, "sync": 0.6},
    ),
    Knob(
        "trainerGpus",
        lambda s, m: [],  # derived from gpus by search (fractions of the pool)
        "disaggregated only; whole nodes; 1/4..3/4 of the configuration's GPUs",
        "more trainer GPUs shorten training but leave fewer rollout replicas",
    ),
    Knob(
        "weightSync",
        lambda s, m: ["nccl", "checkpoint-engine"],
        "none",
        "checkpoint-engine streams weights in buckets over every NIC; disk is slow but simple",
        features={"ws_ce": lambda v: 2.0 * (v == "checkpoint-engine"), "ws_disk": lambda v: 2.0 * (v == "disk")},
        prior_sd={"sync": 0.5},
    ),
    Knob(
        "trainer.tp",
        _tp,
        "divides heads; <= GPUs per node; tp*pp*cp divides the trainer GPUs",
        "shards weights and activations (memory) at the price of all-reduce traffic",
        features={"ttp": _log2},
        prior_sd={"trainer": 0.3},
    ),
    Knob(
        "trainer.pp",
        _trainer_pp,
        "<= layers/4; tp*pp*cp divides the trainer GPUs",
        "shards layers (memory) at the price of the pipeline bubble (PP-1)/(m+PP-1)",
        features={"tpp": _log2},
        prior_sd={"trainer": 0.3},
    ),
    Knob(
        "trainer.cp",
        lambda s, m: [1],
        "divides the trainer GPUs with tp*pp",
        "splits long sequences (activation memory) at the price of ring attention traffic",
        features={"tcp": _log2},
        prior_sd={"trainer": 0.3},
    ),
    Knob(
        "trainer.ep",
        _trainer_ep,
        "MoE only; divides the routed experts; <= trainer GPUs / (pp*cp)",
        "shards experts (memory, fewer expert weights per GPU) at the price of all-to-all traffic",
        features={"tep": _log2},
        prior_sd={"trainer": 0.4},
    ),
    Knob(
        "trainer.etp",
        lambda s, m: [None, 1] if m.is_moe else [None],
        "MoE only; unset = trainer.tp; divides the expert width; ep*etp divides the trainer GPUs / pp",
        "1 keeps each expert whole on a GPU (wider expert GEMMs, the all-to-all inside ep GPUs instead of "
        "ep*tp) at the price of ep-times fewer GPUs sharing each expert's memory than ep*tp",
        features={"tetp": lambda v: 0.0 if v is None else 1.0 + _log2(v)},
        prior_sd={"trainer": 0.3},
    ),
    Knob(
        "trainer.microBatchTokens",
        lambda s, m: [8192, 16384, 32768],
        "verl: >= max prompt + response / cp (its adapter checks); elsewhere a longer sequence forms its own "
        "micro-batch, so activation memory follows the longest sequence and must fit",
        "bigger micro-batches raise GEMM efficiency and shrink the pipeline bubble, cost activation memory",
        features={"mbt": _log2},
        prior_sd={"trainer": 0.2},
    ),
    Knob(
        "trainer.recompute",
        lambda s, m: ["none", "selective", "full"],
        "activation memory must fit",
        "full recompute adds ~1/3 forward compute but frees almost all activation memory",
        features={"rec": lambda v: {"none": 0.0, "selective": 1.0, "full": 2.0}[v]},
        prior_sd={"trainer": 0.3},
    ),
    Knob(
        "trainer.offload",
        lambda s, m: [False, True],
        "none",
        "OpenRLHF (DeepSpeed CPU Adam): offloading optimizer state frees GPU memory but slows every "
        "update; verl: the state leaves the GPU between phases, which frees memory for colocated "
        "rollouts at about no time, not for training",
        features={"off": _flag},
        prior_sd={"trainer": 0.4},
    ),
    Knob(
        "rollout.tp",
        _rollout_tp,
        "divides heads; <= GPUs per node or whole nodes (a replica spanning nodes); divides the rollout GPUs; "
        "weights/tp must fit in the memory share",
        "bigger TP: lower per-token latency (long tail) but fewer replicas and more all-reduce per token; "
        "beyond a node the all-reduces cross the NICs (or an NVL72 rack's NVLink)",
        features={"rtp": _log2},
        prior_sd={"rollout": 0.4, "sync": 0.3},
    ),
    Knob(
        "rollout.expertParallel",
        lambda s, m: [False, True],
        "MoE only",
        "expert parallel replaces TP all-reduce of expert layers by all-to-all",
        features={"rep": lambda v: 1.5 * bool(v)},
        prior_sd={"rollout": 0.3},
    ),
    Knob(
        "rollout.gpuMemoryUtilization",
        lambda s, m: [0.5, 0.6, 0.7, 0.8, 0.9],
        "weights/tp + activation peak must fit under it; colocated: the trainer must fit in the rest while it sleeps",
        "more KV cache (more concurrent sequences, fewer preemptions) against memory for everything else",
        features={"gmu": lambda v: 5.0 * v},
        prior_sd={"rollout": 0.2},
    ),
    Knob(
        "rollout.maxNumSeqs",
        lambda s, m: [128, 256, 512, 1024],
        "none",
        "more concurrent sequences raise decode throughput until KV capacity runs out (preemption)",
        features={"mns": _log2},
        prior_sd={"rollout": 0.2},
    ),
    Knob(
        "rollout.maxNumBatchedTokens",
        lambda s, m: [8192, 16384],
        "none",
        "bigger chunked-prefill budget speeds prefill, costs activation memory and decode latency",
        features={"mnbt": _log2},
        prior_sd={"rollout": 0.15},
    ),
    Knob(
        "rollout.cudaGraphs",
        lambda s, m: [True],
        "none",
        "CUDA graphs remove decode launch overhead at the price of some memory",
        features={"graphs": _flag},
        prior_sd={"rollout": 0.2},
    ),
    Knob(
        "rollout.fp8",
        lambda s, m: [False, True],
        "none",
        "FP8 rollout weights halve weight reads (faster decode) but raise the log-prob mismatch",
        features={"fp8": _flag},
        prior_sd={"rollout": 0.3},
    ),
    Knob(
        "async.staleness",
        lambda s, m: list(range(0, s.constraints.max_staleness + 1)),
        "<= constraints.maxStaleness",
        "lets rollout overlap training (and the long tail) at the price of off-policy samples",
        # like placement: changes what overlaps a rollout, not its speed
        features={"stale": lambda v: 1.5 * v},
        prior_sd={"rollout": 0.08},
    ),
    # its correction is the forecaster's derived "partial rollout streams" (it needs staleness >= 1)
    Knob(
        "async.partialRollout",
        lambda s, m: [False, True],
        "needs staleness >= 1",
        "cuts the long tail by resuming long generations under the next policy",
        features={"partial": _flag},
    ),
    # verl fully-async's fractional bound: the physics models it as the pipeline's run-ahead
    # (rltune/api/pipeline.py); searched only where the job lists values or a framework adapter
    # that can run it supplies them (rltune.adapters)
    Knob(
        "async.staleFraction",
        lambda s, m: [],
        "0..1; only where the framework expresses it (verl fully-async); staleness >= 1",
        "lets up to this share of a batch come from older policies: more overlap, more off-policy samples",
        features={"stalefrac": lambda v: 4.0 * (v or 0.0)},
    ),
    # Real mode on CPUs: only moved when the job lists values (no GPU physics speaks to them, so
    # the forecaster cannot rank them: trials measure them).
    Knob(
        "cpu.rolloutThreads",
        lambda s, m: [],
        "real mode (gpuType CPU) only; listed values only",
        "more threads speed vLLM's decode, leave fewer cores to the trainer when they overlap",
    ),
    Knob(
        "cpu.trainerThreads",
        lambda s, m: [],
        "real mode (gpuType CPU) only; listed values only",
        "more threads speed the torch update, leave fewer cores to the rollout when they overlap",
    ),
]
BY_PATH = {k.path: k for k in CATALOG}


def in_group(*groups: Group) -> tuple[str, ...]:
    """The paths of the knobs of these groups, group by group, in catalog order within a group."""
    return tuple(k.path for g in groups for k in CATALOG if k.group == g)


def feature_names(*groups: Group) -> tuple[str, ...]:
    """The feature names of these groups' knobs, in the order of `in_group`."""
    return tuple(f for p in in_group(*groups) for f in BY_PATH[p].features)


def calibrated(side: Side) -> tuple[str, ...]:
    """The knobs the forecaster's correction of `side` sees (catalog order: it is the column order of the fit)."""
    return tuple(k.path for k in CATALOG if side in k.prior_sd)


ROLLOUT_KNOBS = in_group("rollout")
TRAINER_KNOBS = in_group("trainer")
CPU_KNOBS = in_group("cpu")
# What the search enumerates around the two halves (the trainer split is derived from the GPUs).
OUTER_KNOBS = tuple(p for p in in_group("placement", "async", "sync") if p != "trainerGpus")
