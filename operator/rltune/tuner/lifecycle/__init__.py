"""The one tuning lifecycle: baseline -> profile -> search -> confirm -> conclude, as a pure step.

`step(spec, status, observations, now, generation) -> Decisions` takes the job's status (the
lifecycle's only memory), what the driver observed of each active trial (plain data), and the time;
it returns the new status and what to do: trials to start (recorded Pending: the driver creates
their pods or processes), trials to tear down, events. The operator's reconciler drives it from
pods and Prometheus (read -> step -> write); `rltune tune --local` drives it from local processes.
Nothing here knows Kubernetes, so the lifecycle is unit-tested with plain data.

    Pending -> Profiling -> Searching -> Confirming -> Succeeded
                   |            |  ^          |
                   v            v  +----------+ (the winner did not confirm: next best)
                 Failed       Failed

A job with other GPU pools (spec.resources.pools) stays Confirming for one more trial when the
forecast says the winner is cheaper per step in another pool (rltune.tuner.pools): that trial runs
there, and its measurement, not the forecast, goes into status.poolOffer.

A package, one module a part, bottom up (each imports only those above it):

    types        Observation, Refusal, Event, Decisions: what a step takes and returns
    conditions   time stamps, conditions, phases; refuse_spec and wait_for
    context      StepContext: the state of one step
    trials       a trial recorded, finished, torn down
    scoring      active trials advanced, stopped early, scored, judged
    outcome      the best configuration, the tuning cost, Succeeded
    pooling      the winner's offer on another GPU pool
    concluding   the end of the search: the winner to confirm
    profiling    phase Profiling: the baseline and the profile
    searching    phase Searching
    confirming   phase Confirming
    stepping     `step`: one pass, the phase's decision

Budget and failure accounting live in one place each: the search's budget in `searching.search`,
failures against `budget.maxFailedTrials` there too; the Tuner decides when the search is exhausted.
"""

from .conditions import now_iso, parse_iso, refuse_spec, set_condition, set_phase, wait_for
from .stepping import step
from .types import REASON_GRACE_SECONDS, Decisions, Event, Observation, Refusal

__all__ = [
    "REASON_GRACE_SECONDS",
    "Decisions",
    "Event",
    "Observation",
    "Refusal",
    "now_iso",
    "parse_iso",
    "refuse_spec",
    "set_condition",
    "set_phase",
    "step",
    "wait_for",
]
