"""The final-tables step: the study's tables over several training seeds, read from the run store.

Everything here reads files of the run store and nothing else:

* scores: ``<output_dir>/<profile>/seed<k>/<run>/eval/metrics.json`` (key ``scores``, percent per benchmark;
  ``n_tasks`` per benchmark and ``k_by_benchmark`` (or, in older files, ``k``), the samples per task);
* each score's per-task pass counts: ``<run>/eval/records/<benchmark>.jsonl`` (one line per episode, its task ``id``
  and ``reward``), read when a standard error needs them, which cluster the score's standard error by task and pair
  the difference of two runs on the same tasks (:mod:`acl_lib.noise`; a run without records falls back to the
  binomial standard error of its ``n_tasks`` x k episodes);
* diagnostics: ``<seed_dir>/diagnostics/{weights,tokens,cl_metrics}.json`` (the weight and token diagnostics) and
  ``<seed_dir>/sdft_directions/directions.json`` (the SDFT step's update-direction check).

A run or a diagnostics file that is not on disk for a seed is *reported* (``missing``), never an error: a
reader who ran a subset of the notebooks gets the tables of what is there and the list of what is not.

Means and spreads: ``mean`` over the seeds that have the value, ``std`` the sample standard deviation
(``ddof=1``) over them, 0.0 with a single seed. The findings compare numbers through
:meth:`FinalData.estimate` and :meth:`FinalData.contrast` (:mod:`acl_lib.noise`: each score's standard error
clustered by task, a difference's paired by task, combined with the spread over seeds), so one seed still has a
noise floor. The score tables show mean ± std by default and
mean ± that combined standard error with ``error="se"``.

Public entry points: :func:`seed_dirs`, :func:`collect` (-> :class:`FinalData`), :func:`collect_profile`,
:func:`trajectory_frame`, :func:`main_frame`, :func:`cl_frame`, :func:`missing_frame`, :func:`seeds_trajectory_figure`,
:func:`main_figure`. The findings judged on a :class:`FinalData` are in :mod:`acl_lib.findings`; the HTML report
and the README's results in :mod:`acl_lib.report`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from acl_lib import domains
from acl_lib.config import load_config
from acl_lib.diagnostics.cl_metrics import capability_matrix, cl_metrics
from acl_lib.diagnostics.weights import UPDATE_DIRECTIONS
from acl_lib.envs import BENCHMARKS, IN_DOMAIN
from acl_lib.noise import (
    Estimate,
    TaskCounts,
    binomial_se,
    clustered_se,
    combine,
    contrast_se,
    matches,
    mean_of,
    read_task_counts,
    samples_per_task,
)
from acl_lib.pipeline import checkpoint_names
from acl_lib.steps import from_seq_final, notebook_of
from acl_lib.views import paper_results, trajectory_figure

BENCH_ORDER = list(BENCHMARKS)
IN_DOMAIN_BENCHMARKS = [b for b in BENCH_ORDER if BENCHMARKS[b].suite == "in_domain"]
OOD_BENCHMARKS = [b for b in BENCH_ORDER if BENCHMARKS[b].suite == "ood"]
# The diagnostics each seed may hold, by name: the weight and token diagnostics' files, and the SDFT step's
# update-direction check (the study's 0.77 / 0.05, read by F4).
DIAG_FILES = {"weights": "diagnostics/weights.json", "tokens": "diagnostics/tokens.json",
              "cl_metrics": "diagnostics/cl_metrics.json", "directions": UPDATE_DIRECTIONS}
MERGES = ("merge_uniform", "merge_grid", "merge_balanced", "merge_ties", "merge_dare", "merge_oracles")
# Shared-weight consolidations (F6, F8): distillation, self-distillation, the merges. MLE keeps one expert per
# domain, so it is not one of them.
CONSOLIDATIONS = ("mmopd", "sdft", *MERGES)
MLE_RUNS = ("mle", "mle_learned")

# --- reading the store ---------------------------------------------------------------------------------------


def parse_seeds(seeds) -> list[int]:
    """A list of seeds from a list, an int, or text (``"[0, 1, 2]"``, ``"0 1 2"``: what ``papermill -p`` passes)."""
    if isinstance(seeds, str):
        text = seeds.strip()
        seeds = yaml.safe_load(text) if text.startswith("[") else text.replace(",", " ").split()
    if isinstance(seeds, int):
        seeds = [seeds]
    out = [int(s) for s in seeds]
    if not out:
        raise ValueError("no seeds given")
    return out


def seed_dirs(profile: str, seeds, overrides: Sequence[str] = ()) -> dict[int, Path]:
    """``{seed: <output_dir>/<profile>/seed<k>}`` as ``load_config`` resolves it for each seed."""
    return {s: load_config(profile, list(overrides), seed=s).seed_dir() for s in parse_seeds(seeds)}


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


@dataclass
class FinalData:
    """What the final-tables step reads, per seed. ``scores[run][seed] = {benchmark: %}``;
    ``diagnostics[name][seed]`` the parsed JSON; ``missing`` ``{what: [seeds without it]}`` for every run and
    diagnostics file asked for; ``tasks[run][seed] = {benchmark: n_tasks}`` and ``samples[run][seed] = k`` (an
    int, or ``{benchmark: k}``) where ``metrics.json`` records them; ``eval_dirs[run][seed]`` the evaluation
    directory whose ``records/`` give each score's per-task pass counts, read on first use into ``counts``
    (``{(run, seed, benchmark): TaskCounts or None}``; a test may fill it directly)."""

    seeds: list[int]
    curriculum: list[str]
    seq_runs: list[str]  # base, then the curriculum's stages in order (the run store's names)
    final_run: str  # the last stage's run name; its rows are called seq_final in the main table
    scores: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    diagnostics: dict[str, dict[int, dict]] = field(default_factory=dict)
    missing: dict[str, list[int]] = field(default_factory=dict)
    study: dict = field(default_factory=dict)
    tasks: dict[str, dict[int, dict[str, int]]] = field(default_factory=dict)
    samples: dict[str, dict[int, int | dict[str, int]]] = field(default_factory=dict)
    eval_dirs: dict[str, dict[int, Path]] = field(default_factory=dict)
    counts: dict[tuple[str, int, str], TaskCounts | None] = field(default_factory=dict, repr=False)

    @property
    def oracles(self) -> list[str]:
        return [f"oracle_{d}" for d in self.curriculum]

    def row(self, run: str) -> dict[int, dict[str, float]]:
        """Per-seed scores of a run; ``seq_final`` is the last stage."""
        return self.scores.get(from_seq_final(run, self.final_run), {})

    def has(self, run: str) -> bool:
        return bool(self.row(run))

    def mean(self, run: str, benchmark: str) -> float | None:
        return summarize([s.get(benchmark) for s in self.row(run).values()])[0]

    def _name(self, run: str) -> str:
        return from_seq_final(run, self.final_run)

    def task_counts(self, run: str, seed: int, benchmark: str) -> TaskCounts | None:
        """The per-task pass counts of a run's score at a seed (its evaluation's ``records/<benchmark>.jsonl``),
        None where there are no records or they do not give the score ``metrics.json`` reports."""
        name = self._name(run)
        key = (name, seed, benchmark)
        if key not in self.counts:
            where = self.eval_dirs.get(name, {}).get(seed)
            self.counts[key] = None if where is None else read_task_counts(Path(where) / "records" /
                                                                          f"{benchmark}.jsonl")
        tc = self.counts[key]
        return tc if matches(tc, self.row(name).get(seed, {}).get(benchmark)) else None

    def seed_se(self, run: str, seed: int, benchmark: str) -> float | None:
        """The standard error (points) of a run's score at one seed: clustered by task from its records, else the
        binomial fallback from ``n_tasks`` and k; None when neither is known."""
        tc = self.task_counts(run, seed, benchmark)
        if tc is not None:
            return clustered_se(tc)
        name = self._name(run)
        score = self.row(name).get(seed, {}).get(benchmark)
        n = self.tasks.get(name, {}).get(seed, {}).get(benchmark)
        k = self.samples.get(name, {}).get(seed, 1)
        k = k.get(benchmark, 1) if isinstance(k, dict) else k
        return binomial_se(score, n, k or 1) if has_value(score) and n else None

    def binomial_fallback(self) -> list[str]:
        """``"run (seed s)"`` for every evaluation with a score whose standard error is the binomial fallback (no
        records on disk that give it)."""
        return [f"{run} (seed {s})" for run, per in self.scores.items() for s in sorted(per)
                if any(has_value(v) and self.task_counts(run, s, b) is None for b, v in per[s].items())]

    def clustered(self, run: str, benchmark: str) -> bool:
        """Whether every seed's standard error of this score is clustered by task (records on disk)."""
        per = self.row(run)
        seeds = [s for s in per if has_value(per[s].get(benchmark))]
        return bool(seeds) and all(self.task_counts(run, s, benchmark) is not None for s in seeds)

    def estimate(self, run: str, benchmark: str) -> Estimate | None:
        """A run's score on a benchmark over the seeds that have it, with its noise floor: each seed's standard
        error (:meth:`seed_se`: clustered by task, the binomial fallback without records) combined with the spread
        over seeds (:class:`acl_lib.noise.Estimate`); None when no seed has the score."""
        per = self.row(run)
        seeds = [s for s in sorted(per) if has_value(per[s].get(benchmark))]
        if not seeds:
            return None
        return Estimate.of_values([per[s][benchmark] for s in seeds], [self.seed_se(run, s, benchmark) for s in seeds])

    def contrast(self, weights: Mapping[str, float], benchmark: str) -> Estimate | None:
        """``sum_r w_r score_r`` of runs on one benchmark (``weights`` ``{run: w}``; ``{a: 1, b: -1}`` is ``a - b``),
        per seed over the seeds that have every run, each seed's standard error paired by task
        (:func:`acl_lib.noise.contrast_se`, where every run has records of the same tasks; else the runs taken as
        independent), combined over those seeds like a score. With no seed that has every run, the runs' estimates
        taken as independent. None when a run has no score."""
        ws: dict[str, float] = {}
        for run, w in weights.items():
            ws[self._name(run)] = ws.get(self._name(run), 0.0) + float(w)
        ws = {r: w for r, w in ws.items() if w}
        if not ws:
            return Estimate.exact(0.0)
        seeds = [s for s in self.seeds if all(has_value(self.row(r).get(s, {}).get(benchmark)) for r in ws)]
        if not seeds:
            ests = [self.estimate(r, benchmark) for r in ws]
            return None if any(e is None for e in ests) else combine(ests, list(ws.values()))
        values, ses = [], []
        for s in seeds:
            values.append(sum(w * self.row(r)[s][benchmark] for r, w in ws.items()))
            tcs = [self.task_counts(r, s, benchmark) for r in ws]
            if all(tc is not None for tc in tcs):
                ses.append(contrast_se(list(zip(ws.values(), tcs))))
                continue
            each = [self.seed_se(r, s, benchmark) for r in ws]
            ses.append(None if any(e is None for e in each)
                       else math.sqrt(sum((w * e) ** 2 for w, e in zip(ws.values(), each))))
        return Estimate.of_values(values, ses)

    def diff(self, a: str, b: str, benchmark: str) -> Estimate | None:
        """``a - b`` on ``benchmark``, paired by task and by seed (:meth:`contrast`)."""
        return self.contrast({a: 1.0, b: -1.0}, benchmark)


def collect(seed_dirs: Mapping[int, str | Path], curriculum: Sequence[str] = domains.ORDER,
            seq_runs: Sequence[str] | None = None, extra_runs: Sequence[str] = ()) -> FinalData:
    """Read every run's scores and the diagnostics of each seed.

    ``seq_runs``: base and the stages in curriculum order (default: the study's names, ``seq_<domain>``; pass
    ``[r.name for r in ...]`` from ``pipeline.checkpoint_names(cfg, oracles=False)`` for another order)."""
    curriculum = list(curriculum)
    seq_runs = list(seq_runs or ["base", *[f"seq_{d}" for d in curriculum]])
    data = FinalData(seeds=sorted(int(s) for s in seed_dirs), curriculum=curriculum, seq_runs=seq_runs,
                     final_run=seq_runs[-1], study=paper_results())
    runs = list(dict.fromkeys([*seq_runs, *[f"oracle_{d}" for d in curriculum], *CONSOLIDATIONS, *MLE_RUNS,
                               *extra_runs]))
    for run in runs:
        for seed in data.seeds:
            m = _read_json(Path(seed_dirs[seed]) / run / "eval" / "metrics.json")
            if m is not None and isinstance(m.get("scores"), dict):
                data.scores.setdefault(run, {})[seed] = m["scores"]
                data.eval_dirs.setdefault(run, {})[seed] = Path(seed_dirs[seed]) / run / "eval"
                if isinstance(m.get("n_tasks"), dict):
                    data.tasks.setdefault(run, {})[seed] = m["n_tasks"]
                if m.get("k") is not None or m.get("k_by_benchmark") is not None:
                    # each benchmark's own k (acl_lib.noise.samples_per_task); one number when they are all equal
                    ks = {b: samples_per_task(m, b) for b in m["scores"]}
                    data.samples.setdefault(run, {})[seed] = (next(iter(set(ks.values())))
                                                              if len(set(ks.values())) == 1 else ks)
            else:
                data.missing.setdefault(run, []).append(seed)
    for name, rel in DIAG_FILES.items():
        for seed in data.seeds:
            d = _read_json(Path(seed_dirs[seed]) / rel)
            if d is not None:
                data.diagnostics.setdefault(name, {})[seed] = d
            else:
                data.missing.setdefault(rel, []).append(seed)
    return data


def collect_profile(profile: str, seeds, overrides: Sequence[str] = ()) -> FinalData:
    """:func:`collect` over the run store of ``profile`` for ``seeds`` (one seed: what a stage or diagnostics
    notebook judges its findings on), with the curriculum and the sequence's run names its config gives."""
    seeds = parse_seeds(seeds)
    cfg = load_config(profile, list(overrides), seed=seeds[0])
    return collect(seed_dirs(profile, seeds, overrides), cfg.pipeline.curriculum, checkpoint_names(cfg, oracles=False))


# --- statistics -----------------------------------------------------------------------------------------------


def has_value(x) -> bool:
    """Whether ``x`` is a number (not None, not NaN)."""
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def summarize(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """``(mean, std, n)`` over the values present; std is the sample std (0.0 with one value), None without any."""
    xs = [float(v) for v in values if has_value(v)]
    if not xs:
        return None, None, 0
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0), len(xs)


def fmt(mean: float | None, std: float | None = None, n: int | None = None, digits: int = 1) -> str:
    """``"12.3 ± 1.0"`` (``"-"`` when absent; no spread shown with one seed)."""
    if mean is None:
        return "-"
    if std is None or (n is not None and n < 2):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def aggregate(per_seed: Mapping[int, Mapping[str, float]], benchmarks: Sequence[str] | None = None) -> dict:
    """``{benchmark: (mean, std, n)}`` over seeds of one run's per-seed scores."""
    benchmarks = list(benchmarks or BENCH_ORDER)
    return {b: summarize([s.get(b) for s in per_seed.values()]) for b in benchmarks}


# --- tables ---------------------------------------------------------------------------------------------------


ERRORS = {"std": "ours: mean ± sample std over seeds (no spread shown with one seed)",
          "se": "ours: mean ± standard error over seeds (acl_lib.noise: each seed's standard error clustered by task "
                "from its records, the binomial one of n_tasks x k where a run has none, combined with the spread "
                "over seeds)"}


def fmt_estimate(est: Estimate | None, digits: int = 1) -> str:
    """``"12.3 ± 4.5"``: an estimate and its combined standard error; ``"-"`` without one, the value alone where
    nothing gives it an error (one seed whose task count is unknown)."""
    if est is None:
        return "-"
    if est.sampling is None and est.seeds < 2:
        return f"{est.value:.{digits}f}"
    return est.fmt(digits)


def _score_frame(data: FinalData, rows: Sequence[tuple[str, str]], study: Mapping[str, Mapping],
                 benchmarks: Sequence[str], means: bool = False, error: str = "std"):
    """One row per (label, run); per benchmark the columns ``ours`` and ``study``; ``seeds`` is how many seeds
    have the run. ``means``: add the in-domain and OOD means of the benchmarks shown. ``error``: what follows the
    ± of ours (:data:`ERRORS`): ``std``, the spread over seeds, or ``se``, the combined standard error
    (:meth:`FinalData.estimate`; a suite's mean: :func:`acl_lib.noise.mean_of` of its benchmarks')."""
    import pandas as pd

    if error not in ERRORS:
        raise ValueError(f"error must be one of {sorted(ERRORS)}, got {error!r}")
    out = []
    for label, run in rows:
        per = data.row(run)
        agg = aggregate(per, benchmarks)
        theirs = study.get(label) or study.get(run) or {}
        rec = {("seeds", ""): len(per)}
        for b in benchmarks:
            rec[(b, "ours")] = fmt(*agg[b]) if error == "std" else fmt_estimate(data.estimate(run, b))
            v = theirs.get(b)
            rec[(b, "study")] = "" if v is None else f"{v:.1f}"
        if means:
            for suite, bs in (("in-domain mean", [b for b in benchmarks if b in IN_DOMAIN_BENCHMARKS]),
                              ("OOD mean", [b for b in benchmarks if b in OOD_BENCHMARKS])):
                if not bs:
                    continue
                if error == "std":
                    per_seed = [statistics.fmean(s[b] for b in bs) for s in per.values()
                                if all(has_value(s.get(b)) for b in bs)]
                    rec[(suite, "ours")] = fmt(*summarize(per_seed))
                else:
                    ests = [data.estimate(run, b) for b in bs]
                    rec[(suite, "ours")] = fmt_estimate(mean_of(ests) if all(ests) else None)
                sv = [theirs.get(b) for b in bs]
                rec[(suite, "study")] = f"{statistics.fmean(sv):.1f}" if all(has_value(v) for v in sv) else ""
        out.append(pd.Series(rec, name=label))
    frame = pd.DataFrame(out)
    if len(frame.columns):
        frame.columns = pd.MultiIndex.from_tuples(frame.columns, names=["benchmark", ""])
    frame.attrs["error"] = ERRORS[error]
    return frame.rename_axis("checkpoint")


def trajectory_frame(data: FinalData, benchmarks: Sequence[str] | None = None, error: str = "std"):
    """The sequential trajectory: base and every stage (rows, curriculum order) on every benchmark, mean ± std
    over seeds (``error="se"``: mean ± combined standard error), beside the study's ``sequential`` rows (the
    study's order is math, search, ecom, if: its rows are matched by name, so another curriculum order shows no
    study figures)."""
    rows = [(r, r) for r in data.seq_runs]
    return _score_frame(data, rows, data.study.get("sequential", {}), benchmarks or BENCH_ORDER, error=error)


def lifts_frame(data: FinalData):
    """Each stage and each oracle on its own in-domain benchmark against the checkpoint it started from (a
    stage: the stage before it, the first one the base; an oracle: the base), per seed, with the mean and the
    smallest lift over the seeds that have both. Rows in curriculum order, stages first; a run or a start missing
    at a seed leaves that seed's cell empty (NaN)."""
    import pandas as pd

    rows = []
    starts = [(run, prev, d) for prev, run, d in zip(data.seq_runs, data.seq_runs[1:], data.curriculum)]
    starts += [(f"oracle_{d}", data.seq_runs[0], d) for d in data.curriculum]
    for run, start, d in starts:
        b = IN_DOMAIN[d]
        rec = {"run": run, "from": start, "benchmark": b}
        lifts = []
        for seed in data.seeds:
            after, before = data.row(run).get(seed, {}).get(b), data.row(start).get(seed, {}).get(b)
            lift = after - before if has_value(after) and has_value(before) else float("nan")
            rec[f"seed {seed}"] = lift
            lifts.append(lift)
        known = [x for x in lifts if x == x]
        rec["mean"] = sum(known) / len(known) if known else float("nan")
        rec["smallest"] = min(known) if known else float("nan")
        rows.append(rec)
    return pd.DataFrame(rows).set_index("run")


def main_rows(data: FinalData) -> list[tuple[str, str]]:
    """The main table's rows in the study's layout: oracles, seq_final, MMOPD, SDFT, the merges, MLE."""
    return [*[(o, o) for o in data.oracles], ("seq_final", data.final_run), ("mmopd", "mmopd"), ("sdft", "sdft"),
            *[(m, m) for m in MERGES], *[(m, m) for m in MLE_RUNS]]


def main_frame(data: FinalData, suite: str = "in_domain", include_missing: bool = False, error: str = "std"):
    """The main comparison, ``suite`` ``in_domain`` or ``ood`` columns, mean ± std over seeds (``error="se"``:
    mean ± combined standard error) beside the study's ``main_table``; with the suite's mean column. Rows without
    any evaluation are left out unless ``include_missing`` (they are listed by :func:`missing_frame`)."""
    bs = IN_DOMAIN_BENCHMARKS if suite == "in_domain" else OOD_BENCHMARKS
    rows = [(label, run) for label, run in main_rows(data) if include_missing or data.has(run)]
    return _score_frame(data, rows, data.study.get("main_table", {}), bs, means=True, error=error)


def missing_frame(data: FinalData):
    """What is not on disk: one row per run or diagnostics file missing for at least one seed, with the seeds
    and the notebook that writes it."""
    import pandas as pd

    rows = []
    for what, seeds in data.missing.items():
        rows.append({"missing": what, "seeds": ", ".join(map(str, seeds)), "written by": notebook_of(what),
                     "present for": ", ".join(str(s) for s in data.seeds if s not in seeds) or "none"})
    return pd.DataFrame(rows, columns=["missing", "seeds", "present for", "written by"]).set_index("missing")


CL_KEYS = [("average_accuracy", "average accuracy"), ("backward_transfer", "backward transfer"),
           ("forward_transfer", "forward transfer (vs base)"), ("mean_forgetting", "mean forgetting")]


def cl_per_seed(data: FinalData) -> dict[int, dict]:
    """Each seed's continual-learning metrics (``cl_metrics.json`` ``ours``); where the file is missing but the
    sequence was scored, computed from the scores with the same function (``diagnostics.cl_metrics``)."""
    benchmarks = [IN_DOMAIN[d] for d in data.curriculum]
    out = {}
    for seed in data.seeds:
        d = (data.diagnostics.get("cl_metrics") or {}).get(seed)
        if d is not None and "ours" in d:
            out[seed] = {**d["ours"], "source": "cl_metrics.json"}
            continue
        scores = {r: per[seed] for r, per in data.scores.items() if seed in per}
        if all(r in scores for r in data.seq_runs):
            R, b = capability_matrix(scores, data.seq_runs[1:], benchmarks)
            out[seed] = {**cl_metrics(R, b, benchmarks), "source": "metrics.json"}
    return out


STUDY_DERIVED = "derived from the study's table"  # a figure the suite computed from the study's numbers
STUDY_DERIVED_COLUMN = "study (derived)"


def study_cl(data: FinalData) -> dict:
    """The continual-learning metrics of the study's trajectory (``sequential``), computed by the suite with the
    weight diagnostics' function (``diagnostics.cl_metrics``): the study reports none of them (BWT -10.6 and mean
    forgetting 10.6 are :data:`STUDY_DERIVED`)."""
    benchmarks = [IN_DOMAIN[d] for d in data.curriculum]
    R, b = capability_matrix(data.study.get("sequential", {}), [f"seq_{d}" for d in data.curriculum], benchmarks)
    return cl_metrics(R, b, benchmarks)


def cl_frame(data: FinalData):
    """The continual-learning metrics, mean ± std over seeds (and each seed's value), beside the same metrics
    computed from the study's trajectory (column ``study (derived)``: the study does not report them)."""
    import pandas as pd

    per = cl_per_seed(data)
    theirs = study_cl(data)
    rows = []
    keys = [(k, label, lambda m, k=k: m.get(k), theirs.get(k)) for k, label in CL_KEYS]
    keys += [(f"forgetting:{b}", f"forgetting: {b}", lambda m, b=b: (m.get("forgetting") or {}).get(b),
              theirs["forgetting"].get(b)) for b in [IN_DOMAIN[d] for d in data.curriculum[:-1]]]
    for _, label, get, study_v in keys:
        vals = {s: get(m) for s, m in per.items()}
        rec = {"metric": label, "ours": fmt(*summarize(list(vals.values()))),
               STUDY_DERIVED_COLUMN: "" if study_v is None else f"{study_v:.1f}"}
        for s in data.seeds:
            v = vals.get(s)
            rec[f"seed {s}"] = "-" if not has_value(v) else f"{v:.1f}"
        rows.append(rec)
    frame = pd.DataFrame(rows).set_index("metric")
    frame.attrs["sources"] = {s: m["source"] for s, m in per.items()}
    frame.attrs["note"] = f"{STUDY_DERIVED_COLUMN}: {STUDY_DERIVED} (the study reports none of these metrics)"
    return frame


# --- figures ----------------------------------------------------------------------------------------------------


def seeds_trajectory_figure(data: FinalData, benchmarks: Sequence[str] | None = None):
    """:func:`acl_lib.views.trajectory_figure` of the seeds: per benchmark, the mean over seeds along the sequence
    with ± std error bars (ours) and the study's ``sequential`` figures (dashed)."""
    benchmarks = list(benchmarks or BENCH_ORDER)
    agg = {run: aggregate(data.row(run), benchmarks) for run in data.seq_runs}
    means = {run: {b: a[b][0] for b in benchmarks} for run, a in agg.items()}
    spread = {run: {b: a[b][1] for b in benchmarks} for run, a in agg.items()}
    return trajectory_figure(means, data.study.get("sequential", {}), benchmarks, spread=spread,
                             title=f"The sequential trajectory over {len(data.seeds)} seed(s): ours vs the study")


def main_figure(data: FinalData, benchmarks: Sequence[str] | None = None):
    """The main table as bars: one panel per benchmark (in-domain by default), a bar per row (mean ± std) and a
    diamond where the study reports that row."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    benchmarks = list(benchmarks or IN_DOMAIN_BENCHMARKS)
    rows = [(label, run) for label, run in main_rows(data) if data.has(run)]
    study = data.study.get("main_table", {})
    fig = make_subplots(rows=1, cols=len(benchmarks), subplot_titles=benchmarks, shared_yaxes=True)
    palette = qualitative.Plotly + qualitative.D3
    for i, b in enumerate(benchmarks):
        for j, (label, run) in enumerate(rows):
            m, sd, _ = summarize([s.get(b) for s in data.row(run).values()])
            fig.add_trace(go.Bar(x=[label], y=[m], name=label, marker_color=palette[j % len(palette)],
                                 error_y={"type": "data", "array": [sd or 0.0]}, legendgroup=label,
                                 showlegend=i == 0), row=1, col=i + 1)
            theirs = (study.get(label) or {}).get(b)
            if theirs is not None:
                fig.add_trace(go.Scatter(x=[label], y=[theirs], mode="markers", showlegend=False, name="study",
                                         marker={"symbol": "diamond", "size": 9, "color": "black"}), row=1, col=i + 1)
        fig.update_xaxes(showticklabels=False, row=1, col=i + 1)
        fig.update_yaxes(range=[0, 105], row=1, col=i + 1)
    fig.update_layout(title="Main table, in-domain (bars: ours, mean ± std over seeds; diamonds: the study)",
                      height=420, barmode="group")
    return fig

