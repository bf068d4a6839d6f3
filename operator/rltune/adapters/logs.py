"""Framework console logs -> rltune's metric contract (rltune.api.metrics, docs/metrics.md).

A framework run through the metrics bridge (rltune.adapters.bridge) prints its per-step metrics
on the console the way it always does; the parsers here read those lines and build one
`StepRecord` per completed RL step. Stdlib only (this module and rltune.api.metrics are copied
into the user's framework image by `python -m rltune.adapters.bridge --install DIR`).

Formats (the exact source that prints them):

verl 0.9.1
    `verl/utils/logger/aggregate_logger.py`, `concat_dict_to_str` via `LocalLogger.log` (the
    "console" backend of `verl/utils/tracking.py::Tracking`), called once per step from
    `RayPPOTrainer.fit` (verl/trainer/ppo/ray_trainer.py), `OneStepOffRayTrainer.fit_step`
    (verl/experimental/one_step_off_policy) and twice per sync cycle from `FullyAsyncTrainer`
    (verl/experimental/fully_async_policy/fully_async_trainer.py: `_fit_update_weights` logs the
    rollouter's `fully_async/rollouter/*`, `_fit_log_aggregated_training_metrics` the cycle)::

        step:3 - actor/pg_loss:np.float64(-0.01) - timing_s/step:41.2 - ...

    keys in insertion order, `k:pprint.pformat(v)` for numbers only (so numpy scalars print as
    `np.float64(...)`), joined by " - ". The trainer runs inside a Ray actor (`TaskRunner`), so on
    the job's console each line carries Ray's prefix `(TaskRunner pid=N[, ip=A])` (coloured).
    A step is complete on the line holding `timing_s/step`; lines of the same step number before
    it (fully-async rollouter stats, validation) are merged into it.

OpenRLHF 0.11.2
    `openrlhf/trainer/ppo_trainer.py::PPOTrainer.fit` (synchronous)::

        logger.info(f"✨ Global step {global_step}: {log_status}")

    and `openrlhf/trainer/ppo_trainer_async.py::TrainingActor.fit` (async) the same without "✨ ".
    `log_status` is a plain dict (repr), the logger is `openrlhf/utils/logging_utils.py` (format
    "%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s" on stdout), inside the
    PPOTrainer / TrainingActor Ray actors (Ray prefix as above).

What a framework does not print is not invented: such contract fields stay at their default in
the StepRecord and are listed in the parser's `missing` set (names as in STEP_METRICS, phases as
`step_phase_seconds:<phase>`); the bridge does not export them. Values fixed by a mode's algorithm
are reported as such (a synchronous on-policy trainer's staleness is 0, verl one-step-off's is 1;
phases a mode does not have, e.g. `waiting` when colocated, are 0).
"""

from __future__ import annotations

import ast
import math
import re
from typing import Optional

from rltune.api.metrics import PHASES, STEP_FIELDS, StepRecord

FRAMEWORKS = ("verl", "openrlhf")

# contract fields of StepRecord other than duration and phases: contract name -> attribute
FIELDS = STEP_FIELDS
# contract gauges OpenRLHF does not print (verl does: see verl_record)
UNMAPPED = frozenset({"step_trainer_memory_ratio", "step_longest_sequence_tokens"})


def phase_key(phase: str) -> str:
    """How a phase appears in a `missing` set."""
    return f"step_phase_seconds:{phase}"


# ---------------------------------------------------------------------------------------------- lines
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Ray's log_to_driver prefix: "(TaskRunner pid=123)", "(pid=123, ip=10.0.0.1)", "(PPOTrainer pid=9) "
_RAY_PREFIX = re.compile(r"^\s*\((?:[^()]*\s)?pid=\d+(?:,\s*ip=[^)]*)?\)\s?")
_RAY_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\].*$")


def clean_line(line: str) -> str:
    """A console line without colour codes, line ends, Ray's worker prefix and dedup suffix."""
    text = _ANSI.sub("", line).rstrip("\r\n")
    if "\r" in text:  # a progress bar redrawn before the line: keep the last segment
        text = text.rsplit("\r", 1)[-1]
    text = _RAY_PREFIX.sub("", text, count=1)
    return _RAY_REPEATED.sub("", text)


_NUM_WRAPPED = re.compile(r"^(?:np\.|numpy\.)?(?:float|int|uint)\d*\((.*)\)$|^tensor\(([^,()]*)(?:,.*)?\)$")


def parse_value(text: str) -> Optional[float]:
    """A printed number as float: 1, 0.5, 1e-05, nan, inf, True, np.float64(0.5), tensor(0.5, ...)."""
    s = text.strip()
    m = _NUM_WRAPPED.match(s)
    if m:
        s = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
    if s in ("True", "False"):
        return 1.0 if s == "True" else 0.0
    try:
        return float(s)
    except ValueError:
        return None


# verl: "step:N - k:v - k:v"
_VERL_LINE = re.compile(r"^step:(-?\d+)(?: - (.*))?$")


def parse_verl_line(line: str) -> Optional[tuple[int, dict[str, float]]]:
    """(step, metrics) of a verl console-logger line, else None."""
    m = _VERL_LINE.match(clean_line(line).strip())
    if not m:
        return None
    metrics: dict[str, float] = {}
    for part in (m.group(2) or "").split(" - "):
        key, sep, value = part.rpartition(":")
        if not sep or not key:
            continue
        v = parse_value(value)
        if v is not None:
            metrics[key] = v
    return int(m.group(1)), metrics


# OpenRLHF: "INFO 05-12 10:11:12 ppo_trainer.py:548] ✨ Global step N: {...}"
_ORLHF_LINE = re.compile(r"(?:^|\] )(✨ )?Global step (\d+): (\{.*\})\s*$")
_DICT_ITEM = re.compile(r"""['"]([^'"]+)['"]\s*:\s*([^,{}\[\]]+?|\w+(?:\.\w+)*\([^()]*\))\s*(?=,\s*['"]|\}$)""")


def parse_openrlhf_line(line: str) -> Optional[tuple[int, dict[str, float], bool]]:
    """(step, metrics, is_async) of an OpenRLHF "Global step" line, else None."""
    m = _ORLHF_LINE.search(clean_line(line))
    if not m:
        return None
    body = m.group(3)
    metrics: dict[str, float] = {}
    try:
        parsed = ast.literal_eval(body)
        items = parsed.items() if isinstance(parsed, dict) else ()
        for k, v in items:
            if isinstance(v, (int, float)):
                metrics[str(k)] = float(v)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        for k, v in _DICT_ITEM.findall(body):  # reprs literal_eval refuses (np.float64(...), tensor(...))
            f = parse_value(v)
            if f is not None:
                metrics[k] = f
    return int(m.group(2)), metrics, m.group(1) is None


# ---------------------------------------------------------------------------------------------- records
def _finite(metrics: dict[str, float], *keys: str) -> Optional[float]:
    for k in keys:
        v = metrics.get(k)
        if v is not None and math.isfinite(v):
            return v
    return None


def verl_mode(metrics: dict[str, float]) -> str:
    """The verl trainer that printed a step: fully-async, one-step-off or the synchronous one."""
    if any(k.startswith("fully_async/") for k in metrics):
        return "fully-async"
    if "timing_s/generate_async" in metrics or "timing_s/sync_rollout_weights" in metrics:
        return "one-step-off"
    return "sync"


def verl_record(step: int, m: dict[str, float], gpu_memory_gib: float = 0.0) -> tuple[StepRecord, set[str]]:
    """The StepRecord of one verl step's merged metrics, and the contract fields it lacks.
    `gpu_memory_gib`: the GPU's memory, which turns verl's perf/max_memory_reserved_gb (GiB: verl
    divides by 1024**3) into the contract's share of the GPU (0: unknown, the share is missing)."""
    mode = verl_mode(m)
    missing: set[str] = set()
    rec = StepRecord(step=step, duration=m["timing_s/step"])
    ph: dict[str, Optional[float]] = {p: None for p in PHASES}

    def t(*keys: str) -> float:  # a timer of a phase the trainer runs (absent: not run this step)
        v = _finite(m, *keys)
        return 0.0 if v is None else v

    if mode == "fully-async":
        # the trainer's timing_s/gen is its wait on the message queue; the rollouter reports its
        # active and total time per parameter version
        ph["generation"] = _finite(m, "fully_async/rollouter/active_time")
        version = _finite(m, "fully_async/rollouter/version_time")
        if version is not None and ph["generation"] is not None:
            ph["rollout_idle"] = max(0.0, version - ph["generation"])
        ph["waiting"] = _finite(m, "fully_async/total_wait_time", "timing_s/gen")
        ph["weight_sync"] = t("timing_s/timing_s/param_sync", "timing_s/param_sync")
    elif mode == "one-step-off":
        ph["generation"] = _finite(m, "timing_s/generate_async")
        ph["waiting"] = t("timing_s/gen")  # waiting on the batch generated during the last step
        ph["weight_sync"] = t("timing_s/sync_rollout_weights")
        ph["rollout_idle"] = None  # not measured
        rec.staleness = 1.0  # by construction: trained on the batch generated one version earlier
    else:
        ph["generation"] = _finite(m, "timing_s/gen")
        ph["weight_sync"] = t("timing_s/update_weights")
        ph["waiting"] = ph["rollout_idle"] = 0.0  # colocated: nothing waits on another pool
        rec.staleness = 0.0  # on-policy by construction
    ph["old_logprob"] = t("timing_s/old_log_prob")
    ph["ref_logprob"] = t("timing_s/ref")
    ph["training"] = t("timing_s/update_actor") + t("timing_s/update_critic")
    ph["tool"] = _finite(m, "timing_s/agent_loop/tool_calls/mean")
    ph["generation_tail"] = None  # verl prints no per-sample completion quantiles
    rec.phases = {p: v for p, v in ph.items() if v is not None}
    missing |= {phase_key(p) for p, v in ph.items() if v is None}
    if mode == "fully-async":
        missing.add("step_staleness")  # observed version lag is not printed

    total = _finite(m, "perf/total_num_tokens")
    plen, rlen = _finite(m, "prompt_length/mean"), _finite(m, "response_length/mean")
    samples = None
    if total is not None and plen is not None and rlen is not None and plen + rlen > 0:
        # both lengths and the total come from the same attention mask: total = samples * (p + r)
        samples = float(max(1, round(total / (plen + rlen))))
        rec.generated_tokens = samples * rlen
    else:
        missing.add("step_generated_tokens")
    if total is not None:
        rec.trained_tokens = total
    else:
        missing.add("step_trained_tokens")

    reward = _finite(m, "critic/rewards/mean", "critic/score/mean")
    if reward is not None:
        rec.reward = reward
    else:
        missing.add("step_reward_mean")

    mismatch = None
    if m.get("training/rollout_probs_diff_valid", 1.0) != 0.0:
        mismatch = _finite(m, "training/rollout_probs_diff_mean")
    if mismatch is None:
        mismatch = _finite(m, "rollout_corr/log_ppl_abs_diff")
    if mismatch is not None:
        rec.logprob_mismatch = abs(mismatch)
    else:
        missing.add("step_logprob_mismatch")

    preempted = _finite(m, "timing_s/agent_loop/num_preempted/mean")
    if preempted is not None and samples is not None:
        rec.preemptions = preempted * samples
    else:
        missing.add("step_preemptions")
    missing.add("step_kv_cache_usage_ratio")  # verl prints no KV-cache usage
    reserved = _finite(m, "perf/max_memory_reserved_gb")
    if reserved is not None and gpu_memory_gib > 0:
        rec.trainer_memory = reserved / gpu_memory_gib
    else:
        missing.add("step_trainer_memory_ratio")
    # the longest prompt and the longest response need not be one sequence: an upper bound
    p_max, r_max = _finite(m, "prompt_length/max"), _finite(m, "response_length/max")
    if p_max is not None and r_max is not None:
        rec.longest_sequence = p_max + r_max
    else:
        missing.add("step_longest_sequence_tokens")
    return rec, missing


def openrlhf_record(step: int, m: dict[str, float], is_async: bool) -> tuple[StepRecord, set[str]]:
    """The StepRecord of one OpenRLHF step, and the contract fields it lacks."""
    missing: set[str] = set()
    rec = StepRecord(step=step, duration=m["timing/step_total"])
    make = _finite(m, "timing/make_experience")
    train = _finite(m, "timing/ppo_train")
    sync = _finite(m, "timing/broadcast")
    ph: dict[str, Optional[float]] = {p: None for p in PHASES}
    ph["generation"] = _finite(m, "timing/generation")
    # make_experience = old + reference log-probs (+ values, reward model) in one timer
    ph["old_logprob"] = make
    ph["training"] = train
    ph["weight_sync"] = sync
    if is_async:
        # step_total is the wall time of the iteration incl. the wait on the rollout queue; what the
        # printed phases do not cover is the trainer waiting (derived)
        if None not in (make, train, sync):
            ph["waiting"] = max(0.0, rec.duration - make - train - sync)
    else:
        ph["waiting"] = ph["rollout_idle"] = 0.0
        rec.staleness = 0.0  # on-policy by construction
    rec.phases = {p: v for p, v in ph.items() if v is not None}
    missing |= {phase_key(p) for p, v in ph.items() if v is None}
    if is_async:
        missing.add("step_staleness")

    n = _finite(m, "rollout/num_samples")
    rlen = _finite(m, "rollout/response_length_mean", "response_length")
    tlen = _finite(m, "total_length")
    if n is not None and rlen is not None:
        rec.generated_tokens = n * rlen
    else:
        missing.add("step_generated_tokens")
    if n is not None and tlen is not None:
        rec.trained_tokens = n * tlen
    else:
        missing.add("step_trained_tokens")
    reward = _finite(m, "rollout/reward_mean", "reward")
    if reward is not None:
        rec.reward = reward
    else:
        missing.add("step_reward_mean")
    kl = _finite(m, "vllm_kl")  # mean(log p_rollout - log p_old): its magnitude
    if kl is not None:
        rec.logprob_mismatch = abs(kl)
    else:
        missing.add("step_logprob_mismatch")
    missing |= {"step_kv_cache_usage_ratio", "step_preemptions"} | UNMAPPED
    return rec, missing


# ---------------------------------------------------------------------------------------------- parsers
class LogParser:
    """Feed console lines; get StepRecords (framework step numbers) as steps complete.

    `missing` is the set of contract fields the last completed step lacked; `missing_by_step`
    keeps it per step; `metrics_by_step` the framework's own metrics of each step.
    """

    framework = ""

    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        self.missing: frozenset[str] = frozenset()
        self.missing_by_step: dict[int, frozenset[str]] = {}
        self.metrics_by_step: dict[int, dict[str, float]] = {}

    def feed(self, line: str) -> list[StepRecord]:
        raise NotImplementedError

    def feed_text(self, text: str) -> list[StepRecord]:
        out: list[StepRecord] = []
        for line in text.splitlines():
            out += self.feed(line)
        return out

    def _done(self, rec: StepRecord, missing: set[str], metrics: dict[str, float]) -> list[StepRecord]:
        self.records.append(rec)
        self.missing = frozenset(missing)
        self.missing_by_step[rec.step] = self.missing
        self.metrics_by_step[rec.step] = metrics
        return [rec]


class VerlParser(LogParser):
    framework = "verl"

    def __init__(self, gpu_memory_gib: float = 0.0) -> None:
        super().__init__()
        self._pending: dict[int, dict[str, float]] = {}
        self.gpu_memory_gib = gpu_memory_gib

    def feed(self, line: str) -> list[StepRecord]:
        parsed = parse_verl_line(line)
        if parsed is None:
            return []
        step, metrics = parsed
        merged = self._pending.setdefault(step, {})
        merged.update(metrics)
        if "timing_s/step" not in metrics or not math.isfinite(metrics["timing_s/step"]):
            return []
        for s in [s for s in self._pending if s <= step]:  # earlier numbers never complete now
            del self._pending[s]
        rec, missing = verl_record(step, merged, self.gpu_memory_gib)
        return self._done(rec, missing, merged)


class OpenRLHFParser(LogParser):
    framework = "openrlhf"

    def feed(self, line: str) -> list[StepRecord]:
        parsed = parse_openrlhf_line(line)
        if parsed is None:
            return []
        step, metrics, is_async = parsed
        if _finite(metrics, "timing/step_total") is None:
            return []
        rec, missing = openrlhf_record(step, metrics, is_async)
        return self._done(rec, missing, metrics)


def parser_for(framework: str, gpu_memory_gib: float = 0.0) -> LogParser:
    """The parser of a framework's console log; `gpu_memory_gib`: the trial GPU's memory (verl
    prints its trainer's peak in GiB, the contract wants the share of the GPU)."""
    f = framework.lower()
    if f == "verl":
        return VerlParser(gpu_memory_gib)
    if f == "openrlhf":
        return OpenRLHFParser()
    raise ValueError(f"unknown framework {framework!r} (known: {', '.join(FRAMEWORKS)})")


def parse_log(framework: str, text: str) -> tuple[list[StepRecord], LogParser]:
    """Every completed step of a whole log."""
    p = parser_for(framework)
    return p.feed_text(text), p
