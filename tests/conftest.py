"""Shared pytest fixtures. The test bed (docs/testbed.md) starts only for tests that ask for it.

    bed        (session)  tests.bed.Bed: .kubeconfig, .prometheus_url, .pushgateway_url, .repo,
                          .state_dir, .audit_log, .pod_logs, .ports, .core(), .api_client(), .env()
    core       (function) kubernetes.client.CoreV1Api bound to the bed
    namespace  (function) name of a fresh namespace; its pods are removed and it is deleted after

Any test using `bed` (directly or through `core`/`namespace`) is marked `bed` automatically.
Set RLTUNE_SKIP_BED=1 to skip them instead of starting the bed.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
# test modules are imported by path (importlib mode, below), so put tests/ and its folders on
# sys.path for helper modules next to the tests (tests/bed.py, tests/unit/tuner_fixtures.py, ...)
for _d in [_TESTS, *sorted(p for p in _TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))]:
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))
import bed as bedlib  # noqa: E402  (tests/bed.py)


def pytest_configure(config):
    # tests/unit/test_crd.py and tests/integration/test_crd.py share a basename, which the
    # default "prepend" import mode cannot collect together: import test modules by path.
    if config.getoption("importmode", "prepend") == "prepend":
        config.option.importmode = "importlib"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "bed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.bed)


@pytest.fixture(scope="session")
def bed() -> bedlib.Bed:
    if os.environ.get("RLTUNE_SKIP_BED"):
        pytest.skip("RLTUNE_SKIP_BED is set")
    try:
        return bedlib.ensure_bed()
    except SystemExit as e:  # the bed script reports failures as SystemExit(message)
        pytest.fail(f"test bed did not come up: {e}", pytrace=False)


@pytest.fixture
def core(bed):
    return bed.core()


@pytest.fixture
def namespace(bed, core, request):
    from kubernetes.client.rest import ApiException

    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = bedlib.unique(f"t-{base}")
    core.create_namespace(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"rltune.io/test": "true"}}}
    )
    # pods are rejected until the controller-manager made the namespace's ServiceAccount
    bedlib.wait_for(
        lambda: core.read_namespaced_service_account("default", name), 30, what=f"ServiceAccount {name}/default"
    )
    yield name
    # free the (simulated) GPUs before the next test: delete pods, wait until they are gone
    try:
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        deadline = time.time() + 30
        while core.list_namespaced_pod(name).items and time.time() < deadline:
            time.sleep(0.2)
        core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise
