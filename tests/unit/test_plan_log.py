"""`rltune plan JOB --log FILE`: the measured baseline of the run a team already has, read from its
console log by the metrics bridge's own parsers and calibrating the plan as a baseline trial does
(issue 62). The logs are the frameworks' own renderings (tests/fixtures/logs, see test_adapter_logs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rltune import cli
from rltune.cli import load_job
from rltune.tuner.from_run import from_logs

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "logs"
CASES = [
    (ROOT / "tests" / "fixtures" / "jobs" / "verl-gsm8k-grpo-h100.yaml", LOGS / "verl-0.9.1.log"),
    (ROOT / "examples" / "openrlhf-grpo-b300.yaml", LOGS / "openrlhf-0.11.2.log"),
]


def _plan(capsys, *argv) -> str:
    assert cli.main(["plan", *map(str, argv)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("job, log", CASES, ids=lambda p: p.name)
def test_the_plan_is_calibrated_on_the_runs_log(job, log, capsys):
    """The baseline forecast equals the log's measured step within its noise, and the plan ranks."""
    _, _, spec = load_job(str(job))
    run = from_logs(spec, [log.read_text()])
    assert run.steps >= 3 and run.warmup == spec.budget.warmup_steps
    out = _plan(capsys, job, "--log", log, "--top", "3")
    assert f"measured baseline from 1 log file(s): {run.steps} steps" in out
    forecast = float(re.search(r"baseline forecast: ([\d.]+) s/step", out).group(1))
    s = run.summary
    assert abs(forecast - s.step_time) <= max(2 * s.step_time_std, 0.02 * s.step_time), (forecast, s.step_time)
    assert "profile: " in out and re.search(r"^1 ", out, re.M)


def test_a_log_with_only_step_times_calibrates_on_the_step_and_says_so(tmp_path, capsys):
    """verl lines with their phase timings removed: the plan says the log has no phase times and what
    it falls back to, and still ranks around the measured step."""
    job, log = CASES[0]
    kept = []
    for line in log.read_text().splitlines():
        if " step:" in line:
            line = " - ".join(p for p in line.split(" - ") if not p.startswith("timing_s/") or "timing_s/step:" in p)
        kept.append(line)
    bare = tmp_path / "bare.log"
    bare.write_text("\n".join(kept))
    out = _plan(capsys, job, "--log", bare, "--top", "3")
    assert "the log has no phase times" in out and "profile: unknown" in out
    assert re.search(r"^1 ", out, re.M)


def test_a_log_without_steps_or_a_framework_without_a_parser_is_refused_by_name(tmp_path):
    job, _ = CASES[0]
    empty = tmp_path / "empty.log"
    empty.write_text("(TaskRunner pid=1) Training from scratch\n")
    with pytest.raises(SystemExit, match="no completed verl step in the log"):
        cli.main(["plan", str(job), "--log", str(empty)])
    with pytest.raises(SystemExit, match="--log reads verl and openrlhf console logs"):
        cli.main(["plan", str(ROOT / "examples" / "twin-demo.yaml"), "--log", str(empty)])
    with pytest.raises(SystemExit, match="--log .*missing.log"):
        cli.main(["plan", str(job), "--log", str(tmp_path / "missing.log")])
