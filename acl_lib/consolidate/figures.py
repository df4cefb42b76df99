"""What notebook 10 shows: the merges beside ``seq_final`` and the oracles, per benchmark, beside the study's rows,
the validation search, and a reading computed from the scores.

Rows are named as the study names them (``seq_final`` is the last stage of ``pipeline.curriculum``), so the
study's ``main_table`` rows line up with ours by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from acl_lib import pipeline
from acl_lib.config import setting_text
from acl_lib.envs import BENCHMARKS, IN_DOMAIN
from acl_lib.steps import SEQ_FINAL, as_seq_final, made_by
from acl_lib.views import load_scores, load_standard_errors, scores_frame

OTHER_CONSOLIDATIONS = ("mmopd", "sdft")  # the distillations (notebooks 08, 09)


def _comparison_rows(cfg, runs: Sequence[str], oracles: bool) -> tuple[str, list[str]]:
    """The last stage's run name and the runs a comparison table reads: that stage, ``runs``, the oracles."""
    final = pipeline.sequential_run(cfg, len(cfg.pipeline.curriculum)).name
    return final, [final, *runs, *([f"oracle_{d}" for d in cfg.pipeline.curriculum] if oracles else [])]


def comparison_scores(cfg, runs: Sequence[str], oracles: bool = True) -> dict[str, dict[str, float]]:
    """``{row: {benchmark: %}}``: ``seq_final``, each of ``runs`` and the oracles; rows whose evaluation is missing
    are left out. Only the runs named: under ``acl run --jobs`` notebooks 08-10 run side by side, so a table that
    took whatever other consolidation was already scored would depend on the schedule. Every consolidation is
    beside every other in the final tables (notebook 12), which run after every seed's notebooks."""
    final, names = _comparison_rows(cfg, runs, oracles)
    return {as_seq_final(n, final): s for n, s in load_scores(cfg.seed_dir(), names).items()}


def comparison_standard_errors(cfg, runs: Sequence[str], oracles: bool = True) -> dict[str, dict[str, float | None]]:
    """The standard error (points) of each score :func:`comparison_scores` reads, rows named alike (clustered by
    task from the runs' records, the binomial fallback without them: :func:`acl_lib.views.load_standard_errors`)."""
    final, names = _comparison_rows(cfg, runs, oracles)
    return {as_seq_final(n, final): s for n, s in load_standard_errors(cfg.seed_dir(), names).items()}


def comparison_frame(scores: Mapping[str, Mapping[str, float]], study: Mapping[str, Mapping],
                     se: Mapping[str, Mapping[str, float | None]] | None = None):
    """One row per checkpoint, two columns per benchmark (ours, the study's ``main_table``); with ``se``
    (:func:`comparison_standard_errors`) our cells read ``score ± se``."""
    return scores_frame(dict(scores), dict(study), se=dict(se) if se is not None else None)


def comparison_figure(scores: Mapping[str, Mapping[str, float]], study: Mapping[str, Mapping],
                      benchmarks: Sequence[str] | None = None, title: str = "Merges"):
    """One panel per benchmark: a bar per checkpoint (ours) and a diamond where the study reports that row."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    benchmarks = list(benchmarks or BENCHMARKS)
    rows_names = list(scores)
    cols = 4
    nrows = (len(benchmarks) + cols - 1) // cols
    titles = [f"{b} ({BENCHMARKS[b].suite.replace('_', '-')})" for b in benchmarks]
    fig = make_subplots(rows=nrows, cols=cols, subplot_titles=titles, shared_yaxes=True)
    palette = qualitative.Plotly + qualitative.D3
    colors = {n: palette[i % len(palette)] for i, n in enumerate(rows_names)}
    for i, b in enumerate(benchmarks):
        r, c = i // cols + 1, i % cols + 1
        for n in rows_names:
            v = scores[n].get(b)
            fig.add_trace(go.Bar(x=[n], y=[v], name=n, marker_color=colors[n], legendgroup=n, showlegend=i == 0,
                                 hovertemplate=f"{n} · {b}: %{{y:.1f}}<extra>ours</extra>"), row=r, col=c)
            theirs = (study.get(n) or {}).get(b)
            if theirs is not None:
                fig.add_trace(go.Scatter(x=[n], y=[theirs], mode="markers", legendgroup="study",
                                         marker={"symbol": "diamond", "size": 10, "color": "black"},
                                         name="study", showlegend=False,
                                         hovertemplate=f"{n} · {b}: %{{y:.1f}}<extra>study</extra>"), row=r, col=c)
        fig.update_xaxes(showticklabels=False, row=r, col=c)
        fig.update_yaxes(range=[0, 105], row=r, col=c)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="study (main table)",
                             marker={"symbol": "diamond", "size": 10, "color": "black"}))
    fig.update_layout(title=f"{title} beside seq_final and the oracles (score %, bars: ours, diamonds: the study)",
                      height=260 * nrows + 80, barmode="group")
    return fig


def validation_frame(validation: Mapping, top: int = 8):
    """The validation search: the ``top`` candidates by mean validation score, and the two chosen ones, with
    each domain's validation score, the mean and the worst score relative to its oracle."""
    import pandas as pd

    chosen = validation["chosen"]
    rows = []
    ranked = sorted(validation["candidates"], key=lambda c: -c["mean"])
    for c in ranked[:top]:
        tags = [k for k, v in chosen.items() if v["weights"] == c["weights"]]
        rows.append({"lambda": _lam(c["weights"]), **c["scores"], "mean": c["mean"],
                     "worst / oracle": c["worst_relative"], "chosen as": ", ".join(tags)})
    for key, c in chosen.items():
        if not any(r["chosen as"] and key in r["chosen as"] for r in rows):
            rows.append({"lambda": _lam(c["weights"]), **c["scores"], "mean": c["mean"],
                         "worst / oracle": c["worst_relative"], "chosen as": key})
    rows.append({"lambda": "oracle", **validation["oracle_scores"], "mean": None, "worst / oracle": 1.0,
                 "chosen as": ""})
    return pd.DataFrame(rows).set_index("lambda")


def _lam(weights) -> str:
    """Coefficients as text (pandas would round a tuple of floats to the display precision)."""
    return ", ".join(f"{w:g}" for w in weights)


def _fmt(v: float) -> str:
    return f"{v:+.1f}"


def merge_reading(scores: Mapping[str, Mapping[str, float]], merges: Sequence[str],
                  study: Mapping[str, Mapping], validation: Mapping | None = None, kind: str = "merges") -> str:
    """Which domain each merge wins and loses against ``seq_final`` (in-domain benchmarks, then OOD), and the
    study's F6 / F8 checked on these rows. Markdown; every number comes from ``scores``."""
    if "seq_final" not in scores:
        return f"No `seq_final` evaluation yet: run {made_by(SEQ_FINAL)} first."
    final = scores["seq_final"]
    lines = []
    domains = list(IN_DOMAIN)
    wins_all = []
    for m in merges:
        if m not in scores:
            lines.append(f"- `{m}`: not evaluated.")
            continue
        s = scores[m]
        diffs = {d: s[IN_DOMAIN[d]] - final[IN_DOMAIN[d]] for d in domains
                 if IN_DOMAIN[d] in s and IN_DOMAIN[d] in final}
        if not diffs:
            continue
        best, worst = max(diffs, key=diffs.get), min(diffs, key=diffs.get)
        won = [d for d, v in diffs.items() if v > 0]
        lost = [d for d, v in diffs.items() if v < 0]
        ood = {b: s[b] - final[b] for b in s if BENCHMARKS[b].suite == "ood" and b in final}
        parts = []
        parts.append(f"wins {', '.join(f'{d} ({IN_DOMAIN[d]} {_fmt(diffs[d])})' for d in won)}" if won
                     else "wins no domain")
        parts.append(f"loses {', '.join(f'{d} ({IN_DOMAIN[d]} {_fmt(diffs[d])})' for d in lost)}" if lost
                     else "loses none")
        text = f"- `{m}` against `seq_final`: {'; '.join(parts)}"
        if best != worst and diffs[best] > 0 and diffs[worst] < 0:
            text += f" (largest gain {best}, largest loss {worst})"
        if ood:
            up = sum(v > 0 for v in ood.values())
            down = sum(v < 0 for v in ood.values())
            text += f"; out of domain {up} of {len(ood)} benchmarks up, {down} down"
        lines.append(text + ".")
        if len(diffs) == len(domains) and all(v >= 0 for v in diffs.values()) and any(v > 0 for v in diffs.values()):
            wins_all.append(m)
    ours_uniform, theirs_uniform = scores.get("merge_uniform"), study.get("merge_uniform") or {}
    if ours_uniform:
        cmp = ", ".join(f"{b} {ours_uniform[b]:.1f} (study {theirs_uniform[b]:.1f})" for b in theirs_uniform
                        if b in ours_uniform)
        lines.append(f"\nThe uniform merge, ours beside the study's: {cmp}.")
    present = [m for m in merges if m in scores]
    if present:
        lines.append(
            "\n**F6** (no shared-weight consolidation wins every domain): "
            + (f"holds among these {kind}: none is at or above `seq_final` on all four in-domain benchmarks."
               if not wins_all else f"does not hold here: {', '.join(f'`{m}`' for m in wins_all)} is at or above "
                                    "`seq_final` on all four in-domain benchmarks.")
        )
        agentic = [IN_DOMAIN["search"], IN_DOMAIN["ecom"]]
        consolidators = [m for m in present if m != "merge_oracles"] + [c for c in OTHER_CONSOLIDATIONS if c in scores]
        if "merge_uniform" in consolidators and len(consolidators) > 1:
            mean = {m: sum(scores[m].get(b, 0.0) for b in agentic) / len(agentic) for m in consolidators}
            weakest = min(mean, key=mean.get)
            lowest = [m for m in consolidators if mean[m] == mean[weakest]]
            verdict = ("holds here" if "merge_uniform" in lowest and len(lowest) == 1 else
                       "ties here" if "merge_uniform" in lowest else f"does not hold here (`{weakest}` is weaker)")
            lines.append(
                f"**F8** (uniform merging is the weakest consolidator on the agentic domains, mean of "
                f"{' and '.join(agentic)}): {verdict}; {', '.join(f'`{m}` {v:.1f}' for m, v in mean.items())}."
                + ("" if any(c in scores for c in OTHER_CONSOLIDATIONS) else
                   " Compared among the merges only: MMOPD and SDFT (notebooks 08, 09) are beside them in the "
                   "final tables (notebook 12).")
            )
    if validation is not None:
        ch = validation["chosen"]
        lines.append(
            f"\nCoefficients chosen on {validation['n_tasks']} validation tasks per domain "
            f"(the `{validation['split']}` "
            f"split, seed {validation['validation_seed']}; never the test tasks above): grid-searched "
            f"lambda = ({_lam(ch['grid']['weights'])}) (validation mean {ch['grid']['mean']:.1f}), "
            f"capability-balanced lambda = ({_lam(ch['balanced']['weights'])}) "
            + (f"(worst domain at {ch['balanced']['worst_relative']:.2f} of its oracle)."
               if ch['balanced']['worst_relative'] is not None
               else "(no oracle scores above 0 on validation, so it is chosen by the mean as well).")
        )
    return "\n".join(lines)


def specs_frame(specs):
    """The merges run: method, checkpoints merged, coefficients, density (TIES / DARE)."""
    import pandas as pd

    return pd.DataFrame([{"merge": s.name, "method": s.method, "sources": ", ".join(s.sources),
                          "lambda": _lam(s.weights),
                          "density": setting_text(s.density) if s.method != "task_arithmetic" else None} for s in specs]
                        ).set_index("merge")


# --- distillation (notebook 08) ------------------------------------------------------------------------------


def train_log_frame(seed_dir, runs: Sequence[str]):
    """Per optimizer step of each run's ``train_log.jsonl``: the loss, the student's on-policy reward, the reverse
    KL, the forward term where it applied and the share of positions above alpha (runs without a log left out)."""
    import json
    from pathlib import Path

    import pandas as pd

    keys = {"loss": "loss", "reward": "reward", "mmopd/reverse": "reverse KL", "mmopd/forward": "forward term",
            "mmopd/high_entropy_share": "share above alpha"}
    rows = []
    for run in runs:
        path = Path(seed_dir) / run / "train_log.jsonl"
        if not path.is_file():
            continue
        for rec in map(json.loads, path.read_text().splitlines()):
            if "loss" in rec:
                rows.append({"run": run, "step": rec.get("step"), **{v: rec.get(k) for k, v in keys.items()}})
    return pd.DataFrame(rows)


def train_log_figure(frame):
    """Loss, reverse KL and on-policy reward per step, one line per run."""
    import plotly.express as px

    long = frame.melt(id_vars=["run", "step"], value_vars=["loss", "reverse KL", "reward"], var_name="quantity")
    fig = px.line(long, x="step", y="value", color="run", facet_col="quantity", markers=True)
    fig.update_yaxes(matches=None, showticklabels=True)
    fig.update_layout(title="Distillation: loss, reverse KL (student to routed teacher) and the student's reward",
                      height=360)
    return fig


def single_teacher_frame(scores: Mapping[str, Mapping[str, float]], study_ablation: Mapping[str, Mapping],
                         student: str, teacher: str, distilled: str):
    """The study's single-teacher ablation layout: the student before and after, and the teacher, on nq and retail,
    ours beside the study's (``single_teacher_ablation``)."""
    import pandas as pd

    rows = {"student before": (student, "student_before"), "student after": (distilled, "student_after"),
            "teacher": (teacher, "teacher")}
    data = {}
    for label, (run, key) in rows.items():
        s, theirs = scores.get(run) or {}, study_ablation.get(key) or {}
        data[f"{label} ({run})"] = {(b, col): v for b in ("nq", "retail")
                                     for col, v in (("ours", s.get(b)), ("study", theirs.get(b)))}
    frame = pd.DataFrame(data).T
    frame.columns = pd.MultiIndex.from_tuples(frame.columns, names=["benchmark", ""])
    return frame


def distill_reading(scores: Mapping[str, Mapping[str, float]], runs: Sequence[str], study: Mapping[str, Mapping],
                    moved: Mapping[str, Mapping], single: tuple[str, str, str] | None = None,
                    study_ablation: Mapping[str, Mapping] | None = None) -> str:
    """What each distillation run wins and loses against ``seq_final`` (``merge_reading``'s rule), how far it moved
    the student, and the single-teacher ablation (``single`` = student, teacher, distilled run) beside the study's."""
    lines = [merge_reading(scores, runs, study, kind="runs")]
    for run, m in moved.items():
        lines.append(f"- `{run}` moved the student by {m['update_norm']:.3g} ({100 * m['relative_update']:.2f}% of "
                     f"its weight norm); loss {m.get('loss_first', float('nan')):.3f} -> "
                     f"{m.get('loss_last', float('nan')):.3f} over {m.get('loss_steps', 0)} steps.")
    if single is not None:
        student, teacher, distilled = single
        if all(r in scores for r in single):
            s0, s1, t = scores[student], scores[distilled], scores[teacher]
            theirs = study_ablation or {}
            lines.append(
                f"\n**Single teacher** (`{teacher}` teaching `{student}` on search prompts only): nq "
                f"{s0['nq']:.1f} -> {s1['nq']:.1f} (teacher {t['nq']:.1f}), retail {s0['retail']:.1f} -> "
                f"{s1['retail']:.1f}. The study: nq {theirs.get('student_before', {}).get('nq')} -> "
                f"{theirs.get('student_after', {}).get('nq')} (teacher {theirs.get('teacher', {}).get('nq')}), retail "
                f"{theirs.get('student_before', {}).get('retail')} -> {theirs.get('student_after', {}).get('retail')}: "
                + ("the student passes its teacher here too." if s1["nq"] > t["nq"] else
                   "here the student does not pass its teacher.")
                + (" Retail falls, as in the study." if s1["retail"] < s0["retail"] else
                   " Retail does not fall here" + (" (it was 0 before)." if s0["retail"] == 0 else "."))
            )
        else:
            missing = ", ".join(r for r in single if r not in scores)
            lines.append(f"\nSingle-teacher ablation: not scored yet ({missing}).")
    return "\n".join(lines)
