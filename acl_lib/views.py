"""What a notebook shows of one seed's run store: scores beside the study's, the capability matrix and the
trajectory along the curriculum, training curves, failure reasons, a stage's recipe and phases, and short
readings of a stage and of the sequence; and how its figures show and are saved.

Everything reads files of the run store (``<run>/eval/metrics.json``, ``train_log.jsonl``, ``stage.json``,
``COMPLETE.json``; nothing passes through notebook memory) and the study's figures
(``acl_lib/data/paper_results.yaml``), and returns DataFrames, plotly figures or Markdown; notebooks only display
them. The study's steps (diagnostics, consolidations) and the readings over seeds build on these views, so this
module imports nothing above ``acl_lib.pipeline``.

``setup_notebook()`` makes plotly figures show wherever a notebook is read: interactive in JupyterLab, interactive
and offline in ``jupyter nbconvert`` HTML (plotly.js embedded once per notebook), and as a PNG (GitHub, nbviewer
without JavaScript) when kaleido finds a Chrome; ``save_figure()`` writes a figure beside the run store as offline
HTML and, where kaleido can export, as PNG (decided once per process by ``acl_lib.png_export``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from acl_lib import png_export
from acl_lib.config import setting_text
from acl_lib.envs import BENCHMARKS, IN_DOMAIN
from acl_lib.noise import contrast_se, matches, read_task_counts, samples_per_task, score_se
from acl_lib.pipeline import checkpoint_names
from acl_lib.progress import hf_progress_bars

if TYPE_CHECKING:
    from acl_lib.config import Config

BENCH_ORDER = list(BENCHMARKS)


# --- figures that show everywhere ---------------------------------------------------------------------

_STATIC: dict[str, bool] = {}


def _start_image_server(timeout_s: float = 60.0) -> bool:
    """Keep one headless Chrome for this process's PNG exports (kaleido's sync server): without it kaleido starts
    a browser for every image (3.9 s per PNG against 1.0 s through the server, measured on 2 busy cores).

    Called only after ``png_export.decide`` found a Chrome that exports. The first export through the server is
    still bounded in time (a server whose thread died would make it wait forever); returns whether it worked."""
    import atexit
    import threading
    import warnings

    import kaleido  # optional heavy dependency, only where PNGs are exported
    import plotly.graph_objects as go

    kaleido.start_sync_server(silence_warnings=True)
    atexit.register(kaleido.stop_sync_server, silence_warnings=True)
    # plotly passes its export options along, which a running server ignores (the figure's own are used)
    warnings.filterwarnings("ignore", message="The kopts argument is ignored")
    result: list[bytes] = []

    def first_export() -> None:
        try:
            result.append(go.Figure(go.Bar(x=[1], y=[1])).to_image(format="png", width=60, height=40))
        except Exception:  # reported as "no PNG" below
            pass

    worker = threading.Thread(target=first_export, daemon=True)
    worker.start()
    worker.join(timeout_s)
    return bool(result)


def static_images_available() -> bool:
    """Whether plotly can write PNGs here (a Chrome kaleido can start); decided once per process, never hangs
    (``acl_lib.png_export``). Where not, prints one line saying how to get PNG copies."""
    if "png" not in _STATIC:
        ok, why = png_export.decide()
        if ok and not _start_image_server():
            ok, why = False, "kaleido's image server did not answer"
        if not ok:
            print(png_export.hint(why))
        _STATIC["png"] = ok
    return _STATIC["png"]


def setup_notebook(static_images: bool | None = None) -> str:
    """Make the notebook's figures show everywhere it is read; returns the plotly renderer set.

    ``plotly_mimetype`` (JupyterLab), ``notebook`` (HTML with plotly.js embedded once, for nbconvert HTML,
    offline) and, where kaleido can export, ``png`` (GitHub). Also sets pandas to print scores with one
    decimal and turns the Hugging Face libraries' progress bars off (the suite draws its own lines).
    """
    import pandas as pd
    import plotly.io as pio

    hf_progress_bars(False)  # "Loading weights" redraws in every cell that loads a model; progress: acl_lib.progress
    png = static_images_available() if static_images is None else static_images
    renderer = "plotly_mimetype+notebook" + ("+png" if png else "")
    pio.renderers.default = renderer
    pd.set_option("display.precision", 1)
    pd.set_option("display.max_columns", 40)
    pd.set_option("display.width", 200)
    return renderer


def save_figure(fig, path: str | Path) -> list[Path]:
    """Save as HTML that works offline (it loads ``plotly.min.js`` written once beside it) and as PNG where
    kaleido can export. Returns the files written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = [path.with_suffix(".html")]
    fig.write_html(written[0], include_plotlyjs="directory")
    if static_images_available():
        fig.write_image(path.with_suffix(".png"), scale=2)
        written.append(path.with_suffix(".png"))
    return written


# --- scores ----------------------------------------------------------------------------------------------


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


def load_standard_errors(seed_dir: str | Path, runs: list[str]) -> dict[str, dict[str, float | None]]:
    """``{run: {benchmark: points}}``: the standard error of each score :func:`load_scores` reads, for the same
    runs: clustered by task from the evaluation's ``records/<benchmark>.jsonl`` (``acl_lib.noise.clustered_se``),
    else the binomial fallback (``metrics.json``'s ``se``, or computed from its ``n_tasks`` and k for a file
    written before ``se``: ``acl_lib.noise.score_se``). Pass it as ``se`` to :func:`scores_frame` or
    :func:`format_matrix`."""
    out = {}
    for name in runs:
        p = Path(seed_dir) / name / "eval" / "metrics.json"
        if p.exists():
            metrics = json.loads(p.read_text())
            out[name] = {b: score_se(metrics, b, read_task_counts(p.parent / "records" / f"{b}.jsonl"))
                         for b in metrics["scores"]}
    return out


def load_change_errors(seed_dir: str | Path, before: str, after: str) -> dict[str, float | None]:
    """``{benchmark: points}``: the standard error of ``after - before`` on each benchmark both scored, paired by
    task from the two evaluations' records (``acl_lib.noise.contrast_se``: what the two checkpoints share on a
    task cancels); None where either has no records that give its score (:func:`stage_change_frame` then combines
    the two scores' errors as independent). Pass it as ``change_se`` to :func:`stage_change_frame`."""
    evals = [Path(seed_dir) / run / "eval" for run in (before, after)]
    if not all((e / "metrics.json").exists() for e in evals):
        return {}
    scores = [json.loads((e / "metrics.json").read_text())["scores"] for e in evals]
    out: dict[str, float | None] = {}
    for b in scores[0].keys() & scores[1].keys():
        counts = [read_task_counts(e / "records" / f"{b}.jsonl") for e in evals]
        ok = all(matches(tc, sc.get(b)) for tc, sc in zip(counts, scores))
        out[b] = contrast_se([(-1.0, counts[0]), (1.0, counts[1])]) if ok else None
    return out


def score_text(score: float | None, se: float | None = None, digits: int = 1) -> str:
    """``"12.5 ± 4.1"`` (a score and its standard error), ``"12.5"`` without one, ``"-"`` without a score."""
    if score is None or score != score:
        return "-"
    if se is None or se != se:
        return f"{score:.{digits}f}"
    return f"{score:.{digits}f} ± {se:.{digits}f}"

def format_matrix(scores: dict[str, dict[str, float]], paper: dict[str, dict] | None = None,
                  benchmarks: list[str] | None = None, se: dict[str, dict[str, float | None]] | None = None) -> str:
    """A plain-text capability matrix; with ``paper``, each cell reads ``ours (paper)``; with ``se``
    (:func:`load_standard_errors`), ours reads ``score ± se``."""
    benchmarks = benchmarks or BENCH_ORDER
    width = 7 + (6 if paper else 0) + (7 if se is not None else 0)
    head = f"{'checkpoint':<14}" + "".join(f"{b:>{width}}" for b in benchmarks)
    lines = [head]
    for run, s in scores.items():
        cells = []
        for b in benchmarks:
            ours = score_text(s.get(b), None if se is None else (se.get(run) or {}).get(b))
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


def trajectory_figure(scores: dict[str, dict[str, float | None]], study: dict[str, dict],
                      benchmarks: Sequence[str] | None = None, spread: dict[str, dict[str, float | None]] | None = None,
                      title: str = "Scores along the curriculum: ours vs the study"):
    """One panel per benchmark: its score (%) along the sequential checkpoints, ours (solid) vs the study (dashed).

    ``scores``: ``{run: {benchmark: %}}``, the checkpoints in curriculum order (base first); ``study``: the study's
    figures by run name (``paper_results()["sequential"]``; a run it does not report gets no point). With
    ``spread`` (``{run: {benchmark: std}}``, the final-tables step's spread over seeds) ours is a mean drawn
    with ± std error bars."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    benchmarks = list(benchmarks or BENCH_ORDER)
    runs = list(scores)
    cols = min(4, len(benchmarks))
    rows = (len(benchmarks) + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=benchmarks)
    for i, b in enumerate(benchmarks):
        r, c = i // cols + 1, i % cols + 1
        ours = {"name": "ours"}
        if spread is not None:
            ours = {"name": "ours (mean ± std)", "error_y": {
                "type": "data", "array": [(spread.get(x) or {}).get(b) or 0.0 for x in runs], "visible": True}}
        fig.add_trace(go.Scatter(x=runs, y=[scores[x].get(b) for x in runs], mode="lines+markers", **ours,
                                 line={"color": "#1f77b4"}, showlegend=i == 0, legendgroup="ours"), row=r, col=c)
        theirs = [(study.get(x) or {}).get(b) for x in runs]
        if any(v is not None for v in theirs):
            fig.add_trace(go.Scatter(x=runs, y=theirs, mode="lines+markers", name="study", connectgaps=True,
                                     line={"color": "#d62728", "dash": "dash"}, showlegend=i == 0,
                                     legendgroup="study"), row=r, col=c)
        fig.update_yaxes(range=[0, 105], row=r, col=c)
    fig.update_layout(title=title, height=300 * rows)
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


def read_train_logs(run_dir: str | Path) -> list[dict]:
    """Rows of every ``*train_log*.jsonl`` under a run dir (one row per logging step), each with its ``phase``:
    the trainer's (``sft``, ``grpo``; ``copy_warmup``, ``corpus`` for pretraining), or the file's folder."""
    rows = []
    for p in sorted(Path(run_dir).rglob("*train_log*.jsonl")):
        for line in p.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                row["phase"] = row.get("phase") or row.get("job") or p.parent.name
                rows.append(row)
    return rows


PHASE_TITLES = {"sft": "SFT cold start", "grpo": "GRPO", "copy_warmup": "copy warm-up", "corpus": "pretraining"}


def training_curves(run_dir: str | Path):
    """Plotly figure with one panel per training phase and quantity (SFT loss, GRPO reward, GRPO loss,
    copy gain ...), each against that phase's own steps."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = read_train_logs(run_dir)
    panels = []
    for phase in dict.fromkeys(r["phase"] for r in rows):
        pts = [r for r in rows if r["phase"] == phase]
        for key in ("reward", "loss", "copy_gain"):
            xs = [r["step"] for r in pts if r.get(key) is not None]
            if xs:
                panels.append((phase, key, xs, [r[key] for r in pts if r.get(key) is not None]))
    if not panels:
        fig = go.Figure()
        fig.update_layout(title=f"{Path(run_dir).name}: no training log (nothing trained here)", height=200)
        return fig
    cols = min(3, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    titles = [f"{PHASE_TITLES.get(ph, ph)}: {key.replace('_', ' ')}" for ph, key, _, _ in panels]
    fig = make_subplots(rows=nrows, cols=cols, subplot_titles=titles)
    colors = {"loss": "#1f77b4", "reward": "#2ca02c", "copy_gain": "#9467bd"}
    for i, (_, key, xs, ys) in enumerate(panels):
        r, c = i // cols + 1, i % cols + 1
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers" if len(xs) < 40 else "lines",
                                 name=titles[i], line={"color": colors[key]}, showlegend=False), row=r, col=c)
        fig.update_xaxes(title_text="step", row=r, col=c)
    fig.update_layout(title=f"Training curves: {Path(run_dir).name}", height=320 * nrows)
    return fig


# --- tables ----------------------------------------------------------------------------------------------


def scores_frame(scores: dict[str, dict[str, float]], paper: dict[str, dict] | None = None,
                 benchmarks: list[str] | None = None, se: dict[str, dict[str, float | None]] | None = None):
    """DataFrame of scores (%): one row per checkpoint, one column per benchmark; with ``paper``, two columns
    per benchmark, ``ours`` and ``study`` (NaN where the study reports nothing). With ``se`` (``{run: {benchmark:
    points}}``, :func:`load_standard_errors`) our cells are text, ``score ± se`` (its standard error)."""
    import pandas as pd

    benchmarks = benchmarks or BENCH_ORDER
    if se is not None:
        def ours(run, b):
            return score_text(scores[run].get(b), (se.get(run) or {}).get(b))

        if paper is None:
            return pd.DataFrame({b: [ours(r, b) for r in scores] for b in benchmarks},
                                index=list(scores)).rename_axis("checkpoint")
        cols = pd.MultiIndex.from_product([benchmarks, ["ours", "study"]], names=["benchmark", ""])
        data = [[v for b in benchmarks for v in (ours(run, b), (paper.get(run) or {}).get(b))] for run in scores]
        frame = pd.DataFrame(data, index=list(scores), columns=cols).rename_axis("checkpoint")
        for b in benchmarks:
            frame[(b, "study")] = frame[(b, "study")].astype(float)
        return frame
    if paper is None:
        return pd.DataFrame({b: [scores[r].get(b) for r in scores] for b in benchmarks}, index=list(scores),
                            dtype=float).rename_axis("checkpoint")
    cols = pd.MultiIndex.from_product([benchmarks, ["ours", "study"]], names=["benchmark", ""])
    data = [[v for b in benchmarks for v in (s.get(b), (paper.get(run) or {}).get(b))] for run, s in scores.items()]
    return pd.DataFrame(data, index=list(scores), columns=cols, dtype=float).rename_axis("checkpoint")


def stage_change_frame(scores: dict[str, dict[str, float]], before: str, after: str,
                       paper: dict[str, dict] | None = None, se: dict[str, dict[str, float | None]] | None = None,
                       change_se: dict[str, float | None] | None = None):
    """What one stage changed, benchmark by benchmark: score before and after, the change, and the study's
    before / after / change where it reports them. With ``se`` (:func:`load_standard_errors`), a column ``± change``:
    the change's standard error, paired by task where ``change_se`` (:func:`load_change_errors`) has it, else the
    two scores' errors combined as independent."""
    import pandas as pd

    paper = paper or {}
    rows = []
    for b in BENCH_ORDER:
        x, y = scores.get(before, {}).get(b), scores.get(after, {}).get(b)
        px, py = (paper.get(before) or {}).get(b), (paper.get(after) or {}).get(b)
        row = {"benchmark": b, "suite": BENCHMARKS[b].suite, "before": x, "after": y,
               "change": None if x is None or y is None else y - x}
        if se is not None:
            sx, sy = (se.get(before) or {}).get(b), (se.get(after) or {}).get(b)
            paired = (change_se or {}).get(b)
            row["± change"] = (paired if paired is not None else
                               None if sx is None or sy is None else (sx * sx + sy * sy) ** 0.5)
        row.update({"study before": px, "study after": py,
                    "study change": None if px is None or py is None else py - px})
        rows.append(row)
    return pd.DataFrame(rows).set_index("benchmark")


def forgetting_frame(cfg: Config):
    """For each stage's own benchmark: its score right after its stage, its peak along the sequence, its final
    score and the drop from the peak (a DataFrame; empty until the sequence has run)."""
    import pandas as pd

    names = checkpoint_names(cfg, oracles=False)[1:]
    scores = load_scores(cfg.seed_dir(), names)
    rows = forgetting_summary(scores, [n for n in names if n in scores],
                              {n: IN_DOMAIN[d] for n, d in zip(names, cfg.pipeline.curriculum)})
    cols = ["benchmark", "trained_at", "after_stage", "peak", "final", "drop_from_peak"]
    return pd.DataFrame(rows, columns=cols).set_index("benchmark")


def failure_frame(eval_dir: str | Path, benchmarks: list[str] | None = None):
    """Why episodes failed, per benchmark (from ``metrics.json``): reason, episodes, share of the benchmark's
    episodes (%). Reasons are the environments' own (``wrong answer``, ``database differs from gold`` ...)."""
    import pandas as pd

    metrics = json.loads((Path(eval_dir) / "metrics.json").read_text())
    rows = []
    for b, reasons in metrics.get("failures", {}).items():
        if benchmarks and b not in benchmarks:
            continue
        total = metrics["n_tasks"][b] * samples_per_task(metrics, b)
        for reason, count in reasons.items():
            rows.append({"benchmark": b, "reason": reason, "episodes": count, "share": 100.0 * count / total})
    return pd.DataFrame(rows, columns=["benchmark", "reason", "episodes", "share"])


def own_failures_frame(runs: dict):
    """:func:`failure_frame` of each run on its own domain's benchmark, ``runs`` = ``{domain: Run}``; the rows'
    ``benchmark`` reads ``oracle_math: aime26`` so that the runs stay apart in one figure."""
    import pandas as pd

    frames = [failure_frame(r.path / "eval", [IN_DOMAIN[d]]).assign(benchmark=f"{r.name}: {IN_DOMAIN[d]}")
              for d, r in runs.items()]
    if not frames:
        return pd.DataFrame(columns=["benchmark", "reason", "episodes", "share"])
    return pd.concat(frames, ignore_index=True)


def failure_figure(frame, title: str = "Why episodes failed (share of each benchmark's episodes, %)"):
    """Stacked horizontal bars of :func:`failure_frame`: one bar per benchmark, one segment per reason."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for reason in dict.fromkeys(frame["reason"]):
        part = frame[frame["reason"] == reason]
        fig.add_trace(go.Bar(y=part["benchmark"], x=part["share"], name=reason[:60], orientation="h"))
    fig.update_layout(barmode="stack", title=title, xaxis={"range": [0, 100], "title": "% of episodes"},
                      height=160 + 28 * frame["benchmark"].nunique(), legend={"font": {"size": 10}})
    return fig


# --- readings --------------------------------------------------------------------------------------------


def stage_reading(cfg: Config, run) -> str:
    """A short Markdown reading of one stage, computed from its scores and its input's: what its own benchmark
    did (beside the study), what the other in-domain benchmarks did (forgetting), the largest out-of-domain
    move and the commonest failure on its own benchmark. Changes within one task (100 / n_test points) are
    called unchanged."""
    domain = run.extra.get("domain")
    before, after = run.inputs[0].name, run.name
    scores = load_scores(cfg.seed_dir(), [before, after])
    if after not in scores or before not in scores:
        return f"*No scores yet for {after} and {before}: run the notebook first.*"
    paper = paper_results()["sequential"]
    own = IN_DOMAIN[domain]
    one_task = 100.0 / max(1, cfg.worlds.n_test)

    def move(b: str) -> tuple[float, float, float]:
        x, y = scores[before].get(b, 0.0), scores[after].get(b, 0.0)
        return x, y, y - x

    def verb(d: float) -> str:
        return "stayed level" if abs(d) <= one_task + 1e-9 else ("rose" if d > 0 else "fell")

    x, y, d = move(own)
    lines = [f"- **{own}** (this stage's benchmark) {verb(d)}: {x:.1f} -> {y:.1f} ({d:+.1f})."]
    px, py = (paper.get(before) or {}).get(own), (paper.get(after) or {}).get(own)
    if px is not None and py is not None:
        lines[-1] += f" The study: {px:.1f} -> {py:.1f} ({py - px:+.1f})."
    elif py is not None:
        lines[-1] += f" The study reports {py:.1f} after this stage."
    others = [b for b in IN_DOMAIN.values() if b != own]
    moved = [(b, *move(b)) for b in others]
    fell = [f"{b} {x:.1f} -> {y:.1f}" for b, x, y, d in moved if d < -one_task - 1e-9]
    rose = [f"{b} {x:.1f} -> {y:.1f}" for b, x, y, d in moved if d > one_task + 1e-9]
    lines.append("- Earlier and later stages' benchmarks: "
                 + ("; ".join(filter(None, [("fell: " + ", ".join(fell)) if fell else "",
                                            ("rose: " + ", ".join(rose)) if rose else ""]))
                    or "none moved by more than one task") + ".")
    ood = [b for b in BENCH_ORDER if BENCHMARKS[b].suite != "in_domain"]
    if ood:
        b, x, y, d = max(((b, *move(b)) for b in ood), key=lambda t: abs(t[3]))
        lines.append(f"- Largest out-of-domain move: {b} {x:.1f} -> {y:.1f} ({d:+.1f})."
                     if abs(d) > one_task + 1e-9 else "- Out of domain: no benchmark moved by more than one task.")
    metrics = json.loads((run.path / "eval" / "metrics.json").read_text())
    reasons = metrics.get("failures", {}).get(own) or {}
    if reasons:
        reason, count = max(reasons.items(), key=lambda kv: kv[1])
        total = metrics["n_tasks"][own] * samples_per_task(metrics, own)
        lines.append(f"- Commonest failure on {own}: *{reason}* ({count} of {total} episodes).")
    lines.append(f"- One task of {cfg.worlds.n_test} is {one_task:.1f} points: smaller changes are noise at "
                 "this size.")
    return f"**What this run shows ({after}, {cfg.profile}, seed {cfg.seed})**\n\n" + "\n".join(lines)


# --- recipes and phases ----------------------------------------------------------------------------------


def recipe_frame(cfg: Config, domain: str):
    """The resolved training recipe of a stage (after ``pipeline.stage_overrides``): the ``sft`` and ``grpo``
    settings a user would change, whether the stage cold-starts and who its demos are sampled from
    (``sft.teacher``, and for a model teacher how); values as configured (text, so the one-decimal display of
    scores does not print a learning rate of 0.001 as 0.0)."""
    import pandas as pd

    stage = cfg.for_stage(domain)
    teacher = ["teacher"]  # a model teacher: also how it samples, and the endpoint if it has one
    if stage.sft.teacher != "expert":
        teacher += ["teacher_url"] if stage.sft.teacher_url else []
        teacher += ["samples_per_task", "teacher_temperature", "teacher_top_p"]
    keys = {"sft": teacher + ["num_demos", "max_steps", "batch_size", "learning_rate", "max_length"],
            "grpo": ["max_steps", "batch_size", "num_generations", "learning_rate", "max_turns",
                     "max_completion_length"]}
    rows = [{"setting": f"{section}.{k}", "value": setting_text(getattr(getattr(stage, section), k))}
            for section, ks in keys.items() for k in ks]
    rows.insert(0, {"setting": "pipeline.cold_start", "value": setting_text(bool(cfg.pipeline.cold_start.get(domain)))})
    return pd.DataFrame(rows).set_index("setting")


def phases_frame(run_dir: str | Path):
    """One row per training phase of a stage run (from ``stage.json``): steps, wall seconds and their share of the
    stage's, first and last loss and reward, and for a cold start the demonstrations kept and where they came from
    (``sft.teacher``)."""
    import pandas as pd

    info = json.loads((Path(run_dir) / "stage.json").read_text())
    rows = []
    for phase in ("sft", "grpo"):
        s = info.get(phase)
        if not s:
            continue
        row = {"phase": PHASE_TITLES[phase], "steps": s.get("steps"), "wall_s": s.get("wall_s"),
               "first_loss": s.get("first_loss"), "last_loss": s.get("last_loss"),
               "first_reward": s.get("first_reward"), "last_reward": s.get("last_reward")}
        if phase == "sft" and info.get("demos"):
            d = info["demos"]
            row["demos kept"] = f"{d['kept']} of {d['tried']}" + (f" ({d['duplicates']} duplicates)"
                                                                    if d.get("duplicates") else "")
            row["demos from"] = d.get("source", "the scripted expert")  # stage.json of before sft.teacher: expert
        rows.append(row)
    total = sum(r["wall_s"] or 0.0 for r in rows)
    for r in rows:  # the study's recipe gives RL the larger share of a stage's training compute
        r["time share %"] = round(100.0 * r["wall_s"] / total, 1) if total and r["wall_s"] is not None else None
    return pd.DataFrame(rows).set_index("phase") if rows else pd.DataFrame()


def oracle_gap_frame(cfg: Config):
    """Per domain: the oracle's score on its own benchmark, the sequential pipeline's final score on it, and
    the gap (what sequential training loses against training on that domain alone), beside the study's."""
    import pandas as pd

    names = checkpoint_names(cfg, oracles=True)
    final = [n for n in names if not n.startswith("oracle_") and n != "base"][-1]
    scores = load_scores(cfg.seed_dir(), names)
    paper = paper_results()["main_table"]
    rows = []
    for d in cfg.pipeline.curriculum:
        b = IN_DOMAIN[d]
        o, f = scores.get(f"oracle_{d}", {}).get(b), scores.get(final, {}).get(b)
        po, pf = (paper.get(f"oracle_{d}") or {}).get(b), (paper.get("seq_final") or {}).get(b)
        rows.append({"domain": d, "benchmark": b, "oracle": o, "sequential final": f,
                     "gap": None if o is None or f is None else o - f, "study oracle": po,
                     "study sequential final": pf, "study gap": None if po is None or pf is None else po - pf})
    return pd.DataFrame(rows).set_index("domain")


# --- the run store's records and Markdown tables ------------------------------------------------------


def completion_records(seed_dirs: Sequence[str | Path], parts: Sequence[str]) -> dict[tuple[str, str], dict]:
    """``{(seed dir, run): COMPLETE.json}`` for each of ``parts`` (run names, ``<run>/eval`` too) that is complete."""
    out = {}
    for d in seed_dirs:
        for part in parts:
            p = Path(d) / part / "COMPLETE.json"
            if p.is_file():
                out[(str(d), part)] = json.loads(p.read_text())
    return out


def md_table(header: list[str], rows: list[list], align: str = "---:") -> str:
    """A Markdown table: floats with one decimal, None and NaN as ``-``; columns after the first right-aligned
    (``align="---"``: left-aligned, for text)."""

    def cell(v):
        if v is None or (isinstance(v, float) and v != v):
            return "-"
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|---|" + f"{align}|" * (len(header) - 1)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)

