"""Everything about a job's spec that the CRD schema cannot say, checked before any pod exists.

The schema and pydantic check each field and the simple cross-field rules. What is left needs the
tuner's own knowledge, so it lives here and calls the tuner's code rather than restating it:

- the baseline's layout (Space.rollout_valid / Space.trainer_valid, the rules every candidate
  meets, plus the disaggregated split the twin would refuse): a layout error must be a message, not
  a baseline pod that fails;
- every searchSpace.knobs value: its type and range (the knob catalog's type, RLConfig's bounds),
  GPU counts within the budget, staleness within constraints.maxStaleness, MoE knobs on dense
  models: a "8" string or an 80 meant as 0.8 must be named, not crash the tuner later;
- that the space holds at least one valid configuration besides the baseline (by the same validity
  rules; memory fit is the forecaster's business), else the job could only confirm its baseline;
- that the space holds at most search.MAX_SPACE configurations and costs at most search.MAX_WORK to
  weigh, both counted without enumerating it (Space.count, Space.work): the search weighs it on every
  tick, so a larger one would hold an operator worker.

Pure: no Kubernetes, no I/O. The operator turns the problems into SpecValid=False.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from pydantic import ValidationError

from ..adapters.registry import FRAMEWORKS
from ..adapters.registry import problems as framework_problems
from ..api.layout import layout_of
from ..api.models import RLConfig, RLTuningJobSpec
from .knobs import BY_PATH, MAX_REPLICA_NODES, ROLLOUT_KNOBS, TRAINER_KNOBS
from .search import MAX_SPACE, MAX_WORK, Space

# The knobs the layout rules read; the other knobs of a half never change its validity.
ROLLOUT_LAYOUT = tuple(p for p in ROLLOUT_KNOBS if BY_PATH[p].layout)
TRAINER_LAYOUT = tuple(p for p in TRAINER_KNOBS if BY_PATH[p].layout)
_TRY = (1, 2, 4, 8, 16, 32, 64)  # parallel sizes offered as fixes


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: `field` as users write it (spec.baseline.rollout.tp), `message`
    what is wrong and how to fix it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def check_spec(spec: RLTuningJobSpec) -> list[Problem]:
    """Every problem of a (pydantic-valid) spec that the schema cannot express; [] when it can run."""
    value_problems, clean = _search_values(spec)
    space = Space(clean)
    base_problems = _baseline(space)
    out = _framework(space) + value_problems + base_problems
    too_big = _too_big(space)  # counted, never enumerated: before anything walks the space
    # With values dropped the space is not the one the user wrote, and an invalid baseline pins
    # knobs (MoE knobs on a dense model) to its invalid value: judge the space once both are fixed.
    if not out and not too_big:
        out += _some_valid_configuration(space)
    return too_big + out


# --------------------------------------------------------------------------- a bounded space


def _too_big(space: Space) -> list[Problem]:
    """The space past MAX_SPACE configurations or MAX_WORK units of enumeration (Space.count and
    Space.work: arithmetic, nothing is enumerated)."""
    n, w = space.count(), space.work()
    if n <= MAX_SPACE and w <= MAX_WORK:
        return []
    sizes = {k: len(v) for k, v in space.values.items() if len(v) > 1}
    sizes["gpus x placement x trainerGpus"] = space.contexts()
    big = sorted(sizes.items(), key=lambda kv: -kv[1])[:4]
    return [
        Problem(
            "spec.searchSpace",
            f"the search space holds {n:,} configurations (the operator's bound: {MAX_SPACE:,}) and weighing it "
            f"costs {w:,} units (bound {MAX_WORK:,}, one unit ~50 us), on every tick of the job; the most values: "
            f"{', '.join(f'{k} {c}' for k, c in big)}: list fewer values in spec.searchSpace.knobs or freeze "
            "knobs (spec.searchSpace.frozen)",
        )
    ]


# --------------------------------------------------------------------------- framework


def _framework(space: Space) -> list[Problem]:
    """What the job's framework cannot run: a searchSpace naming a knob it cannot express (the
    search would silently never move it), and a baseline its own constraints refuse."""
    cov, ss, fw = space.coverage, space.spec.search_space, space.spec.workload.framework
    out = [
        Problem(
            f"spec.searchSpace.knobs.{d.knob}",
            f"{fw} cannot run this knob ({d.why}): remove it from searchSpace.knobs",
        )
        for d in cov.dropped
        if d.knob in (ss.knobs or {}) and ss.knobs[d.knob]
    ]
    for path, vals in (ss.knobs or {}).items():
        bad = [v for v in vals if not cov.runs(path, v)]
        if bad and not cov.is_dropped(path):
            low, high = cov.ranges.get(path, (None, None))
            among = f"values in ({low:g}, {high:g}]" if low is not None else f"values among {cov.values.get(path)}"
            out.append(Problem(f"spec.searchSpace.knobs.{path}", f"{fw} cannot run {bad}: use {among}"))
    base = [] if fw not in FRAMEWORKS else framework_problems(space.spec, space.spec.baseline)
    out += [Problem("spec.workload.command", f"the baseline command breaks a {fw} rule: {p}") for p in base]
    return out


# --------------------------------------------------------------------------- searchSpace values


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_problem(kind: str, v: Any) -> Optional[str]:
    """Why `v` is not of a catalog type (int | float | bool | enum), None if it is. Strict: the tuner
    compares and multiplies these values, so a "8" string or a 1 for true is refused, not coerced."""
    ok = {"int": _is_int(v), "float": _is_int(v) or isinstance(v, float), "bool": isinstance(v, bool), "enum": True}[
        kind
    ]  # an enum's names are RLConfig's Literal: _range_problem lists them
    if ok:
        return None
    want = {"int": "an integer", "float": "a number", "bool": "true or false"}[kind]
    quoted = " (write it without quotes)" if isinstance(v, str) else ""
    return f"{v!r} is not {want}{quoted}"


def _range_problem(path: str, v: Any) -> Optional[str]:
    """RLConfig's own bounds and enums for one knob value (the model validates what a trial receives)."""
    try:
        RLConfig().with_knobs({path: v})
    except ValidationError as e:
        return e.errors()[0]["msg"].removeprefix("Value error, ")
    except ValueError as e:
        return str(e)
    return None


def _search_values(spec: RLTuningJobSpec) -> tuple[list[Problem], RLTuningJobSpec]:
    """Problems of the listed knob values, and the spec with the unusable values dropped (so the
    rest of the checks can build the tuner's Space without crashing on them)."""
    ss = spec.search_space
    budget = spec.resources.gpu_budget
    dense = not spec.workload.model.resolved().is_moe
    max_st = spec.constraints.max_staleness
    out: list[Problem] = []
    clean: dict[str, list] = {}
    for path, values in (ss.knobs or {}).items():
        keep = []
        for i, v in enumerate(values):
            where = f"spec.searchSpace.knobs.{path}[{i}]"
            kind = "int" if path == "gpus" else BY_PATH[path].type
            why = _type_problem(kind, v)
            if why is None and path == "gpus":
                if v < 1 or v > budget:
                    why = f"{v} GPUs is outside 1..spec.resources.gpuBudget ({budget}): raise the budget or drop it"
            elif why is None and path == "trainerGpus":
                if v < 1 or v >= budget:
                    why = (
                        f"{v} trainer GPUs must be 1..{budget - 1}, fewer than spec.resources.gpuBudget "
                        f"({budget}) so that some GPUs serve rollouts"
                    )
            elif why is None:
                rng = _range_problem(path, v)
                if rng:
                    why = f"{v!r} is out of range: {rng}"
                elif dense and BY_PATH[path].moe_only and v != BY_PATH[path].default:
                    why = (
                        f"{v!r}: workload.model is dense (no experts), so {path} does not apply: "
                        f"list only {BY_PATH[path].default!r} or remove the knob"
                    )
                elif path == "async.staleness" and v > max_st:
                    why = (
                        f"{v} exceeds spec.constraints.maxStaleness ({max_st}), so no such trial could pass: "
                        "raise constraints.maxStaleness or drop the value"
                    )
            if why:
                out.append(Problem(where, why))
            if why is None or (path == "gpus" and _is_int(v) and v >= 1):
                keep.append(v)  # GPU counts over the budget: the Space drops them itself (and says so)
        clean[path] = keep
    for path in sorted(set(ss.frozen or []) & set(ss.knobs or {})):
        out.append(
            Problem(
                "spec.searchSpace.frozen",
                f"{path} is both frozen and listed in spec.searchSpace.knobs: remove it from one of them",
            )
        )
    cleaned = spec.model_copy(update={"search_space": ss.model_copy(update={"knobs": clean or ss.knobs})})
    return out, cleaned


# --------------------------------------------------------------------------- the baseline's layout


def _alternatives(test: Callable[[dict], Optional[str]], full: dict, knob: str, values: Iterable) -> str:
    ok = [v for v in values if test(full | {knob: v}) is None]
    return f" (valid here: {knob} {', '.join(map(str, ok[:6]))})" if ok else ""


def _layout_problem(space: Space, side: str, reason: str, full: dict, gr: int, gt: int) -> Problem:
    """Name the field a Space rule is about and the fix; the rule's own words say what is wrong."""
    m = space.model
    rt = lambda k: space.rollout_valid(k, gr)  # noqa: E731
    tt = lambda k: space.trainer_valid(k, gt)  # noqa: E731
    if side == "rollout":
        if reason.startswith("rollout TP spans part of a node"):
            return Problem(
                "spec.baseline.rollout.tp",
                f"rollout TP {full['rollout.tp']} is wider than a node (spec.resources.gpusPerNode = "
                f"{space.gpn}) but not whole nodes: a vLLM replica spanning nodes takes a whole number of "
                "them" + _alternatives(rt, full, "rollout.tp", _TRY),
            )
        if reason.startswith("rollout TP spans too many nodes"):
            return Problem(
                "spec.baseline.rollout.tp",
                f"rollout TP {full['rollout.tp']} spans more than {MAX_REPLICA_NODES} nodes of {space.gpn} GPUs: "
                "use a smaller rollout TP (with expertParallel for MoE models)"
                + _alternatives(rt, full, "rollout.tp", _TRY),
            )
        if re.match(r"rollout TP \d+ does not divide \d+ heads", reason):
            return Problem(
                "spec.baseline.rollout.tp",
                f"{reason} (workload.model): use a TP that divides {m.heads}"
                + _alternatives(rt, full, "rollout.tp", _TRY),
            )
        if re.match(r"rollout TP \d+ does not divide \d+ rollout GPUs", reason):
            return Problem(
                "spec.baseline.rollout.tp",
                f"{reason}: every rollout GPU must belong to a replica; change rollout.tp, baseline.gpus "
                "or baseline.trainerGpus" + _alternatives(rt, full, "rollout.tp", _TRY),
            )
        if reason.startswith("expert parallel on a dense model"):
            return Problem(
                "spec.baseline.rollout.expertParallel",
                "workload.model is dense (no experts): set rollout.expertParallel to false",
            )
        return Problem("spec.baseline.rollout", reason)
    if reason.startswith("trainer TP spans nodes"):
        return Problem(
            "spec.baseline.trainer.tp",
            f"trainer TP {full['trainer.tp']} is wider than a node (spec.resources.gpusPerNode = "
            f"{space.gpn})" + _alternatives(tt, full, "trainer.tp", _TRY),
        )
    if re.match(r"trainer TP \d+ does not divide", reason):
        return Problem(
            "spec.baseline.trainer.tp",
            f"{reason} (workload.model): use a TP that divides {m.heads}" + _alternatives(tt, full, "trainer.tp", _TRY),
        )
    if re.match(r"trainer PP \d+ too deep", reason):
        return Problem(
            "spec.baseline.trainer.pp",
            f"{reason}: each pipeline stage needs at least 4 layers" + _alternatives(tt, full, "trainer.pp", _TRY),
        )
    if reason.startswith("tp*pp*cp="):
        tp, pp = full["trainer.tp"], full["trainer.pp"]
        pairs = sorted(itertools.product(_TRY, _TRY), key=lambda x: (x[0] != tp) + (x[1] != pp) + abs(x[1] - pp) / 64)
        ok = [f"tp={t} pp={p}" for t, p in pairs if tt(full | {"trainer.tp": t, "trainer.pp": p}) is None][:4]
        return Problem(
            "spec.baseline.trainer",
            f"trainer {reason} (trainer.tp x trainer.pp x trainer.cp must divide them)"
            + (f"; valid here with cp={full['trainer.cp']}: {', '.join(ok)}" if ok else ""),
        )
    if re.match(r"EP \d+ does not divide \d+ experts", reason):
        return Problem(
            "spec.baseline.trainer.ep",
            f"{reason} (workload.model)" + _alternatives(tt, full, "trainer.ep", range(1, min(m.experts, 256) + 1)),
        )
    if re.match(r"EP \d+ does not divide", reason):
        return Problem(
            "spec.baseline.trainer.ep",
            f"{reason} (trainer GPUs / trainer.pp)" + _alternatives(tt, full, "trainer.ep", _TRY),
        )
    if reason.startswith("EP*ETP"):
        etp = full.get("trainer.etp")
        return Problem(
            "spec.baseline.trainer.etp",
            f"{reason} (trainer GPUs / trainer.pp; trainer.etp {'unset = trainer.tp' if etp is None else etp}): "
            "Megatron shards experts over ep*etp GPUs of each pipeline stage; set trainer.etp 1 or lower "
            "trainer.ep" + _alternatives(tt, full, "trainer.etp", _TRY),
        )
    if reason.startswith("trainer expert TP spans nodes") or re.match(r"ETP \d+ does not divide", reason):
        return Problem(
            "spec.baseline.trainer.etp",
            f"{reason} (spec.resources.gpusPerNode = {space.gpn}; workload.model)"
            + _alternatives(tt, full, "trainer.etp", _TRY),
        )
    if reason.startswith("expert tensor parallel on a dense model"):
        return Problem(
            "spec.baseline.trainer.etp",
            f"workload.model is dense (no experts): leave trainer.etp unset, not {full['trainer.etp']}",
        )
    if reason.startswith("expert parallel on a dense model"):
        return Problem(
            "spec.baseline.trainer.ep",
            f"workload.model is dense (no experts): set trainer.ep to 1, not {full['trainer.ep']}",
        )
    return Problem("spec.baseline.trainer", reason)


def _baseline(space: Space) -> list[Problem]:
    """The baseline must be a configuration the search itself would accept (it is trial zero)."""
    base = space.base
    gpus, gt, gr = layout_of(base, space.budget, space.gpn).parts
    if gpus > space.budget:
        return [
            Problem(
                "spec.baseline.gpus",
                f"uses {gpus} GPUs, more than spec.resources.gpuBudget "
                f"({space.budget}): raise the budget or lower baseline.gpus",
            )
        ]
    out = []
    if base["placement"] == "disaggregated":
        given = "" if base.get("trainerGpus") else " (the default split)"
        if gt >= gpus or gr < base["rollout.tp"]:
            out.append(
                Problem(
                    "spec.baseline.rollout.tp",
                    f"disaggregated placement leaves {max(gr, 0)} rollout GPUs (spec.baseline.gpus {gpus} - "
                    f"spec.baseline.trainerGpus {gt}{given}), fewer than spec.baseline.rollout.tp "
                    f"({base['rollout.tp']}), one replica: lower trainerGpus or rollout.tp, or use placement colocated",
                )
            )
            return out
    why = space.rollout_valid(base, gr)
    if why:
        out.append(_layout_problem(space, "rollout", why, base, gr, gt))
    why = space.trainer_valid(base, gt)
    if why:
        out.append(_layout_problem(space, "trainer", why, base, gr, gt))
    return out


# --------------------------------------------------------------------------- a non-empty space


def _distinct(values: list) -> list:
    """`values` without repeats of the same type and value (1 and True stay two), in linear time."""
    seen: set = set()
    out = []
    for v in values:
        try:
            if (type(v), v) in seen:
                continue
            seen.add((type(v), v))
        except TypeError:  # unhashable: compared the slow way
            if any(v == w and type(v) is type(w) for w in out):
                continue
        out.append(v)
    return out


def _layouts(space: Space, layout: tuple[str, ...], half: tuple[str, ...]) -> list[dict]:
    """Every combination of a half's layout knobs, the rest at their first value (they never change
    validity, so each combination stands for the product of the rest)."""
    fill = {n: space.values[n][0] for n in half}
    return [fill | dict(zip(layout, c)) for c in itertools.product(*(_distinct(space.values[n]) for n in layout))]


def _some_valid_configuration(space: Space) -> list[Problem]:
    """At least one configuration besides the baseline meets the search's validity rules."""
    if not space.gpus:
        listed = (space.spec.search_space.knobs or {}).get("gpus")
        return [
            Problem(
                "spec.searchSpace",
                f"no valid configuration: every GPU count in searchSpace.knobs.gpus "
                f"({listed}) is above spec.resources.gpuBudget={space.budget}: list counts within the budget",
            )
        ]
    outer = space.iter_outer()  # walked only as far as needed
    first = next(outer, None)
    if first is None:
        return [
            Problem(
                "spec.searchSpace",
                "no valid configuration: placement is disaggregated only and no trainer "
                "split fits (searchSpace.knobs.trainerGpus must be fewer than the GPUs of a configuration): "
                "list smaller trainerGpus or allow placement colocated",
            )
        ]
    rolls = _layouts(space, ROLLOUT_LAYOUT, ROLLOUT_KNOBS)
    trains = _layouts(space, TRAINER_LAYOUT, TRAINER_KNOBS)
    r_rest = math.prod(len(_distinct(space.values[n])) for n in ROLLOUT_KNOBS if n not in ROLLOUT_LAYOUT)
    t_rest = math.prod(len(_distinct(space.values[n])) for n in TRAINER_KNOBS if n not in TRAINER_LAYOUT)
    valid_r: dict[int, list[dict]] = {}
    valid_t: dict[int, list[dict]] = {}
    why_r: Counter = Counter()
    why_t: Counter = Counter()
    count, example = 0, None
    for o in itertools.chain([first], outer):
        _, gt, gr = layout_of(dict(space.base) | o, space.budget, space.gpn).parts
        if gr < 1 or gt < 1:
            continue
        if gr not in valid_r:
            valid_r[gr] = []
            for r in rolls:
                why = space.rollout_valid(r, gr)
                if why:
                    why_r[why] += 1
                else:
                    valid_r[gr].append(r)
        if gt not in valid_t:
            valid_t[gt] = []
            for t in trains:
                why = space.trainer_valid(t, gt)
                if why:
                    why_t[why] += 1
                else:
                    valid_t[gt].append(t)
        n = len(valid_r[gr]) * r_rest * len(valid_t[gt]) * t_rest
        if n and example is None:
            example = dict(space.base) | o | valid_r[gr][0] | valid_t[gt][0]
            if example["placement"] == "colocated":
                example["trainerGpus"] = None
        count += n
        if count >= 2:
            return []  # two distinct valid configurations: at least one is not the baseline
    if count == 1 and space.config_key(example) != space.config_key(space.base):
        return []
    if count == 1:
        return [
            Problem(
                "spec.searchSpace",
                "no valid configuration besides the baseline: every knob is frozen or "
                "pinned to the baseline's value: list other values in searchSpace.knobs or unfreeze knobs",
            )
        ]
    if not any(valid_r.values()):
        reason, _ = why_r.most_common(1)[0] if why_r else ("no rollout GPUs", 0)
        return [
            Problem(
                "spec.searchSpace",
                f"no valid configuration: no rollout layout is valid ({reason}): list "
                "rollout.tp values that divide the attention heads and fit a node",
            )
        ]
    if not any(valid_t.values()):
        reason, _ = why_t.most_common(1)[0] if why_t else ("no trainer GPUs", 0)
        return [
            Problem(
                "spec.searchSpace",
                f"no valid configuration: no trainer layout is valid ({reason}): list "
                "trainer tp/pp/cp/ep values whose product divides the trainer GPUs",
            )
        ]
    return [
        Problem(
            "spec.searchSpace",
            "no valid configuration: no GPU split has both a valid rollout and a valid "
            f"trainer layout (rollout: {why_r.most_common(1)[0][0] if why_r else '-'}; trainer: "
            f"{why_t.most_common(1)[0][0] if why_t else '-'}): widen searchSpace.knobs",
        )
    ]
