"""One admission check: whatever the operator refuses of a spec before any pod, `rltune plan`
refuses with the same message, and what it admits, the plan ranks (issue 58: the CLI used to rank
jobs the operator refused)."""

from pathlib import Path

import pytest
import yaml

from rltune import admission, cli
from rltune.controller.reconcile import InvalidSpec, preflight, validate_spec
from rltune.settings import OperatorSettings

ROOT = Path(__file__).resolve().parents[2]
JOBS = sorted((ROOT / "tests" / "invalid_jobs").glob("*.yaml")) + sorted((ROOT / "examples" / "invalid").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _job(path: Path) -> dict:
    return next(d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "RLTuningJob")


def _operator_verdict(raw: dict):
    """The operator's refusal of the spec itself (None: admitted), leaving out what only the cluster
    admin's policy decides (endpoints, pod security), which a CLI cannot know."""
    try:
        spec = validate_spec(raw)
    except InvalidSpec as e:
        return str(e)
    found = admission.problems(spec)
    return "; ".join(found[:4]) if found else None


def _plan(path: Path, capsys):
    try:
        rc = cli.main(["plan", str(path), "--top", "1"])
    except SystemExit as e:
        return str(e)
    assert rc == 0
    capsys.readouterr()
    return None


@pytest.mark.parametrize("path", JOBS + EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_plan_and_operator_give_the_same_verdict(path, capsys):
    raw = _job(path)
    verdict = _operator_verdict(raw.get("spec") or {})
    planned = _plan(path, capsys)
    if verdict is None:
        assert planned is None, planned
    else:
        assert planned is not None and verdict in planned, (verdict, planned)


def test_the_operator_refuses_what_admission_refuses():
    """preflight applies admission.problems (and only adds the cluster policy's checks)."""
    raw = yaml.safe_load((ROOT / "examples" / "twin-demo.yaml").read_text())["spec"]
    raw["searchSpace"] = {"knobs": {"async.staleness": [5]}}
    spec = validate_spec(raw)
    found = admission.problems(spec)
    assert found
    with pytest.raises(InvalidSpec) as e:
        preflight(spec, OperatorSettings())
    assert found[0] in str(e.value)


def test_an_empty_ranking_says_why(tmp_path, capsys):
    """A job no configuration of which fits (DeepSeek-V3 on one node of H100s): `rltune plan` says
    so and what refuses the baseline, instead of printing an empty table."""
    job = yaml.safe_load((ROOT / "examples" / "twin-demo.yaml").read_text())
    job["spec"]["workload"]["model"] = {"preset": "deepseek-v3"}
    job["spec"]["resources"] = {"gpuType": "H100", "gpuBudget": 8, "gpusPerNode": 8}
    job["spec"].pop("searchSpace", None)
    job["spec"].pop("baseline", None)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert cli.main(["plan", str(path), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "nothing ranks" in out and "out of memory" in out
