"""The study's report, in one place: the HTML report over seeds (what ``acl report`` writes) and the README's
results section (what ``tools/readme_results.py`` writes), both built from the run store alone.

* :func:`write_report`: ``<output_dir>/<profile>/report.html``, one file that opens offline in any browser: the
  findings' verdicts, the final tables over the seeds, the trajectory and main-table figures, every run's
  ``config.yaml`` and links to the executed notebooks. :func:`seeds_on_disk` says which seeds ``acl report``
  aggregates when none are named.
* :func:`results_markdown`: the README's results section: one seed's scores beside the study's
  (:func:`one_seed_markdown`), with ``seeds`` the final tables and findings over them (:func:`seeds_markdown`),
  with ``orders`` the curriculum-orders study (:func:`orders_markdown`); :func:`write_results_section` puts it
  between the README's markers.

The views a notebook shows of one seed (scores, figures, readings) are in :mod:`acl_lib.views`, its episodes in
:mod:`acl_lib.transcripts`; the tables over seeds in :mod:`acl_lib.final`, the findings' rules in
:mod:`acl_lib.findings`, the curriculum-orders study in :mod:`acl_lib.curriculum`.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from acl_lib import budget, curriculum, final, findings
from acl_lib.atomic import atomic_write_text
from acl_lib.config import load_config, project_root
from acl_lib.envs import IN_DOMAIN
from acl_lib.final import FinalData
from acl_lib.pipeline import checkpoint_names
from acl_lib.progress import fmt_duration
from acl_lib.runs import CONFIG, SUPERSEDED
from acl_lib.steps import SEQ_FINAL, as_seq_final, made_by
from acl_lib.views import (
    BENCH_ORDER,
    completion_records,
    forgetting_frame,
    load_scores,
    load_standard_errors,
    md_table,
    paper_results,
)

if TYPE_CHECKING:
    from acl_lib.config import Config

__all__ = [
    # the HTML report and ``acl report``
    "write_report", "build_report", "default_tables", "seeds_on_disk", "run_configs", "executed_notebooks",
    # the README's results section
    "results_markdown", "one_seed_markdown", "final_tables_markdown", "seeds_markdown", "orders_markdown",
    "write_results_section", "RESULTS_BEGIN", "RESULTS_END", "CONSOLIDATION_ROWS",
]


# --- the HTML report ----------------------------------------------------------------------------------------------


def run_configs(seed_dirs: Mapping[int, str | Path]) -> dict[int, dict[str, str]]:
    """``{seed: {run: config.yaml text}}`` for every run directory of each seed (nested evaluation runs included;
    superseded runs and trainer checkpoints left out)."""
    out = {}
    for seed, d in sorted(seed_dirs.items()):
        d = Path(d)
        found = {}
        if d.is_dir():
            for p in sorted(d.rglob(CONFIG)):
                rel = p.parent.relative_to(d)
                if SUPERSEDED in rel.parts or "checkpoints" in rel.parts or not rel.parts:
                    continue
                found[str(rel)] = p.read_text()
        out[int(seed)] = found
    return out


def executed_notebooks(papermill_dir: str | Path, profile: str, seeds: Sequence[int]) -> dict[str, list[Path]]:
    """``{"seed <k>": [executed copies], "all seeds": [...]}``: the executed notebooks on disk."""
    root = Path(papermill_dir) / profile
    out = {}
    for s in seeds:
        found = sorted((root / f"seed{s}").glob("*.ipynb"))
        if found:
            out[f"seed {s}"] = found
    across = sorted(root.glob("*.ipynb"))
    if across:
        out["all seeds"] = across
    return out


def _table_html(frame, table_id: str) -> str:
    return frame.to_html(table_id=table_id, classes="acl", na_rep="-", escape=True, border=0)


_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1400px;padding:0 1em;color:#222}
table.acl{border-collapse:collapse;font-size:12px;margin:.5em 0 1.5em}table.acl td,table.acl th{border:1px solid #ccc;
padding:2px 6px;text-align:right}table.acl th{background:#f3f3f3}pre{font-size:11px;background:#f7f7f7;padding:6px;
overflow-x:auto}details{margin:2px 0}.note{color:#555;font-size:13px}"""


def build_report(data: FinalData, title: str, *, tables: Mapping[str, tuple] | None = None,
                 figures: Sequence[object] = (), configs: Mapping[int, Mapping[str, str]] | None = None,
                 notebooks: Mapping[str, Sequence[Path]] | None = None, where: Path | None = None,
                 intro: str = "") -> str:
    """The report as one HTML document: ``tables`` ``{id: (heading, DataFrame[, note])}`` (default: trajectory, main
    in-domain / OOD, CL metrics, findings, missing), ``figures`` (plotly; plotly.js inlined once, in the first),
    ``configs`` (collapsed, one per run and seed), ``notebooks`` linked relative to ``where`` (the report's
    folder)."""
    if tables is None:
        tables = default_tables(data)
    parts = [f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    if intro:
        parts.append(f"<p class='note'>{html.escape(intro)}</p>")
    parts.append(f"<p class='note'>Seeds: {', '.join(map(str, data.seeds))}; curriculum: "
                 f"{' → '.join(data.curriculum)}. Scores are percent, mean ± std over the seeds that have the run "
                 "(sample std; none shown with one seed). 'study': the ACLArena study's reported figure.</p>")
    for tid, (heading, frame, *note) in tables.items():
        parts.append(f"<h2 id='h-{tid}'>{html.escape(heading)}</h2>")
        if note and note[0]:
            parts.append(f"<p class='note'>{html.escape(note[0])}</p>")
        parts.append(_table_html(frame, tid) if len(frame) else "<p class='note'>(nothing on disk yet)</p>")
    if figures:
        parts.append("<h2 id='h-figures'>Figures</h2>")
        for i, fig in enumerate(figures):
            parts.append(fig.to_html(full_html=False, include_plotlyjs="inline" if i == 0 else False,
                                     div_id=f"figure-{i}"))
    if notebooks:
        parts.append("<h2 id='h-notebooks'>Executed notebooks</h2><ul>")
        for group, paths in notebooks.items():
            links = []
            for p in paths:
                href = os.path.relpath(Path(p).resolve(), Path(where).resolve()) if where else str(p)
                links.append(f"<a href='{html.escape(Path(href).as_posix())}'>{html.escape(Path(p).name)}</a>")
            parts.append(f"<li>{html.escape(group)}: {' · '.join(links)}</li>")
        parts.append("</ul>")
    if configs:
        parts.append("<h2 id='h-configs'>Run configurations</h2>")
        for seed, runs in configs.items():
            parts.append(f"<h3>seed {seed}</h3>")
            for run, text in runs.items():
                head = text.splitlines()[0] if text else ""
                parts.append(f"<details class='config'><summary>{html.escape(run)} <span class='note'>"
                             f"{html.escape(head.lstrip('# '))}</span></summary>"
                             f"<pre>{html.escape(text)}</pre></details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def default_tables(data: FinalData) -> dict:
    """The report's tables, ``{id: (heading, DataFrame[, note])}``, in the order they are shown; a note (the
    findings' noise-floor formula) goes under its heading in small print."""
    return {
        "findings": ("Findings F1-F8: verdicts computed from the numbers", findings.findings_frame(data),
                     findings.NOISE_FLOOR),
        "trajectory": ("The sequential trajectory", final.trajectory_frame(data)),
        "lifts": ("Each stage and oracle on its own benchmark, points over the checkpoint it started from",
                  final.lifts_frame(data)),
        "main-in-domain": ("Main table, in-domain", final.main_frame(data, "in_domain")),
        "main-ood": ("Main table, out of domain", final.main_frame(data, "ood")),
        "cl-metrics": ("Continual-learning metrics", final.cl_frame(data)),
        "missing": ("Missing runs and diagnostics", final.missing_frame(data)),
    }


def seeds_on_disk(cfg: Config) -> list[int]:
    """The seeds of ``cfg``'s profile that have a folder in the run store (``seed<k>``), or ``[0]`` when none has:
    what ``acl report`` aggregates when no seed is named."""
    root = cfg.seed_dir().parent
    seeds = sorted(int(p.name[4:]) for p in root.glob("seed*") if p.name[4:].isdigit()) if root.is_dir() else []
    return seeds or [0]


def write_report(profile: str, seeds: Sequence[int], overrides: Sequence[str] = (),
                 path: str | Path | None = None) -> Path:
    """Collect the store of ``profile`` over ``seeds`` and write ``<output_dir>/<profile>/report.html`` (or
    ``path``); returns the file. What ``acl report`` and the final-tables notebook's last cell call."""
    seeds = final.parse_seeds(seeds)
    cfg = load_config(profile, list(overrides), seed=seeds[0])
    dirs = final.seed_dirs(profile, seeds, overrides)
    data = final.collect(dirs, cfg.pipeline.curriculum, checkpoint_names(cfg, oracles=False))
    out = Path(path) if path else dirs[seeds[0]].parent / "report.html"
    pm = Path(cfg.papermill_dir)
    pm = pm if pm.is_absolute() else project_root() / pm
    doc = build_report(
        data, f"ACLArena suite: final report (profile {profile}, seeds {', '.join(map(str, data.seeds))})",
        figures=[final.seeds_trajectory_figure(data), final.main_figure(data)], configs=run_configs(dirs),
        notebooks=executed_notebooks(pm, profile, data.seeds), where=out.parent,
        intro="Built from the run store only (metrics.json of every run, diagnostics/*.json); open it in any browser.")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, doc)
    out.chmod(0o644)
    return out


# --- the README's results section -------------------------------------------------------------------------


# The consolidation runs the README's results show beside seq_final, in the study's order (distillation,
# self-distillation, merging, MLE).
CONSOLIDATION_ROWS = ("mmopd", "mmopd_rkl", "mmopd_single", "sdft", "sdft_base", "merge_uniform", "merge_grid",
                      "merge_balanced", "merge_ties", "merge_dare", "merge_oracles", "mle", "mle_learned")



def sampling_text(cfg: Config) -> str:
    """How the scores were sampled: the default k and temperature, then each benchmark that differs (its own
    ``eval.limits`` k, temperature or task count), e.g. "k=1, temperature 0.0; aime26: 128 tasks, avg@8 at 0.6"."""
    from acl_lib.envs import BENCHMARKS
    from acl_lib.eval.harness import benchmark_size

    text = f"k={cfg.eval.k}, temperature {cfg.eval.temperature}"
    own = []
    for key, lim in cfg.eval.limits.items():
        if not {"k", "temperature", "max_tasks"} & set(lim):
            continue
        k, t = cfg.eval.sampling_for(key)
        own.append(f"{key}: {benchmark_size(cfg, BENCHMARKS[key])} tasks, avg@{k} at {t:g}")
    return text + ("; " + "; ".join(own) if own else "")


def _largest_se(se: Mapping[str, Mapping[str, float | None]], benchmark: str) -> str:
    """The largest standard error of ``benchmark`` over the runs of ``se`` (:func:`load_standard_errors`), "-"
    where none is known."""
    known = [v[benchmark] for v in se.values() if v.get(benchmark) is not None]
    return f"{max(known):.1f}" if known else "-"


def one_seed_markdown(cfg: Config) -> str:
    """The README's results for the run store of ``cfg`` (profile, seed): every checkpoint's
    scores (this stage's own benchmark in bold), the study's in-domain figures beside the final and the
    oracles, each stage's lift and the forgetting, the wall time of the runs, and which code made them (the
    commits recorded in the runs' ``COMPLETE.json``) and when."""
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
    se = load_standard_errors(cfg.seed_dir(), list(scores))
    rows.append(["± (largest SE)"] + [_largest_se(se, b) for b in BENCH_ORDER])
    out = [f"Profile `{cfg.profile}`, seed {cfg.seed}, world seed {cfg.worlds.seed}; runs finished "
           f"{min(done)[:10]} to {max(done)[:10]}; code {', '.join(sorted(codes))}. Scores in percent "
           f"({cfg.worlds.n_test} in-domain and {cfg.worlds.n_ood} out-of-domain tasks per benchmark, "
           f"{sampling_text(cfg)}); in bold, the benchmark the run trained for; the last row, the largest standard "
           f"error of a score in its column (points, clustered by task from the runs' records, the binomial one of "
           f"n tasks x k samples where a run has none; `acl_lib.noise`).", "",
           md_table(["run"] + BENCH_ORDER, rows), ""]
    paper = paper_results()["main_table"]
    seq = [n for n in names if n.startswith("seq")]
    last = seq[-1] if seq else None
    cmp_rows = []
    for run, label in [(last, "seq_final")] + [(f"oracle_{d}", f"oracle_{d}") for d in cfg.pipeline.curriculum]:
        if run in scores:
            theirs = paper.get(label) or {}
            cmp_rows.append([f"{run} (final)" if run == last else run]
                            + [f"{scores[run].get(b, float('nan')):.1f} ("
                               + (f"{theirs[b]:.1f}" if b in theirs else "-") + ")" for b in IN_DOMAIN.values()])
    if cmp_rows:
        out += ["Beside the study (ours, then the study's in parentheses; in-domain benchmarks):", "",
                md_table(["run"] + list(IN_DOMAIN.values()), cmp_rows), ""]
    consolidations = load_scores(cfg.seed_dir(), list(CONSOLIDATION_ROWS))
    if consolidations and last in scores:
        rows = []
        for run, s in [("seq_final", scores[last])] + list(consolidations.items()):
            theirs = paper.get(run) or {}
            rows.append([run] + [f"{s.get(b, float('nan')):.1f}" + (f" ({theirs[b]:.1f})" if b in theirs else "")
                                 for b in IN_DOMAIN.values()])
        se = load_standard_errors(cfg.seed_dir(), [last, *consolidations])
        rows.append(["± (largest SE)"] + [_largest_se(se, b) for b in IN_DOMAIN.values()])
        out += ["The consolidations of `seq_final` and MLE (notebooks 08-11; the study's figure in parentheses where "
                "it reports one):", "", md_table(["run"] + list(IN_DOMAIN.values()), rows), ""]
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
        out.append(f"Peak along the sequence -> final ({last}): " + "; ".join(drops) + ".")
    train_s = sum(v for k, v in durations.items() if not k.endswith("/eval"))
    eval_s = sum(v for k, v in durations.items() if k.endswith("/eval"))
    out.append(f"Run time of these runs: {(train_s + eval_s) / 60:.1f} min ({train_s / 60:.1f} training, "
               f"{eval_s / 60:.1f} evaluation).")
    return "\n".join(out)


def final_tables_markdown(data: FinalData, provenance: str = "", rows: list[dict] | None = None) -> str:
    """The final tables over every seed of ``data`` as Markdown (the README's results with ``--seeds``): the
    trajectory and the main table in-domain (ours mean ± std, the study's figure in parentheses), the findings
    with their verdicts, and what is missing. ``provenance``: a sentence for the first paragraph (when and by
    which code the runs were made)."""
    ids = final.IN_DOMAIN_BENCHMARKS

    def table(frame, benchmarks):
        rows = []
        for label, rec in frame.iterrows():
            cells = [label, int(rec[("seeds", "")])]
            for b in benchmarks:
                ours, theirs = rec.get((b, "ours"), "-"), rec.get((b, "study"), "")
                cells.append(f"{ours} ({theirs})" if theirs else ours)
            rows.append(cells)
        return md_table(["checkpoint", "seeds", *benchmarks], rows)

    out = [f"Over seeds {', '.join(map(str, data.seeds))}: mean ± sample std of each seed's score (percent), the "
           "study's figure in parentheses where it reports one." + (f" {provenance}" if provenance else ""), "",
           "The sequence, in-domain benchmarks:", "",
           table(final.trajectory_frame(data, ids), ids), "",
           "The main table, in-domain (out-of-domain columns are in notebook 12 and the report):", "",
           table(final.main_frame(data, "in_domain"), [*ids, "in-domain mean"]), ""]
    lifts = final.lifts_frame(data)
    seed_cols = [f"seed {s}" for s in data.seeds]
    out += ["Each stage and each oracle on its own benchmark, points over the checkpoint it started from (a stage: "
            "the stage before it; an oracle: the base, so its lift is the base's gap below it):", "",
            md_table(["run", "benchmark", "from", *seed_cols, "mean", "smallest"],
                     [[run, r["benchmark"], r["from"], *(_signed(r[c]) for c in seed_cols), _signed(r["mean"]),
                       _signed(r["smallest"])] for run, r in lifts.iterrows()]), ""]
    rows = rows if rows is not None else findings.judge(data)
    out += [f"The study's findings, judged by the rules of `acl_lib.findings` ({findings.verdict_summary(rows)}):", "",
            md_table(["finding", "verdict", "ours", "study", "power", "rule"],
                      [[_md_text(r[k]) for k in ("finding", "verdict", "ours", "study", "power", "rule")]
                       for r in rows]),
            "", f"Noise floor: {findings.NOISE_FLOOR}."]
    if data.missing:
        out += ["", "Missing for some seeds: " + "; ".join(f"{w} (seeds {', '.join(map(str, s))})"
                                                          for w, s in data.missing.items()) + "."]
    return "\n".join(out)


def _md_text(v) -> str:
    """Text for a Markdown table cell: a ``|`` escaped (a finding's rule may write ``|cosine|``)."""
    return str(v).replace("|", "\\|")


def _signed(v: float) -> str:
    """A lift as text: ``+12.5``, or ``-`` for NaN (a run or its start is missing)."""
    return "-" if v != v else f"{v:+.1f}"


def _by_verdict(rows: list[dict]) -> dict[str, list[str]]:
    """``{verdict: [finding ids]}`` of :func:`acl_lib.findings.judge`'s rows, every verdict a key."""
    return {v: [r["finding"] for r in rows if r["verdict"] == v] for v in findings.VERDICTS}


def _in_domain_means(score, runs: Sequence[tuple[str, str]]) -> list[str]:
    """``label mean`` of each ``(label, run)`` whose four in-domain scores ``score(run, benchmark)`` are all there
    (None: not)."""
    out = []
    for label, run in runs:
        vals = [score(run, b) for b in final.IN_DOMAIN_BENCHMARKS]
        if all(v is not None for v in vals):
            out.append(f"{label} {sum(vals) / len(vals):.1f}")
    return out


def seeds_reading(data: FinalData, rows: list[dict] | None = None) -> str:
    """What the runs over the seeds show, in a few sentences computed from them (notebook 12's reading): each
    stage's and oracle's lift on its own benchmark (mean, smallest), each in-domain benchmark along the sequence,
    the verdicts of the findings (``rows``: :func:`acl_lib.findings.judge`'s, judged here when not given) and the
    in-domain means of ``seq_final`` and the consolidations. Means over the seeds that have each run."""
    if not data.has(data.final_run):
        return (f"*The sequence has not been scored for any seed yet: run {made_by('base')} and "
                f"{made_by(SEQ_FINAL)} first.*")
    lifts = final.lifts_frame(data)
    kinds = [("stage", [r for r in lifts.index if not r.startswith("oracle_")]),
             ("oracle, over the base,", [r for r in lifts.index if r.startswith("oracle_")])]
    lines = []
    for kind, runs in kinds:
        cells = [f"{lifts.loc[r, 'benchmark']} {lifts.loc[r, 'mean']:+.1f} (smallest {lifts.loc[r, 'smallest']:+.1f})"
                 for r in runs if lifts.loc[r, "mean"] == lifts.loc[r, "mean"]]
        if cells:
            lines.append(f"- **Each {kind} on its own benchmark**, mean over the seeds: " + "; ".join(cells) + ".")
    along = []
    for b in final.IN_DOMAIN_BENCHMARKS:
        steps = [f"{data.mean(r, b):.1f} ({r})" for r in data.seq_runs if data.mean(r, b) is not None]
        along.append(f"{b} " + " -> ".join(steps))
    lines.append("- **Along the sequence** (means): " + "; ".join(along) + ".")
    rows = rows if rows is not None else findings.judge(data)
    lines.append("- **The findings**: " + "; ".join(f"{v}: {', '.join(ids)}" for v, ids in _by_verdict(rows).items()
                                                   if ids)
                 + " (the table above says what each rule saw).")
    means = _in_domain_means(data.mean, [("seq_final", data.final_run),
                                         *((m, m) for m in (*final.CONSOLIDATIONS, *final.MLE_RUNS))])
    if means:
        lines.append("- **In-domain means**: " + ", ".join(means) + ".")
    return f"**What these runs show** (seeds {', '.join(map(str, data.seeds))})\n\n" + "\n".join(lines)


# The mini regime before the mid-trained base (a text-only base, every stage taught by SFT; three seeds; the
# measurements are in docs/mini-calibration.md): the column the regime table keeps for comparison. Fixed history.
REGIME_BEFORE = {
    "the base": "6.2 / 0 / 6.2 / 12.5",
    "how a stage trains": "every stage an SFT cold start (math 800 steps), then 4-10 GRPO steps",
    "each stage on its benchmark, from its start": "+53 / +25 / +25 / +25",
    "each oracle over the base": "+51 / +19 / +7 / +24",
    "SFT/RL displacement (L2)": "58.6 ± 6.7x",
    "forgetting": "total: every domain back to 0",
    "low-entropy positions that keep their token": "28%",
    "consolidations, in-domain mean": "seq_final 9.1; only merging above it (11.5)",
    "MLE against the oracles": "9.6 against oracles of 13.5-57.3",
    "findings reproduced": "F1, F5, F6 under the old, lax rules",
}
# The study's side of the rows the paper_results.yaml figures do not give as numbers.
REGIME_STUDY = {
    "how a stage trains": "math, IF: RL; search, e-commerce: short cold start, then RL",
    "SFT/RL displacement (L2)": "3-7x",
    "forgetting": "partial, non-monotonic (AIME 25.8 -> 6.0 -> 10.2)",
    "low-entropy positions that keep their token": "~94%",
}


def _run_config(seed_dir: Path, run: str) -> dict:
    """The resolved config a run of the store ran with (its ``config.yaml``), or {}."""
    path = Path(seed_dir) / run / CONFIG
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def recipe_text(seed_dir: Path, seq_runs: Sequence[str], curriculum: Sequence[str]) -> str:
    """How each stage of the store trained, from its runs' ``config.yaml`` and ``stage.json``: ``math: GRPO 300 x
    64; search: cold start 80 SFT steps, then GRPO 80 x 16; ...`` (steps x completions a step)."""
    parts = []
    for run, d in zip(seq_runs[1:], curriculum):
        conf = _run_config(seed_dir, run)
        stage = Path(seed_dir) / run / "stage.json"
        cold = json.loads(stage.read_text()).get("cold_start") if stage.is_file() else None
        if not conf:
            continue
        grpo, sft = conf.get("grpo", {}), conf.get("sft", {})
        mantissa, exponent = f"{float(grpo.get('learning_rate', 0.0)):.2e}".split("e")
        lr = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"  # 0.0001 -> 1e-4, 0.00015 -> 1.5e-4
        text = f"GRPO {grpo.get('max_steps')} x {grpo.get('batch_size')} at lr {lr}"
        if grpo.get("beta"):
            text += f", KL {grpo['beta']:g}"
        if cold:
            text = f"cold start {sft.get('max_steps')} SFT steps, then {text}"
        parts.append(f"{d}: {text}")
    return "; ".join(parts)


def regime_markdown(data: FinalData, seed_dir: Path, rows: list[dict] | None = None) -> str:
    """The regime table: the study, the mini regime before the mid-trained base (:data:`REGIME_BEFORE`) and the
    runs of ``data`` (the base's in-domain scores, the recipe the store's stages ran, each stage's and oracle's
    lift, the findings' measurements of F5, F1, F3 and F7, the consolidations' in-domain means and the verdicts),
    means over the seeds. ``seed_dir``: a seed of the store, whose runs' configs give the recipe; ``rows``:
    :func:`acl_lib.findings.judge`'s on ``data``, judged here when not given."""
    ids = final.IN_DOMAIN_BENCHMARKS
    judged = rows if rows is not None else findings.judge(data)
    rows = {r["finding"]: r for r in judged}
    study = data.study
    num = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    lifts = final.lifts_frame(data)
    consolidations = [("seq_final", data.final_run), ("MMOPD", "mmopd"), ("SDFT", "sdft"),
                      ("uniform merge", "merge_uniform"), ("DARE", "merge_dare"), ("MLE", "mle")]

    def lift_cells(oracles: bool) -> str:
        part = lifts[[r.startswith("oracle_") == oracles for r in lifts.index]]
        return (" / ".join(_signed(v) for v in part["mean"]) + " (seed minima "
                + " / ".join(_signed(v) for v in part["smallest"]) + ")")

    def means(score) -> str:
        return ", ".join(_in_domain_means(score, consolidations)) or "-"

    study_main = study.get("main_table", {})
    by_verdict = _by_verdict(judged)
    verdicts = ", ".join(by_verdict[findings.REPRODUCED]) or "none"
    verdicts += "".join(f"; {v}: {', '.join(by_verdict[v])}" for v in findings.VERDICTS[1:] if by_verdict[v])
    ours = {
        "the base": " / ".join(num(data.mean("base", b)) for b in ids),
        "how a stage trains": recipe_text(seed_dir, data.seq_runs, data.curriculum) or "-",
        "each stage on its benchmark, from its start": lift_cells(oracles=False),
        "each oracle over the base": lift_cells(oracles=True),
        "SFT/RL displacement (L2)": rows["F5"]["ours"],
        "forgetting": rows["F1"]["ours"],
        "low-entropy positions that keep their token": rows["F3"]["ours"],
        "consolidations, in-domain mean": means(data.mean),
        "MLE against the oracles": rows["F7"]["ours"],
        "findings reproduced": verdicts,
    }
    theirs = {
        "the base": " / ".join(num((study.get("sequential", {}).get("base") or {}).get(b)) for b in ids),
        "consolidations, in-domain mean": means(lambda run, b: (study_main.get(
            as_seq_final(run, data.final_run)) or {}).get(b)),
        "MLE against the oracles": rows["F7"]["study"],
        **REGIME_STUDY,
    }
    table = md_table(["", "the study (Qwen3-8B-Base)", "mini before (text-only base)",
                      f"mini now (seeds {', '.join(map(str, data.seeds))})"],
                     [[row, _md_text(theirs.get(row, "")), _md_text(REGIME_BEFORE[row]), _md_text(ours[row])]
                      for row in REGIME_BEFORE], align="---")
    return ("**The regime**: the study's, the mini profile's before its mid-trained base, and these runs' (in-domain "
            f"benchmarks {' / '.join(ids)}; means over the seeds; the intermediate regimes are in "
            "`docs/mini-calibration.md`):\n\n" + table)


RESULTS_BEGIN = "<!-- results:begin"
RESULTS_END = "<!-- results:end -->"


def seeds_markdown(cfg: Config, seeds: Sequence[int], overrides: Sequence[str] = (), data: FinalData | None = None,
                   rows: list[dict] | None = None) -> str:
    """The final tables over ``seeds`` as Markdown (:func:`final_tables_markdown`), saying when their evaluations
    finished and which code made them. ``data`` / ``rows``: the store already collected / judged."""
    dirs = final.seed_dirs(cfg.profile, seeds, overrides)
    if data is None:
        data = final.collect(dirs, cfg.pipeline.curriculum, checkpoint_names(cfg, oracles=False))
    runs = dict.fromkeys([*data.seq_runs, *(r for _, r in final.main_rows(data))])
    records = completion_records(list(dirs.values()), [f"{r}/eval" for r in runs]).values()
    done = [c.get("finished_at") or "" for c in records]
    codes = sorted({c.get("code") or "unrecorded" for c in records})
    made = f"Their evaluations finished {min(done)[:10]} to {max(done)[:10]}; code {', '.join(codes)}." if done else ""
    return final_tables_markdown(data, provenance=made, rows=rows)


def orders_markdown(cfg: Config, orders: Sequence[Sequence[str]], overrides: Sequence[str] = ()) -> str:
    """The curriculum-orders study for ``orders`` in the seed of ``cfg`` as Markdown, with each order's stages
    that are not scored yet named (:func:`acl_lib.curriculum.positions_markdown`)."""
    results = curriculum.scores_by_order({tuple(o): curriculum.order_config(cfg.profile, overrides, cfg.seed, o)
                                          for o in orders})
    missing = [n for names, scores in results.values() for n in names if n not in scores]
    text = curriculum.positions_markdown(curriculum.positions_frame(results))
    return text + (f"\n\nNot scored yet: {', '.join(missing)}." if missing else "")


TIMING_JSON = "timing.json"  # <output_dir>/<profile>/timing.json: benchmarks/pipeline_time.py's measurement


def wall_time_markdown(cfg: Config, seeds: Sequence[int]) -> str:
    """A paragraph on the wall time of the whole ``acl run`` that made this store, from its
    ``<output_dir>/<profile>/timing.json`` (``benchmarks/pipeline_time.py``, which times a run from an empty store),
    where that file exists and covers exactly ``seeds``; else ``""``."""
    path = cfg.seed_dir().parent / TIMING_JSON
    if not path.is_file():
        return ""
    t = json.loads(path.read_text())
    if list(t.get("seeds", [])) != list(seeds):
        return ""
    hours = fmt_duration(t["total_s"], words=True)
    status = "" if t.get("exit_status") == 0 else f", exit status {t.get('exit_status')}"
    target = t.get("budget_s")
    budget = "" if not target else (f" (the profile's target: {target / 3600:g} h)" if target >= 3600 else
                                    f" (the profile's target: {target / 60:g} min)")
    speed = t.get("machine_speed_s") or {}
    machine = (f" On that machine `benchmarks/machine_speed.py` takes {speed['1']:.1f} s at one thread and "
               f"{speed['2']:.1f} s at two: timings scale with it." if {"1", "2"} <= set(speed) else "")
    return (f"Wall time of the whole run, notebooks 00-12 of seeds {', '.join(map(str, seeds))} from an empty store "
            f"(`acl run --jobs {t.get('jobs', '?')}`, what `make run` runs; `benchmarks/pipeline_time.py`, code "
            f"{t.get('commit', '?')}, started {t.get('started', '?')}{status}): **{hours}**{budget}.{machine}")


def configured_rollouts(cfg: Config) -> dict[str, int]:
    """RL rollouts (steps x completions a step) a profile configures: each stage's (an oracle's is its stage's),
    each MLE expert's (``expert_cfg``) and MMOPD's, keyed as the mini store names the runs."""
    from acl_lib.consolidate.mle.specs import expert_cfg  # the consolidations' layer, read for its recipe only

    out = {}
    for d in cfg.pipeline.curriculum:
        g = cfg.for_stage(d).grpo
        out[f"seq_{d}"] = out[f"oracle_{d}"] = g.max_steps * g.batch_size
        e = expert_cfg(cfg, d).grpo
        out[f"mle_expert_{d}"] = e.max_steps * e.batch_size
    out["mmopd"] = cfg.mmopd.max_steps * cfg.mmopd.batch_size
    return out


def budget_section(cfg: Config, seeds: Sequence[int], overrides: Sequence[str] = ()) -> str:
    """Where a seed's compute goes (``acl_lib.budget``: each step's run-minutes and share, over ``seeds``), then the
    RL budgets of the runs that have them, beside the paper profile's configured ones."""
    dirs = final.seed_dirs(cfg.profile, seeds, overrides)
    per_seed = [budget.run_rows(d) for d in dirs.values() if d.is_dir()]
    if not any(per_seed):
        return ""
    parts = budget.part_rows(per_seed)
    paper = configured_rollouts(load_config("paper"))
    mine = budget.rl_budgets(per_seed[0])

    def n(table, run):
        return f"{table[run]:,}" if table.get(run) else "-"

    lines = [budget.budget_markdown(parts, n_seeds=len(per_seed)), "",
             f"RL rollouts (steps x completions a step), seed {next(iter(dirs))}, beside the paper profile's recipe:",
             "", "| domain | stage | oracle | MLE expert | paper: stage / oracle | paper: MLE expert |",
             "|---|---:|---:|---:|---:|---:|"]
    for d in cfg.pipeline.curriculum:
        lines.append(f"| {d} | {n(mine, f'seq_{d}')} | {n(mine, f'oracle_{d}')} | {n(mine, f'mle_expert_{d}')} | "
                     f"{n(paper, f'seq_{d}')} | {n(paper, f'mle_expert_{d}')} |")
    lines.append(f"| MMOPD (all four) | {n(mine, 'mmopd')} | | | {n(paper, 'mmopd')} | |")
    return ("Each step's run-minutes (a run's `COMPLETE.json` duration; notebooks run two at a time, so these are "
            "run-seconds, not the wall clock) and training inside them (`acl_lib.budget`; rollouts = GRPO / MMOPD "
            "steps x completions a step):\n\n" + "\n".join(lines))


def results_markdown(cfg: Config, seeds: Sequence[int] = (), orders: Sequence[Sequence[str]] = (),
                     overrides: Sequence[str] = ()) -> str:
    """The README's results section: :func:`one_seed_markdown` for the seed of ``cfg``, then, with ``seeds``, the
    final tables over those seeds (:func:`seeds_markdown`) and the wall time of the run that made them
    (:func:`wall_time_markdown`, where measured) and, with ``orders``, the curriculum-orders study
    (:func:`orders_markdown`)."""
    body = one_seed_markdown(cfg)
    if seeds:
        dirs = final.seed_dirs(cfg.profile, seeds, overrides)
        data = final.collect(dirs, cfg.pipeline.curriculum, checkpoint_names(cfg, oracles=False))
        rows = findings.judge(data)  # once, for the tables, the reading and the regime
        body += (f"\n\n### Over seeds {', '.join(map(str, seeds))} (notebook 12)\n\n"
                 + seeds_markdown(cfg, seeds, overrides, data=data, rows=rows))
        body += "\n\n" + seeds_reading(data, rows)
        if cfg.profile == "mini":  # the mini regime beside the study's and the one before it
            body += "\n\n" + regime_markdown(data, dirs[seeds[0]], rows)
        wall = wall_time_markdown(cfg, seeds)
        if wall:
            body += "\n\n" + wall
        spent = budget_section(cfg, seeds, overrides)
        if spent:
            body += "\n\n#### Where a seed's compute goes\n\n" + spent
    if orders:
        body += (f"\n\n### Curriculum orders (notebook 13, seed {cfg.seed})\n\n"
                 + orders_markdown(cfg, orders, overrides))
    return body


def write_results_section(readme: str | Path, cfg: Config, seeds: Sequence[int] = (),
                          orders: Sequence[Sequence[str]] = (), overrides: Sequence[str] = ()) -> str:
    """Replace the text between the results markers of ``readme`` with :func:`results_markdown` (``seeds``,
    ``orders``: as there); returns the text."""
    readme = Path(readme)
    text = readme.read_text()
    if RESULTS_BEGIN not in text or RESULTS_END not in text:
        raise ValueError(f"{readme} has no '{RESULTS_BEGIN} ... -->' / '{RESULTS_END}' markers")
    head, rest = text.split(RESULTS_BEGIN, 1)
    marker_line, _ = rest.split("-->", 1)
    _, tail = rest.split(RESULTS_END, 1)
    body = results_markdown(cfg, seeds, orders, overrides)
    atomic_write_text(readme, f"{head}{RESULTS_BEGIN}{marker_line}-->\n{body}\n{RESULTS_END}{tail}")
    return body
