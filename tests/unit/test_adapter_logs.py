"""The framework console-log parsers (rltune.adapters.logs) on the frameworks' real formats.

Fixtures (tests/fixtures/logs/, each with a header naming version and source):

- verl-0.9.1.log: verl 0.9.1, verl/utils/logger/aggregate_logger.py::concat_dict_to_str (through
  LocalLogger.log, the "console" backend of verl/utils/tracking.py::Tracking), called from
  verl/trainer/ppo/ray_trainer.py::RayPPOTrainer.fit; lines rendered by that very function.
- openrlhf-0.11.2.log: OpenRLHF 0.11.2, openrlhf/trainer/ppo_trainer.py::PPOTrainer.fit,
  `logger.info(f"✨ Global step {global_step}: {log_status}")` through
  openrlhf/utils/logging_utils.py (NewLineFormatter, _FORMAT, _DATE_FORMAT); rendered by it.

Where the frameworks are installed (`pip install --no-deps verl==0.9.1 openrlhf==0.11.2`), the tests
also run their formatting functions (loaded by file path: the packages' __init__ needs their full
dependency set) to prove the fixtures' lines are exactly what they print, and to generate lines
for modes without a fixture (fully-async, one-step-off, OpenRLHF async).
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import re
from pathlib import Path

import pytest

from rltune.adapters import logs
from rltune.api.metrics import PHASES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
VERL_LOG = FIXTURES / "verl-0.9.1.log"
ORLHF_LOG = FIXTURES / "openrlhf-0.11.2.log"


def _load(pkg: str, rel: str, name: str):
    """A framework module by file path (not through the package __init__), or skip."""
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{pkg} is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    mspec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(mspec)
    try:
        mspec.loader.exec_module(mod)
    except ImportError as e:
        pytest.skip(f"{pkg}/{rel}: {e}")
    return mod


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


@pytest.fixture(scope="module")
def verl_console():
    if _dist_version("verl") not in (None, "0.9.1"):
        pytest.skip(f"verl {_dist_version('verl')} installed, the fixtures are 0.9.1")
    return _load("verl", "utils/logger/aggregate_logger.py", "_verl_aggregate_logger")


@pytest.fixture(scope="module")
def orlhf_logging():
    if _dist_version("openrlhf") not in (None, "0.11.2"):
        pytest.skip(f"openrlhf {_dist_version('openrlhf')} installed, the fixtures are 0.11.2")
    return _load("openrlhf", "utils/logging_utils.py", "_openrlhf_logging_utils")


def _verl_step_lines() -> list[str]:
    return [ln for ln in VERL_LOG.read_text().splitlines() if " step:" in ln and "timing_s/step:" in ln]


# ---------------------------------------------------------------------------------------------- fixtures
def test_fixture_headers_name_version_and_source():
    v = VERL_LOG.read_text()
    assert "verl 0.9.1" in v and "aggregate_logger.py::concat_dict_to_str" in v and "RayPPOTrainer.fit" in v
    o = ORLHF_LOG.read_text()
    assert "OpenRLHF 0.11.2" in o and "ppo_trainer.py::PPOTrainer.fit" in o and "logging_utils.py" in o


def _verl_value(text: str):
    """A printed verl value back as the Python object that printed it (pprint.pformat of a Number)."""
    import numpy as np

    m = re.fullmatch(r"np\.(\w+)\((.*)\)", text)
    if m:
        return getattr(np, m.group(1))(ast.literal_eval(m.group(2)))
    if text in ("nan", "inf", "-inf"):
        return float(text)
    return ast.literal_eval(text)


def test_verl_fixture_lines_are_what_verl_prints(verl_console):
    pytest.importorskip("numpy")
    lines = _verl_step_lines()
    assert len(lines) == 6
    for line in lines:
        body = logs.clean_line(line)
        m = re.match(r"step:(\d+) - (.*)$", body)
        data = {}
        for part in m.group(2).split(" - "):
            k, _, v = part.rpartition(":")
            data[k] = _verl_value(v)
        assert verl_console.concat_dict_to_str(data, step=int(m.group(1))) == body


def test_openrlhf_fixture_lines_are_what_openrlhf_prints(orlhf_logging):
    fmt = orlhf_logging.NewLineFormatter(orlhf_logging._FORMAT, datefmt=orlhf_logging._DATE_FORMAT)
    lines = [ln for ln in ORLHF_LOG.read_text().splitlines() if "Global step" in ln and not ln.startswith("#")]
    assert len(lines) == 6
    for line in lines:
        body = logs.clean_line(line)
        m = re.match(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) (\S+):(\d+)\] (✨ Global step (\d+): (\{.*\}))$", body)
        assert m, body
        status = ast.literal_eval(m.group(6))
        assert m.group(4) == f"✨ Global step {m.group(5)}: {status}"  # the f-string in PPOTrainer.fit
        rec = logging.LogRecord("openrlhf", logging.INFO, "/x/" + m.group(2), int(m.group(3)), m.group(4), None, None)
        out = fmt.format(rec)
        assert out.startswith("INFO ") and out.endswith(f"{m.group(2)}:{m.group(3)}] {m.group(4)}")


# ---------------------------------------------------------------------------------------------- verl
def test_verl_fixture_parses_to_contract_records():
    recs, p = logs.parse_log("verl", VERL_LOG.read_text())
    assert [r.step for r in recs] == [1, 2, 3, 4, 5, 6]  # the step:0 validation line is no step
    first = _verl_step_lines()[0]
    _, raw = logs.parse_verl_line(first)
    r = recs[0]
    assert r.duration == raw["timing_s/step"]
    assert r.phases["generation"] == raw["timing_s/gen"]
    assert r.phases["old_logprob"] == raw["timing_s/old_log_prob"]
    assert r.phases["ref_logprob"] == raw["timing_s/ref"]
    assert r.phases["training"] == raw["timing_s/update_actor"]
    assert r.phases["weight_sync"] == raw["timing_s/update_weights"]
    assert r.phases["tool"] == raw["timing_s/agent_loop/tool_calls/mean"] == 0.0
    assert r.phases["waiting"] == r.phases["rollout_idle"] == 0.0  # colocated
    assert "generation_tail" not in r.phases
    assert r.trained_tokens == raw["perf/total_num_tokens"]
    n = round(raw["perf/total_num_tokens"] / (raw["prompt_length/mean"] + raw["response_length/mean"]))
    assert n == 256
    assert r.generated_tokens == pytest.approx(n * raw["response_length/mean"])
    assert r.reward == raw["critic/rewards/mean"]
    assert r.logprob_mismatch == raw["training/rollout_probs_diff_mean"]
    assert r.preemptions == pytest.approx(n * raw["timing_s/agent_loop/num_preempted/mean"])
    assert r.staleness == 0.0
    # the longest sequence is printed; the memory share needs the GPU's size (below)
    assert r.longest_sequence == raw["prompt_length/max"] + raw["response_length/max"]
    assert p.missing == {"step_kv_cache_usage_ratio", "step_phase_seconds:generation_tail", "step_trainer_memory_ratio"}
    # the phases a colocated step runs one after the other stay within the step
    for rec in recs:
        assert sum(rec.phases.values()) < rec.duration
        assert set(rec.phases) <= set(PHASES)


def test_verl_peak_memory_becomes_the_share_of_the_gpu_the_bridge_is_told():
    """verl prints its trainer's peak reserved memory in GiB; with the GPU's size it is the contract's share."""
    p = logs.parser_for("verl", 80.0)
    recs = p.feed_text(VERL_LOG.read_text())
    raws = [logs.parse_verl_line(line)[1] for line in _verl_step_lines()]
    reserved = [m["perf/max_memory_reserved_gb"] for m in raws if "perf/max_memory_reserved_gb" in m]
    assert [r.trainer_memory for r in recs] == [x / 80.0 for x in reserved]
    assert all(0.0 < r.trainer_memory < 1.0 for r in recs)
    assert "step_trainer_memory_ratio" not in p.missing and "step_longest_sequence_tokens" not in p.missing


def test_verl_values_numpy_and_special():
    assert logs.parse_value("np.float64(0.25)") == 0.25
    assert logs.parse_value("np.int64(3)") == 3.0
    assert logs.parse_value("1e-06") == 1e-06
    assert logs.parse_value("True") == 1.0
    assert logs.parse_value("tensor(0.5000, device='cuda:0')") == 0.5
    assert logs.parse_value("'text'") is None
    v = logs.parse_value("nan")
    assert v != v


@pytest.mark.parametrize(
    "prefix",
    [
        "(TaskRunner pid=2361) ",
        "\x1b[36m(TaskRunner pid=2361)\x1b[0m ",
        "(TaskRunner pid=2361, ip=10.0.3.7) ",
        "(pid=77) ",
        "",
    ],
)
def test_verl_ray_prefixes(prefix):
    line = prefix + "step:4 - timing_s/gen:1.5 - timing_s/step:3.0 - critic/rewards/mean:0.5"
    p = logs.VerlParser()
    (rec,) = p.feed(line + " [repeated 2x across cluster]")
    assert (rec.step, rec.duration, rec.phases["generation"], rec.reward) == (4, 3.0, 1.5, 0.5)
    assert "step_generated_tokens" in p.missing and "step_trained_tokens" in p.missing


def test_verl_non_step_lines_are_ignored():
    p = logs.VerlParser()
    for line in (
        "Training Progress:  17%|#     | 1/6 [00:41<03:25, 41.02s/it]",
        "(TaskRunner pid=1) step:0 - val-core/openai/gsm8k/acc/mean@1:0.3",
        "(TaskRunner pid=1) [FullyAsyncTrainer] global_steps: 3 local_trigger_step: 1",
        "step:abc - x:1",
        "",
    ):
        assert p.feed(line) == []


def test_verl_fully_async_cycle(verl_console):
    """FullyAsyncTrainer logs the rollouter's stats, then the cycle's aggregate, at one step number."""
    np = pytest.importorskip("numpy")
    rollouter = {  # FullyAsyncRollouter.reset_staleness -> FullyAsyncTrainer._fit_update_weights
        "fully_async/rollouter/active_time": 30.5,
        "fully_async/rollouter/version_time": 34.0,
        "fully_async/rollouter/idle_ratio": 1 - 30.5 / 34.0,
        "fully_async/rollouter/step_generated_samples": 512,
        "dynamic_resource/rollout_resource_utilization": 0.81,
    }
    aggregated = {  # MetricsAggregator.get_aggregated_metrics -> _fit_log_aggregated_training_metrics
        "fully_async/count/stale_trajectory_processed": 130.0,
        "fully_async/partial/max_partial_span": 1.0,
        "fully_async/total_wait_time": 4.25,
        "timing_s/gen": 4.5,
        "timing_s/old_log_prob": 2.0,
        "timing_s/ref": 1.75,
        "timing_s/update_actor": 8.0,
        "timing_s/timing_s/param_sync": 1.25,  # marked_timer("timing_s/param_sync") + compute_timing_metrics
        "timing_s/step": 18.0,
        "critic/rewards/mean": np.float64(0.625),
        "response_length/mean": 300.0,
        "prompt_length/mean": 100.0,
        "perf/total_num_tokens": 204800,
        "fully_async/trainer/idle_ratio": 0.25,
    }
    p = logs.VerlParser()
    assert p.feed("(FullyAsyncTrainer pid=5) " + verl_console.concat_dict_to_str(rollouter, step=3)) == []
    (rec,) = p.feed("(FullyAsyncTrainer pid=5) " + verl_console.concat_dict_to_str(aggregated, step=3))
    assert rec.step == 3 and rec.duration == 18.0
    assert rec.phases["generation"] == 30.5
    assert rec.phases["rollout_idle"] == pytest.approx(3.5)
    assert rec.phases["waiting"] == 4.25
    assert rec.phases["weight_sync"] == 1.25
    assert rec.phases["training"] == 8.0
    assert rec.reward == 0.625
    assert rec.generated_tokens == pytest.approx(512 * 300.0)
    assert "step_staleness" in p.missing and "step_logprob_mismatch" in p.missing


def test_verl_one_step_off(verl_console):
    m = {"timing_s/generate_async": 20.0, "timing_s/gen": 0.5, "timing_s/sync_rollout_weights": 1.0}
    m.update({"timing_s/update_actor": 9.0, "timing_s/step": 14.0, "rollout_corr/log_ppl_abs_diff": 0.003})
    (rec,) = logs.VerlParser().feed(verl_console.concat_dict_to_str(m, step=2))
    assert rec.phases["generation"] == 20.0 and rec.phases["waiting"] == 0.5 and rec.phases["weight_sync"] == 1.0
    assert rec.staleness == 1.0 and rec.logprob_mismatch == 0.003


def test_verl_invalid_mismatch_is_missing(verl_console):
    m = {"training/rollout_probs_diff_valid": 0, "training/rollout_probs_diff_mean": float("nan"), "timing_s/step": 5.0}
    p = logs.VerlParser()
    (rec,) = p.feed(verl_console.concat_dict_to_str(m, step=1))
    assert rec.logprob_mismatch == 0.0 and "step_logprob_mismatch" in p.missing


# ---------------------------------------------------------------------------------------------- OpenRLHF
def test_openrlhf_fixture_parses_to_contract_records():
    recs, p = logs.parse_log("openrlhf", ORLHF_LOG.read_text())
    assert [r.step for r in recs] == [1, 2, 3, 4, 5, 6]
    line = next(ln for ln in ORLHF_LOG.read_text().splitlines() if "Global step 1:" in ln)
    status = ast.literal_eval(line.split("Global step 1: ", 1)[1])
    r = recs[0]
    assert r.duration == status["timing/step_total"]
    assert r.phases == {
        "generation": status["timing/generation"],
        "old_logprob": status["timing/make_experience"],
        "training": status["timing/ppo_train"],
        "weight_sync": status["timing/broadcast"],
        "waiting": 0.0,
        "rollout_idle": 0.0,
    }
    assert r.generated_tokens == pytest.approx(status["rollout/num_samples"] * status["rollout/response_length_mean"])
    assert r.trained_tokens == pytest.approx(status["rollout/num_samples"] * status["total_length"])
    assert r.reward == status["rollout/reward_mean"]
    assert r.logprob_mismatch == abs(status["vllm_kl"])
    assert r.staleness == 0.0
    assert (
        p.missing
        == {
            "step_kv_cache_usage_ratio",
            "step_preemptions",
            "step_phase_seconds:generation_tail",
            "step_phase_seconds:ref_logprob",
            "step_phase_seconds:tool",
        }
        | logs.UNMAPPED
    )


def test_openrlhf_async_line_from_its_logger(orlhf_logging, capsys):
    """TrainingActor.fit (ppo_trainer_async.py) prints "Global step N: {...}" without the sparkle."""
    log = logging.getLogger("_rltune_test_openrlhf_async")
    handler = logging.StreamHandler()
    handler.setFormatter(orlhf_logging.NewLineFormatter(orlhf_logging._FORMAT, datefmt=orlhf_logging._DATE_FORMAT))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)
    status = {"policy_loss": 0.01, "timing/make_experience": 5.0, "timing/ppo_train": 10.0, "timing/broadcast": 1.0}
    status.update({"rollout/num_samples": 128.0, "rollout/response_length_mean": 200.0, "timing/generation": 30.0})
    status["timing/step_total"] = 19.5
    log.info(f"Global step {7}: {status}")
    line = capsys.readouterr().err.strip()
    p = logs.OpenRLHFParser()
    (rec,) = p.feed("(TrainingActor pid=12) " + line)
    assert rec.step == 7 and rec.duration == 19.5
    assert rec.phases["waiting"] == pytest.approx(3.5)  # 19.5 - 5 - 10 - 1: the wait on the rollout queue
    assert "step_staleness" in p.missing and "step_phase_seconds:rollout_idle" in p.missing
    assert "step_logprob_mismatch" in p.missing and "step_reward_mean" in p.missing


def test_openrlhf_repr_literal_eval_refuses():
    line = "INFO 03-02 11:21:28 ppo_trainer.py:548] ✨ Global step 2: {'vllm_kl': np.float64(-0.002), "
    line += "'timing/step_total': 12.5, 'timing/generation': tensor(6.0, device='cuda:0'), 'note': 'a, b'}"
    (rec,) = logs.OpenRLHFParser().feed(line)
    assert rec.duration == 12.5 and rec.logprob_mismatch == 0.002 and rec.phases["generation"] == 6.0


def test_openrlhf_other_lines_are_ignored():
    p = logs.OpenRLHFParser()
    assert p.feed("INFO 03-02 11:20:00 ppo_trainer.py:224] Sample: ['x', 1.0]") == []
    assert p.feed("INFO 03-02 11:20:00 ppo_trainer_async.py:214] Eval at step 5: {'eval_acc': 0.5}") == []


def test_parser_for_unknown():
    with pytest.raises(ValueError):
        logs.parser_for("trl")


def test_logs_module_is_stdlib_only():
    import subprocess
    import sys

    root = Path(logs.__file__).resolve().parents[2]
    code = "import sys, rltune.adapters.logs; bad = [m for m in sys.modules if m.split('.')[0] in "
    code += (
        "('numpy', 'pydantic', 'torch', 'yaml', 'requests', 'prometheus_client', 'kubernetes')]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-S", "-c", code], env={"PYTHONPATH": str(root)}, check=True)
