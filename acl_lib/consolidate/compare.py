"""The comparison every consolidation notebook (08-11) shows: its runs beside ``seq_final`` and the oracles, per
benchmark, beside the study's rows.

Rows are named as the study names them (``seq_final`` is the last stage of ``pipeline.curriculum``), so the
study's ``main_table`` rows line up with ours by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.envs import BENCHMARKS
from acl_lib.steps import as_seq_final
from acl_lib.views import load_scores, load_standard_errors, scores_frame

if TYPE_CHECKING:
    from acl_lib.config import Config


def _comparison_rows(cfg: Config, runs: Sequence[str], oracles: bool) -> tuple[str, list[str]]:
    """The last stage's run name and the runs a comparison table reads: that stage, ``runs``, the oracles."""
    final = pipeline.final_run(cfg).name
    return final, [final, *runs, *([f"oracle_{d}" for d in cfg.pipeline.curriculum] if oracles else [])]


def comparison_scores(cfg: Config, runs: Sequence[str], oracles: bool = True) -> dict[str, dict[str, float]]:
    """``{row: {benchmark: %}}``: ``seq_final``, each of ``runs`` and the oracles; rows whose evaluation is missing
    are left out. Only the runs named: under ``acl run --jobs`` notebooks 08-10 run side by side, so a table that
    took whatever other consolidation was already scored would depend on the schedule. Every consolidation is
    beside every other in the final tables (notebook 12), which run after every seed's notebooks."""
    final, names = _comparison_rows(cfg, runs, oracles)
    return {as_seq_final(n, final): s for n, s in load_scores(cfg.seed_dir(), names).items()}


def comparison_standard_errors(cfg: Config, runs: Sequence[str],
                               oracles: bool = True) -> dict[str, dict[str, float | None]]:
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
