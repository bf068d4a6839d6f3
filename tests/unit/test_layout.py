"""One layout rule (api/layout.py): physics, the twin, the trial pods, the RayJobs and the adapters
put a configuration's GPUs where the spec's `layout` says, the default trainer split included."""

from __future__ import annotations

import pytest
from test_adapter_openrlhf import make_spec as openrlhf_spec
from test_tuner_fixtures import job

from rltune.adapters.openrlhf import ADAPTER as OPENRLHF
from rltune.adapters.openrlhf import _Opts
from rltune.api.layout import Layout, default_trainer_gpus, layout, layout_of
from rltune.api.models import RLConfig
from rltune.controller import pods, rayjob
from rltune.settings import OperatorSettings
from rltune.twin.simulate import make_plan


@pytest.mark.parametrize(
    "gpus, per_node, trainer",
    [
        (32, 8, 16),  # half, in whole nodes
        (24, 8, 8),  # 12 would split a node: the whole nodes below half
        (16, 8, 8),
        (8, 8, 4),  # one node: half its GPUs
        (4, 8, 2),
        (1, 8, 1),  # at least one (the rollout then has none: not runnable)
        (12, 4, 4),
    ],
)
def test_the_default_trainer_split(gpus, per_node, trainer):
    assert default_trainer_gpus(gpus, per_node) == trainer
    lay = layout(gpus, "disaggregated", None, 64, per_node)
    assert (lay.trainer, lay.rollout) == (trainer, gpus - trainer)
    assert lay.runnable == (gpus - trainer >= 1)


def test_colocated_shares_every_gpu_and_nodes_round_up():
    assert layout(None, "colocated", None, 20, 8) == Layout(20, 20, 20, 3, True)
    assert layout(12, "disaggregated", 8, 64, 8) == Layout(12, 8, 4, 2, False)


CONFIGS = [
    {"gpus": 16, "placement": "colocated"},
    {"gpus": 16, "placement": "disaggregated"},  # default split
    {"gpus": 24, "placement": "disaggregated"},  # default split: whole nodes (8), not 12
    {"gpus": 8, "placement": "disaggregated"},  # one node: 4 + 4
    {"gpus": 32, "placement": "disaggregated", "trainerGpus": 24},
    {"placement": "disaggregated"},  # the budget
]


@pytest.mark.parametrize("knobs", CONFIGS)
def test_every_layer_reads_the_same_layout(knobs):
    spec = job()
    cfg = RLConfig().with_knobs(knobs)
    lay = spec.layout(cfg)
    gpn = spec.resources.gpus_per_node
    assert layout_of(cfg.flat(), spec.resources.gpu_budget, gpn).parts == (lay.gpus, lay.trainer, lay.rollout)
    m = spec.workload.model.resolved()
    plan = make_plan(m, spec.workload.task, spec.resources.gpu_type, gpn, cfg.model_copy(update={"gpus": lay.gpus}))
    assert (plan.gpus, plan.train_gpus, plan.rollout_gpus) == (lay.gpus, lay.trainer, lay.rollout)
    # (a command whose model groups all share the actor's GPUs: no side groups to leave out)
    assert OPENRLHF._pools(spec, cfg, _Opts(["--train.colocate_all"])) == (lay.gpus, lay.trainer, lay.rollout)
    made, _ = pods.trial_manifests("ns", "j", None, spec, "t1", cfg, 4, 1, None, settings=OperatorSettings())
    assert len(made) == lay.nodes
    ray_spec = openrlhf_spec(budget=spec.resources.gpu_budget)
    ray_spec.resources.gpus_per_node = gpn
    rj = rayjob.rayjob_manifest("ns", "j", None, ray_spec, "t1", cfg, 4, "http://pgw", settings=OperatorSettings())
    workers = rj["spec"]["rayClusterSpec"].get("workerGroupSpecs") or []
    assert 1 + sum(w["replicas"] for w in workers) == lay.nodes
