"""Quality gates a trial must pass before its speed counts.

Gates (each returns a verdict text; a trial passing all is `succeeded`, otherwise `rejected`):

- steps:     at least one steady-state step was measured.
- nan:       no NaN/inf in step time, phases, reward, staleness or mismatch.
- staleness: max observed policy-version lag <= constraints.maxStaleness.
- mismatch:  mean rollout-vs-trainer log-prob mismatch <= constraints.maxLogprobMismatch
             (mean over steady-state steps; verl's rollout_probs_diff_mean, OpenRLHF vllm_kl).
- memory:    (rltune.tuner.headroom, added by Tuner.judge for search trials) the trial's measured
             trainer peak, carried to the planned run's longest sequence, stays within the GPU.
- reward:    a one-sided test of the candidate's per-step mean rewards against the baseline's
             (steady-state steps; `reward_test`). The relative drop D = (mean_b - mean_c) / |mean_b|
             is estimated with a trend-adjusted two-sample t model: both trials share one linear
             learning trend over their step positions (the reward climbs during a trial and both
             start from the same checkpoint), the candidate is offset by delta; the residual
             variance is pooled (df = n_b + n_c - 3). With a = constraints.rewardTestAlpha and
             tol = constraints.rewardTolerance, [lo, hi] are the one-sided (1 - a) bounds of D and
             the trial is rejected when lo > tol: the data show, at level a, a drop larger than the
             tolerance. A trial whose drop is within the tolerance is rejected with probability
             <= a; a drop beyond it is caught with a power set by the steps and the reward noise
             (bench/gate_rates.py measures it; docs/tuner.md has the detectable drop per step count and
             why the gate does not use the non-inferiority framing, reject unless hi <= tol).
             Fallbacks: without the degrees of freedom for a trend, a pooled t-test of the means;
             with one step on either side, the plain comparison D > tol.
             With constraints.rewardGate nonInferiority the winner's confirmation run is judged
             in the non-inferiority framing instead (reject unless hi <= tol) against a baseline
             profiled as long: the stage that holds a drop at the tolerance to <= alpha, with a
             false-alarm rate the steps and the noise set (`reward_power` estimates it from the
             baseline's rewards; docs/tuner.md says why it is the default).
             The confirmation is group-sequential (`confirmation_looks`): an interim look after
             half its scored steps confirms early when every gate passes at alpha/2; otherwise the
             full run is judged at alpha/2. By Bonferroni a drop at the tolerance still passes with
             probability <= alpha; a healthy winner usually stops at the look (bench/gate_rates.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from ..api.models import Budget, Constraints
from .summary import TrialSummary, TunerModel

# ----------------------------------------------------------------- Student t without scipy


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the regularised incomplete beta (Numerical Recipes 6.4)."""
    MAXIT, EPS, FPMIN = 300, 3e-14, 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > FPMIN else FPMIN)
    h = d
    for m in range(1, MAXIT + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > FPMIN else FPMIN)
        c = 1.0 + aa / c
        c = c if abs(c) > FPMIN else FPMIN
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > FPMIN else FPMIN)
        c = 1.0 + aa / c
        c = c if abs(c) > FPMIN else FPMIN
        de = d * c
        h *= de
        if abs(de - 1.0) < EPS:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x)
    bt = math.exp(lbt)
    if x < (a + 1) / (a + b + 2):
        return bt * _betacf(a, b, x) / a
    return 1.0 - bt * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


@lru_cache(maxsize=1024)
def t_ppf(p: float, df: float) -> float:
    """The p-quantile of Student's t with df degrees of freedom (bisection on t_cdf; cached, the
    gates ask for few distinct (p, df) pairs)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must lie in (0, 1)")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class RewardTest:
    """The reward gate's statistics. Drops are relative to |baseline mean| (0.05 = 5% lower)."""

    drop: float  # estimated relative drop D of the candidate's mean reward (negative: higher)
    lo: float  # one-sided (1 - alpha) lower bound of D
    hi: float  # one-sided (1 - alpha) upper bound of D
    se: float  # standard error of D
    df: float  # degrees of freedom of the t reference (inf: none estimated)
    method: str  # "trend-adjusted t", "pooled t" or "means"
    tolerance: float
    alpha: float
    reject: bool
    mean_c: float
    mean_b: float
    non_inferiority: bool = False  # the framing: reject unless shown within the tolerance

    @property
    def verdict(self) -> str:
        if self.reject and self.non_inferiority and self.lo <= self.tolerance:
            return "not shown within the tolerance"
        if self.reject:
            return "significantly more than the tolerance lower"
        if self.hi <= self.tolerance:
            return "shown within the tolerance"
        if self.lo > 0:
            return "significantly lower, not significantly beyond the tolerance"
        return "no significant drop"


def reward_test(
    cand: list[float], base: list[float], tol: float, alpha: float, non_inferiority: bool = False
) -> RewardTest:
    """Tolerance test of the candidate's per-step rewards against the baseline's (module docstring).

    Rewards are in step order; position i of each list is the i-th steady-state step, so a common
    linear learning trend over positions is removed before the comparison. `non_inferiority`: the
    confirmation's framing, reject unless hi <= tol (the data show the drop within the tolerance)."""
    nc, nb = len(cand), len(base)
    if nc == 0 or nb == 0:
        raise ValueError("reward_test needs at least one reward on each side")
    mc, mb = sum(cand) / nc, sum(base) / nb
    scale = abs(mb) if abs(mb) > 1e-12 else 1.0
    margin = tol if abs(mb) > 1e-12 else 0.0  # relative tolerance of a zero baseline is no slack
    xc, xb = (nc - 1) / 2.0, (nb - 1) / 2.0
    sxx = sum((i - xc) ** 2 for i in range(nc)) + sum((i - xb) ** 2 for i in range(nb))
    syy = sum((y - mc) ** 2 for y in cand) + sum((y - mb) ** 2 for y in base)
    n = nc + nb
    if n - 3 >= 1 and sxx > 0:
        sxy = sum((i - xc) * (y - mc) for i, y in enumerate(cand)) + sum(
            (i - xb) * (y - mb) for i, y in enumerate(base)
        )
        beta = sxy / sxx
        delta = (mc - mb) - beta * (xc - xb)
        df = float(n - 3)
        s2 = max(0.0, syy - beta * sxy) / df
        var = s2 * (1.0 / nc + 1.0 / nb + (xc - xb) ** 2 / sxx)
        method = "trend-adjusted t"
    elif n - 2 >= 1:
        delta, df = mc - mb, float(n - 2)
        var = syy / df * (1.0 / nc + 1.0 / nb)
        method = "pooled t"
    else:
        delta, df, var, method = mc - mb, math.inf, 0.0, "means"
    drop = -delta / scale
    se = math.sqrt(var) / scale
    q = t_ppf(1.0 - alpha, df) if se > 0 else 0.0
    lo, hi = drop - q * se, drop + q * se
    reject = (hi > margin + 1e-12) if non_inferiority else (lo > margin + 1e-12)
    return RewardTest(drop, lo, hi, se, df, method, tol, alpha, reject, mc, mb, non_inferiority)


@dataclass(frozen=True)
class RewardPower:
    """How well the winner's confirmation can resolve the tolerance, from the baseline's reward noise.

    The non-inferiority test catches a drop at the tolerance with probability >= 1 - alpha by
    construction; what the steps decide is how often a healthy winner (no drop) fails it, the
    false-alarm rate. noise: the baseline's per-step reward sd around its learning trend, relative
    to |mean|; false_alarm: the approximate chance that a winner with no drop fails confirmation with
    `scored` steady-state steps on each side; needed: the fewest scored steps per side that bring it
    to <= FALSE_ALARM_GOAL (None: more than MAX_SCORED)."""

    noise: float
    scored: int
    false_alarm: float
    needed: Optional[int]


FALSE_ALARM_GOAL = 0.05  # the share of healthy winners a confirmation may fail (bench/gate_rates.py measures it)
MAX_SCORED = 200


def _false_alarm(n: int, noise: float, tol: float, alpha: float) -> float:
    """P(hi > tol | no drop) for n scored steps per side (normal approximation to the drop). Both
    series start at position 0, so the shared trend adds nothing to the offset's error."""
    se = noise * math.sqrt(2.0 / n)
    if se <= 0:
        return 0.0
    df = max(1.0, 2.0 * n - 3.0)
    z = tol / se - t_ppf(1.0 - alpha, df)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def reward_power(base: list[float], scored: int, tol: float, alpha: float) -> Optional[RewardPower]:
    """The confirmation's power at the baseline's measured reward noise (None: fewer than 3 finite
    baseline rewards, so no noise estimate around a trend)."""
    ys = [y for y in base if math.isfinite(y)]
    n = len(ys)
    if n < 3 or scored < 1:
        return None
    m = sum(ys) / n
    x = (n - 1) / 2.0
    sxx = sum((i - x) ** 2 for i in range(n))
    beta = sum((i - x) * (y - m) for i, y in enumerate(ys)) / sxx
    resid = sum((y - m - beta * (i - x)) ** 2 for i, y in enumerate(ys))
    noise = math.sqrt(resid / (n - 2)) / (abs(m) if abs(m) > 1e-12 else 1.0)
    fa = _false_alarm(scored, noise, tol, alpha)
    needed = next((k for k in range(2, MAX_SCORED + 1) if _false_alarm(k, noise, tol, alpha) <= FALSE_ALARM_GOAL), None)
    return RewardPower(noise, scored, fa, needed)


@dataclass(frozen=True)
class Look:
    """One look at the winner's confirmation: after `steps` steps (warm-up included), the reward's
    non-inferiority test at level `alpha`; `final`: the run's full length (an interim look can
    only confirm early, never reject)."""

    steps: int
    alpha: float
    final: bool


INTERIM_ALPHA_SHARE = 0.5  # the share of rewardTestAlpha spent at the interim look (bench/gate_rates.py chose it)
MIN_INTERIM_SCORED = 3  # fewer scored steps than this at half the run: no interim look


def confirmation_looks(b: Budget, c: Constraints) -> tuple[Look, ...]:
    """The looks at a confirmation run of `b.confirmSteps` steps. With rewardGate nonInferiority an
    interim look after half the scored steps may confirm a winner early at alpha * INTERIM_ALPHA_SHARE,
    and the full run is judged at the rest of alpha: the chance that a drop at the tolerance passes
    either look is <= alpha (Bonferroni), as with one look, while a winner whose reward is clearly
    within it stops at half the cost. Screen confirmations and short ones have the one final look."""
    a = c.reward_test_alpha
    scored = b.confirm_steps - b.warmup_steps
    if c.reward_gate != "nonInferiority" or scored // 2 < MIN_INTERIM_SCORED:
        return (Look(b.confirm_steps, a, True),)
    first = a * INTERIM_ALPHA_SHARE
    return (Look(b.warmup_steps + scored // 2, first, False), Look(b.confirm_steps, a - first, True))


# ----------------------------------------------------------------- the gates


class GateResult(TunerModel):
    """One quality gate's verdict on a trial: passed or not, and the measured detail for people."""

    passed: bool
    detail: str = ""

    def __str__(self) -> str:
        return ("pass" if self.passed else "fail") + (f": {self.detail}" if self.detail else "")


def evaluate(
    summary: TrialSummary,
    baseline: Optional[TrialSummary],
    c: Constraints,
    confirmation: bool = False,
    alpha: Optional[float] = None,
) -> dict[str, GateResult]:
    """Gate name -> verdict. `confirmation`: the winner's confirmation run, whose reward test is the
    non-inferiority framing (reject unless the drop is shown within the tolerance); `alpha`: the
    reward test's level at this look (default constraints.rewardTestAlpha; `confirmation_looks`)."""
    g: dict[str, GateResult] = {}
    if summary.failed or summary.steps == 0:
        g["steps"] = GateResult(passed=False, detail="no steady-state step was measured")
        return g
    g["steps"] = GateResult(passed=True, detail=f"{summary.steps} steady-state steps")
    g["nan"] = GateResult(passed=not summary.nan, detail="NaN or inf reported" if summary.nan else "all values finite")
    st = summary.max_staleness
    ok = st <= c.max_staleness + 1e-9
    g["staleness"] = GateResult(
        passed=ok,
        detail=f"max staleness {st:g} <= {c.max_staleness}"
        if ok
        else f"max staleness {st:g} > limit {c.max_staleness}",
    )
    mm = summary.mean_logprob_mismatch
    ok = mm <= c.max_logprob_mismatch
    g["mismatch"] = GateResult(
        passed=ok,
        detail=f"mean log-prob mismatch {mm:.4f} <= {c.max_logprob_mismatch:g}"
        if ok
        else f"mean log-prob mismatch {mm:.4f} > limit {c.max_logprob_mismatch:g}",
    )
    if baseline is None or not baseline.rewards:
        g["reward"] = GateResult(passed=True, detail="no baseline rewards to compare against")
    elif not summary.rewards:
        g["reward"] = GateResult(passed=False, detail="no rewards reported")
    elif not all(math.isfinite(r) for r in summary.rewards + baseline.rewards):
        g["reward"] = GateResult(passed=False, detail="non-finite reward reported")
    else:
        a = c.reward_test_alpha if alpha is None else alpha
        rt = reward_test(summary.rewards, baseline.rewards, c.reward_tolerance, a, confirmation)
        g["reward"] = GateResult(
            passed=not rt.reject,
            detail=f"mean reward {rt.mean_c:.4f} vs baseline {rt.mean_b:.4f}: drop {rt.drop:.1%} "
            f"(one-sided {1 - rt.alpha:.0%} bounds {rt.lo:.1%}..{rt.hi:.1%}, {rt.method}"
            + (f", df {rt.df:g}" if math.isfinite(rt.df) else "")
            + f"), tolerance {rt.tolerance:.1%}"
            + (", non-inferiority" if confirmation else "")
            + f": {rt.verdict}",
        )
    return g


def passed(gates: dict[str, GateResult]) -> bool:
    return all(g.passed for g in gates.values())


def failed_gates(gates: dict[str, GateResult]) -> list[str]:
    return [name for name, g in gates.items() if not g.passed]
