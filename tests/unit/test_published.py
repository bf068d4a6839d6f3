"""bench/published.py: the published-step dataset through the twin (issue 14), shipped-factor path only."""

import math

import pytest

from bench import calibrate
from bench import published as published_bench
from rltune.api.models import RLConfig, TaskSpec
from rltune.twin import simulate_step_breakdown


@pytest.fixture(scope="module")
def data():
    return published_bench.load()


@pytest.fixture(scope="module")
def built(data):
    return published_bench.build(data)


@pytest.fixture(scope="module")
def nofit():
    return published_bench.run_all(do_fit=False, folds=False, log=lambda m: None)


def test_every_headline_row_builds_valid_twin_inputs(data, built):
    yaml_rows = {r["id"]: r for r in data["rows"]}
    assert len(built) == len(yaml_rows) == 47
    heads = [b for b in built if b.headline]
    # issue 14: at least 30 published step times from at least 4 independent sources
    assert len(heads) >= 30
    assert len({b.source for b in heads}) >= 4
    for b in heads:
        r = yaml_rows[b.id]
        assert r["metric_kind"] in published_bench.HEADLINE_KINDS and not r.get("twin_unsupported")
        i = b.inputs
        cfg = RLConfig.model_validate(i["cfg"])
        assert isinstance(i["task"], TaskSpec)
        assert cfg.gpus == r["gpus"], b.id
        if r["mode"] == "colocated_sync":
            assert cfg.placement == "colocated" and cfg.async_.staleness == 0, b.id
        else:
            assert cfg.placement == "disaggregated", b.id
            want = {"disaggregated_sync": 0, "one_step_off": 1}.get(r["mode"])
            if want is not None:
                assert cfg.async_.staleness == want and not cfg.async_.partial_rollout, b.id
            else:
                assert cfg.async_.staleness >= 1 and cfg.async_.partial_rollout, b.id
        if r["mode"] == "fully_async" and "staleness_threshold" in (r.get("async") or {}):
            thr = r["async"]["staleness_threshold"]
            assert cfg.async_.stale_fraction == thr and cfg.async_.staleness == max(1, math.ceil(thr)), b.id
        if (r.get("async") or {}).get("use_rollout_log_probs"):
            assert i["scenario"].get("rollout_logprobs") is True, b.id
        if r.get("train_backend", "").startswith("FSDP") and b.id not in published_bench.CALIBRATE_TWINS:
            assert i["scenario"].get("fsdp") is True, b.id
        assert b.assumptions, b.id
        assert b.row.published["step_s"] == r["metrics"]["step_s"]


def test_split_is_by_source_and_disjoint(data, built):
    sp = data["split"]
    fit, held = set(sp["fit"]), set(sp["held_out"])
    assert fit and held and not fit & held
    assert fit | held == set(data["sources"]) == set(sp["leave_one_source_out"])
    for b in built:
        assert b.split == ("fit" if b.source in fit else "held_out")
    assert sum(b.split == "held_out" for b in built) == sp["row_counts"]["held_out"]


def test_calibrate_twins_are_real_calibrate_rows():
    names = {r.name for r in calibrate.ALL_ROWS}
    assert published_bench.CALIBRATE_NAMES_IN_DATASET <= names
    # every calibrate RL / weight-sync row is one of the dataset's rows: none may leak into a fold
    assert {r.name for r in calibrate.RL_ROWS + calibrate.SYNC_ROWS} == published_bench.CALIBRATE_NAMES_IN_DATASET


def test_fold_never_fits_on_the_left_out_source(data, built):
    by_name = {b.id: b for b in built}
    for s in data["split"]["leave_one_source_out"]:
        rows = published_bench.fold_fit_rows(built, {s})
        assert rows
        for r in rows:
            assert r.name not in published_bench.CALIBRATE_NAMES_IN_DATASET
            if r.name in by_name:
                assert by_name[r.name].source != s
                assert not by_name[r.name].unsupported
        # the left-out source's runnable rows are all outside the fold's fit
        assert not {b.row.name for b in built if b.source == s and b.row} & {r.name for r in rows}
    shipped_fit = published_bench.fold_fit_rows(built, set(data["split"]["held_out"]))
    assert all(by_name[r.name].split == "fit" for r in shipped_fit if r.name in by_name)


def test_headline_excludes_twin_unsupported_rows(built):
    heads = [b for b in built if b.headline]
    perfect = {b.id: {"step_s": b.metrics["step_s"]} for b in heads}
    fake = published_bench.Built(
        id="fake-unsupported",
        source="areal",
        split="held_out",
        hardware="H100",
        gpus=8,
        mode="colocated_sync",
        kind="step",
        precision="exact",
        doubtful=False,
        unsupported=["speculative decoding"],
        metrics={"step_s": 100.0},
        assumptions=[],
        row=calibrate.Row("areal", "fake-unsupported", "H100", {"step_s": 100.0}, lambda s: {"step_s": 900.0}, ""),
    )
    assert not fake.headline
    preds = {**perfect, fake.id: {"step_s": 900.0}}
    s = published_bench.summarize(built + [fake], preds, published_bench.headline)
    assert s["rows"] == len(heads) and s["median"] == 0.0 and s["max"] == 0.0
    for b in built:
        if b.unsupported:
            assert not b.headline


def test_error_sign_convention():
    assert published_bench.err_pct(100.0, 110.0) == pytest.approx(10.0)  # twin slower than published: positive
    assert published_bench.err_pct(200.0, 150.0) == pytest.approx(-25.0)


def test_calibrate_rows_predict_the_same(built):
    """Rows shared with bench/calibrate.py run the same twin inputs, so the two reports agree."""
    cal_rows = {r.name: r for r in calibrate.RL_ROWS}
    for rid in ("verl-fa-7b-colocate-64", "verl-osp-7b-megatron-colocate-16"):
        b = next(x for x in built if x.id == rid)
        ours = published_bench.predict(b, {})["step_s"]
        theirs = cal_rows[published_bench.CALIBRATE_TWINS[rid]].run({})["step"]
        assert ours == pytest.approx(theirs, rel=1e-9)


def test_no_fit_report(nofit):
    md, stats = published_bench.report(nofit)
    assert "| set | rows |" in md and "shipped factors, held-out sources" in md
    head = stats["sets"]["shipped factors, all sources"]
    assert head["rows"] + head["refused"] >= 30
    assert stats["cpu_ms"]["n"] > 0 and stats["cpu_ms"]["median"] > 0
    assert any(r["id"] == "rocm-h100-qwen2-7b-grpo" and r["twin_shipped"] > 0 for r in stats["rows"])
    assert all(r["not_run"] for r in stats["rows"] if r["id"].startswith("skyrl"))
    assert stats["rules"] and stats["rules"][0].startswith("R-a")


def test_the_report_is_embedded_once_and_survives_a_calibrate_rewrite(tmp_path):
    doc = tmp_path / "calibration.md"
    doc.write_text("# Twin calibration\n\nintro\n\n## Summary\n\nold\n")
    published_bench.embed("### report one", doc)
    published_bench.embed("### report two", doc)
    text = doc.read_text()
    assert text.count(published_bench.BEGIN) == 1 and "report two" in text and "report one" not in text
    assert text.index(published_bench.BEGIN) < text.index("## Summary")
    # bench/calibrate.py rewrites the page around the block and keeps it
    tab, stats = calibrate.table(calibrate.evaluate(calibrate.SYNC_ROWS, {}))
    calibrate.write_doc(tab, stats, doc)
    text = doc.read_text()
    assert text.count(published_bench.BEGIN) == 1 and "report two" in text and "intro" not in text
    # and so are hand-written findings between the block and the summary
    doc.write_text(text.replace("\n## Summary", "\n### A finding\n\nwritten by hand\n\n## Summary", 1))
    calibrate.write_doc(tab, stats, doc)
    text = doc.read_text()
    assert text.count("written by hand") == 1
    assert text.index(published_bench.END) < text.index("written by hand") < text.index("## Summary")


def test_dense_pretraining_rows_hold_on_every_gpu_type():
    """Megatron-Bridge's Llama3-8B/70B recipes, run with the tables' own shapes at the shipped factors,
    stay within 15% on H100, B200, GB200 and GB300: the training model's compute side."""
    dense = [r for r in calibrate.TRAIN_ROWS if r.name.startswith(("Llama3-8B", "Llama3-70B"))]
    ran = [
        (row, published_bench, pred) for row, _, published_bench, pred in calibrate.evaluate(dense, {}) if pred == pred
    ]
    assert len(ran) >= 6 and {row.hw for row, _, _ in ran} == {"H100", "B200", "GB200", "GB300"}
    for row, published, predicted in ran:
        assert abs(calibrate.err(published, predicted)) < 15.0, (row.name, published, predicted)


def test_retool_rows_run_the_recipe_workload(data, built):
    """The ReTool rows are math with a Python interpreter, not the twin's SWE defaults (20 turns, 1,200
    observation tokens, 20 s tools): turns within the recipe's published range and under its cap,
    replies within verl's tool-reply cap, the script's offload per mode."""
    yaml_rows = {r["id"]: r for r in data["rows"]}
    rows = [b for b in built if b.id.startswith("verl-fa-7b-retool")]
    assert len(rows) == 2
    for b in rows:
        task, scn, cfg = b.inputs["task"], b.inputs["scenario"], RLConfig.model_validate(b.inputs["cfg"])
        r = yaml_rows[b.id]
        # verl's num_turns = user + assistant + 1; the README publishes 7.2 (SFT) and 10 (RL)
        assert (7.2 - 1) / 2 <= task.turns <= 10 / 2 and task.turns <= r["agentic"]["max_assistant_turns"]
        assert scn["obs_tokens"] <= 256  # max_tool_response_length characters: at most one token each
        assert task.tool_latency_seconds < 30 and task.sandboxes == 128  # the tool config's timeout, rate limit
        assert cfg.trainer.offload is (r["mode"] == "colocated_sync"), b.id
        assert cfg.trainer.micro_batch_tokens == 18432 and cfg.trainer.cp == 4, b.id


def test_require_batches_rows_train_a_whole_batch_per_logged_step(built):
    """verl's rule for comparing with colocated runs (trigger_parameter_sync_step = train_batch_size /
    (require_batches x ppo_mini_batch_size)): every require_batches row logs 512 prompts per step."""
    rows = [b for b in built if b.id.startswith("verl-fa-7b-async-64-64-reqbatch")]
    assert len(rows) == 3
    for b in rows:
        assert b.inputs["task"].prompts_per_step == 512, b.id
        assert b.inputs["scenario"]["mini_batches"] == 512 // 32, b.id


def test_the_30b_fully_async_row_runs_the_layout_its_yaml_records(data, built):
    """Rule R-b: a verl-async-h20 row changes from its calibrate sibling what the YAML states, here the
    script's trainer TP2 CP2 EP8 ETP1 and ppo_mini_batch 128 of 512 prompts (4 mini-batches)."""
    r = next(r for r in data["rows"] if r["id"] == "verl-fa-30b-async-96-32")
    b = next(b for b in built if b.id == r["id"])
    t = RLConfig.model_validate(b.inputs["cfg"]).trainer
    par = r["parallelism"]
    assert (t.tp, t.cp, t.ep, t.expert_tp) == (par["train_tp"], par["train_cp"], par["train_ep"], par["train_etp"])
    assert b.inputs["scenario"]["mini_batches"] == 512 // r["batch"]["ppo_mini_batch_prompts"] == 4
    dsv3 = next(b for b in built if b.id == "verl-dsv3-671b-colocate-96")
    assert RLConfig.model_validate(dsv3.inputs["cfg"]).trainer.expert_tp == 1  # the script's ETP


def test_generate_sequences_is_the_engines_generation_even_one_step_off(built):
    """verl's generate_sequences is scored against the twin's generation phase in every mode; a
    one-step-off row's gen-like wait (wait_prev_gen) stays the trainer's wait."""
    osp = next(b for b in built if b.id == "verl-osp-7b-fsdp2-onestepoff-4-12")
    assert {"generate_sequences_s", "wait_prev_gen_s"} <= set(osp.metrics)
    pred = published_bench.predict(osp, {})
    cfg = RLConfig.model_validate(osp.inputs["cfg"])
    i = osp.inputs
    phases = simulate_step_breakdown(i["model"], i["task"], i["gpu"], i["gpn"], cfg, i["scenario"])["phases"]
    assert pred["generate_sequences_s"] == phases["generation"] > phases["waiting"] == pred["wait_prev_gen_s"]


def test_megatron_bridge_recipes_agree_with_their_own_gradient_accumulation():
    """Each transcribed recipe satisfies GBS = GA x MBS x DP with the table's own GA column (a typo in
    GPUs, TP, PP, CP, MBS or GBS breaks it). The one row the source itself contradicts is named."""
    contradicted = {("25.11", "GB300", "q235")}  # published GA 32; its GBS 8192, MBS 2 and PP4 give 64
    for r in calibrate.MEGATRON_BRIDGE_RECIPES:
        dp, rem = divmod(r.gpus, r.tp * r.pp * r.cp)
        assert rem == 0 and r.ep <= r.gpus // r.pp, r
        consistent = r.gbs == r.ga * r.mbs * dp
        assert consistent != ((r.release, r.hw, r.model) in contradicted), r


def test_moe_layers_with_few_local_experts_are_gpu_bound_in_the_twin_too():
    """Per MoE layer and micro-batch, the rack recipes that hold 4-8 experts per GPU (no host floor)
    run within 30% of the twin's GPU time: its MoE compute side."""
    rack = [m for m in calibrate.moe_layer_times() if m.local_experts <= 8 and m.recipe.hw.startswith("GB")]
    assert len(rack) >= 8
    for m in rack:
        assert abs(m.twin_ms / m.published_ms - 1) < 0.3, m
