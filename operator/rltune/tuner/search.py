"""Candidate generation over a job's search space.

The space is the product of the knob values the job allows (searchSpace.knobs, else the
catalog's default range plus the baseline value; searchSpace.frozen and MoE-only knobs on dense
models pin a knob to the baseline), minus invalid configurations (divisibility by heads and
GPUs per node, GPU budget, staleness <= constraints.maxStaleness) and configurations that
certainly do not fit in memory (fit probability below memfit.P_FIT_MIN).

The product is large (millions for a MoE job with the default catalog), but a step's time is
monotone non-decreasing in every phase, and the rollout phases depend only on (rollout GPUs,
rollout knobs, staleness/partial rollout) while the trainer phases depend only on (trainer GPUs,
trainer knobs). So, per outer context (GPU count, placement and split, staleness, partial
rollout, weight sync) the search keeps the `top` best rollout halves and the `top` best trainer
halves under the calibrated forecaster (plus the baseline's own halves) and scores their full
product. The best-predicted configuration of the whole space is always among the candidates;
uncertainty-driven exploration sees the `top`x`top` neighbourhood of each context's optimum.
Ranking halves by the forecast's median alone would hide a knob value no trial has measured
behind many measured near-copies (the physics ranking rollout TP 1 12% below TP 4 keeps every
TP 1 half out of a 7B job's candidates, although its correction is the prior's +-40%): each
context also keeps the EXPLORE best halves by their optimistic bound (EXPLORE_Z sds below the
median), and expected improvement decides whether a trial there is worth it.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Optional

import numpy as np

from ..adapters.registry import adapter_for, coverage
from ..adapters.registry import problems as framework_problems
from ..api.layout import layout_of
from ..api.models import ModelArch, RLConfig, RLTuningJobSpec, TrainerKnobs
from . import physics
from .forecast import Forecaster, features
from .knobs import BY_PATH, CATALOG, CPU_KNOBS, MAX_REPLICA_NODES, ROLLOUT_KNOBS, TRAINER_KNOBS
from .memfit import P_FIT_MIN
from .records import objective_of

# Halves kept per context beyond the `top` best medians: the best by the optimistic bound, EXPLORE_Z
# sds of the calibrated correction below the median (module docstring).
EXPLORE, EXPLORE_Z = 2, 1.0
# Configurations forecast at once under a deadline (candidates looks at the clock between chunks).
PREDICT_CHUNK = 2048


def _hopeful(kept: np.ndarray, hope: np.ndarray) -> list[int]:
    """Indices of the EXPLORE rows best by their optimistic bound `hope` among those not `kept`
    (the `top` best by the median)."""
    held = set(kept.tolist())
    return [int(i) for i in np.argsort(hope) if int(i) not in held][:EXPLORE]


def _uniq(xs: Iterable) -> list:
    """`xs` without repeats, first occurrences in order, in linear time: a set of seen keys (a dict
    by its items), where a list's `in` made enumerating a space quadratic (three rollout knobs of 16
    values took 42 s). Equality is the same as the list's (1 == 1.0 == True)."""
    seen: set = set()
    out = []
    for x in xs:
        try:
            key = frozenset(x.items()) if isinstance(x, dict) else x
            if key in seen:
                continue
            seen.add(key)
        except TypeError:  # an unhashable value: compared the slow way
            if x in out:
                continue
        out.append(x)
    return out


# The bounds on a job's search space, both counted without enumerating it and checked before any pod
# (validation.check_spec, spec.searchSpace): the search weighs the space on every tick, so a space past
# them would hold an operator worker (three rollout knobs of 60 values: 6x10^10 configurations, hours
# of enumeration; the CRD admits 24 knobs of 64 values, ~3x10^30). The tick budget (Deadline,
# tickBudgetSeconds) is the second guard, for what still runs long under them. Measured on 2 cores
# with `python -m bench.space_bound --time --shapes` (a cold physics cache: a job's first tick):
#
# MAX_SPACE, configurations (Space.count: every knob's value count x the GPU counts, placements and
# trainer splits). The catalog's default ranges count 11,059,200 for examples/twin-demo.yaml (0.6-1.4 s),
# 147,456,000 for verl-dapo-b300.yaml (3.6 s) and 162,570,240 for twin-deepseek-v3-h200.yaml (4.4 s),
# the largest of the examples, the invalid corpus and the bench's jobs (theirs are at most 4,608);
# 10^9 leaves it 6x. A space of 943,718,400 (wide halves, one context) enumerates in 6 s. The count is
# a poor measure of time (the halves are enumerated side by side, not multiplied), hence
# MAX_WORK, units of ~50 us (Space.work: the vLLM physics of every rollout half per rollout context,
# the trainer halves, the forecasts). Under it: twin-deepseek-v3-h200.yaml 346,080 (4.4 s), 45 CPU
# splits of the demo job 406,560 (6-9 s); past it: three rollout knobs of 8 values on the demo job
# 700,192 (11-16 s), of 12 values 2,334,496 (24-41 s). The physics is cached per process
# (physics.rollout_part, shared by the jobs), so a space the first tick cuts short is usually weighed
# whole on the next ones (the 943,718,400 one: cut at 5 s, then 2.2 s, 1.1 s).
MAX_SPACE = 1_000_000_000
MAX_WORK = 500_000


@dataclass
class Deadline:
    """A time budget for one tick's search: `seconds` on `clock` from its creation (plain numbers:
    the pure core never reads the operator's settings). `candidates` stops enumerating once it has
    passed and says so in `truncated`; `completed` counts the enumerations that finished in time."""

    seconds: float
    clock: Callable[[], float] = time.monotonic
    at: float = field(init=False)
    truncated: list[str] = field(default_factory=list)
    completed: int = 0

    def __post_init__(self) -> None:
        self.at = self.clock() + self.seconds

    def expired(self) -> bool:
        return self.clock() >= self.at


class _OutOfTime(Exception):
    """The deadline passed inside an enumeration."""


def _checked(xs: Iterable, deadline: Optional[Deadline], every: int = 512) -> Iterator:
    """`xs`, raising _OutOfTime once `deadline` has passed (looked at every `every` items)."""
    if deadline is None:
        yield from xs
        return
    for i, x in enumerate(xs):
        if i % every == 0 and deadline.expired():
            raise _OutOfTime
        yield x


class Space:
    """The job's search space: per-knob candidate values and the validity rules."""

    def __init__(self, spec: RLTuningJobSpec):
        self.spec = spec
        self.model: ModelArch = spec.workload.model.resolved()
        self.base = spec.baseline.flat()
        self.budget = spec.resources.gpu_budget
        self.gpn = spec.resources.gpus_per_node
        ss = spec.search_space
        listed = ss.knobs or {}
        frozen = set(ss.frozen or [])
        unknown = [p for p in list(listed) + list(frozen) if p not in BY_PATH and p not in ("gpus",)]
        if unknown:
            raise ValueError(f"searchSpace names unknown knobs {unknown}: known are {sorted(BY_PATH)} and gpus")
        # what the job's framework can express (rltune.adapters): dropped knobs stay at the
        # baseline, restricted ones keep only values the framework can run
        self.coverage = coverage(spec)
        self.values: dict[str, list] = {}
        for k in CATALOG:
            if k.path == "trainerGpus":
                continue
            b = self.base.get(k.path)
            runnable = self.coverage.values.get(k.path)
            if k.path in frozen or (k.moe_only and not self.model.is_moe) or self.coverage.is_dropped(k.path):
                vals = [b]
            elif k.path in listed:
                vals = _uniq(listed[k.path]) or [b]
            else:
                default = list(k.values(spec, self.model))
                vals = _uniq([b] + (default if default or runnable is None else list(runnable)))
            if runnable is not None:
                vals = [v for v in vals if v == b or self.coverage.runs(k.path, v)] or [b]
            self.values[k.path] = vals
        # staleness never above the limit (the baseline's own value is allowed as given)
        ms = spec.constraints.max_staleness
        self.values["async.staleness"] = [s for s in self.values["async.staleness"] if s <= ms] or [
            self.base["async.staleness"]
        ]
        base_gpus = self.base.get("gpus") or self.budget
        if "gpus" in listed and listed["gpus"]:
            gl = [g for g in listed["gpus"] if g <= self.budget]
        elif "gpus" in frozen:
            gl = [base_gpus]
        elif ss.allow_fewer_gpus or spec.objective in ("gpuSecondsPerStep", "costPerStep"):
            lo = ss.min_gpus or max(self.gpn, self.budget // 2)
            gl = [g for g in range(self.gpn, self.budget + 1, self.gpn) if g >= lo]
            gl = _uniq([base_gpus] + gl)
        else:
            gl = [base_gpus]
        self.gpus = sorted(set(gl))
        self.trainer_gpus_listed = listed.get("trainerGpus")
        self.frozen = frozen
        self.narrowed: dict[str, list] = {}
        self._narrow(listed)

    def _narrow(self, listed: dict) -> None:
        """rltune's own default ranges past MAX_SPACE configurations or MAX_WORK (a job of many
        GPUs: more layouts, more splits): the widest default range (never one the job listed or
        froze) is thinned to every other value, the baseline's kept, until the space fits; what was
        left out is in `narrowed`, which the job's status reports (status.narrowedKnobs)."""
        while self.count() > MAX_SPACE or self.work() > MAX_WORK:  # as validation counts them
            open_ = [p for p, v in self.values.items() if p not in listed and p not in self.frozen and len(v) > 2]
            if not open_:
                return  # only the job's own lists are left: validation refuses them, naming the knobs
            path = max(open_, key=lambda p: len(self.values[p]))
            base, vals = self.base.get(path), self.values[path]
            keep = [v for i, v in enumerate(vals) if i % 2 == 0 or v == base]
            self.narrowed.setdefault(path, []).extend(v for v in vals if v not in keep)
            self.values[path] = keep

    # ------------------------------------------------------------------ validity
    def trainer_splits(self, gpus: int) -> list[Optional[int]]:
        if self.trainer_gpus_listed:
            return _uniq(t for t in self.trainer_gpus_listed if 0 < t < gpus)
        if "trainerGpus" in self.frozen and self.base.get("trainerGpus"):
            return [self.base["trainerGpus"]] if self.base["trainerGpus"] < gpus else []
        out = []
        for f in (0.25, 0.375, 0.5, 0.625, 0.75):
            t = int(round(gpus * f / self.gpn)) * self.gpn
            if self.gpn <= t <= gpus - self.gpn and t not in out:
                out.append(t)
        if (
            self.base["placement"] == "disaggregated"
            and self.base.get("trainerGpus")
            and (self.base.get("gpus") or self.budget) == gpus
            and self.base["trainerGpus"] not in out
        ):
            out.append(self.base["trainerGpus"])
        return out

    def rollout_valid(self, r: dict, gr: int) -> Optional[str]:
        tp = r["rollout.tp"]
        if tp > self.gpn and tp % self.gpn:
            return "rollout TP spans part of a node"
        if tp > MAX_REPLICA_NODES * self.gpn:
            return "rollout TP spans too many nodes"
        if self.model.heads % tp:
            return f"rollout TP {tp} does not divide {self.model.heads} heads"
        if gr % tp:
            return f"rollout TP {tp} does not divide {gr} rollout GPUs"
        if r["rollout.expertParallel"] and not self.model.is_moe:
            return "expert parallel on a dense model"
        return None

    def trainer_valid(self, t: dict, gt: int) -> Optional[str]:
        tp, pp, cp, ep = t["trainer.tp"], t["trainer.pp"], t["trainer.cp"], t["trainer.ep"]
        if tp > self.gpn:
            return "trainer TP spans nodes"
        if self.model.heads % tp:
            return f"trainer TP {tp} does not divide {self.model.heads} heads"
        if pp > max(1, self.model.layers // 4):
            return f"trainer PP {pp} too deep for {self.model.layers} layers"
        if gt % (tp * pp * cp):
            return f"tp*pp*cp={tp * pp * cp} does not divide {gt} trainer GPUs"
        etp = t.get("trainer.etp")
        if self.model.is_moe:
            etp = physics.TrainerKnobs.of(t).expert_tp
            if self.model.experts % ep:
                return f"EP {ep} does not divide {self.model.experts} experts"
            if (gt // pp) % ep:
                return f"EP {ep} does not divide {gt // pp} GPUs per stage"
            if (gt // pp) % (ep * etp):
                return f"EP*ETP {ep * etp} does not divide {gt // pp} GPUs per stage"
            if etp > self.gpn:
                return "trainer expert TP spans nodes"
            if self.model.expert_ffn % etp:
                return f"ETP {etp} does not divide the expert width {self.model.expert_ffn}"
        elif ep != 1:
            return "expert parallel on a dense model"
        elif etp is not None and etp != tp:
            return "expert tensor parallel on a dense model"
        return None

    def outer(self) -> list[dict]:
        """Every outer context: GPU count, placement and trainer split, async settings, weight sync, CPU split."""
        return list(self.iter_outer())

    def iter_outer(self) -> Iterator[dict]:
        """The outer contexts one by one, in `outer`'s order (nothing is built before it is asked for)."""
        cpus = self.halves(CPU_KNOBS)
        for gpus in self.gpus:
            for place in self.values["placement"]:
                splits = [None] if place == "colocated" else self.trainer_splits(gpus)
                for tg in splits:
                    for st, pr, sf in itertools.product(
                        self.values["async.staleness"],
                        self.values["async.partialRollout"],
                        self.values["async.staleFraction"],
                    ):
                        if (pr or sf) and st < 1:
                            continue
                        for ws in self.values["weightSync"]:
                            for cpu in cpus:
                                yield {
                                    "gpus": gpus,
                                    "placement": place,
                                    "trainerGpus": tg,
                                    "async.staleness": st,
                                    "async.partialRollout": pr,
                                    "async.staleFraction": sf,
                                    "weightSync": ws,
                                } | cpu

    def framework_problem(self, k: dict) -> Optional[str]:
        """The first constraint of the job's framework a full flat configuration violates."""
        if adapter_for(self.spec.workload.framework) is None:
            return None
        found = framework_problems(self.spec, self.config(k))
        return found[0] if found else None

    def halves(self, names: tuple[str, ...], deadline: Optional[Deadline] = None) -> list[dict]:
        """Every combination of the named knobs' values, each in its canonical form (`canonical`),
        once: two spellings of one layout would be forecast and tried as two configurations.
        Raises _OutOfTime once `deadline` has passed."""
        combos = itertools.product(*(self.values[n] for n in names))
        return _uniq(canonical(dict(zip(names, combo))) for combo in _checked(combos, deadline))

    def size(self) -> int:
        """Configurations in the (unpruned) product, for display."""
        r = math.prod(len(self.values[k]) for k in ROLLOUT_KNOBS)
        t = math.prod(len(self.values[k]) for k in TRAINER_KNOBS)
        return len(self.outer()) * r * t

    def contexts(self) -> int:
        """GPU count x placement pairs, a disaggregated one once per trainer split (counted, not built)."""
        return sum(
            1 if place == "colocated" else len(self.trainer_splits(g))
            for g in self.gpus
            for place in self.values["placement"]
        )

    def work(self, top: int = 6) -> int:
        """What one enumeration (`candidates`) costs, counted without enumerating, in units of about
        50 us on 2 cores (MAX_WORK), an upper bound: per rollout GPU count and streaming, every rollout
        half of a valid layout runs the vLLM physics once (`physics.rollout_part`, ~2 ms: 40 units; the
        staleness values reuse it, 1 unit each); every trainer half once per trainer GPU count (1); the
        kept halves' product (at most top + EXPLORE + 3 a side) in every outer context is forecast (4 a
        configuration)."""
        grs, gts = set(), set()
        for g in self.gpus:
            for place in self.values["placement"]:
                for tg in [None] if place == "colocated" else self.trainer_splits(g):
                    k = dict(self.base) | {"gpus": g, "placement": place, "trainerGpus": tg}
                    _, gt, gr = layout_of(k, self.budget, self.gpn).parts
                    if gr >= 1 and gt >= 1:
                        grs.add(gr)
                        gts.add(gt)
        r = math.prod(len(self.values[k]) for k in ROLLOUT_KNOBS)
        t = math.prod(len(self.values[k]) for k in TRAINER_KNOBS)
        layout = ("rollout.tp", "rollout.expertParallel")  # all that Space.rollout_valid reads
        rest = r // math.prod(len(self.values[k]) for k in layout)
        valid = sum(
            self.rollout_valid({"rollout.tp": tp, "rollout.expertParallel": ep}, gr) is None
            for gr in grs
            for tp in self.values["rollout.tp"]
            for ep in self.values["rollout.expertParallel"]
        )
        streams = 2 if any(self.values["async.partialRollout"]) else 1
        stale = len(self.values["async.staleness"])
        keep = top + EXPLORE + 3
        outer = self.count() // (r * t)
        return (
            40 * streams * valid * rest
            + streams * stale * len(grs) * r
            + len(gts) * t
            + 4 * outer * min(r, keep) * min(t, keep)
        )

    def count(self) -> int:
        """Configurations in the product, counted without enumerating it: `contexts()` times every other
        knob's value count. An upper bound of `size()`, which leaves out the contexts `outer` skips
        (partial rollout or a stale fraction without staleness); two spellings of one layout count twice."""
        return self.contexts() * math.prod(len(v) for k, v in self.values.items() if k != "placement")

    def config_key(self, k: dict) -> str:
        """Identity of a configuration of this space (see `flat_key`)."""
        return flat_key(k, self.budget, self.gpn)

    def config(self, k: dict) -> RLConfig:
        """An explicit RLConfig from a flat knob dict: gpus always set, and the trainer split when
        disaggregated (a trial must not depend on a workload's own default split)."""
        return explicit(
            self.spec.baseline.with_knobs(
                {p: v for p, v in k.items() if p != "cpu" and not (p in CPU_KNOBS and v is None)}
            ),
            self.budget,
            self.gpn,
        )

    def all_valid(self, full: dict) -> Optional[str]:
        """Validity of a full flat config against the space (used for baseline-independent checks)."""
        gpus, gt, gr = layout_of(full, self.budget, self.gpn).parts
        if gpus > self.budget:
            return f"uses {gpus} GPUs, budget {self.budget}"
        if full["async.staleness"] > self.spec.constraints.max_staleness:
            return "staleness above constraints.maxStaleness"
        return self.rollout_valid(full, gr) or self.trainer_valid(full, gt)


@dataclass
class Candidate:
    k: dict  # flat knobs
    step: float
    std: float
    objective: float
    objective_std: float
    gpus: int
    phases: dict
    p_fit: float = 1.0  # probability that it fits in memory (rltune.tuner.memfit)
    extrapolation: str = ""  # what its forecast rests on that no measurement has shown


def candidates(
    space: Space,
    fc: Forecaster,
    top: int = 6,
    exclude=None,
    gpus_max: Optional[int] = None,
    deadline: Optional[Deadline] = None,
) -> list[Candidate]:
    """Scored candidates (feasible, valid, not excluded), pruned as the module docstring explains.

    With a `deadline` the enumeration stops once it has passed: the candidates are those of the outer
    contexts gathered by then (possibly none), and `deadline.truncated` says how far it got."""
    base = space.base
    cut = len(deadline.truncated) if deadline is not None else 0  # a deadline may be shared by several calls
    try:
        r_all = space.halves(ROLLOUT_KNOBS, deadline)
        t_all = space.halves(TRAINER_KNOBS, deadline)
    except _OutOfTime:
        deadline.truncated.append("out of time listing the rollout and trainer halves, before any context")
        return []
    r_base = {k: base[k] for k in ROLLOUT_KNOBS}
    t_base = {k: base[k] for k in TRAINER_KNOBS}
    outer: Iterable[dict] = space.iter_outer()
    if gpus_max is not None:
        outer = (o for o in outer if o["gpus"] <= gpus_max)
    gspec = space.spec
    mf = physics.facts_cached(space.model)
    tf = fc.task  # the task as measured (response length, learned tool latency)
    gname = gspec.resources.gpu_type
    reach = physics.gpu_lookup(gname).nvlink_reach(space.gpn)

    best_r: dict[tuple, list[dict]] = {}
    best_t: dict[int, list[dict]] = {}
    out: list[dict] = []
    seen: set[str] = set()
    gathered = 0
    try:
        for o in _checked(outer, deadline, every=1):
            gpus = o["gpus"]
            ko = dict(base) | o
            _, gt, gr = layout_of(ko, space.budget, space.gpn).parts
            if gr < 1 or gt < 1:
                continue
            partial = physics.AsyncKnobs.of(o).streams
            rkey = (gr, o["async.staleness"], partial)
            if rkey not in best_r:
                rows, feats, raws = [], [], []
                for r in _checked(r_all, deadline):
                    if space.rollout_valid(r, gr):
                        continue
                    ro = physics.rollout_part(mf, tf, gname, gr, physics.RolloutKnobs.of(r, partial).on(mf), reach)
                    if not ro.feasible or fc.memory.p_side("rollout", -ro.free_frac) < P_FIT_MIN:
                        continue
                    kk = dict(ko) | r
                    rows.append(r)
                    feats.append(features(kk, gpus, gt, gr, ro.preempt_log))
                    raws.append({"generation": fc.gen_raw(ro.bulk + ro.tool, ro.tail)})
                if rows:
                    tot = fc.calibrated_total(("generation",), raws, feats)
                    order = np.argsort(tot)
                    pick = [rows[i] for i in order[:top]]
                    hope = fc.calibrated_total(("generation",), raws, feats, z=EXPLORE_Z)
                    pick += [rows[i] for i in _hopeful(order[:top], hope)]
                    # keep diversity in the memory dimension (colocated memory coupling) and the baseline half
                    lowmem = sorted(range(len(rows)), key=lambda i: (rows[i]["rollout.gpuMemoryUtilization"], tot[i]))[
                        :2
                    ]
                    pick += [rows[i] for i in lowmem]
                    if r_base in rows:
                        pick.append(r_base)
                    best_r[rkey] = _uniq(pick)
                else:
                    best_r[rkey] = []
            if gt not in best_t:
                rows, feats, raws = [], [], []
                for t in _checked(t_all, deadline):
                    if space.trainer_valid(t, gt):
                        continue
                    tr = physics.trainer_of(mf, tf, gname, gt, physics.TrainerKnobs.of(t))
                    if not tr.feasible or fc.memory.p_side("trainer", tr.mem_frac) < P_FIT_MIN:
                        continue
                    kk = dict(ko) | t
                    rows.append(t)
                    feats.append(features(kk, gpus, gt, gr))
                    raws.append({"old_logprob": tr.old_logprob, "ref_logprob": tr.ref_logprob, "training": tr.training})
                if rows:
                    phases = ("old_logprob", "ref_logprob", "training")
                    tot = fc.calibrated_total(phases, raws, feats)
                    order = np.argsort(tot)
                    pick = [rows[i] for i in order[:top]]
                    hope = fc.calibrated_total(phases, raws, feats, z=EXPLORE_Z)
                    pick += [rows[i] for i in _hopeful(order[:top], hope)]
                    # smallest resident weights (colocated memory coupling)
                    pick += [
                        rows[i]
                        for i in sorted(
                            range(len(rows)),
                            key=lambda i: (
                                -rows[i]["trainer.tp"] * rows[i]["trainer.pp"] * rows[i]["trainer.ep"],
                                tot[i],
                            ),
                        )[:2]
                    ]
                    if t_base in rows:
                        pick.append(t_base)
                    best_t[gt] = _uniq(pick)
                else:
                    best_t[gt] = []
            for r in best_r[rkey]:
                for t in best_t[gt]:
                    k = dict(base) | o | r | t
                    if k["placement"] == "colocated":
                        k["trainerGpus"] = None
                    key = space.config_key(k)
                    if key in seen:
                        continue
                    seen.add(key)
                    out.append(k)
            gathered += 1
    except _OutOfTime:
        deadline.truncated.append(f"out of time after gathering {gathered} outer contexts (GPUs, placement, async)")
    if exclude:
        out = [k for k in out if not exclude(k)]
    if adapter_for(gspec.workload.framework) is not None:
        out = [k for k in out if space.framework_problem(k) is None]
    if deadline is None:
        preds = fc.predict_many(out)
    else:  # forecast in chunks, so that a deadline passed meanwhile keeps what is forecast
        preds = []
        for i in range(0, len(out), PREDICT_CHUNK):
            if deadline.expired() and preds:
                deadline.truncated.append(f"out of time after forecasting {len(preds)} of {len(out)} configurations")
                break
            preds += fc.predict_many(out[i : i + PREDICT_CHUNK])
    if deadline is not None and len(deadline.truncated) == cut:
        deadline.completed += 1
    res = []
    for k, p in zip(out, preds):
        if not p.feasible:
            continue
        res.append(
            Candidate(
                k,
                p.step,
                p.std,
                objective_of(gspec, p.step, p.gpus),
                objective_of(gspec, p.std, p.gpus),
                p.gpus,
                p.phases,
                p.p_fit,
                p.extrapolation,
            )
        )
    return res


def expected_improvement(incumbent: float, cands: list[Candidate]) -> np.ndarray:
    """Expected improvement of each candidate's objective over the incumbent's, under its forecast.

    The forecaster's uncertainty is multiplicative (log-space corrections to the physics), so the
    objective is lognormal: median `objective`, log-sd `objective_std / objective`. A wide forecast
    well above the incumbent then has little mass below it; a normal of the same sd would put much
    there (and some below zero) and rank a layout forecast 3x slower at +-85% above a sure 5% gain."""
    med = np.maximum(np.array([c.objective for c in cands]), 1e-12)
    sig = np.maximum(np.array([c.objective_std for c in cands]) / med, 1e-9)
    z = (math.log(max(incumbent, 1e-12)) - np.log(med)) / sig
    return incumbent * _ncdf(z) - med * np.exp(0.5 * sig * sig) * _ncdf(z - sig)


def noisy_trial_value(cands: list[Candidate], measurement_sd: float) -> list[Candidate]:
    """The candidates with the objective sd that a noisy trial can resolve: a trial measures the
    objective with relative sd `measurement_sd`, so the estimate it leaves moves by at most
    sd^2 / sqrt(sd^2 + noise^2) (the knowledge gradient of one noisy observation), not by the
    full forecast sd. Expected improvement under that sd is what the trial is worth: where the
    forecast is no more certain than one trial's noise, another trial mostly re-draws the noise."""
    out = []
    for c in cands:
        noise = measurement_sd * c.objective
        sd = c.objective_std**2 / math.sqrt(c.objective_std**2 + noise**2) if c.objective_std > 0 else 0.0
        out.append(replace(c, objective_std=sd))
    return out


def _ncdf(z):
    return 0.5 * (1.0 + np.vectorize(math.erf)(np.asarray(z) / math.sqrt(2.0)))


def canonical(k: dict) -> dict:
    """The flat knobs in the one form RLConfig keeps (api.models.TrainerKnobs.kept_etp): an expert TP equal
    to the dense TP is Megatron's default, unset. A search space listing trainer.etp [1] beside
    trainer.tp 1 names the unset layout: without this the search forecast it as an unmeasured knob
    value and proposed it again after every trial of it (the trial ran, and was stored, unset)."""
    etp = k.get("trainer.etp")
    kept = TrainerKnobs.kept_etp(k.get("trainer.tp"), etp)
    return k if kept == etp else k | {"trainer.etp": kept}


def flat_key(k: dict, budget: int, gpn: int) -> str:
    """Identity of a configuration (flat knobs) for de-duplication: gpus=None means the budget,
    a disaggregated split of None means the default split, colocated has no split, and the knobs
    are compared in their canonical form."""
    kk = {p: v for p, v in canonical(k).items() if p != "cpu" and not (p in CPU_KNOBS and v is None)}
    if kk.get("gpus") in (None, budget):
        kk["gpus"] = None
    if kk.get("placement") == "colocated":
        kk["trainerGpus"] = None
    elif not kk.get("trainerGpus"):
        kk["trainerGpus"] = layout_of(k, budget, gpn).trainer
    return repr(sorted(kk.items(), key=lambda x: x[0]))


def explicit(cfg: RLConfig, budget: int, gpn: int) -> RLConfig:
    """The configuration with gpus (and trainerGpus when disaggregated) filled in."""
    gpus, gt, _ = layout_of(cfg.flat(), budget, gpn).parts
    upd = {"gpus": gpus, "trainer_gpus": gt if cfg.placement == "disaggregated" else None}
    return cfg.model_copy(update=upd)
