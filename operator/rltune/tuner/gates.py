"""Quality gates a trial must pass before its speed counts.

Gates (each returns a verdict text; a trial passing all is `succeeded`, otherwise `rejected`):

- steps:     at least one steady-state step was measured.
- nan:       no NaN/inf in step time, phases, reward, staleness or mismatch.
- staleness: max observed policy-version lag <= constraints.maxStaleness.
- mismatch:  mean rollout-vs-trainer log-prob mismatch <= constraints.maxLogprobMismatch
             (mean over steady-state steps; verl's rollout_probs_diff_mean, OpenRLHF vllm_kl).
- reward:    one-sided Welch t-test on the per-step mean rewards of the steady-state steps.
             H0: mean_c >= thr, H1: mean_c < thr, with thr = mean_b - tol * |mean_b|
             (tol = constraints.rewardTolerance, b = baseline, c = candidate). The statistic is
             t = (mean_c - thr) / sqrt(s_c^2/n_c + s_b^2/n_b) with Welch-Satterthwaite degrees of
             freedom; the trial is rejected when P(T <= t) < constraints.rewardTestAlpha, i.e. when
             the data show, at that significance level, a reward drop larger than the tolerance.
             With one step on either side (no variance estimate) the gate falls back to the plain
             comparison mean_c >= thr.
"""

from __future__ import annotations

import math
from typing import Optional

from ..api.models import Constraints
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


def _mean_var(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    v = sum((x - m) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return m, v


def welch_one_sided(cand: list[float], base: list[float], tol: float) -> tuple[float, float, float, float]:
    """(p-value of H1 mean_c < thr, t, df, thr). See module docstring."""
    mc, vc = _mean_var(cand)
    mb, vb = _mean_var(base)
    thr = mb - tol * abs(mb)
    se2 = vc / len(cand) + vb / len(base)
    if se2 <= 0 or len(cand) < 2 or len(base) < 2:
        return (0.0 if mc < thr else 1.0), float("nan"), float("nan"), thr
    t = (mc - thr) / math.sqrt(se2)
    num = se2**2
    den = 0.0
    if len(cand) > 1:
        den += (vc / len(cand)) ** 2 / (len(cand) - 1)
    if len(base) > 1:
        den += (vb / len(base)) ** 2 / (len(base) - 1)
    df = num / den if den > 0 else float(len(cand) + len(base) - 2)
    return t_cdf(t, df), t, df, thr


# ----------------------------------------------------------------- the gates


class GateResult(TunerModel):
    """One quality gate's verdict on a trial: passed or not, and the measured detail for people."""

    passed: bool
    detail: str = ""

    def __str__(self) -> str:
        return ("pass" if self.passed else "fail") + (f": {self.detail}" if self.detail else "")


def evaluate(summary: TrialSummary, baseline: Optional[TrialSummary], c: Constraints) -> dict[str, GateResult]:
    """Gate name -> verdict."""
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
    else:
        p, t, df, thr = welch_one_sided(summary.rewards, baseline.rewards, c.reward_tolerance)
        mc = sum(summary.rewards) / len(summary.rewards)
        mb = sum(baseline.rewards) / len(baseline.rewards)
        g["reward"] = GateResult(
            passed=p >= c.reward_test_alpha,
            detail=f"mean reward {mc:.4f} vs baseline {mb:.4f} (threshold {thr:.4f}, "
            f"one-sided Welch p={p:.3g}, alpha={c.reward_test_alpha:g})",
        )
    return g


def passed(gates: dict[str, GateResult]) -> bool:
    return all(g.passed for g in gates.values())


def failed_gates(gates: dict[str, GateResult]) -> list[str]:
    return [name for name, g in gates.items() if not g.passed]
