"""The OpenRLHF adapter against OpenRLHF's own argument parser.

Round trip: every command the adapter renders is parsed by the real parser of the installed
OpenRLHF (openrlhf/cli/train_ppo_ray.py, the version asserted below), including the validation that
follows `parse_args()` in its `__main__` block; the canonical knobs are read back from the parsed
Namespace and compared with the RLConfig.

The parser is built inside `if __name__ == "__main__":`, after module-level imports of ray, vLLM and
DeepSpeed (not installed here: CI installs openrlhf with --no-deps). So the test compiles that block
from the installed file (line numbers kept, so tracebacks point into it) with the module's standard
library imports, and replaces only `train(args)`, which the block calls last, by a function that
returns the validated arguments. Its one import, `openrlhf.utils.config.hierarchize`, is loaded from
the installed file by path, without `openrlhf/utils/__init__.py` (which imports torch/transformers).
Nothing is stubbed. If openrlhf is not installed, this module fails (it does not skip).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.metadata
import importlib.util
import io
import sys
from pathlib import Path
from types import SimpleNamespace

import openrlhf  # noqa: F401  (a missing openrlhf must fail this module, not skip it)
import pytest

from rltune.adapters.base import Treatment
from rltune.adapters.openrlhf import ADAPTER, DEFAULTS, ENTRY, FLAGS, RULES
from rltune.api.models import RLConfig, RLTuningJobSpec, knob_paths

OPENRLHF_VERSION = importlib.metadata.version("openrlhf")


# --------------------------------------------------------------------------- the real parser


class _Parsed(Exception):
    def __init__(self, args):
        super().__init__("parsed")
        self.parsed = args


def _load_parser():
    root = Path(importlib.util.find_spec("openrlhf").submodule_search_locations[0])
    path = root / "cli" / "train_ppo_ray.py"
    tree = ast.parse(path.read_text(), str(path))
    mains = [
        n
        for n in tree.body
        if isinstance(n, ast.If) and ast.unparse(n.test) in ("__name__ == '__main__'", '__name__ == "__main__"')
    ]
    assert len(mains) == 1, f"{path}: expected one `if __name__ == '__main__'` block (OpenRLHF changed?)"

    def stdlib(node) -> bool:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        return all(n.split(".")[0] in sys.stdlib_module_names for n in names)

    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and stdlib(n)]
    code_imports = compile(ast.Module(body=imports, type_ignores=[]), str(path), "exec")
    code_main = compile(ast.Module(body=mains[0].body, type_ignores=[]), str(path), "exec")
    cfg_spec = importlib.util.spec_from_file_location("openrlhf.utils.config", root / "utils" / "config.py")
    cfg = importlib.util.module_from_spec(cfg_spec)
    cfg_spec.loader.exec_module(cfg)

    def run(argv: list[str]) -> tuple[SimpleNamespace, argparse.ArgumentParser]:
        """(the validated, hierarchized args train() would get, the parser). Parser errors raise
        SystemExit, the __main__ block's asserts AssertionError."""

        def train(args):
            raise _Parsed(args)

        parsers: list[argparse.ArgumentParser] = []
        original = argparse.ArgumentParser.parse_args

        def spy(self, *a, **k):
            parsers.append(self)
            return original(self, *a, **k)

        ns = {"__name__": "__main__", "__file__": str(path)}
        exec(code_imports, ns)
        ns["train"] = train
        saved_argv, saved_cfg = sys.argv, sys.modules.get("openrlhf.utils.config")
        sys.argv = [str(path), *argv]
        sys.modules["openrlhf.utils.config"] = cfg
        argparse.ArgumentParser.parse_args = spy
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the block's [Warning] prints
                exec(code_main, ns)
        except _Parsed as p:
            return p.parsed, parsers[0]
        finally:
            argparse.ArgumentParser.parse_args = original
            sys.argv = saved_argv
            if saved_cfg is None:
                sys.modules.pop("openrlhf.utils.config", None)
            else:
                sys.modules["openrlhf.utils.config"] = saved_cfg
        raise AssertionError("train_ppo_ray's __main__ block ended without calling train(args)")

    return run


RUN = _load_parser()


def parse(argv) -> SimpleNamespace:
    return RUN(list(argv))[0]


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return RUN(BASE_OPTIONS)[1]


def from_namespace(a: SimpleNamespace) -> dict:
    """Canonical knob values read from OpenRLHF's parsed arguments (independently of the adapter)."""
    asynchronous = a.train.async_enable
    colocated = a.train.colocate_all and not asynchronous
    actor = a.actor.num_nodes * a.actor.num_gpus_per_node
    rollout = a.vllm.num_engines * a.vllm.tensor_parallel_size
    out = {
        "trainer.tp": a.ds.tensor_parallel_size,
        "trainer.cp": a.ds.ring_attn_size,
        "trainer.recompute": "full" if a.actor.gradient_checkpointing_enable else "none",
        "trainer.offload": a.ds.adam_offload,
        "rollout.tp": a.vllm.tensor_parallel_size,
        "rollout.gpuMemoryUtilization": a.vllm.gpu_memory_utilization,
        "rollout.cudaGraphs": not a.vllm.enforce_eager,
        "async.staleness": a.train.async_queue_size if asynchronous else 0,
        "async.partialRollout": a.train.partial_rollout_enable,
        "placement": "colocated" if colocated else "disaggregated",
        "gpus": actor if colocated else actor + rollout,
        "weightSync": a.vllm.sync_backend,
    }
    # a dynamic token budget, else the fixed micro-batch's sequences at their longest
    out["trainer.microBatchTokens"] = (
        a.train.max_tokens_per_gpu if a.train.dynamic_batch_enable else a.train.micro_batch_size * a.data.max_len
    )
    if not colocated:
        out["trainerGpus"] = actor
    return out


def expected(config: RLConfig, spec: RLTuningJobSpec) -> dict:
    """What OpenRLHF should run for `config` (recompute selective is HF gradient checkpointing: full)."""
    f = config.flat()
    want = {k: f[k] for k in from_namespace_keys(config)}
    want["gpus"] = config.gpus or spec.resources.gpu_budget
    if want["trainer.recompute"] == "selective":
        want["trainer.recompute"] = "full"
    return want


def from_namespace_keys(config: RLConfig) -> list[str]:
    keys = [
        "trainer.tp",
        "trainer.cp",
        "trainer.recompute",
        "trainer.offload",
        "rollout.tp",
        "rollout.gpuMemoryUtilization",
        "rollout.cudaGraphs",
        "async.staleness",
        "async.partialRollout",
        "placement",
        "weightSync",
        "trainer.microBatchTokens",
    ]
    return keys + ([] if config.placement == "colocated" else ["trainerGpus"])


# --------------------------------------------------------------------------- fixtures

BASE_OPTIONS = [
    "--actor.model_name_or_path",
    "Qwen/Qwen2.5-7B-Instruct",
    "--reward.remote_url",
    "http://reward:5000/get_reward",
    "--algo.advantage.estimator",
    "group_norm",
    "--algo.kl.use_loss",
    "--algo.kl.init_coef",
    "0.001",
    "--algo.kl.estimator",
    "k3",
    "--data.prompt_dataset",
    "/data/math.jsonl",
    "--data.input_key",
    "prompt",
    "--data.apply_chat_template",
    "--data.max_len",
    "4096",
    "--rollout.batch_size",
    "64",
    "--rollout.n_samples_per_prompt",
    "8",
    "--train.batch_size",
    "64",
    "--ds.zero_stage",
    "3",
    "--actor.adam.lr",
    "5e-7",
    "--reward.clip_range",
    "-10",
    "10",
    "--actor.num_nodes",
    "1",
    "--actor.num_gpus_per_node",
    "8",
    "--ref.num_nodes",
    "1",
    "--ref.num_gpus_per_node",
    "8",
    "--vllm.num_engines",
    "4",
    "--vllm.tensor_parallel_size",
    "2",
    "--vllm.gpu_memory_utilization=0.6",
    "--train.colocate_all",
    "--vllm.enable_sleep",
    "--ds.enable_sleep",
    "--vllm.enforce_eager",
    "--actor.gradient_checkpointing_enable",
    "--ds.packing_samples",
    "--logger.wandb.key",
    "WANDB_KEY",
    "--logger.logging_steps",
    "5",
    "--ckpt.save_steps",
    "20",
    "--ckpt.path",
    "/ckpt/run",
    "--ckpt.load_enable",
    "--eval.steps",
    "10",
]
USER = [*ENTRY, *BASE_OPTIONS]


def make_spec(options=BASE_OPTIONS, budget=16, task=None) -> RLTuningJobSpec:
    return RLTuningJobSpec.model_validate(
        {
            "workload": {
                "framework": "openrlhf",
                "model": {"preset": "qwen2.5-7b"},
                "task": task or {"promptsPerStep": 64, "samplesPerPrompt": 8},
                "command": list(ENTRY),
                "args": list(options),
            },
            "resources": {"gpuType": "H200", "gpuBudget": budget, "gpusPerNode": 8},
        }
    )


SPEC = make_spec()
BASE = RLConfig()


def cfg(**changes) -> RLConfig:
    return BASE.with_knobs({k.replace("__", "."): v for k, v in changes.items()})


# one configuration per mode (and a few variants), all valid for SPEC
MODES = {
    "colocate-all": cfg(gpus=8, placement="colocated", **{"rollout.tp": 2, "trainer.recompute": "full"}),
    "colocate-all-16": cfg(
        gpus=16,
        placement="colocated",
        **{"rollout.tp": 4, "trainer.tp": 2, "trainer.offload": True, "rollout.cudaGraphs": False},
    ),
    "disaggregated": cfg(
        gpus=16,
        placement="disaggregated",
        trainerGpus=8,
        **{"rollout.tp": 2, "trainer.cp": 2, "trainer.recompute": "none", "trainer.microBatchTokens": 32768},
    ),
    "async": cfg(
        gpus=16,
        placement="disaggregated",
        trainerGpus=8,
        **{"async.staleness": 2, "rollout.gpuMemoryUtilization": 0.9, "rollout.tp": 1},
    ),
    "async-partial-rollout": cfg(
        gpus=12,
        placement="disaggregated",
        trainerGpus=8,
        **{"async.staleness": 1, "async.partialRollout": True, "rollout.tp": 4},
    ),
}
MODE_OF = {
    "colocate-all": "colocate-all",
    "colocate-all-16": "colocate-all",
    "disaggregated": "disaggregated",
    "async": "async",
    "async-partial-rollout": "async-partial-rollout",
}


# --------------------------------------------------------------------------- version, rules, parser facts


def test_openrlhf_version_is_the_one_the_mapping_was_checked_against():
    print(f"OpenRLHF {OPENRLHF_VERSION} (adapter checked against {ADAPTER.version})")
    assert ADAPTER.version == "0.11.2"
    assert OPENRLHF_VERSION == ADAPTER.version, (
        f"installed openrlhf {OPENRLHF_VERSION}, the adapter maps {ADAPTER.version}: install "
        f"openrlhf=={ADAPTER.version} (pip install --no-deps) or re-check the mapping"
    )


def test_rules_cover_every_canonical_knob():
    rules = ADAPTER.rules(ADAPTER.backend(USER))
    assert ADAPTER.backend(USER) == "deepspeed"
    assert set(rules) == set(knob_paths()) | {"gpus", "trainerGpus"}
    for knob, rule in rules.items():
        assert rule.knob == knob
        if rule.treatment == Treatment.REFUSED:
            assert not rule.keys and rule.note, knob
        else:
            assert rule.keys, knob
        if rule.treatment == Treatment.TRANSFORMED:
            assert rule.note, knob
    with pytest.raises(ValueError, match="deepspeed"):
        ADAPTER.rules("megatron")


def test_treatments():
    t = {k: r.treatment for k, r in RULES.items()}
    refused = {k for k, v in t.items() if v == Treatment.REFUSED}
    assert refused == {
        "trainer.pp",
        "trainer.ep",
        "trainer.etp",
        "rollout.expertParallel",
        "rollout.maxNumSeqs",
        "rollout.maxNumBatchedTokens",
        "rollout.fp8",
        "async.staleFraction",
        "cpu.rolloutThreads",
        "cpu.trainerThreads",
    }
    # rollout.tp: --vllm.num_engines (the rollout GPUs / TP) moves with it
    for k in (
        "placement",
        "gpus",
        "trainerGpus",
        "trainer.recompute",
        "rollout.cudaGraphs",
        "async.staleness",
        "rollout.tp",
    ):
        assert t[k] == Treatment.TRANSFORMED, k
    for k in ("trainer.tp", "trainer.cp", "trainer.offload", "rollout.gpuMemoryUtilization"):
        assert t[k] == Treatment.MAPPED, k
    assert "fractional" in RULES["async.staleFraction"].note


def test_every_key_is_a_real_option_and_flags_are_store_true(parser):
    actions = parser._option_string_actions
    keys = {k for r in RULES.values() for k in r.keys}
    missing = sorted(k for k in keys | set(DEFAULTS) | FLAGS if k not in actions)
    assert not missing, f"not options of OpenRLHF {OPENRLHF_VERSION}'s train_ppo_ray: {missing}"
    for k in keys | FLAGS:
        is_flag = isinstance(actions[k], argparse._StoreTrueAction)
        assert is_flag == (k in FLAGS), k
    for k in FLAGS:
        assert actions[k].default is False, k


def test_defaults_table_matches_the_parser(parser):
    actions = parser._option_string_actions
    for k, v in DEFAULTS.items():
        assert actions[k].default == v, k


def test_old_underscored_names_are_gone(parser):
    # the names of the brief and of older OpenRLHF releases: 0.11.2 rejects them
    for old in ("--vllm_num_engines", "--colocate_all_models", "--adam_offload", "--async_train", "--ring_attn_size"):
        assert old not in parser._option_string_actions
    with pytest.raises(SystemExit):
        with contextlib.redirect_stderr(io.StringIO()):
            parse([*BASE_OPTIONS, "--vllm_num_engines", "2"])


def test_flag_with_value_is_rejected_by_openrlhf():
    # why the adapter never renders --flag=true: a store_true option takes no value
    with pytest.raises(SystemExit):
        with contextlib.redirect_stderr(io.StringIO()):
            parse([*BASE_OPTIONS, "--ds.adam_offload=true"])


# --------------------------------------------------------------------------- read


def test_read_user_command():
    got = ADAPTER.read(USER)
    assert got == {
        "trainer.tp": 1,
        "trainer.cp": 1,
        "trainer.recompute": "full",
        "trainer.offload": False,
        "rollout.tp": 2,
        "rollout.gpuMemoryUtilization": 0.6,
        "rollout.cudaGraphs": False,
        "async.staleness": 0,
        "async.partialRollout": False,
        "placement": "colocated",
        "weightSync": "nccl",
        "gpus": 8,
        "trainer.microBatchTokens": got["trainer.microBatchTokens"],
    }
    # the same values the real parser gives; a fixed micro-batch reads as its sequences' tokens
    a = parse(BASE_OPTIONS)
    ns = from_namespace(a)
    assert {k: ns[k] for k in got if k != "trainer.microBatchTokens"} == {
        k: v for k, v in got.items() if k != "trainer.microBatchTokens"
    }
    if not a.train.dynamic_batch_enable:
        assert got["trainer.microBatchTokens"] == a.train.micro_batch_size * a.data.max_len


def test_read_async_and_disaggregated():
    cmd = [
        *ENTRY,
        "--actor.num_nodes=2",
        "--actor.num_gpus_per_node",
        "8",
        "--vllm.num_engines",
        "4",
        "--vllm.tensor_parallel_size",
        "2",
        "--train.async_enable",
        "--train.async_queue_size",
        "3",
        "--train.partial_rollout_enable",
        "--train.dynamic_batch_enable",
        "--train.max_tokens_per_gpu",
        "24576",
        "--ds.ring_attn_size",
        "2",
        "--ds.adam_offload",
    ]
    got = ADAPTER.read(cmd)
    assert got["async.staleness"] == 3 and got["async.partialRollout"] is True
    # the defaults run a critic (gae), a reference model (KL 0.01) and a reward model, each on 1 x 8
    # GPUs of its own beside the actor's 16: the trainer's GPUs count them (OpenRLHF's train())
    assert got["placement"] == "disaggregated" and got["gpus"] == 16 + 3 * 8 + 8 and got["trainerGpus"] == 16 + 3 * 8
    assert got["trainer.microBatchTokens"] == 24576 and got["trainer.cp"] == 2 and got["trainer.offload"] is True
    assert got["trainer.recompute"] == "none" and got["rollout.cudaGraphs"] is True
    # async without a queue size: OpenRLHF's default 1
    assert ADAPTER.read([*ENTRY, "--train.async_enable"])["async.staleness"] == 1
    # colocate_all under async colocates only DeepSpeed: vLLM has GPUs of its own -> disaggregated
    r = ADAPTER.read([*ENTRY, "--train.colocate_all", "--train.async_enable", "--vllm.num_engines", "8"])
    assert r["placement"] == "disaggregated" and r["gpus"] == 16 and r["trainerGpus"] == 8
    # every value read is a valid canonical configuration
    RLConfig().with_knobs(got)


def test_read_defaults_and_gloo():
    got = ADAPTER.read([*ENTRY, "--vllm.sync_backend", "gloo"])
    assert "weightSync" not in got and "gpus" not in got
    assert got["trainer.microBatchTokens"] == 1 * 2048  # --train.micro_batch_size 1 x --data.max_len 2048
    assert got["rollout.gpuMemoryUtilization"] == 0.95 and got["placement"] == "disaggregated"


def test_read_inverts_command():
    for name, config in MODES.items():
        fc = ADAPTER.command(SPEC, config, USER)
        assert ADAPTER.read(fc.argv) == expected(config, SPEC), name


# --------------------------------------------------------------------------- command: flags, replacement


def _tokens(fc) -> list[str]:
    return list(fc.overrides)


def _count(tokens, name) -> int:
    return sum(1 for t in tokens if t == name or t.startswith(name + "="))


def _value(tokens, name):
    i = tokens.index(name)
    return tokens[i + 1]


@pytest.mark.parametrize("name", sorted(MODES))
def test_no_flag_ever_has_a_value(name):
    for fc in (ADAPTER.command(SPEC, MODES[name], USER), ADAPTER.trial_command(SPEC, MODES[name], USER, 4)):
        for t in fc.overrides:
            assert not t.lower().endswith(("=true", "=false")), t
            assert t not in ("true", "false", "True", "False"), t
        toks = _tokens(fc)
        for f in FLAGS:
            if f in toks:
                i = toks.index(f)
                assert i + 1 == len(toks) or toks[i + 1].startswith("--"), f


def test_turning_flags_off_removes_them():
    config = cfg(
        gpus=16,
        placement="disaggregated",
        trainerGpus=8,
        **{"rollout.cudaGraphs": True, "trainer.recompute": "none", "trainer.offload": False},
    )
    user = [*USER, "--ds.adam_offload", "--train.async_enable", "--train.async_queue_size", "2"]
    user += ["--train.partial_rollout_enable"]
    toks = _tokens(ADAPTER.command(SPEC, config, user))
    for gone in (
        "--vllm.enforce_eager",
        "--actor.gradient_checkpointing_enable",
        "--ds.adam_offload",
        "--train.async_enable",
        "--train.async_queue_size",
        "--train.partial_rollout_enable",
        "--train.colocate_all",
        "--vllm.enable_sleep",
        "--ds.enable_sleep",
    ):
        assert _count(toks, gone) == 0, gone
    a = parse(toks)
    assert not (a.vllm.enforce_eager or a.actor.gradient_checkpointing_enable or a.ds.adam_offload)
    assert not (a.train.async_enable or a.train.partial_rollout_enable or a.train.colocate_all)


def test_turning_flags_on_adds_bare_flags():
    config = cfg(gpus=8, **{"rollout.cudaGraphs": False, "trainer.recompute": "selective", "trainer.offload": True})
    user = [*ENTRY, "--actor.model_name_or_path", "m", "--reward.remote_url", "http://r"]
    user += ["--algo.advantage.estimator", "group_norm"]
    toks = _tokens(ADAPTER.command(SPEC, config, user))
    for flag in (
        "--vllm.enforce_eager",
        "--actor.gradient_checkpointing_enable",
        "--ds.adam_offload",
        "--train.colocate_all",
        "--vllm.enable_sleep",
        "--ds.enable_sleep",
        "--train.dynamic_batch_enable",
    ):
        assert toks.count(flag) == 1, flag
    a = parse(toks)
    assert a.vllm.enforce_eager and a.actor.gradient_checkpointing_enable and a.ds.adam_offload
    assert a.train.colocate_all and a.vllm.enable_sleep and a.ds.enable_sleep


def test_every_mapped_option_once_and_user_options_kept():
    user = [*USER, "--vllm.tensor_parallel_size=1", "--ds.tensor_parallel_size", "1", "--vllm.enforce_eager"]
    config = MODES["colocate-all-16"]
    toks = _tokens(ADAPTER.command(SPEC, config, user))
    for rule in RULES.values():
        for key in rule.keys:
            assert _count(toks, key) <= 1, key
    assert _value(toks, "--vllm.tensor_parallel_size") == "4"
    assert _value(toks, "--ds.tensor_parallel_size") == "2"
    # the user's own options, in their order, with their values
    user_groups = [t for t in BASE_OPTIONS if t.startswith("--") and not any(t.startswith(k) for k in _mapped())]
    rendered_groups = [t for t in toks if t.startswith("--") and t in user_groups]
    assert rendered_groups == user_groups
    assert toks[toks.index("--reward.clip_range") : toks.index("--reward.clip_range") + 3] == [
        "--reward.clip_range",
        "-10",
        "10",
    ]
    assert _value(toks, "--actor.adam.lr") == "5e-7"


def _mapped() -> set[str]:
    return {k for r in RULES.values() for k in r.keys} | {"--rollout.batch_size", "--rollout.n_samples_per_prompt"}


@pytest.mark.parametrize(
    "changes, option, value",
    [
        ({"trainer.tp": 2}, "--ds.tensor_parallel_size", "2"),
        ({"trainer.cp": 2}, "--ds.ring_attn_size", "2"),
        ({"trainer.microBatchTokens": 8192}, "--train.max_tokens_per_gpu", "8192"),
        ({"rollout.tp": 4}, "--vllm.tensor_parallel_size", "4"),
        ({"rollout.tp": 4}, "--vllm.num_engines", "2"),
        ({"rollout.gpuMemoryUtilization": 0.75}, "--vllm.gpu_memory_utilization", "0.75"),
        ({"async.staleness": 0}, "--vllm.num_engines", "4"),
        ({"gpus": 16}, "--actor.num_nodes", "2"),
        ({"gpus": 16}, "--actor.num_gpus_per_node", "8"),
        ({"gpus": 16}, "--ref.num_nodes", "2"),
        ({"gpus": 4}, "--actor.num_gpus_per_node", "4"),
        ({"gpus": 4}, "--vllm.num_engines", "2"),
        ({"weightSync": "nccl"}, "--vllm.sync_backend", "nccl"),
    ],
)
def test_valued_mapping(changes, option, value):
    config = MODES["colocate-all"].with_knobs(changes)
    toks = _tokens(ADAPTER.command(SPEC, config, USER))
    assert _count(toks, option) == 1
    assert _value(toks, option) == value


@pytest.mark.parametrize(
    "changes, flag, present",
    [
        ({"trainer.recompute": "none"}, "--actor.gradient_checkpointing_enable", False),
        ({"trainer.recompute": "full"}, "--actor.gradient_checkpointing_enable", True),
        ({"trainer.recompute": "selective"}, "--actor.gradient_checkpointing_enable", True),
        ({"trainer.offload": True}, "--ds.adam_offload", True),
        ({"trainer.offload": False}, "--ds.adam_offload", False),
        ({"rollout.cudaGraphs": False}, "--vllm.enforce_eager", True),
        ({"rollout.cudaGraphs": True}, "--vllm.enforce_eager", False),
        ({"trainer.microBatchTokens": 8192}, "--train.dynamic_batch_enable", True),
        ({"placement": "colocated"}, "--train.colocate_all", True),
    ],
)
def test_flag_mapping(changes, flag, present):
    config = MODES["colocate-all"].with_knobs(changes)
    toks = _tokens(ADAPTER.command(SPEC, config, USER))
    assert toks.count(flag) == int(present)


def test_placement_switch_colocated_to_disaggregated_and_back():
    dis = ADAPTER.command(SPEC, MODES["disaggregated"], USER)
    toks = _tokens(dis)
    assert "--train.colocate_all" not in toks and "--vllm.enable_sleep" not in toks and "--ds.enable_sleep" not in toks
    assert "--train.colocate_actor_ref" in toks  # the reference model (KL) stays on the actor's GPUs
    assert _value(toks, "--vllm.num_engines") == "4"  # (16 - 8) / rollout.tp 2
    # back to colocated from a disaggregated user command: sleep modes come along
    back = ADAPTER.command(SPEC, MODES["colocate-all"], dis.argv)
    t2 = _tokens(back)
    for f in ("--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"):
        assert t2.count(f) == 1, f
    # colocated user command without sleep modes: kept as the user has them
    plain = [t for t in USER if t not in ("--vllm.enable_sleep", "--ds.enable_sleep")]
    t3 = _tokens(ADAPTER.command(SPEC, MODES["colocate-all"], plain))
    assert "--vllm.enable_sleep" not in t3 and "--ds.enable_sleep" not in t3 and "--train.colocate_all" in t3


def test_modes_and_entry_point():
    for name, config in MODES.items():
        fc = ADAPTER.command(SPEC, config, USER)
        assert fc.mode == MODE_OF[name]
        assert fc.entry == ENTRY  # one entry point: train_ppo_ray picks PPOTrainerAsync by --train.async_enable
        assert fc.argv[: len(ENTRY)] == list(ENTRY)


def test_entry_prefixes_are_kept():
    ray = ["ray", "job", "submit", "--address=http://head:8265", "--", "python3", "-m", "openrlhf.cli.train_ppo_ray"]
    fc = ADAPTER.command(SPEC, MODES["async"], [*ray, *BASE_OPTIONS])
    assert fc.entry == tuple(ray)
    fc = ADAPTER.command(SPEC, MODES["async"], ["python", "/app/openrlhf/cli/train_ppo_ray.py", *BASE_OPTIONS])
    assert fc.entry == ("python", "/app/openrlhf/cli/train_ppo_ray.py")
    fc = ADAPTER.command(SPEC, MODES["async"], BASE_OPTIONS)  # options only: the default entry
    assert fc.entry == ENTRY
    with pytest.raises(ValueError, match="train_ppo_ray"):
        ADAPTER.command(SPEC, MODES["async"], ["bash", "run.sh"])
    assert any("train_ppo_ray" in p for p in ADAPTER.problems(SPEC, MODES["async"], ["bash", "run.sh"]))


def test_entry_problem_and_read_task():
    assert ADAPTER.entry_problem(USER) is None
    assert ADAPTER.entry_problem(BASE_OPTIONS) is None  # options only: the default entry point
    assert "train_ppo_ray" in ADAPTER.entry_problem(["python3", "-m", "verl.trainer.main_ppo"])
    assert ADAPTER.read_task(USER) == {"promptsPerStep": 64, "samplesPerPrompt": 8}
    cmd = [*USER, "--rollout.max_new_tokens", "3072"]
    assert ADAPTER.read_task(cmd) == {
        "promptsPerStep": 64,
        "samplesPerPrompt": 8,
        "maxResponseTokens": 3072,
        "maxPromptTokens": 1024,  # --data.max_len 4096 - max_new_tokens
    }
    a = parse(cmd[len(ENTRY) :])
    assert (a.rollout.batch_size, a.rollout.n_samples_per_prompt, a.rollout.max_new_tokens) == (64, 8, 3072)
    assert ADAPTER.read_task([*ENTRY]) == {"promptsPerStep": 1024, "samplesPerPrompt": 1}  # OpenRLHF's defaults


def test_task_batch_shape_fills_missing_options():
    user = [*ENTRY, "--actor.model_name_or_path", "m", "--reward.remote_url", "http://r"]
    user += ["--algo.advantage.estimator", "group_norm", "--train.batch_size", "64"]
    fc = ADAPTER.command(SPEC, MODES["colocate-all"], user)
    a = parse(fc.overrides)
    assert a.rollout.batch_size == 64 and a.rollout.n_samples_per_prompt == 8


# --------------------------------------------------------------------------- staleness


@pytest.mark.parametrize("staleness", [0, 1, 2, 4])
def test_staleness_is_the_async_queue_size(staleness):
    config = MODES["async"].with_knobs({"async.staleness": staleness})
    fc = ADAPTER.command(SPEC, config, USER)
    a = parse(fc.overrides)
    assert a.train.async_enable == (staleness >= 1)
    if staleness:
        assert a.train.async_queue_size == staleness
        assert fc.mode == "async"
    else:
        assert "--train.async_queue_size" not in fc.overrides and fc.mode == "disaggregated"
    assert ADAPTER.read(fc.argv)["async.staleness"] == staleness


def test_values():
    assert ADAPTER.values("async.staleness", SPEC) is None  # any queue size >= 1 runs
    assert ADAPTER.values("trainer.recompute", SPEC) == ["none", "full"]
    assert ADAPTER.values("weightSync", SPEC) == ["nccl"]
    for knob, rule in RULES.items():
        if rule.treatment == Treatment.REFUSED:
            assert ADAPTER.values(knob, SPEC) is None, knob  # pinned to the baseline by the search


# --------------------------------------------------------------------------- problems


@pytest.mark.parametrize("name", sorted(MODES))
def test_valid_modes_have_no_problems(name):
    assert ADAPTER.problems(SPEC, MODES[name], USER) == []


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"trainer.pp": 2}, "trainer.pp"),
        ({"trainer.ep": 2}, "trainer.ep"),
        ({"rollout.fp8": True}, "rollout.fp8"),
        ({"rollout.expertParallel": True}, "rollout.expertParallel"),
        ({"async.staleFraction": 0.5}, "async.staleFraction"),
        ({"weightSync": "checkpoint-engine"}, "weightSync"),
        ({"cpu.rolloutThreads": 4}, "cpu."),
        ({"async.staleness": 1}, "placement colocated with async.staleness"),
        ({"rollout.tp": 16, "gpus": 8}, "--vllm.num_engines * --vllm.tensor_parallel_size"),
        ({"gpus": 12}, "whole nodes"),
        ({"trainer.tp": 2, "gpus": 6}, "--train.batch_size (64) must be a multiple"),
        ({"trainer.tp": 3}, "--ds.tensor_parallel_size (3)"),
        ({"async.partialRollout": True}, "async.partialRollout needs async.staleness"),
    ],
)
def test_problems(changes, words):
    config = MODES["colocate-all"].with_knobs(changes)
    found = ADAPTER.problems(SPEC, config, USER)
    assert any(words in p for p in found), found


def test_problems_disaggregated():
    base = MODES["disaggregated"]
    assert any("needs trainerGpus" in p for p in ADAPTER.problems(SPEC, base.with_knobs({"trainerGpus": None}), USER))
    assert any("no GPU" in p for p in ADAPTER.problems(SPEC, base.with_knobs({"trainerGpus": 16}), USER))
    assert any(
        "rollout.tp 8" in p for p in ADAPTER.problems(SPEC, base.with_knobs({"rollout.tp": 8, "gpus": 12}), USER)
    )
    # a critic or a reward model on GPUs needs GPUs of its own outside colocate_all
    gae = [t for t in USER if t not in ("group_norm",)]
    gae[gae.index("--algo.advantage.estimator") + 1 : gae.index("--algo.advantage.estimator") + 1] = ["gae"]
    assert any("critic" in p for p in ADAPTER.problems(SPEC, base, gae))
    assert not any("critic" in p for p in ADAPTER.problems(SPEC, MODES["colocate-all"], gae))


def test_problems_that_openrlhf_asserts_too():
    # the parser's own asserts fire on the same configurations the adapter reports
    partial = MODES["disaggregated"].with_knobs({"async.partialRollout": True})
    assert any("partialRollout" in p for p in ADAPTER.problems(SPEC, partial, USER))
    with pytest.raises(AssertionError, match="partial_rollout_enable requires"):
        parse(ADAPTER.command(SPEC, partial, USER).overrides)

    over = [*USER, "--rollout.vllm_generate_batch_size", "128"]
    sync = MODES["disaggregated"]
    assert any("vllm_generate_batch_size" in p for p in ADAPTER.problems(SPEC, sync, over))
    with pytest.raises(AssertionError, match="vllm_generate_batch_size"):
        parse(ADAPTER.command(SPEC, sync, over).overrides)
    assert not any("vllm_generate_batch_size" in p for p in ADAPTER.problems(SPEC, MODES["async"], over))
    parse(ADAPTER.command(SPEC, MODES["async"], over).overrides)

    tiny = make_spec(task={"promptsPerStep": 1, "samplesPerPrompt": 1})
    small = [*ENTRY, "--actor.model_name_or_path", "m", "--reward.remote_url", "http://r"]
    small += ["--algo.advantage.estimator", "reinforce", "--train.batch_size", "16"]
    config = cfg(gpus=16, placement="colocated", **{"rollout.tp": 2})
    found = ADAPTER.problems(tiny, config, small)
    assert any("must be >= actor GPUs" in p for p in found), found
    with pytest.raises(AssertionError, match="number of sample batches"):
        parse(ADAPTER.command(tiny, config, small).overrides)


def test_problem_task_contradicts_command():
    spec = make_spec(task={"promptsPerStep": 128, "samplesPerPrompt": 8})
    found = ADAPTER.problems(spec, MODES["colocate-all"], USER)
    assert any("--rollout.batch_size 64" in p and "promptsPerStep" in p for p in found), found


def test_ring_attention_head_stride():
    user = [*USER, "--ds.ring_attn_head_stride", "3"]  # qwen2.5-7b: 28 heads
    found = ADAPTER.problems(SPEC, MODES["disaggregated"], user)
    assert any("ring_attn_head_stride" in p for p in found)
    assert not any("ring_attn_head_stride" in p for p in ADAPTER.problems(SPEC, MODES["colocate-all"], user))


def test_tensor_parallel_needs_bf16():
    user = [*USER, "--ds.param_dtype", "fp16"]
    assert any("bf16" in p for p in ADAPTER.problems(SPEC, MODES["colocate-all-16"], user))


# --------------------------------------------------------------------------- round trip through the real parser


@pytest.mark.parametrize("name", sorted(MODES))
def test_round_trip_through_openrlhf_parser(name):
    config = MODES[name]
    fc = ADAPTER.command(SPEC, config, USER)
    a = parse(fc.overrides)  # raises on any option OpenRLHF does not know or any failed assert
    assert from_namespace(a) == expected(config, SPEC), name
    # the user's own settings survive
    assert a.actor.model_name_or_path == "Qwen/Qwen2.5-7B-Instruct"
    assert a.ds.zero_stage == 3 and a.actor.adam.lr == 5e-7 and a.reward.clip_range == [-10.0, 10.0]
    assert a.algo.advantage.estimator == "group_norm" and a.rollout.batch_size == 64
    # colocated: the assert in train() (actor GPUs == engines * tp) and the ref-shape assert hold
    if a.train.colocate_all and not a.train.async_enable:
        assert a.actor.num_nodes * a.actor.num_gpus_per_node == a.vllm.num_engines * a.vllm.tensor_parallel_size
    if a.algo.kl.init_coef > 0 and (a.train.colocate_all or a.train.colocate_actor_ref):
        assert (a.ref.num_nodes, a.ref.num_gpus_per_node) == (a.actor.num_nodes, a.actor.num_gpus_per_node)
    if a.train.async_enable:
        assert not a.vllm.enable_sleep  # asserted by the parser too


@pytest.mark.parametrize("name", sorted(MODES))
def test_round_trip_from_a_minimal_command(name):
    # the reference model on the actor's GPUs, as OpenRLHF's examples run it (without the flag it
    # takes GPUs of its own, which the trainer's GPUs then count: test_side_groups_*)
    user = [*ENTRY, "--actor.model_name_or_path", "m", "--reward.remote_url", "http://r", "--train.colocate_actor_ref"]
    user += ["--algo.advantage.estimator", "group_norm", "--train.batch_size", "64"]
    config = MODES[name]
    assert ADAPTER.problems(SPEC, config, user) == []
    a = parse(ADAPTER.command(SPEC, config, user).overrides)
    assert from_namespace(a) == expected(config, SPEC)


@pytest.mark.parametrize("name", sorted(MODES))
def test_trial_command(name):
    config = MODES[name]
    fc = ADAPTER.trial_command(SPEC, config, USER, 5)
    assert fc.mode == MODE_OF[name] and fc.entry == ENTRY
    a = parse(fc.overrides)
    assert from_namespace(a) == expected(config, SPEC)
    assert a.data.max_samples == 5 * 64 and a.train.num_episodes == 1
    assert a.eval.steps == -1 and a.ckpt.save_steps == -1 and not a.ckpt.load_enable and not a.ckpt.save_hf
    assert a.ckpt.path.startswith("/tmp/") and a.ckpt.output_dir.startswith("/tmp/")
    assert a.logger.logging_steps == 1 and a.logger.wandb.key is None and a.logger.tensorboard_dir is None
    for opt in ("--data.max_samples", "--eval.steps", "--ckpt.save_steps", "--logger.logging_steps"):
        assert _count(fc.overrides, opt) == 1, opt
    with pytest.raises(ValueError):
        ADAPTER.trial_command(SPEC, config, USER, 0)


def test_registry_uses_the_adapter():
    from rltune.adapters import registry

    assert registry.adapter_for("openrlhf") is ADAPTER
    spec = registry.resolve(SPEC)
    assert spec.baseline.placement == "colocated" and spec.baseline.rollout.tp == 2
    assert spec.baseline.rollout.cuda_graphs is False and spec.baseline.gpus == 8
    cov = registry.coverage(SPEC)
    assert cov.version == "0.11.2" and cov.backend == "deepspeed"
    assert {d.knob for d in cov.dropped} == {k for k, r in RULES.items() if r.treatment == Treatment.REFUSED}
    baseline_cmd = registry.framework_command(spec, spec.baseline)
    a = parse(baseline_cmd.overrides)
    assert from_namespace(a) == expected(spec.baseline, spec)


def test_side_groups_are_counted_and_kept_at_their_sizes():
    """A critic on GPUs of its own (OpenRLHF's PPO examples without --train.colocate_all): the
    baseline's GPUs count it, and a disaggregated plan keeps its size and gives the actor the rest
    of the trainer's GPUs (issue 58: 6 read where 8 ran)."""
    user = [*ENTRY, "--actor.model_name_or_path", "m", "--reward.remote_url", "http://r", "--train.colocate_actor_ref"]
    user += ["--actor.num_nodes", "1", "--actor.num_gpus_per_node", "2", "--ref.num_nodes", "1"]
    user += ["--ref.num_gpus_per_node", "2", "--critic.num_nodes", "1", "--critic.num_gpus_per_node", "2"]
    user += ["--vllm.num_engines", "2", "--vllm.tensor_parallel_size", "2", "--train.batch_size", "64"]
    got = ADAPTER.read(user)
    assert (got["gpus"], got["trainerGpus"]) == (2 + 2 + 4, 2 + 2)  # actor (+ref), critic, vLLM
    spec = make_spec(user[len(ENTRY) :], budget=8)
    config = RLConfig().with_knobs({"gpus": 8, "placement": "disaggregated", "trainerGpus": 6, "rollout.tp": 2})
    assert ADAPTER.problems(spec, config, user) == []
    a = parse(ADAPTER.command(spec, config, user).overrides)
    assert (a.actor.num_nodes * a.actor.num_gpus_per_node, a.critic.num_gpus_per_node, a.vllm.num_engines) == (4, 2, 1)
