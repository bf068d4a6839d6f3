"""Search: validity, de-duplication, the GPU budget, staleness limit, frozen knobs, TaskSpec untouched."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_tuner_fixtures import job, steps

from rltune.api.models import TaskSpec
from rltune.api.status import FailureCause, TrialState
from rltune.tuner import Tuner, baseline_record, summarize
from rltune.tuner.knobs import CATALOG
from rltune.tuner.search import Candidate, Space, expected_improvement

PH = {"generation": 420.0, "generation_tail": 200.0, "old_logprob": 55.0, "training": 160.0, "weight_sync": 6.0}

ALL_KNOBS = [k.path for k in CATALOG]


def _base(spec):
    return baseline_record(spec, summarize(steps(PH)))


def test_only_valid_configuration_is_found():
    # 32 heads: rollout TP 3 and 5 are invalid, 8 is the only valid choice; everything else frozen
    frozen = [k for k in ALL_KNOBS if k != "rollout.tp"]
    spec = job(searchSpace={"knobs": {"rollout.tp": [3, 5, 8]}, "frozen": frozen})
    base = _base(spec)
    t = Tuner(spec, base, [])
    props = t.proposer.propose(4, 32)
    assert len(props) == 1 and props[0].config.rollout.tp == 8
    assert props[0].changes == {"rollout.tp": [2, 8]}
    rec = t.judge(t.record_for("t1", props[0]), summarize(steps(dict(PH, generation=300.0))))
    t2 = Tuner(spec, base, [rec])
    assert t2.proposer.propose(4, 32) == []
    assert t2.terminator.done() == (True, "search space exhausted")


def test_a_layout_spelled_two_ways_is_tried_once():
    """trainer.etp [1] beside trainer.tp 1 names TP1 with expert TP unset, the form RLConfig keeps:
    once it ran (and was stored unset) the search must not propose it again, nor forecast it as an
    unmeasured knob value (seen on a generated job: the same layout tried 9 times in a row)."""
    frozen = [k for k in ALL_KNOBS if k not in ("trainer.tp", "trainer.etp")]
    spec = job(searchSpace={"knobs": {"trainer.tp": [1, 2], "trainer.etp": [1]}, "frozen": frozen})
    base = _base(spec)
    t = Tuner(spec, base, [])
    layouts = {(h["trainer.tp"], h["trainer.etp"]) for h in t.space.halves(("trainer.tp", "trainer.etp"))}
    assert (1, 1) not in layouts and (1, None) in layouts
    hist = []
    for i in range(4):
        props = Tuner(spec, base, hist).proposer.propose(1, 32)
        if not props:
            break
        rec = t.record_for(f"t{i + 1}", props[0])
        hist.append(t.judge(rec, summarize(steps(dict(PH, training=150.0 - 5 * i), seed=i))))
    keys = [r.config.key() for r in hist]
    assert len(keys) == len(set(keys)) == 2, keys  # TP1 (ETP unset) and TP2 ETP1; the baseline is TP2
    assert Tuner(spec, base, hist).terminator.done() == (True, "search space exhausted")


def test_every_configuration_the_search_enumerates_is_in_the_form_rlconfig_keeps():
    """The invariant behind the test above, over the generated jobs' spaces (other models, GPUs and
    knob lists): a configuration's identity must survive RLConfig's validators, or a trial's stored
    config never matches the candidate that proposed it."""
    from bench.jobs import generated_jobs
    from bench.run import enumerate_space
    from rltune.api.models import RLTuningJobSpec

    checked = 0
    for j in generated_jobs():
        sp = Space(RLTuningJobSpec.model_validate(j["spec"]))
        ks = enumerate_space(sp)
        for k in ks[:: max(1, len(ks) // 150)]:
            assert sp.config_key(k) == sp.config_key(sp.config(k).flat()), (j["metadata"]["name"], k)
            checked += 1
    assert checked > 1000


def test_failed_configuration_is_never_proposed_twice():
    spec = job()
    base = _base(spec)
    t = Tuner(spec, base, [])
    p = t.proposer.propose(1, 32)[0]
    failed = t.record_for("t1", p).model_copy(
        update={
            "state": TrialState.FAILED,
            "reason": "CUDA out of memory: trainer",
            "cause": FailureCause.OUT_OF_MEMORY,
        }
    )
    t2 = Tuner(spec, base, [failed])
    keys = {x.config.key() for x in t2.proposer.propose(8, 32)}
    assert p.config.key() not in keys
    # and nothing at least as memory-hungry as the OOM on the trainer side
    fm = t2.forecaster.raw(p.config.flat()).trainer_mem_frac
    for x in t2.proposer.propose(8, 32):
        assert t2.forecaster.raw(x.config.flat()).trainer_mem_frac < fm


def test_respects_gpus_free_and_budget():
    spec = job(searchSpace={"allowFewerGpus": True, "minGpus": 8}, objective="gpuSecondsPerStep")
    t = Tuner(spec, _base(spec), [])
    assert set(t.space.gpus) == {8, 16, 24, 32}
    props = t.proposer.propose(4, 16)
    assert props and all(p.gpus <= 16 for p in props)
    assert all(p.config.gpus <= 16 for p in props)
    assert sum(p.gpus for p in props) <= 16  # the batch together, not each proposal alone
    assert t.proposer.propose(2, 4) == []  # no configuration fits in 4 GPUs (whole nodes)
    full = job()  # every configuration uses the whole budget: one trial at a time
    b = full.resources.gpu_budget
    assert len(Tuner(full, _base(full), []).proposer.propose(3, b)) == 1


def test_respects_max_staleness():
    spec = job(constraints={"maxStaleness": 1}, searchSpace={"knobs": {"async.staleness": [0, 1, 2, 4]}})
    t = Tuner(spec, _base(spec), [])
    assert t.space.values["async.staleness"] == [0, 1]
    for p in t.proposer.propose(8, 32) + t.proposer.rank(limit=50):
        assert p.config.async_.staleness <= 1
    spec0 = job(constraints={"maxStaleness": 0})
    for p in Tuner(spec0, _base(spec0), []).proposer.rank(limit=50):
        assert p.config.async_.staleness == 0 and not p.config.async_.partial_rollout


def test_frozen_knobs_and_task_untouched():
    spec = job(searchSpace={"frozen": ["rollout.tp", "placement"]})
    task_before = spec.workload.task.model_dump()
    t = Tuner(spec, _base(spec), [])
    props = t.proposer.propose(6, 32) + t.proposer.rank(limit=30)
    assert props
    for p in props:
        assert p.config.rollout.tp == 2 and p.config.placement == "colocated"
        assert not any(k.startswith("task") for k in p.changes)
    assert spec.workload.task.model_dump() == task_before
    assert set(TaskSpec.model_fields).isdisjoint({k.split(".")[-1] for k in spec.baseline.flat()})


def test_batch_is_diverse_and_unique():
    spec = job()
    t = Tuner(spec, _base(spec), [])
    props = t.proposer.propose(4, 4 * spec.resources.gpu_budget)  # room for four full-budget trials
    assert len(props) == 4
    assert len({p.config.key() for p in props}) == 4
    assert all(p.bottleneck for p in props) and all(p.predicted > 0 and p.std > 0 for p in props)


def test_space_lists_unknown_knob_clearly():
    with pytest.raises(ValueError, match="unknown knob"):
        Space(job(searchSpace={"knobs": {"rollout.bogus": [1]}}))


def test_expected_improvement_treats_the_forecast_as_multiplicative():
    """The forecaster's uncertainty is log-space: a layout forecast 3x slower than the incumbent at
    +-85% is worth less than a sure 5% gain, where a normal of the same sd would rank it first."""

    def cand(objective: float, sd: float) -> Candidate:
        return Candidate({}, objective, sd, objective, sd, 8, {}, 1.0, "")

    inc = 1364.0
    wide, sure = cand(3955.0, 0.85 * 3955.0), cand(0.95 * inc, 0.01 * inc)
    ei = expected_improvement(inc, [wide, sure])
    assert ei[0] < ei[1]
    # the lognormal expectation of (incumbent - X)+, by sampling
    rng = np.random.default_rng(0)
    x = 1100.0 * np.exp(0.3 * rng.standard_normal(400_000))
    mc = np.maximum(inc - x, 0.0).mean()
    assert expected_improvement(inc, [cand(1100.0, 0.3 * 1100.0)])[0] == pytest.approx(mc, rel=0.01)
    # a certain forecast is worth exactly its gain
    assert expected_improvement(inc, [dataclasses.replace(sure, objective_std=1e-9)])[0] == pytest.approx(0.05 * inc)


def _gen10_after_first_trial():
    """gen-10 (Qwen2.5-7B coding on 32 B200s) after its baseline and the tuner's first trial (rollout
    TP 4): the physics ranks a rollout TP 1 half 12% slower than TP 4, and no trial has measured TP 1."""
    from bench.jobs import generated_jobs
    from bench.run import measured_baseline, run_rltune
    from rltune.api.models import RLTuningJobSpec

    job = next(j for j in generated_jobs() if j["metadata"]["name"].startswith("gen-10"))
    rn, base = measured_baseline(job["metadata"]["name"], RLTuningJobSpec.model_validate(job["spec"]))
    return rn.spec, base, run_rltune(rn, base, 1, seed=0)["history"]  # the product's loop, one trial


def test_a_knob_value_no_trial_measured_stays_a_candidate(monkeypatch):
    """Halves ranked by the median alone would keep TP 1 out of every context (many measured TP 4 and
    TP 2 near-copies fill the `top`); its optimistic bound keeps it among the candidates, with a forecast
    that says it is an extrapolation."""
    from rltune.tuner import search

    spec, base, hist = _gen10_after_first_trial()
    t = Tuner(spec, base, hist)
    assert hist[0].config.rollout.tp != 1
    tp1 = [c for c in search.candidates(t.space, t.forecaster) if c.k["rollout.tp"] == 1]
    assert tp1 and all("rollout.tp=1" in c.extrapolation for c in tp1)
    monkeypatch.setattr(search, "EXPLORE", 0)
    assert not [c for c in search.candidates(t.space, t.forecaster) if c.k["rollout.tp"] == 1]


# --------------------------------------------------------------------------- bounded work


def test_uniq_is_first_occurrences_in_order_with_the_lists_equality():
    from rltune.tuner.search import _uniq

    assert _uniq([3, 1, 3, 2, 1]) == [3, 1, 2]
    assert _uniq([1, 1.0, True, 0.5]) == [1, 0.5]  # what `x not in out` kept
    assert _uniq([{"a": 1, "b": 2}, {"b": 2, "a": 1}, {"a": 2}]) == [{"a": 1, "b": 2}, {"a": 2}]
    assert _uniq([[1], [1], [2]]) == [[1], [2]]  # unhashable: the slow way, same result


class Ticks:
    """A clock that advances one second each time it is read: a deadline passes after a fixed number of looks."""

    def __init__(self):
        self.n = 0

    def __call__(self) -> float:
        self.n += 1
        return float(self.n)


def test_a_deadline_ends_the_enumeration_with_what_it_has_and_says_so():
    from rltune.tuner.search import Deadline, candidates

    spec = job()
    t = Tuner(spec, _base(spec), [])
    full = candidates(t.space, t.forecaster)
    clock = Ticks()
    d = Deadline(1e9, clock)
    assert [c.k for c in candidates(t.space, t.forecaster, deadline=d)] == [c.k for c in full]
    assert d.completed == 1 and d.truncated == []
    looks = clock.n
    d = Deadline(looks // 2, Ticks())  # runs out half-way through the looks a whole enumeration takes
    part = candidates(t.space, t.forecaster, deadline=d)
    assert d.completed == 0 and len(d.truncated) == 1 and "out of time" in d.truncated[0]
    keys = [t.space.config_key(c.k) for c in full]
    assert 0 < len(part) < len(full)
    assert [t.space.config_key(c.k) for c in part] == keys[: len(part)]  # a prefix: nothing made up
    d = Deadline(0.0)
    assert candidates(t.space, t.forecaster, deadline=d) == [] and d.truncated


def test_a_truncated_search_never_ends_for_it():
    """Only part of the space was weighed: `done` must not call it exhausted or not worth a trial."""
    from rltune.tuner.search import Deadline

    frozen = [k for k in ALL_KNOBS if k != "rollout.tp"]
    spec = job(searchSpace={"knobs": {"rollout.tp": [3, 5, 8]}, "frozen": frozen})
    t = Tuner(spec, _base(spec), [], deadline=Deadline(0.0))
    assert t.proposer.propose(4, 32) == []
    done, why = t.terminator.done()
    assert not done and why.startswith("search truncated: out of time") and t.proposer.truncated


# --------------------------------------------------------------------------- one knob, one default


def test_the_catalog_covers_the_models_knobs_with_their_types():
    """A knob is declared once, on RLConfig (api/models.py: type, default, bounds, and its KnobRole's
    group and layout role); the catalog reads it from there. Every RLConfig leaf but `gpus` is a
    declared knob, every declared knob has a catalog entry and no entry is undeclared, and each
    default is of the declared type (an "int" knob defaulting to a string would mislead the search)."""
    from rltune.api.models import RLConfig, declared

    leaves = set(RLConfig().flat()) - {"gpus", "cpu"}
    assert {p for p in declared() if not p.startswith("cpu.")} == leaves
    assert [k.path for k in CATALOG if k.path not in declared()] == []
    assert set(declared()) - {k.path for k in CATALOG} == set()
    kinds = {"int": (int,), "float": (float, int), "bool": (bool,), "enum": (str,)}
    wrong = {
        k.path: (k.type, k.default)
        for k in CATALOG
        if k.default is not None
        and (not isinstance(k.default, kinds[k.type]) or (k.type == "int" and isinstance(k.default, bool)))
    }
    assert wrong == {}


def _example_specs():
    root = Path(__file__).resolve().parents[2] / "examples"
    return [
        pytest.param(d["spec"], id=f.name)
        for f in sorted(root.glob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if d and d.get("kind") == "RLTuningJob"
    ]


@pytest.mark.parametrize("raw", _example_specs())
def test_every_default_candidate_is_within_the_declared_bounds(raw):
    """The search's default ranges (Knob.values) stay inside what RLConfig declares (bounds, enum
    values): a candidate outside them would be refused by the model at trial time."""
    from rltune.api.models import RLTuningJobSpec

    spec = RLTuningJobSpec.model_validate(raw)
    model = spec.workload.model.resolved()
    outside = {}
    for k in CATALOG:
        d = k.declared
        for v in k.values(spec, model):
            low = d.minimum is not None and v is not None and v < d.minimum
            high = d.maximum is not None and v is not None and v > d.maximum
            if (d.choices and v not in d.choices) or low or high:
                outside.setdefault(k.path, []).append(v)
    assert outside == {}
