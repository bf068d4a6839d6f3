"""Tuning reports (Markdown or HTML) with PNG plots, from `rltune tune --results` JSON.

Plots (matplotlib, optional extra `report`): the baseline's and the winner's phase breakdown,
predicted vs measured step time of every scored trial, and the trial timeline.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Optional

PHASE_ORDER = ("generation", "old_logprob", "ref_logprob", "training", "weight_sync")


def _step(summary: Optional[dict]) -> Optional[float]:
    """The step time a trial was scored by (TrialSummary.step_time) from its summary's JSON."""
    from .tuner.summary import TrialSummary

    if not summary:
        return None
    s = TrialSummary.model_validate(summary)
    return s.step_time if s.steps else None


def _changes(result: dict, cfg: dict) -> dict:
    from .api.models import RLConfig, RLTuningJobSpec
    from .tuner.records import config_changes

    spec = RLTuningJobSpec.model_validate(result["spec"])
    return config_changes(spec.baseline, RLConfig.model_validate(cfg), spec.resources.gpu_budget)


def _save(plt, fig, path: Path, title: str) -> tuple[str, str]:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return title, path.name


def _plots(result: dict, out_dir: Path, stem: str) -> list[tuple[str, str]]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    files = []
    base = result["baseline"]
    trials = result["trials"]
    best = next((t for t in trials if t["id"] == result.get("best")), None)
    # 1. phase breakdown
    bars = [("baseline", base)] + ([(f"best ({best['id']})", best)] if best else [])
    fig, ax = plt.subplots(figsize=(7, 2.2 + 0.4 * len(bars)))
    colors = ["#4C72B0", "#DD8452", "#937860", "#55A868", "#C44E52"]
    for i, (_label, rec) in enumerate(bars):
        ph = (rec.get("summary") or {}).get("phases", {})
        left = 0.0
        for j, p in enumerate(PHASE_ORDER):
            v = ph.get(p, 0.0)
            if v <= 0:
                continue
            ax.barh(
                i,
                v,
                left=left,
                color=colors[j],
                label=p if i == 0 or p not in ax.get_legend_handles_labels()[1] else None,
            )
            left += v
        step = _step(rec.get("summary")) or 0.0
        ax.plot([step, step], [i - 0.4, i + 0.4], "k--", lw=1)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars])
    ax.set_xlabel("seconds (phases stacked; dashed: step time, overlap makes it shorter than the stack)")
    h, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, h))
    ax.legend(uniq.values(), uniq.keys(), fontsize=7, loc="lower right")
    ax.set_title("Phase breakdown: baseline vs best")
    files.append(_save(plt, fig, out_dir / f"{stem}-phases.png", "Phase breakdown"))
    # 2. predicted vs measured
    pts = [
        (t["predicted"], _step(t["summary"]), t["state"])
        for t in trials
        if t.get("predicted") and t.get("summary") and t["summary"].get("steps")
    ]
    if pts:
        fig, ax = plt.subplots(figsize=(4.5, 4.5))
        for state, c in (("Succeeded", "#55A868"), ("Rejected", "#C44E52"), ("Stopped", "#999999")):
            xs = [p[0] for p in pts if p[2] == state]
            ys = [p[1] for p in pts if p[2] == state]
            if xs:
                ax.scatter(xs, ys, c=c, label=state, s=25)
        lo = min(min(p[0], p[1]) for p in pts) * 0.9
        hi = max(max(p[0], p[1]) for p in pts) * 1.1
        ax.plot([lo, hi], [lo, hi], "k:", lw=1)
        ax.set_xlabel("predicted s/step")
        ax.set_ylabel("measured s/step")
        ax.set_title("Forecast vs measurement")
        ax.legend(fontsize=7)
        files.append(_save(plt, fig, out_dir / f"{stem}-forecast.png", "Predicted vs measured"))
    # 3. timeline
    tl = result.get("timeline") or []
    if tl:
        states = {t["id"]: t["state"] for t in trials}
        states[base["id"]] = base["state"]
        fig, ax = plt.subplots(figsize=(7, 0.8 + 0.3 * len(tl)))
        cmap = {"Succeeded": "#55A868", "Rejected": "#C44E52", "Failed": "#8C1C13", "Stopped": "#999999"}
        for i, (tid, a, b) in enumerate(tl):
            ax.barh(i, max(b - a, 0.01), left=a, color=cmap.get(states.get(tid, ""), "#4C72B0"))
        ax.set_yticks(range(len(tl)), [t[0] for t in tl])
        ax.invert_yaxis()
        ax.set_xlabel("wall seconds since start")
        ax.set_title("Trial timeline")
        files.append(_save(plt, fig, out_dir / f"{stem}-timeline.png", "Trial timeline"))
    return files


def _rows(result: dict) -> list[list[str]]:
    base = result["baseline"]
    bobj = base.get("objective")
    rows = []
    for t in [base] + result["trials"]:
        s = t.get("summary") or {}
        meas = _step(s)
        sp = f"{bobj / t['objective']:.2f}x" if (t.get("objective") and bobj and t["state"] == "Succeeded") else "-"
        ch = _changes(result, t["config"]) if t is not base else {}
        chs = ", ".join(f"{k}={v[1]}" for k, v in ch.items()) or "(baseline)"
        rows.append(
            [
                t["id"],
                t["state"],
                f"{t['predicted']:.1f}" if t.get("predicted") else "-",
                f"{meas:.1f}" if meas else "-",
                sp,
                str(t.get("gpus", "")),
                chs,
                (t.get("reason") or "")[:120],
            ]
        )
    return rows


HEAD = ["trial", "state", "predicted s", "measured s", "speed-up", "GPUs", "changes", "reason"]


def result_from_job(job: dict) -> dict:
    """The report's input from an RLTuningJob the operator ran (its spec and status), so that
    `rltune report --job NS/NAME` draws the same report as `rltune tune --local --report`."""
    from datetime import datetime, timezone

    from .api.models import RLTuningJobSpec
    from .api.status import RLTuningJobStatus
    from .tuner.records import config_from_diff, unflatten_summary

    md = job["metadata"]
    spec = RLTuningJobSpec.model_validate(job.get("spec") or {})
    st = RLTuningJobStatus.model_validate(job.get("status") or {})

    def t_of(iso):
        return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp() if iso else None

    def rec(t) -> dict:
        summary = unflatten_summary(t.summary).dump() if t.summary else None
        return {
            "id": t.id,
            "state": str(t.state),
            "config": config_from_diff(spec.baseline, t.config).dump(),
            "gpus": t.gpus,
            "predicted": t.predicted_seconds,
            "objective": t.objective,
            "summary": summary,
            "reason": t.reason,
            "gates": {name: {"passed": ok, "detail": ""} for name, ok in (t.gates or {}).items()},
        }

    base = next((t for t in st.trials if t.kind == "baseline"), None)
    if base is None:
        raise ValueError(f"{md.get('namespace')}/{md['name']}: no baseline trial in its status yet")
    t0 = t_of(st.started_at) or t_of(base.created_at) or 0.0
    timeline = []
    for t in st.trials:
        a, b = t_of(t.started_at) or t_of(t.created_at), t_of(t.finished_at)
        if a is not None and b is not None:
            timeline.append([t.id, a - t0, b - t0])
    bs = st.baseline
    return {
        "job": f"{md.get('namespace', 'default')}/{md['name']}",
        "mode": "real" if spec.workload.framework == "reference" else "twin",
        "spec": spec.dump(),
        "baseline": rec(base),
        "trials": [rec(t) for t in st.trials if t.kind != "baseline"],
        "best": (st.best.trial if st.best else None),
        "reason": f"phase {st.phase}: {st.message or ''}".strip(),
        "forecastError": st.forecast_error,
        "profile": {"evidence": "; ".join(bs.evidence or []), "bottleneck": bs.bottleneck} if bs else None,
        "timeline": timeline,
        "poolOffer": st.pool_offer.model_dump(by_alias=True) if st.pool_offer else None,
        "rewardGate": reward_gate(st),
    }


def reward_gate(st) -> Optional[dict]:
    """The RewardGatePowered condition (docs/tuner.md "The reward gate on the winner") for the summary."""
    c = next((c for c in st.conditions if c.type == "RewardGatePowered"), None)
    return {"status": c.status, "reason": c.reason, "message": c.message} if c else None


def render(result: dict, path: str) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    plots = _plots(result, out.parent, out.stem)
    base = result["baseline"]
    best = next((t for t in result["trials"] if t["id"] == result.get("best")), None)
    bstep = _step(base.get("summary"))
    lines_summary = [f"Job {result['job']} ({result.get('mode', 'twin')} mode): {result.get('reason', '')}."]
    if bstep:
        lines_summary.append(f"Baseline: {bstep:.1f} s/step on {base.get('gpus')} GPUs.")
    if result.get("profile"):
        lines_summary.append(f"Profile: {result['profile'].get('evidence', '')}")
    if best and base.get("objective"):
        lines_summary.append(
            f"Winner {best['id']}: {_step(best['summary']):.1f} s/step on {best['gpus']} GPUs, "
            f"{base['objective'] / best['objective']:.2f}x the baseline."
        )
        for k, (a, b) in _changes(result, best["config"]).items():
            lines_summary.append(f"  {k}: {a} -> {b}")
        if best.get("gates"):
            lines_summary.append("Quality gates of the winner:")
            for gate, verdict in best["gates"].items():
                lines_summary.append(
                    f"  {gate}: {'pass' if verdict['passed'] else 'fail'}"
                    + (f": {verdict['detail']}" if verdict.get("detail") else "")
                )
    if result.get("forecastError") is not None:
        lines_summary.append(f"Forecaster median |error| on trials: {result['forecastError']:.1%}.")
    if result.get("poolOffer"):
        lines_summary.append(f"Other GPU pools: {result['poolOffer'].get('message', '')}.")
    if result.get("rewardGate"):
        rg = result["rewardGate"]
        lines_summary.append(f"Reward gate ({rg['reason']}): {rg['message']}.")
    rows = _rows(result)
    if out.suffix.lower() in (".html", ".htm"):
        h = [
            "<!doctype html><html><head><meta charset='utf-8'><title>rltune report</title>",
            "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
            "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}</style></head><body>",
            "<h1>rltune tuning report</h1>",
        ]
        h += [f"<p>{html.escape(line)}</p>" for line in lines_summary]
        h.append("<h2>Trials</h2><table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in HEAD) + "</tr>")
        for r in rows:
            h.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>")
        h.append("</table>")
        for title, f in plots:
            h.append(f"<h2>{html.escape(title)}</h2><img src='{html.escape(f)}'>")
        h.append("</body></html>")
        out.write_text("\n".join(h))
    else:
        md = ["# rltune tuning report", ""]
        md += [line if not line.startswith("  ") else f"- `{line.strip()}`" for line in lines_summary]
        md += ["", "## Trials", "", "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
        for r in rows:
            md.append("| " + " | ".join(c.replace("|", "/") for c in r) + " |")
        for title, f in plots:
            md += ["", f"## {title}", "", f"![{title}]({f})"]
        out.write_text("\n".join(md) + "\n")
