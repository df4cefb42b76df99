"""Capability matrices and trajectories: our measured scores beside the study's.

Everything reads ``metrics.json`` files from the run store (nothing passes through notebook memory) and
returns plain data or plotly figures; notebooks only display them.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import yaml

from acl_lib.envs import BENCHMARKS

BENCH_ORDER = list(BENCHMARKS)


def paper_results() -> dict:
    """The study's reported figures (``acl_lib/data/paper_results.yaml``, the study's reported numbers)."""
    return yaml.safe_load(resources.files("acl_lib.data").joinpath("paper_results.yaml").read_text())


def load_scores(seed_dir: str | Path, runs: list[str]) -> dict[str, dict[str, float]]:
    """``{run: {benchmark: percent}}`` for every run of ``runs`` whose evaluation (``<run>/eval/metrics.json``)
    exists (others absent)."""
    out = {}
    for name in runs:
        p = Path(seed_dir) / name / "eval" / "metrics.json"
        if p.exists():
            out[name] = json.loads(p.read_text())["scores"]
    return out


def matrix_rows(scores: dict[str, dict[str, float]], benchmarks: list[str] | None = None) -> list[list]:
    """Rows ``[run, score per benchmark...]`` (None where missing), for tables."""
    benchmarks = benchmarks or BENCH_ORDER
    return [[run] + [s.get(b) for b in benchmarks] for run, s in scores.items()]


def format_matrix(scores: dict[str, dict[str, float]], paper: dict[str, dict] | None = None,
                  benchmarks: list[str] | None = None) -> str:
    """A plain-text capability matrix; with ``paper``, each cell reads ``ours (paper)``."""
    benchmarks = benchmarks or BENCH_ORDER
    width = 13 if paper else 7
    head = f"{'checkpoint':<14}" + "".join(f"{b:>{width}}" for b in benchmarks)
    lines = [head]
    for run, s in scores.items():
        cells = []
        for b in benchmarks:
            ours = "-" if s.get(b) is None else f"{s[b]:.1f}"
            if paper is not None:
                theirs = (paper.get(run) or {}).get(b)
                ours += f" ({theirs:.1f})" if theirs is not None else " (-)"
            cells.append(f"{ours:>{width}}")
        lines.append(f"{run:<14}" + "".join(cells))
    return "\n".join(lines)


def capability_heatmap(scores: dict[str, dict[str, float]], title: str = "Capability matrix (score, %)",
                       benchmarks: list[str] | None = None):
    """Plotly heatmap: checkpoint (rows) x benchmark (columns)."""
    import plotly.graph_objects as go

    benchmarks = benchmarks or BENCH_ORDER
    runs = list(scores)
    z = [[scores[r].get(b) for b in benchmarks] for r in runs]
    text = [["" if v is None else f"{v:.1f}" for v in row] for row in z]
    fig = go.Figure(go.Heatmap(z=z, x=benchmarks, y=runs, text=text, texttemplate="%{text}", zmin=0, zmax=100,
                               colorscale="Viridis", colorbar={"title": "%"}))
    fig.update_layout(title=title, yaxis={"autorange": "reversed"}, height=120 + 40 * len(runs))
    return fig


def trajectory_figure(scores: dict[str, dict[str, float]], paper: dict[str, dict], benchmarks: list[str]):
    """One panel per benchmark: its score across the sequential checkpoints, ours (solid) vs the study (dashed)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    runs = list(scores)
    cols = min(4, len(benchmarks))
    rows = (len(benchmarks) + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=benchmarks)
    for i, b in enumerate(benchmarks):
        r, c = i // cols + 1, i % cols + 1
        fig.add_trace(go.Scatter(x=runs, y=[scores[x].get(b) for x in runs], mode="lines+markers", name="ours",
                                 line={"color": "#1f77b4"}, showlegend=i == 0), row=r, col=c)
        theirs = [(paper.get(x) or {}).get(b) for x in runs]
        if any(v is not None for v in theirs):
            fig.add_trace(go.Scatter(x=runs, y=theirs, mode="lines+markers", name="study", connectgaps=True,
                                     line={"color": "#d62728", "dash": "dash"}, showlegend=i == 0), row=r, col=c)
        fig.update_yaxes(range=[0, 100], row=r, col=c)
    fig.update_layout(title="Scores along the curriculum: ours vs the study", height=300 * rows)
    return fig


def forgetting_summary(scores: dict[str, dict[str, float]], curriculum_runs: list[str],
                       in_domain: dict[str, str]) -> list[dict]:
    """For each stage's in-domain benchmark: its peak along the sequence, its final value, the drop.

    ``curriculum_runs`` are the sequential checkpoints in order (``seq_math``, ...), ``in_domain`` maps a
    run to the benchmark its stage trains (``seq_math`` -> ``aime26``).
    """
    rows = []
    final = curriculum_runs[-1]
    for run in curriculum_runs:
        b = in_domain.get(run)
        if b is None:
            continue
        seq = [scores[r].get(b) for r in curriculum_runs if r in scores and scores[r].get(b) is not None]
        if not seq or final not in scores:
            continue
        after = scores.get(run, {}).get(b)
        rows.append({"benchmark": b, "trained_at": run, "after_stage": after, "peak": max(seq),
                     "final": scores[final].get(b), "drop_from_peak": max(seq) - (scores[final].get(b) or 0.0)})
    return rows


def save_figure(fig, path: str | Path) -> list[Path]:
    """Save as HTML (always) and PNG (where a static renderer works). Returns the files written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = [path.with_suffix(".html")]
    fig.write_html(written[0], include_plotlyjs="cdn")
    try:
        fig.write_image(path.with_suffix(".png"))
        written.append(path.with_suffix(".png"))
    except Exception:  # kaleido needs a browser; the HTML is the record
        pass
    return written


def forgetting_table(cfg) -> str:
    """Text table of :func:`forgetting_summary` for the configured curriculum (reads the run store)."""
    from acl_lib.envs import IN_DOMAIN
    from acl_lib.pipeline import checkpoint_names

    names = checkpoint_names(cfg, oracles=False)[1:]
    scores = load_scores(cfg.seed_dir(), names)
    rows = forgetting_summary(scores, [n for n in names if n in scores],
                              {n: IN_DOMAIN[d] for n, d in zip(names, cfg.pipeline.curriculum)})
    if not rows:
        return "no complete sequential runs yet"
    lines = [f"{'benchmark':<10} {'trained at':<14} {'after':>7} {'peak':>7} {'final':>7} {'drop':>7}"]
    for r in rows:
        lines.append(f"{r['benchmark']:<10} {r['trained_at']:<14} {r['after_stage'] or 0:>7.1f} {r['peak']:>7.1f} "
                     f"{r['final'] or 0:>7.1f} {r['drop_from_peak']:>7.1f}")
    return "\n".join(lines)


def read_train_logs(run_dir: str | Path) -> list[dict]:
    """Rows of every ``*train_log*.jsonl`` under a run dir (one row per logging step: phase, step, loss, reward...)."""
    rows = []
    for p in sorted(Path(run_dir).rglob("*train_log*.jsonl")):
        for line in p.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                row.setdefault("phase", p.stem.replace("_train_log", "").replace("train_log", "") or "train")
                rows.append(row)
    return rows


def training_curves(run_dir: str | Path):
    """Plotly figure: loss and reward per step for each training phase logged in ``run_dir``."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = read_train_logs(run_dir)
    fig = make_subplots(rows=1, cols=2, subplot_titles=["loss", "reward"])
    for phase in dict.fromkeys(r["phase"] for r in rows):
        pts = [r for r in rows if r["phase"] == phase]
        for col, key in ((1, "loss"), (2, "reward")):
            xs = [r.get("step") for r in pts if r.get(key) is not None]
            ys = [r[key] for r in pts if r.get(key) is not None]
            if ys:
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"{phase} {key}"), row=1, col=col)
    fig.update_layout(title=f"Training curves: {Path(run_dir).name}", height=350)
    return fig
