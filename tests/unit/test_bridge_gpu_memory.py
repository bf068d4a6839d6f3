"""The bridge's GPU memory: the driver's figure (nvidia-smi) when it answers, the operator's nominal one else.

The nvidia-smi query itself runs for real only on a GPU node (docs/frameworks.md records that run);
here the query is any command, so the plumbing around it is exercised with real subprocesses."""

from __future__ import annotations

import sys

import pytest

from rltune.adapters.bridge import gpu_memory_gib, parse_memory_total


def test_parse_takes_the_smallest_gpu_in_gib():
    # `nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits` prints MiB, one line per GPU
    assert parse_memory_total("143771\n") == pytest.approx(143771 / 1024)
    assert parse_memory_total("81559\n81559\n80000\n") == pytest.approx(80000 / 1024)


@pytest.mark.parametrize("text", ["", "[N/A]\n", "No devices were found\n", "0\n"])
def test_parse_without_a_figure_is_none(text):
    assert parse_memory_total(text) is None


def test_the_driver_figure_wins_over_the_nominal_one():
    mem, src = gpu_memory_gib(80.0, query=(sys.executable, "-c", "print(81559); print(81559)"))
    assert src == "nvidia-smi" and mem == pytest.approx(81559 / 1024)


@pytest.mark.parametrize(
    "query",
    [
        ("rltune-no-such-nvidia-smi",),  # not installed (a CPU node)
        (sys.executable, "-c", "import sys; print('NVIDIA-SMI has failed'); sys.exit(9)"),  # driver not loaded
        (sys.executable, "-c", "print('[N/A]')"),
    ],
)
def test_without_an_answer_the_nominal_figure_is_used(query):
    assert gpu_memory_gib(288.0, query=query) == (288.0, "nominal")
    assert gpu_memory_gib(0.0, query=query) == (0.0, "unknown")
