"""The generated CRD on the real API server of the test bed: valid examples accepted, invalid ones
rejected with a message naming the field, `kubectl explain` teaches the spec, immutable fields stay
immutable, and every status field the operator writes survives structural pruning."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess

import pytest
import yaml

from hack.demo import wait_crd_established

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.bed


def kubectl(bed, *args, input=None, check=False):
    r = subprocess.run(
        [str(bed.bin_dir / "kubectl"), *args], env=bed.env(), capture_output=True, text=True, input=input, timeout=60
    )
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def crd(bed):
    kubectl(
        bed, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds" / "rltuningjobs.yaml"), check=True
    )
    wait_crd_established(bed.env(), "rltuningjobs.rltune.io", kubectl_bin=str(bed.bin_dir / "kubectl"))
    return bed


def _examples():
    return sorted(
        p
        for p in (ROOT / "examples").glob("*.yaml")
        if any(d and d.get("kind") == "RLTuningJob" for d in yaml.safe_load_all(p.read_text()))
    )


@pytest.mark.parametrize("path", _examples(), ids=lambda p: p.name)
def test_valid_examples_accepted(crd, namespace, path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for d in docs:
        d.get("metadata", {}).pop("namespace", None)  # into the test's namespace
    r = kubectl(crd, "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "invalid").glob("*.yaml")), ids=lambda p: p.name)
def test_invalid_examples_rejected_naming_the_field(crd, namespace, path):
    expect = re.search(r"^# expect: (\S+)", path.read_text(), re.M).group(1)
    r = kubectl(crd, "apply", "-n", namespace, "-f", str(path))
    assert r.returncode != 0, f"{path.name} was accepted"
    assert expect in r.stderr, f"{path.name}: {expect!r} not named in: {r.stderr}"


def test_explain_teaches_budget(crd):
    r = kubectl(crd, "explain", "rltuningjob.spec.budget", check=True)
    for field in (
        "maxTrials",
        "parallelTrials",
        "stepsPerTrial",
        "warmupSteps",
        "confirmSteps",
        "scheduleTimeoutSeconds",
        "metricsTimeoutSeconds",
    ):
        assert field in r.stdout
    assert "How much trial work the search may spend" in r.stdout
    assert "Most trials (the baseline not counted)" in r.stdout
    r = kubectl(crd, "explain", "rltj.status.best", check=True)
    assert "speedup" in r.stdout and "overrides" in r.stdout


def test_immutable_fields(crd, namespace):
    doc = yaml.safe_load((ROOT / "examples" / "twin-demo.yaml").read_text())
    kubectl(crd, "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=True)
    for path, value, field in (
        (("workload", "model", "preset"), "qwen3-32b", "workload.model"),
        (("resources", "gpuType"), "H100", "resources.gpuType"),
        (("workload", "task", "promptsPerStep"), 17, "workload.task"),
    ):
        d = json.loads(json.dumps(doc))
        node = d["spec"]
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
        r = kubectl(crd, "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(d))
        assert r.returncode != 0 and f"{field} is immutable" in r.stderr, r.stderr
    d = json.loads(json.dumps(doc))
    d["spec"]["budget"]["maxTrials"] = 20  # the budget is not immutable: raising it resumes a search
    kubectl(crd, "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(d), check=True)


def test_every_status_field_survives_pruning(crd, namespace, tmp_path):
    import importlib.util  # tests/unit/test_crd.py: the largest status the operator can write

    sp = importlib.util.spec_from_file_location("unit_test_crd", ROOT / "tests" / "unit" / "test_crd.py")
    test_crd = importlib.util.module_from_spec(sp)
    sp.loader.exec_module(test_crd)

    doc = yaml.safe_load((ROOT / "examples" / "twin-demo.yaml").read_text())
    kubectl(crd, "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=True)
    status = test_crd._big_status(205).dump()
    patch = tmp_path / "status.json"
    patch.write_text(json.dumps({"status": status}))
    r = kubectl(
        crd,
        "patch",
        "rltuningjob",
        "twin-demo",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "--patch-file",
        str(patch),
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(kubectl(crd, "get", "rltuningjob", "twin-demo", "-n", namespace, "-o", "json", check=True).stdout)[
        "status"
    ]
    assert got == json.loads(json.dumps(status)), "the API server pruned or changed status fields"
    out = kubectl(crd, "get", "rltuningjobs", "-n", namespace, check=True).stdout
    header = out.splitlines()[0].split()
    assert header[:5] == ["NAME", "PHASE", "BOTTLENECK", "TRIALS", "SPEEDUP"]
    assert "3.00x" in out and "205/205" in out and "Succeeded" in out
