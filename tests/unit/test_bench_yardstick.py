"""bench.yardstick: the noiseless yardstick against the twin's noisy steps."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.yardstick import Contender, JobYardstick, measure_job, noisy_steps  # noqa: E402


def _job(*rows: tuple[str, float, float, float]) -> JobYardstick:
    return JobYardstick("j", "math", [Contender(*r) for r in rows])


def test_agreeing_yardsticks_have_no_regret():
    j = _job(("oracle", 100.0, 110.0, 1.0), ("plan#1", 105.0, 116.0, 1.0))
    assert j.same_best and j.regret == 0.0 and not j.resolved
    assert j.contenders[0].bias == pytest.approx(100 / 110 - 1)
    assert j.speedup("noiseless") is None  # no baseline among the contenders


def test_a_reversal_beyond_the_sampling_is_reported_as_resolved_regret():
    # the noiseless yardstick prefers the oracle, the noisy mean prefers plan#1 by 5%, se 1 s each
    j = _job(("oracle", 100.0, 120.0, 1.0), ("plan#1", 101.0, 114.0, 1.0))
    assert not j.same_best
    assert j.by("noisy_mean").label == "plan#1"
    assert j.regret == pytest.approx(120 / 114 - 1)
    assert j.resolved
    # the same reversal inside the noise is not
    assert not _job(("oracle", 100.0, 120.0, 4.0), ("plan#1", 101.0, 114.0, 4.0)).resolved


def test_a_real_job_measures_both_yardsticks_with_common_random_numbers():
    from bench.run import select_jobs

    job = select_jobs("gen-07-qwen3-30b-a3b-gb200-math", "generated")[0]
    r = measure_job(job, samples=2, top=1)
    labels = [c.label for c in r.contenders]
    assert labels[:2] == ["baseline", "oracle"]
    for c in r.contenders:
        assert c.noiseless > 0 and c.noisy_mean > 0 and abs(c.bias) < 0.5
    # the oracle is the noiseless yardstick's best by construction, and faster than the baseline
    assert r.by("noiseless").label == "oracle"
    assert r.speedup("noiseless") > 1.0 and r.speedup("noisy_mean") > 1.0


def test_an_infeasible_configuration_has_no_noisy_steps():
    from bench.run import Runner, select_jobs

    from rltune.api.models import RLTuningJobSpec

    job = select_jobs("gen-07-qwen3-30b-a3b-gb200-math", "generated")[0]
    spec = RLTuningJobSpec.model_validate(job["spec"])
    rn = Runner("t", spec)
    cfg = spec.baseline.model_copy(
        update={"rollout": spec.baseline.rollout.model_copy(update={"gpu_memory_utilization": 0.99})}
    )
    assert noisy_steps(rn, cfg, 2) is None
