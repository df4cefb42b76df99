"""What the notebooks show: scores beside the study's, training curves, transcripts, failure reasons, and a
short reading of a stage, all read from the run store.

Everything reads files of the run store (``<run>/eval/metrics.json``, ``records/``, ``train_log.jsonl``;
nothing passes through notebook memory) and returns DataFrames, plotly figures or displayable objects;
notebooks only display them. ``setup_notebook()`` makes plotly figures show wherever a notebook is read:
interactive in JupyterLab, interactive and offline in ``jupyter nbconvert`` HTML (plotly.js is embedded
once per notebook), and as a PNG (GitHub, nbviewer without JavaScript) when kaleido finds a Chrome.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import yaml

from acl_lib import png_export
from acl_lib.config import setting_text
from acl_lib.envs import BENCHMARKS

BENCH_ORDER = list(BENCHMARKS)
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
        except Exception:  # noqa: BLE001  (reported as "no PNG" below)
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

    from acl_lib.progress import hf_progress_bars

    hf_progress_bars(False)  # "Loading weights" redraws in every cell that loads a model; progress: acl_lib.progress
    png = static_images_available() if static_images is None else static_images
    renderer = "plotly_mimetype+notebook" + ("+png" if png else "")
    pio.renderers.default = renderer
    pd.set_option("display.precision", 1)
    pd.set_option("display.max_columns", 40)
    pd.set_option("display.width", 200)
    return renderer


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
    for i, (phase, key, xs, ys) in enumerate(panels):
        r, c = i // cols + 1, i % cols + 1
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers" if len(xs) < 40 else "lines",
                                 name=titles[i], line={"color": colors[key]}, showlegend=False), row=r, col=c)
        fig.update_xaxes(title_text="step", row=r, col=c)
    fig.update_layout(title=f"Training curves: {Path(run_dir).name}", height=320 * nrows)
    return fig


# --- tables ----------------------------------------------------------------------------------------------


def scores_frame(scores: dict[str, dict[str, float]], paper: dict[str, dict] | None = None,
                 benchmarks: list[str] | None = None):
    """DataFrame of scores (%): one row per checkpoint, one column per benchmark; with ``paper``, two columns
    per benchmark, ``ours`` and ``study`` (NaN where the study reports nothing)."""
    import pandas as pd

    benchmarks = benchmarks or BENCH_ORDER
    if paper is None:
        return pd.DataFrame({b: [scores[r].get(b) for r in scores] for b in benchmarks}, index=list(scores),
                            dtype=float).rename_axis("checkpoint")
    cols = pd.MultiIndex.from_product([benchmarks, ["ours", "study"]], names=["benchmark", ""])
    data = [[v for b in benchmarks for v in (s.get(b), (paper.get(run) or {}).get(b))] for run, s in scores.items()]
    return pd.DataFrame(data, index=list(scores), columns=cols, dtype=float).rename_axis("checkpoint")


def stage_change_frame(scores: dict[str, dict[str, float]], before: str, after: str,
                       paper: dict[str, dict] | None = None):
    """What one stage changed, benchmark by benchmark: score before and after, the change, and the study's
    before / after / change where it reports them."""
    import pandas as pd

    paper = paper or {}
    rows = []
    for b in BENCH_ORDER:
        x, y = scores.get(before, {}).get(b), scores.get(after, {}).get(b)
        px, py = (paper.get(before) or {}).get(b), (paper.get(after) or {}).get(b)
        rows.append({"benchmark": b, "suite": BENCHMARKS[b].suite, "before": x, "after": y,
                     "change": None if x is None or y is None else y - x,
                     "study before": px, "study after": py,
                     "study change": None if px is None or py is None else py - px})
    return pd.DataFrame(rows).set_index("benchmark")


def forgetting_frame(cfg):
    """For each stage's own benchmark: its score right after its stage, its peak along the sequence, its final
    score and the drop from the peak (a DataFrame; empty until the sequence has run)."""
    import pandas as pd

    from acl_lib.envs import IN_DOMAIN
    from acl_lib.pipeline import checkpoint_names

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
        total = metrics["n_tasks"][b] * metrics.get("k", 1)
        for reason, count in reasons.items():
            rows.append({"benchmark": b, "reason": reason, "episodes": count, "share": 100.0 * count / total})
    return pd.DataFrame(rows, columns=["benchmark", "reason", "episodes", "share"])


def own_failures_frame(runs: dict):
    """:func:`failure_frame` of each run on its own domain's benchmark, ``runs`` = ``{domain: Run}``; the rows'
    ``benchmark`` reads ``oracle_math: aime26`` so that the runs stay apart in one figure."""
    import pandas as pd

    from acl_lib.envs import IN_DOMAIN

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


# --- transcripts -----------------------------------------------------------------------------------------


def read_records(eval_dir: str | Path, benchmark: str) -> list[dict]:
    """The episode records of one benchmark (``<eval_dir>/records/<benchmark>.jsonl``)."""
    path = Path(eval_dir) / "records" / f"{benchmark}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no records for {benchmark!r}: {path} does not exist (was it evaluated?)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Transcript:
    """One episode, displayable: HTML in a notebook (the system prompt folded away), text elsewhere."""

    MAX_CHARS = 700

    def __init__(self, record: dict):
        self.record = record

    def _messages(self):
        for m in self.record.get("messages", []):
            content = m.get("content") or ""
            for call in m.get("tool_calls") or []:
                fn = call.get("function", call)
                content += f"\n<tool_call> {fn.get('name')}({fn.get('arguments')})"
            for raw in m.get("malformed_calls") or []:
                content += f"\n<tool_call, malformed> {raw.strip()}"
            if len(content) > self.MAX_CHARS:
                content = content[: self.MAX_CHARS] + f" ... [{len(content) - self.MAX_CHARS} more characters]"
            yield m.get("role", "?"), m.get("name"), content.strip()

    def header(self) -> str:
        r = self.record
        verdict = "success" if r.get("reward", 0) >= 1.0 - 1e-9 else f"failure: {r.get('failure')}"
        return f"{r.get('benchmark')} · {r.get('id')} · reward {r.get('reward', 0):.2f} · {r.get('turns')} turns · {verdict}"

    def __repr__(self) -> str:
        lines = [self.header()]
        for role, name, content in self._messages():
            if role == "system":
                content = content[:120] + " ..."
            lines.append(f"[{role}{' ' + name if name else ''}] {content}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        colors = {"system": "#eee", "user": "#e8f0fe", "assistant": "#e6f4ea", "tool": "#fef7e0"}
        parts = [f"<div style='font-size:12px'><b>{html.escape(self.header())}</b>"]
        for role, name, content in self._messages():
            body = (f"<pre style='white-space:pre-wrap;margin:0;font-size:11px'>{html.escape(content)}</pre>")
            label = html.escape(role + (f" ({name})" if name else ""))
            if role == "system":
                parts.append(f"<details><summary>system prompt</summary>{body}</details>")
            else:
                parts.append(f"<div style='background:{colors.get(role, '#fff')};padding:3px 6px;margin:2px 0'>"
                             f"<b>{label}</b>{body}</div>")
        return "".join(parts) + "</div>"


def transcripts(eval_dir: str | Path, benchmark: str, successes: int = 1, failures: int = 1) -> list[Transcript]:
    """The first ``successes`` successful and ``failures`` failed episodes of a benchmark (fewer when there
    are not that many), as displayable :class:`Transcript` objects."""
    records = read_records(eval_dir, benchmark)
    ok = [r for r in records if r.get("reward", 0) >= 1.0 - 1e-9][:successes]
    bad = [r for r in records if r.get("reward", 0) < 1.0 - 1e-9][:failures]
    return [Transcript(r) for r in ok + bad]


def show_transcripts(eval_dir: str | Path, benchmarks: list[str], successes: int = 1, failures: int = 1) -> None:
    """Display a success and a failure (when there is one) of each benchmark, saying so when there is none."""
    from IPython.display import Markdown, display

    for b in benchmarks:
        shown = transcripts(eval_dir, b, successes, failures)
        n_ok = sum(t.record.get("reward", 0) >= 1.0 - 1e-9 for t in shown)
        note = "" if n_ok else " (no successful episode to show)"
        display(Markdown(f"**{b}**{note}"))
        for t in shown:
            display(t)


# --- reading ---------------------------------------------------------------------------------------------


def stage_reading(cfg, run) -> str:
    """A short Markdown reading of one stage, computed from its scores and its input's: what its own benchmark
    did (beside the study), what the other in-domain benchmarks did (forgetting), the largest out-of-domain
    move and the commonest failure on its own benchmark. Changes within one task (100 / n_test points) are
    called unchanged."""
    from acl_lib.envs import IN_DOMAIN

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
        total = metrics["n_tasks"][own] * metrics.get("k", 1)
        lines.append(f"- Commonest failure on {own}: *{reason}* ({count} of {total} episodes).")
    lines.append(f"- One task of {cfg.worlds.n_test} is {one_task:.1f} points: smaller changes are noise at "
                 "this size.")
    return f"**What this run shows ({after}, {cfg.profile}, seed {cfg.seed})**\n\n" + "\n".join(lines)


# --- recipes and phases ----------------------------------------------------------------------------------


def recipe_frame(cfg, domain: str):
    """The resolved training recipe of a stage (after ``pipeline.stage_overrides``): the ``sft`` and ``grpo``
    settings a user would change, and whether the stage cold-starts; values as configured (text, so the one-decimal
    display of scores does not print a learning rate of 0.001 as 0.0)."""
    import pandas as pd

    resolved = cfg.for_stage(domain).to_dict()
    keys = {"sft": ["num_demos", "max_steps", "batch_size", "learning_rate", "max_length"],
            "grpo": ["max_steps", "batch_size", "num_generations", "learning_rate", "max_turns",
                     "max_completion_length"]}
    rows = [{"setting": f"{section}.{k}", "value": setting_text(resolved[section].get(k))}
            for section, ks in keys.items() for k in ks if k in resolved[section]]
    rows.insert(0, {"setting": "pipeline.cold_start", "value": setting_text(bool(cfg.pipeline.cold_start.get(domain)))})
    return pd.DataFrame(rows).set_index("setting")


def phases_frame(run_dir: str | Path):
    """One row per training phase of a stage run (from ``stage.json``): steps, wall seconds, first and last
    loss and reward, and for a cold start the demonstrations kept."""
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
            row["demos kept"] = f"{info['demos']['kept']} of {info['demos']['tried']}"
        rows.append(row)
    return pd.DataFrame(rows).set_index("phase") if rows else pd.DataFrame()


def oracle_gap_frame(cfg):
    """Per domain: the oracle's score on its own benchmark, the sequential pipeline's final score on it, and
    the gap (what sequential training loses against training on that domain alone), beside the study's."""
    import pandas as pd

    from acl_lib.envs import IN_DOMAIN
    from acl_lib.pipeline import checkpoint_names

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


def sequence_reading(cfg) -> str:
    """Markdown: the study's two claims about the sequence (F1: the final checkpoint ends below earlier peaks
    on the earlier domains; F2: the e-commerce stage interferes most with math and search), checked on this
    run's scores. Changes within one task are not counted."""
    from acl_lib.envs import IN_DOMAIN
    from acl_lib.pipeline import checkpoint_names

    names = checkpoint_names(cfg, oracles=False)
    scores = load_scores(cfg.seed_dir(), names)
    if any(n not in scores for n in names):
        return "*The sequence is not complete yet: run notebooks 00-04 first.*"
    one_task = 100.0 / max(1, cfg.worlds.n_test)
    seq = names[1:]
    lines = []
    below = []
    for run, d in list(zip(seq, cfg.pipeline.curriculum))[:-1]:
        b = IN_DOMAIN[d]
        peak = max(scores[r].get(b, 0.0) for r in seq)
        final = scores[seq[-1]].get(b, 0.0)
        if peak - final > one_task + 1e-9:
            below.append(f"{b} (peak {peak:.1f}, final {final:.1f})")
    lines.append("- **F1** (the final checkpoint ends below earlier peaks on the earlier domains): "
                 + (f"seen here on {', '.join(below)}." if below else
                    "not seen here: no earlier domain's benchmark ends more than one task below its peak."))
    drops = {}
    for b in ("aime26", "nq"):
        steps = [(seq[i], scores[names[i]].get(b, 0.0) - scores[seq[i]].get(b, 0.0)) for i in range(len(seq))]
        stage, drop = max(steps, key=lambda t: t[1])
        drops[b] = (stage, drop)
    parts = [f"{b}: largest drop at {stage} ({drop:.1f} points)" if drop > one_task + 1e-9 else f"{b}: no drop"
             for b, (stage, drop) in drops.items()]
    ecom = [n for n, d in zip(seq, cfg.pipeline.curriculum) if d == "ecom"]
    agree = all(stage in ecom and drop > one_task + 1e-9 for stage, drop in drops.values())
    lines.append("- **F2** (the e-commerce stage interferes most with math and search): "
                 + "; ".join(parts) + (". Agrees with the study." if agree else ". Differs from the study."))
    return f"**The sequence, {cfg.profile} seed {cfg.seed}**\n\n" + "\n".join(lines)


# --- the README's results section ------------------------------------------------------------------------


def _md_table(header: list[str], rows: list[list]) -> str:
    def cell(v):
        if v is None or (isinstance(v, float) and v != v):
            return "-"
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# The consolidation runs the README's results show beside seq_final, in the notebooks' order (08, 09, 10).
CONSOLIDATION_ROWS = ("mmopd", "mmopd_rkl", "mmopd_single", "sdft", "sdft_base", "merge_uniform", "merge_grid",
                      "merge_balanced", "merge_ties", "merge_dare", "merge_oracles", "mle", "mle_learned")


def results_markdown(cfg) -> str:
    """The results section of the README, from the run store of ``cfg`` (profile, seed): every checkpoint's
    scores (this stage's own benchmark in bold), the study's in-domain figures beside the final and the
    oracles, each stage's lift and the forgetting, the wall time of the runs, and which code made them (the
    commits recorded in the runs' ``COMPLETE.json``) and when."""
    from acl_lib.envs import IN_DOMAIN
    from acl_lib.pipeline import checkpoint_names

    names = checkpoint_names(cfg, oracles=True)
    scores = load_scores(cfg.seed_dir(), names)
    if not scores:
        raise FileNotFoundError(f"no evaluated runs in {cfg.seed_dir()}: run the notebooks first (acl run)")
    records = completion_records([cfg.seed_dir()], [p for n in names for p in (n, f"{n}/eval")])
    done = [c["finished_at"] for c in records.values()]
    durations = {part: c.get("duration_s", 0.0) for (_, part), c in records.items()}
    codes = {c.get("code") or "unrecorded" for c in records.values()}
    own = {f"seq_{d}": IN_DOMAIN[d] for d in IN_DOMAIN} | {f"oracle_{d}": IN_DOMAIN[d] for d in IN_DOMAIN}
    rows = []
    for run, s in scores.items():
        row = [run]
        for b in BENCH_ORDER:
            v = s.get(b)
            row.append("-" if v is None else (f"**{v:.1f}**" if own.get(run) == b else f"{v:.1f}"))
        rows.append(row)
    out = [f"Profile `{cfg.profile}`, seed {cfg.seed}, world seed {cfg.worlds.seed}; runs finished "
           f"{min(done)[:10]} to {max(done)[:10]}; code {', '.join(sorted(codes))}. Scores in percent "
           f"({cfg.worlds.n_test} in-domain and {cfg.worlds.n_ood} out-of-domain tasks per benchmark, k={cfg.eval.k}, "
           f"temperature {cfg.eval.temperature}); in bold, the benchmark the run trained for.", "",
           _md_table(["run"] + BENCH_ORDER, rows), ""]
    paper = paper_results()["main_table"]
    seq = [n for n in names if n.startswith("seq")]
    final = seq[-1] if seq else None
    cmp_rows = []
    for run, label in [(final, "seq_final")] + [(f"oracle_{d}", f"oracle_{d}") for d in cfg.pipeline.curriculum]:
        if run in scores:
            theirs = paper.get(label) or {}
            cmp_rows.append([f"{run} (final)" if run == final else run]
                            + [f"{scores[run].get(b, float('nan')):.1f} ("
                               + (f"{theirs[b]:.1f}" if b in theirs else "-") + ")" for b in IN_DOMAIN.values()])
    if cmp_rows:
        out += ["Beside the study (ours, then the study's in parentheses; in-domain benchmarks):", "",
                _md_table(["run"] + list(IN_DOMAIN.values()), cmp_rows), ""]
    consolidations = load_scores(cfg.seed_dir(), list(CONSOLIDATION_ROWS))
    if consolidations and final in scores:
        rows = []
        for run, s in [("seq_final", scores[final])] + list(consolidations.items()):
            theirs = paper.get(run) or {}
            rows.append([run] + [f"{s.get(b, float('nan')):.1f}" + (f" ({theirs[b]:.1f})" if b in theirs else "")
                                 for b in IN_DOMAIN.values()])
        out += ["The consolidations of `seq_final` and MLE (notebooks 08-11; the study's figure in parentheses where it reports "
                "one):", "", _md_table(["run"] + list(IN_DOMAIN.values()), rows), ""]
    lifts = []
    prev = "base"
    for run, d in zip(seq, cfg.pipeline.curriculum):
        b = IN_DOMAIN[d]
        if run in scores and prev in scores:
            lifts.append(f"{run} {b} {scores[prev].get(b, 0):.1f} -> {scores[run].get(b, 0):.1f}")
        prev = run
    if lifts:
        out.append("Each stage on its own benchmark, from the checkpoint it started from: " + "; ".join(lifts) + ".")
    forgetting = forgetting_frame(cfg)
    if len(forgetting):
        drops = [f"{b} {r.peak:.1f} -> {r.final:.1f}" for b, r in forgetting.iterrows()]
        out.append(f"Peak along the sequence -> final ({final}): " + "; ".join(drops) + ".")
    train_s = sum(v for k, v in durations.items() if not k.endswith("/eval"))
    eval_s = sum(v for k, v in durations.items() if k.endswith("/eval"))
    out.append(f"Run time of these runs: {(train_s + eval_s) / 60:.1f} min ({train_s / 60:.1f} training, "
               f"{eval_s / 60:.1f} evaluation).")
    return "\n".join(out)


RESULTS_BEGIN = "<!-- results:begin"
RESULTS_END = "<!-- results:end -->"


def completion_records(seed_dirs: Sequence[str | Path], parts: Sequence[str]) -> dict[tuple[str, str], dict]:
    """``{(seed dir, run): COMPLETE.json}`` for each of ``parts`` (run names, ``<run>/eval`` too) that is complete."""
    out = {}
    for d in seed_dirs:
        for part in parts:
            p = Path(d) / part / "COMPLETE.json"
            if p.is_file():
                out[(str(d), part)] = json.loads(p.read_text())
    return out


def seeds_markdown(cfg, seeds: Sequence[int], overrides: Sequence[str] = ()) -> str:
    """Notebook 12's tables over ``seeds`` as markdown (:func:`acl_lib.final.results_markdown`), saying when
    their evaluations finished and which code made them."""
    from acl_lib import final
    from acl_lib.pipeline import checkpoint_names

    dirs = final.seed_dirs(cfg.profile, seeds, overrides)
    data = final.collect(dirs, cfg.pipeline.curriculum, checkpoint_names(cfg, oracles=False))
    runs = dict.fromkeys([*data.seq_runs, *(r for _, r in final.main_rows(data))])
    records = completion_records(list(dirs.values()), [f"{r}/eval" for r in runs]).values()
    done = [c.get("finished_at") or "" for c in records]
    codes = sorted({c.get("code") or "unrecorded" for c in records})
    made = f"Their evaluations finished {min(done)[:10]} to {max(done)[:10]}; code {', '.join(codes)}." if done else ""
    return final.results_markdown(data, provenance=made)


def orders_markdown(cfg, orders: Sequence[Sequence[str]], overrides: Sequence[str] = ()) -> str:
    """Notebook 13's result for ``orders`` in the seed of ``cfg`` as markdown, with each order's stages that
    are not scored yet named (:func:`acl_lib.curriculum.results_markdown`)."""
    from acl_lib import curriculum

    results = curriculum.scores_by_order({tuple(o): curriculum.order_config(cfg.profile, overrides, cfg.seed, o)
                                          for o in orders})
    missing = [n for names, scores in results.values() for n in names if n not in scores]
    text = curriculum.results_markdown(curriculum.positions_frame(results))
    return text + (f"\n\nNot scored yet: {', '.join(missing)}." if missing else "")


def write_results_section(readme: str | Path, cfg, seeds: Sequence[int] = (), orders: Sequence[Sequence[str]] = (),
                          overrides: Sequence[str] = ()) -> str:
    """Replace the text between the results markers of ``readme`` with :func:`results_markdown`, then, with
    ``seeds``, the tables over those seeds (:func:`seeds_markdown`) and, with ``orders``, the curriculum-order
    study (:func:`orders_markdown`); returns the text."""
    readme = Path(readme)
    text = readme.read_text()
    if RESULTS_BEGIN not in text or RESULTS_END not in text:
        raise ValueError(f"{readme} has no '{RESULTS_BEGIN} ... -->' / '{RESULTS_END}' markers")
    head, rest = text.split(RESULTS_BEGIN, 1)
    marker_line, _ = rest.split("-->", 1)
    _, tail = rest.split(RESULTS_END, 1)
    body = results_markdown(cfg)
    if seeds:
        body += f"\n\n### Over seeds {', '.join(map(str, seeds))} (notebook 12)\n\n" + seeds_markdown(cfg, seeds, overrides)
    if orders:
        body += (f"\n\n### Curriculum orders (notebook 13, seed {cfg.seed})\n\n"
                 + orders_markdown(cfg, orders, overrides))
    from acl_lib.atomic import atomic_write_text

    atomic_write_text(readme, f"{head}{RESULTS_BEGIN}{marker_line}-->\n{body}\n{RESULTS_END}{tail}")
    return body
