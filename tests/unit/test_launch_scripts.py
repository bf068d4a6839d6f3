"""verl's own launch scripts, as their repository runs them (tests/fixtures/launch_scripts), through
rltune as a user applies them: admission, the plan, and every rendered command composed by verl's
own Hydra configs and compared key by key with the user's composed configuration (issue 58).

What a command must keep: everything no planned knob owns (algorithm, data, reward, logging,
checkpoints) equal to the user's, and the run length (prompts trained) the same. What it may
change: the keys of the knobs the plan changes (the adapter's own rules name them), and nothing
else. A difference outside them fails and is named.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rltune import admission
from rltune.adapters.registry import adapter_for, framework_command
from rltune.adapters.verl import (
    FULLY_ASYNC,
    HYBRID,
    MODE_CARRIED,
    MODE_ONLY_KEYS,
    MODE_ONLY_PREFIXES,
    MODE_OWNED,
    ONE_STEP,
    SEPARATE,
    _Cmd,
)

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "launch_scripts"
VERL = sorted(CORPUS.glob("verl-*.yaml"))
TOP = 3

# Scripts rltune refuses, with the part of the message that names the field and the fix (none of
# them changes the algorithm).
REFUSED = {
    # verl-recipe's DAPO main runs a trainer of its own: no verl 0.9.1 entry point runs it unchanged
    "verl-dapo-recipe-qwen2.5-32b.yaml": "is a verl-recipe trainer",
    # TP 4, PP 2, EP 2 with the expert TP unset (= TP 4, Megatron's default) needs 16 GPUs per stage group
    "verl-grpo-qwen3-30b-a3b-megatron.yaml": "set trainer.etp 1 (actor_rollout_ref.actor.megatron.expert_tensor",
}


def fixture(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def command_of(fx: dict) -> list[str]:
    """The script's command with the changes the pinned verl version needs (recorded in the fixture)."""
    drop = {c["drop"] for c in fx.get("pinned_changes") or []}
    return [t for t in fx["command"] if t not in drop]


def job_of(fx: dict) -> dict:
    return {
        "workload": {
            "framework": fx["framework"],
            "image": "verlai/verl:vllm",
            "command": command_of(fx),
            "model": fx["job"]["model"],
        },
        "resources": fx["job"]["resources"],
    }


def _flat(node, prefix: str = "") -> dict:
    out = {}
    if isinstance(node, dict):
        for k, v in node.items():
            out |= _flat(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]: node}


def composed(argv) -> dict:
    from omegaconf import OmegaConf

    from rltune.adapters.verl_loader import compose

    return _flat(OmegaConf.to_container(compose(argv), resolve=False))


# the run's length and batch: compared as prompts trained and prompts per update, not key by key
RUN_LENGTH = (
    "trainer.total_training_steps",
    "rollout.total_rollout_steps",
    "trainer.total_epochs",
    "data.train_batch_size",
)


def prompts_per_update(cfg: dict, mode: str) -> int:
    """Prompts per optimizer update: data.train_batch_size, or fully-async's mini-batch x
    require_batches x trigger_parameter_sync_step (its data.train_batch_size must be 0)."""
    if mode in (SEPARATE, FULLY_ASYNC):
        return (
            cfg["actor_rollout_ref.actor.ppo_mini_batch_size"]
            * cfg["async_training.require_batches"]
            * cfg["async_training.trigger_parameter_sync_step"]
        )
    return cfg["data.train_batch_size"]


def prompts_trained(cfg: dict, mode: str) -> tuple:
    """What bounds the run: fully-async (the rollouter) counts prompts, the others count steps of
    data.train_batch_size prompts; None where the dataset's length decides (epochs)."""
    if mode in (SEPARATE, FULLY_ASYNC):
        n = cfg.get("rollout.total_rollout_steps")
        return ("prompts", n, cfg.get("trainer.total_epochs"))
    steps = cfg.get("trainer.total_training_steps")
    return ("prompts", None if steps is None else steps * cfg["data.train_batch_size"], cfg.get("trainer.total_epochs"))


def owned_keys(spec, changes: dict) -> set[str]:
    """The framework keys the changed knobs write, by the adapter's own rules."""
    ad = adapter_for("verl")
    rules = ad.rules(ad.backend(spec.workload.command))
    return {k for knob in changes if knob in rules for k in rules[knob].keys}


def mode_owned(key: str) -> bool:
    """Keys only a mode's config has (async_training.*, the top-level rollout pool), which a mode change owns."""
    return key.startswith(tuple(MODE_ONLY_PREFIXES)) or key in MODE_ONLY_KEYS


ENTRIES = {
    HYBRID: ("verl.trainer.main_ppo", "ppo_trainer", "ppo_megatron_trainer"),
    ONE_STEP: (
        "verl.experimental.one_step_off_policy.main_ppo",
        "one_step_off_ppo_trainer",
        "one_step_off_ppo_megatron_trainer",
    ),
    FULLY_ASYNC: (
        "verl.experimental.fully_async_policy.fully_async_main",
        "fully_async_ppo_trainer",
        "fully_async_ppo_megatron_trainer",
    ),
}


@pytest.mark.parametrize("megatron", [False, True], ids=["fsdp", "megatron"])
def test_every_default_a_mode_change_flips_is_owned_or_carried(megatron):
    """verl's mode configs differ in some defaults: each such key is the mode's machinery (owned by
    placement, MODE_OWNED and the mode-only prefixes) or an algorithm setting the adapter carries at
    the user's value (MODE_CARRIED). A key verl adds to a mode's config that is neither fails here."""
    cfgs = {
        m: composed(["python3", "-m", mod, f"--config-name={mega if megatron else fsdp}"])
        for m, (mod, fsdp, mega) in ENTRIES.items()
    }
    known = set(MODE_OWNED) | set(MODE_CARRIED) | {"actor_rollout_ref.rollout.checkpoint_engine.backend"}
    loose = {}
    for a in cfgs:
        for b in cfgs:
            for k in set(cfgs[a]) | set(cfgs[b]):
                if cfgs[a].get(k, "<absent>") != cfgs[b].get(k, "<absent>") and not mode_owned(k) and k not in known:
                    loose[k] = (a, cfgs[a].get(k, "<absent>"), b, cfgs[b].get(k, "<absent>"))
    assert loose == {}
    for key, defaults in MODE_CARRIED.items():
        assert {m: cfgs[m][key] for m in cfgs} == {m: defaults[m] for m in cfgs}


@pytest.mark.parametrize("path", VERL, ids=lambda p: p.name)
def test_a_real_verl_script_is_admitted_or_refused_with_a_fix(path):
    fx = fixture(path)
    try:
        admission.admit(job_of(fx))
    except admission.Refused as e:
        assert path.name in REFUSED, f"refused: {e}"
        assert REFUSED[path.name] in str(e)
        return
    assert path.name not in REFUSED, "admitted, but listed as refused"


def _plans(spec):
    from rltune.tuner import Tuner, baseline_record

    tuner = Tuner(spec, baseline_record(spec), [])
    return tuner.baseline.config, [p.config for p in tuner.proposer.rank(limit=TOP)]


def read_back_mismatches(spec, cfg, argv) -> dict:
    """What the rendered command runs that the plan does not say, by the adapter's own read of it
    (which knows every key a knob can be set by, e.g. Megatron's optimizer_cpu_offload): each knob
    the command sets must read back as the plan's value."""
    ad = adapter_for(spec.workload.framework)
    want = cfg.flat() | {"gpus": cfg.gpus or spec.resources.gpu_budget}
    return {k: (want[k], v) for k, v in ad.read(argv).items() if k in want and want[k] != v}


@pytest.mark.parametrize("path", [p for p in VERL if p.name not in REFUSED], ids=lambda p: p.name)
def test_the_semantic_round_trip_of_a_real_verl_script(path):
    """The baseline's command and the top plans' compose, keep what no planned knob owns and keep
    the run length; what they own reads back as the plan's values."""
    from rltune.tuner.records import config_changes

    fx = fixture(path)
    spec = admission.admit(job_of(fx))
    user_argv = command_of(fx)
    user = composed(user_argv)
    user_mode = _Cmd(user_argv).mode
    base, plans = _plans(spec)
    assert plans, "no plan"
    failures = []
    for i, cfg in enumerate([base] + plans):
        cmd = framework_command(spec, cfg)
        got = composed(cmd.argv)
        if read_back_mismatches(spec, cfg, cmd.argv):
            failures.append(f"rank {i}: the command runs {read_back_mismatches(spec, cfg, cmd.argv)} (plan, read)")
        changes = config_changes(base, cfg, spec.resources.gpu_budget)
        allowed = owned_keys(spec, changes)
        moved = cmd.mode != user_mode
        diff = {
            k: (user.get(k, "<absent>"), got.get(k, "<absent>"))
            for k in sorted(set(user) | set(got))
            if user.get(k, "<absent>") != got.get(k, "<absent>")
            and k not in allowed
            and k not in RUN_LENGTH
            and not (moved and mode_owned(k))
        }
        if diff:
            failures.append(f"rank {i} ({cmd.mode}, changes {sorted(changes)}): {diff}")
        if prompts_per_update(user, user_mode) != prompts_per_update(got, cmd.mode):
            failures.append(
                f"rank {i} ({cmd.mode}): {prompts_per_update(got, cmd.mode)} prompts per update, the user's "
                f"{prompts_per_update(user, user_mode)}"
            )
        if prompts_trained(user, user_mode) != prompts_trained(got, cmd.mode):
            failures.append(
                f"rank {i} ({cmd.mode}): run length {prompts_trained(got, cmd.mode)} != the user's "
                f"{prompts_trained(user, user_mode)}"
            )
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------- OpenRLHF

OPENRLHF = sorted(CORPUS.glob("openrlhf-*.yaml"))


def openrlhf_command(fx: dict) -> list[str]:
    """The script's options with the renames OpenRLHF 0.11.2 needs (recorded in the fixture): each
    replaced option is removed with its value, the new ones appended."""
    cmd = list(fx["command"])
    for change in fx.get("pinned_changes") or []:
        old = change["replace"]
        takes_value = {
            t: i + 1 < len(old) and not old[i + 1].startswith("--") for i, t in enumerate(old) if t[:2] == "--"
        }
        out, i = [], 0
        while i < len(cmd):
            if cmd[i] in takes_value:
                i += 2 if takes_value[cmd[i]] else 1
                continue
            out.append(cmd[i])
            i += 1
        cmd = out + list(change["with"])
    return cmd


def parsed(argv) -> dict:
    """The args OpenRLHF's own parser (and its __main__ asserts) hand train(), flattened."""
    from test_adapter_openrlhf import RUN

    from rltune.adapters.openrlhf import _split

    _, options = _split(argv)
    args, _ = RUN(list(options))

    def flat(ns, prefix=""):
        out = {}
        for k, v in vars(ns).items():
            out |= flat(v, f"{prefix}{k}.") if hasattr(v, "__dict__") else {prefix + k: v}
        return out

    return flat(args)


def _openrlhf_job(fx: dict) -> dict:
    return {
        "workload": {
            "framework": "openrlhf",
            "image": "openrlhf/openrlhf:0.11",
            "command": openrlhf_command(fx),
            "model": fx["job"]["model"],
        },
        "resources": fx["job"]["resources"],
    }


RUN_OPENRLHF = OPENRLHF


@pytest.mark.parametrize("path", RUN_OPENRLHF, ids=lambda p: p.name)
def test_the_semantic_round_trip_of_a_real_openrlhf_script(path):
    """Admitted; the baseline's and the top plans' commands parse with OpenRLHF's parser, and only
    the options of the knobs a plan changes differ from the user's parsed args."""
    from rltune.tuner.records import config_changes

    fx = fixture(path)
    spec = admission.admit(_openrlhf_job(fx))
    user = parsed(openrlhf_command(fx))
    ad = adapter_for("openrlhf")
    rules = ad.rules(ad.backend(spec.workload.command))
    base, plans = _plans(spec)
    assert plans, "no plan"
    failures = []
    for i, cfg in enumerate([base] + plans):
        argv = framework_command(spec, cfg).argv
        got = parsed(argv)
        if read_back_mismatches(spec, cfg, argv):
            failures.append(f"rank {i}: the command runs {read_back_mismatches(spec, cfg, argv)} (plan, read)")
        changes = config_changes(base, cfg, spec.resources.gpu_budget)
        owned = {k.lstrip("-") for knob in changes if knob in rules for k in rules[knob].keys}
        diff = {
            k: (user.get(k, "<absent>"), got.get(k, "<absent>"))
            for k in sorted(set(user) | set(got))
            if user.get(k, "<absent>") != got.get(k, "<absent>") and k not in owned
        }
        if diff:
            failures.append(f"rank {i} (changes {sorted(changes)}): {diff}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("path", VERL + RUN_OPENRLHF, ids=lambda p: p.name)
def test_plan_gives_the_operators_verdict_on_a_real_script(path, tmp_path, capsys):
    """`rltune plan` on the script's job: refused with admission's message, or ranked."""
    from rltune import cli

    fx = fixture(path)
    raw = job_of(fx) if fx["framework"] == "verl" else _openrlhf_job(fx)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"apiVersion": "rltune.io/v1alpha1", "kind": "RLTuningJob", "spec": raw}))
    try:
        admission.admit(raw)
        verdict = None
    except admission.Refused as e:
        verdict = str(e)
    try:
        assert cli.main(["plan", str(job), "--top", "1"]) == 0
        planned = None
    except SystemExit as e:
        planned = str(e)
    capsys.readouterr()
    assert (planned is None) == (verdict is None), (verdict, planned)
    assert verdict is None or verdict in planned
