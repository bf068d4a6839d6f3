"""Workload sampling: response lengths (long-tailed lognormal), agentic episodes (turns, tool latency).

Lengths: lognormal with the task's mean (default max/4) and coefficient of variation (default 1.0),
clipped at the maximum (docs/references.md 'Workload shapes': DAPO responses are long-tailed; the
max of 16 samples is ~5x
the mean). `stratified=True` gives a deterministic, noise-free sample (quantiles of the
distribution in a fixed shuffled order): the expectation used by `simulate_step_time`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple, Optional

import numpy as np

from rltune.api.models import TaskSpec

from .efficiency import Efficiency

_FIXED_PERM_SEED = 20240611


def _std_normal(n: int, rng: Optional[np.random.Generator], stream: int = 0) -> np.ndarray:
    """n standard normal draws; without a generator, the deterministic quantiles of N(0,1) in a
    fixed shuffled order. `stream` picks the order: draws that are independent in the noisy twin
    (an agentic turn's generation, observation and tool latency: arrays of the same length) need
    orders of their own, or the noiseless sample makes them comonotone (the longest generations
    meet the longest observations, more episodes hit the context limit, the tail thins)."""
    if rng is None:
        from statistics import NormalDist

        q = (np.arange(n) + 0.5) / n
        nd = NormalDist()
        z = np.array([nd.inv_cdf(float(x)) for x in q]) if n <= 64 else _fast_probit(q)
        seed = _FIXED_PERM_SEED + n if stream == 0 else [_FIXED_PERM_SEED + n, stream]
        return z[np.random.default_rng(seed).permutation(n)]
    return rng.standard_normal(n)


def _fast_probit(q: np.ndarray) -> np.ndarray:
    # Acklam's rational approximation of the inverse normal CDF (|error| < 1.2e-9).
    a = [
        -3.969683028665376e01,
        2.209460984245205e02,
        -2.759285104469687e02,
        1.383577518672690e02,
        -3.066479806614716e01,
        2.506628277459239e00,
    ]
    b = [
        -5.447609879822406e01,
        1.615858368580409e02,
        -1.556989798598866e02,
        6.680131188771972e01,
        -1.328068155288572e01,
    ]
    c = [
        -7.784894002430293e-03,
        -3.223964580411365e-01,
        -2.400758277161838e00,
        -2.549732539343734e00,
        4.374664141464968e00,
        2.938163982698783e00,
    ]
    d = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00]
    plow = 0.02425
    out = np.empty_like(q)
    lo = q < plow
    hi = q > 1 - plow
    mid = ~(lo | hi)
    ql = np.sqrt(-2 * np.log(q[lo]))
    out[lo] = (((((c[0] * ql + c[1]) * ql + c[2]) * ql + c[3]) * ql + c[4]) * ql + c[5]) / (
        (((d[0] * ql + d[1]) * ql + d[2]) * ql + d[3]) * ql + 1
    )
    qh = np.sqrt(-2 * np.log(1 - q[hi]))
    out[hi] = -(((((c[0] * qh + c[1]) * qh + c[2]) * qh + c[3]) * qh + c[4]) * qh + c[5]) / (
        (((d[0] * qh + d[1]) * qh + d[2]) * qh + d[3]) * qh + 1
    )
    qm = q[mid] - 0.5
    r = qm * qm
    out[mid] = (
        (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5])
        * qm
        / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    )
    return out


def lognormal(
    n: int, mean: float, cv: float, lo: float, hi: float, rng: Optional[np.random.Generator], stream: int = 0
) -> np.ndarray:
    """n lognormal draws with the given (unclipped) mean and CV, clipped to [lo, hi], as ints
    (`stream`: see _std_normal)."""
    s2 = math.log1p(cv * cv)
    mu = math.log(max(mean, 1.0)) - s2 / 2
    x = np.exp(mu + math.sqrt(s2) * _std_normal(n, rng, stream))
    return np.clip(np.rint(x), lo, hi).astype(np.int64)


@dataclass
class Episodes:
    """Rollout work of one step: one turn per episode (`gen`), or multi-turn episodes (`turns`)."""

    prompt: np.ndarray  # initial prompt tokens per episode
    gen: Optional[np.ndarray] = None  # single turn: generated tokens per episode
    turns: Optional[FlatTurns] = None  # multi-turn: every episode's turns as flat arrays

    @property
    def multi(self) -> bool:
        return self.turns is not None

    def __len__(self) -> int:
        return len(self.prompt)

    @cached_property
    def flat(self) -> FlatTurns:
        """Every episode's turns as flat arrays (indexed per replica)."""
        if self.turns is not None:
            return self.turns
        n = len(self.gen)
        return FlatTurns(
            np.asarray(self.prompt, dtype=np.int64),
            np.arange(n + 1, dtype=np.int64),
            np.asarray(self.gen, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.float64),
        )

    def select(self, idx: np.ndarray) -> FlatTurns:
        """The flat turns of episodes `idx` (in that order), offsets starting at 0."""
        f = self.flat
        if not self.multi:
            return FlatTurns(f.prompt[idx], np.arange(len(idx) + 1, dtype=np.int64), f.gen[idx], f.obs, f.tool)
        lens = f.off[idx + 1] - f.off[idx]
        off = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lens, out=off[1:])
        pos = np.repeat(f.off[idx] - off[:-1], lens) + np.arange(off[-1], dtype=np.int64)
        return FlatTurns(f.prompt[idx], off, f.gen[pos], f.obs[pos], f.tool[pos])

    def per_episode(self) -> tuple[list, list, list]:
        """Each episode's generated tokens, observation tokens and tool seconds per turn, as lists
        (for reading and tests; the twin works on the flat arrays)."""
        f = self.flat
        cut = f.off[1:-1]
        split = lambda a: [x.tolist() for x in np.split(a, cut)]  # noqa: E731
        if not self.multi:
            return split(f.gen), [[0]] * len(self), [[0.0]] * len(self)
        return split(f.gen), split(f.obs), split(f.tool)

    def seq_lens(self) -> np.ndarray:
        """Tokens each episode's trained sequence holds: prompt, generations and observations."""
        f = self.flat
        if not self.multi:
            return f.prompt + f.gen
        return f.prompt + np.add.reduceat(f.gen + f.obs, f.off[:-1])

    def generated(self) -> int:
        """Tokens generated in the step (every turn of every episode)."""
        return int(self.flat.gen.sum())


class FlatTurns(NamedTuple):
    """Episodes as flat arrays: episode j's turns are off[j]..off[j+1]-1 (single turn: obs, tool empty)."""

    prompt: np.ndarray  # int64, per episode
    off: np.ndarray  # int64, n + 1
    gen: np.ndarray  # int64, generated tokens per turn
    obs: np.ndarray  # int64, observation tokens after each turn
    tool: np.ndarray  # float64, tool seconds after each turn


def max_model_len(task: TaskSpec) -> int:
    return task.max_prompt_tokens + task.max_response_tokens


def sample_episodes(task: TaskSpec, eff: Efficiency, rng: Optional[np.random.Generator], batches: int = 1) -> Episodes:
    n = task.prompts_per_step * task.samples_per_prompt * batches
    cv = task.response_length_cv or eff.extra.get("length_cv", 1.0)
    mean = task.mean_response_tokens or task.max_response_tokens / 4
    prompt_mean = eff.extra.get("prompt_mean_tokens", max(64.0, task.max_prompt_tokens / 4))
    prompts_per = lognormal(task.prompts_per_step * batches, prompt_mean, 0.5, 16, task.max_prompt_tokens, rng)
    prompt = np.repeat(prompts_per, task.samples_per_prompt)
    if task.kind != "agentic-coding":
        return Episodes(prompt=prompt, gen=lognormal(n, mean, cv, 1, task.max_response_tokens, rng))
    # Agentic coding: geometric turns (CV ~ 1), per-turn generation, observations and tool latency.
    turns_mean = float(task.turns or eff.turns)
    tool_mean = float(task.tool_latency_seconds if task.tool_latency_seconds is not None else eff.tool_latency)
    limit = max_model_len(task)
    if rng is None:
        q = (np.arange(n) + 0.5) / n
        q = q[np.random.default_rng(_FIXED_PERM_SEED).permutation(n)]
        p = 1.0 / max(turns_mean, 1.0)
        turns = np.maximum(1, np.ceil(np.log1p(-q) / math.log1p(-p) if p < 1 else np.ones(n))).astype(int)
    else:
        turns = rng.geometric(1.0 / max(turns_mean, 1.0), n) if turns_mean > 1 else np.ones(n, int)
    turns = np.minimum(turns, int(max(1, 4 * turns_mean)))
    total = int(turns.sum())
    per_turn_mean = mean / turns_mean
    gens = lognormal(total, per_turn_mean, cv, 1, task.max_response_tokens, rng)
    obs = lognormal(total, eff.obs_tokens, 1.0, 0, limit, rng, stream=1)
    tools = np.zeros(total)
    if tool_mean > 0:
        s2 = math.log1p(eff.tool_cv**2)
        z = _std_normal(total, rng, stream=2)
        tools = np.exp(math.log(tool_mean) - s2 / 2 + math.sqrt(s2) * z)
    off, g, o, t = _truncate_episodes(prompt, turns, gens, obs, tools, task.max_response_tokens, limit)
    return Episodes(prompt=prompt, turns=FlatTurns(np.asarray(prompt, dtype=np.int64), off, g, o, t))


def _truncate_episodes(
    prompt: np.ndarray,
    turns: np.ndarray,
    gens: np.ndarray,
    obs: np.ndarray,
    tools: np.ndarray,
    budget0: int,
    limit: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each episode's turns, cut where its response budget or context runs out, as flat arrays
    (episode offsets, generated tokens, observation tokens, tool seconds per kept turn).

    Turns before an episode's first cut are taken as drawn; the cumulative sums find that turn
    for all episodes at once (the sums are exact: token counts are integers). The cut turn keeps
    its generation clipped to what is left and its observation clipped to the context, and ends
    the episode; an episode left with no turn keeps one token of its first."""
    n, total = len(turns), int(turns.sum())
    offs = np.zeros(n, dtype=np.int64)
    np.cumsum(turns[:-1], out=offs[1:])
    ep_of = np.repeat(np.arange(n), turns)

    def before(x: np.ndarray) -> np.ndarray:
        """Sum of x over each turn's earlier turns in its episode."""
        c = np.cumsum(x) - x
        return c - c[offs][ep_of]

    gens, obs = np.asarray(gens, dtype=np.int64), np.asarray(obs, dtype=np.int64)
    tools = np.asarray(tools, dtype=np.float64)
    ctx = prompt.astype(np.int64)[ep_of] + before(gens + obs)  # context before each turn's generation
    left = budget0 - before(gens)  # response budget left at each turn
    # A turn is cut, or ends its episode, when its generation uses up the budget or its generation
    # and observation reach the context limit (observations are >= 0, so this also covers a
    # generation clipped by the context).
    cut = (gens >= left) | (ctx + gens + obs >= limit - 1)
    first = np.minimum.reduceat(np.where(cut, np.arange(total), total), offs)
    clean = np.minimum(first, offs + turns) - offs  # whole turns kept per episode
    # the cut turn: generation clipped to the budget and context left, kept if anything is left
    has_cut = clean < turns
    j = np.minimum(offs + clean, total - 1)
    gj = np.minimum(np.minimum(gens[j], left[j]), limit - ctx[j] - 1)
    add = has_cut & (gj > 0)
    oj = np.minimum(obs[j], np.maximum(0, limit - (ctx[j] + gj) - 1))
    g, o = gens.copy(), obs.copy()
    g[j[add]], o[j[add]] = gj[add], oj[add]
    rank = np.arange(total) - offs[ep_of]  # turn number within its episode
    keep = rank < (clean + add)[ep_of]
    empty = (clean == 0) & ~add  # nothing left: one token, no observation, the first turn's tool time
    g[offs[empty]], o[offs[empty]] = 1, 0
    keep[offs[empty]] = True
    lens = np.maximum(clean + add, 1)
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    return off, g[keep], o[keep], tools[keep]
