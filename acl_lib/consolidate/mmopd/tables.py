"""What notebook 08 shows: the runs' specs, the training curves, the single-teacher ablation and a reading
computed from the scores (the comparison with ``seq_final`` and the oracles: ``consolidate.compare``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from acl_lib.config import setting_text
from acl_lib.consolidate.merging.tables import merge_reading
from acl_lib.consolidate.mmopd.specs import DistillSpec


def specs_frame(specs: Sequence[DistillSpec]):
    """The distillation runs: student, teacher of each domain, prompt mixture, alpha."""
    import pandas as pd

    return pd.DataFrame([{"run": s.name, "student": s.student,
                          "teachers": ", ".join(f"{d}: {t}" for d, t in s.teachers.items()),
                          "mixture": ", ".join(f"{d} {w:g}" for d, w in s.mixture.items() if w > 0),
                          "alpha": "inf (reverse KL only)" if s.alpha is None else setting_text(s.alpha)}
                         for s in specs]
                        ).set_index("run")


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
