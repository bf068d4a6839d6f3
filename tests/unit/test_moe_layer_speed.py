"""bench.moe_layer_speed, the prepared GPU measurement of a MoE layer's per-local-expert floor: its two
paths compute the same layer, its fit recovers a known floor, and it runs end to end on the CPU."""

import json

import pytest

torch = pytest.importorskip("torch")

from bench import moe_layer_speed  # noqa: E402
from rltune.api.models import ModelArch  # noqa: E402

TOY = ModelArch(
    name="toy-moe", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=0, vocab=256,
    experts=16, active_experts=4, expert_ffn=32,
)  # fmt: skip


def test_the_expert_loop_and_the_grouped_gemm_are_the_same_layer():
    s = moe_layer_speed.shape_for(TOY, ep=4, tokens=48)
    assert (s.local_experts, s.slots) == (4, 192)
    layer = moe_layer_speed.Layer(s, "cpu", torch.float32, seed=3)
    y_loop, g_loop = layer.step("loop")
    y_grp, g_grp = layer.step("grouped")
    assert y_loop.abs().max() > 0
    assert torch.allclose(y_loop, y_grp, rtol=1e-4, atol=1e-5)
    for a, b in zip(g_loop, g_grp, strict=True):
        assert a.abs().max() > 0  # every weight and the input get a gradient
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    # every slot is routed once, to one of the local experts, in expert order
    assert sum(layer.counts) == s.slots and max(layer.counts) - min(layer.counts) <= 1
    assert sorted(layer.order.tolist()) == list(range(s.slots))


def test_the_fit_recovers_a_known_floor_and_per_slot_cost():
    pts = [
        moe_layer_speed.Point("loop", ep, 16 // ep, t, 4 * t, 0.7 * (16 // ep) + 2e-4 * 4 * t, 0.0)
        for ep in (1, 2, 4)
        for t in (1024, 4096, 16384)
    ]
    (f,) = moe_layer_speed.fit(pts)
    assert f.path == "loop" and f.points == 9
    assert f.floor_ms_per_local_expert == pytest.approx(0.7, rel=1e-6)
    assert f.us_per_slot == pytest.approx(0.2, rel=1e-6)
    assert f.max_rel_residual < 1e-9


def test_an_expert_parallel_size_that_does_not_divide_the_experts_is_refused():
    with pytest.raises(SystemExit, match="not divisible by 3"):
        moe_layer_speed.shape_for(TOY, ep=3, tokens=64)


def test_it_runs_on_the_cpu_and_writes_its_points(tmp_path, monkeypatch):
    pts = moe_layer_speed.measure(TOY, [4, 2], [64], "cpu", repeats=1)
    assert {(p.path, p.local_experts) for p in pts} == {(p, e) for p in moe_layer_speed.PATHS for e in (4, 8)}
    assert all(p.ms > 0 and p.slots == 256 for p in pts)
    monkeypatch.setattr(
        moe_layer_speed,
        "shape_for",
        lambda model, ep, tokens: moe_layer_speed.LayerShape(64, 32, 16, 16 // ep, 4, tokens),
    )
    out = tmp_path / "m.json"
    assert moe_layer_speed.main(["--model", "qwen3-30b-a3b", "--ep", "8,4", "--tokens", "64,128", "--repeats", "1",
                   "--device", "cpu", "--out", str(out)]) == 0  # fmt: skip
    d = json.loads(out.read_text())
    assert d["gpu"] == "cpu" and len(d["points"]) == 8 and {f["path"] for f in d["fits"]} == set(moe_layer_speed.PATHS)
