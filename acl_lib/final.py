"""Notebook 12: the study's tables over several training seeds, the findings verdict, and a report in one HTML file.

Everything here reads files of the run store and nothing else:

* scores: ``<output_dir>/<profile>/seed<k>/<run>/eval/metrics.json`` (key ``scores``, percent per benchmark);
* diagnostics: ``<seed_dir>/diagnostics/{weights,tokens,cl_metrics}.json`` (notebooks 06 and 07);
* run configs: ``<run>/config.yaml`` (written by the run store), executed notebooks under
  ``<papermill_dir>/<profile>/seed<k>/``.

A run or a diagnostics file that is not on disk for a seed is *reported* (``missing``), never an error: a
reader who ran a subset of the notebooks gets the tables of what is there and the list of what is not.

Means and spreads: ``mean`` over the seeds that have the value, ``std`` the sample standard deviation
(``ddof=1``) over them, 0.0 with a single seed (no spread can be measured from one seed; the findings' rules
then compare the mean alone and say so).

Public entry points: :func:`seed_dirs`, :func:`collect` (-> :class:`FinalData`), :func:`trajectory_frame`,
:func:`main_frame`, :func:`cl_frame`, :func:`missing_frame`, :func:`findings`, :func:`findings_frame`,
:func:`trajectory_figure`, :func:`main_figure`, :func:`write_report`; the rules themselves are ``rule_f1`` ...
``rule_f8`` (each takes a :class:`FinalData` and returns one findings row).
"""

from __future__ import annotations

import html
import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from acl_lib.envs import BENCHMARKS, IN_DOMAIN

BENCH_ORDER = list(BENCHMARKS)
IN_DOMAIN_BENCHMARKS = [b for b in BENCH_ORDER if BENCHMARKS[b].suite == "in_domain"]
OOD_BENCHMARKS = [b for b in BENCH_ORDER if BENCHMARKS[b].suite == "ood"]
DIAG_FILES = ("weights", "tokens", "cl_metrics")
MERGES = ("merge_uniform", "merge_grid", "merge_balanced", "merge_ties", "merge_dare", "merge_oracles")
# Shared-weight consolidations (F6, F8): distillation, self-distillation, the merges. MLE keeps one expert per
# domain, so it is not one of them.
CONSOLIDATIONS = ("mmopd", "sdft", *MERGES)
MLE_RUNS = ("mle", "mle_learned")
REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE = "reproduced", "not reproduced", "not testable at this scale"

# Thresholds of the rules (written beside each verdict).
F3_STABLE_MIN = 0.8  # low-entropy positions that keep the reference's top-1 token: "stable" from this fraction
F4_NEAR_ZERO = 0.1  # |cosine| of unrelated oracle task vectors counted as "near 0"
F7_POINTS = 5.0  # "within a few points": score points (percent)


# --- reading the store ---------------------------------------------------------------------------------------


def parse_seeds(seeds) -> list[int]:
    """A list of seeds from a list, an int, or text (``"[0, 1, 2]"``, ``"0 1 2"``: what ``papermill -p`` passes)."""
    if isinstance(seeds, str):
        import yaml

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
    from acl_lib.config import load_config

    return {s: load_config(profile, list(overrides), seed=s).seed_dir() for s in parse_seeds(seeds)}


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


@dataclass
class FinalData:
    """What notebook 12 reads, per seed. ``scores[run][seed] = {benchmark: %}``; ``diagnostics[name][seed]`` the
    parsed JSON; ``missing`` ``{what: [seeds without it]}`` for every run and diagnostics file asked for."""

    seeds: list[int]
    curriculum: list[str]
    seq_runs: list[str]  # base, then the curriculum's stages in order (the run store's names)
    final_run: str  # the last stage's run name; its rows are called seq_final in the main table
    scores: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    diagnostics: dict[str, dict[int, dict]] = field(default_factory=dict)
    missing: dict[str, list[int]] = field(default_factory=dict)
    study: dict = field(default_factory=dict)

    @property
    def oracles(self) -> list[str]:
        return [f"oracle_{d}" for d in self.curriculum]

    def row(self, run: str) -> dict[int, dict[str, float]]:
        """Per-seed scores of a run; ``seq_final`` is the last stage."""
        return self.scores.get(self.final_run if run == "seq_final" else run, {})

    def has(self, run: str) -> bool:
        return bool(self.row(run))

    def mean(self, run: str, benchmark: str) -> float | None:
        return summarize([s.get(benchmark) for s in self.row(run).values()])[0]


def collect(seed_dirs: Mapping[int, str | Path], curriculum: Sequence[str] = ("math", "search", "ecom", "if"),
            seq_runs: Sequence[str] | None = None, extra_runs: Sequence[str] = ()) -> FinalData:
    """Read every run's scores and the diagnostics of each seed.

    ``seq_runs``: base and the stages in curriculum order (default: the study's names, ``seq_<domain>``; pass
    ``[r.name for r in ...]`` from ``pipeline.checkpoint_names(cfg, oracles=False)`` for another order)."""
    from acl_lib.report import paper_results

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
            else:
                data.missing.setdefault(run, []).append(seed)
    for name in DIAG_FILES:
        for seed in data.seeds:
            d = _read_json(Path(seed_dirs[seed]) / "diagnostics" / f"{name}.json")
            if d is not None:
                data.diagnostics.setdefault(name, {})[seed] = d
            else:
                data.missing.setdefault(f"diagnostics/{name}.json", []).append(seed)
    return data


# --- statistics -----------------------------------------------------------------------------------------------


def _ok(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def summarize(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """``(mean, std, n)`` over the values present; std is the sample std (0.0 with one value), None without any."""
    xs = [float(v) for v in values if _ok(v)]
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


def _fmt_study(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (list, tuple)):
        return " to ".join(f"{x:g}" for x in v)
    return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"


def aggregate(per_seed: Mapping[int, Mapping[str, float]], benchmarks: Sequence[str] | None = None) -> dict:
    """``{benchmark: (mean, std, n)}`` over seeds of one run's per-seed scores."""
    benchmarks = list(benchmarks or BENCH_ORDER)
    return {b: summarize([s.get(b) for s in per_seed.values()]) for b in benchmarks}


# --- tables ---------------------------------------------------------------------------------------------------


def _score_frame(data: FinalData, rows: Sequence[tuple[str, str]], study: Mapping[str, Mapping],
                 benchmarks: Sequence[str], means: bool = False):
    """One row per (label, run); per benchmark the columns ``ours`` (mean ± std) and ``study``; ``seeds`` is how
    many seeds have the run. ``means``: add the in-domain and OOD means of the benchmarks shown."""
    import pandas as pd

    out = []
    for label, run in rows:
        per = data.row(run)
        agg = aggregate(per, benchmarks)
        theirs = study.get(label) or study.get(run) or {}
        rec = {("seeds", ""): len(per)}
        for b in benchmarks:
            rec[(b, "ours")] = fmt(*agg[b])
            v = theirs.get(b)
            rec[(b, "study")] = "" if v is None else f"{v:.1f}"
        if means:
            for suite, bs in (("in-domain mean", [b for b in benchmarks if b in IN_DOMAIN_BENCHMARKS]),
                              ("OOD mean", [b for b in benchmarks if b in OOD_BENCHMARKS])):
                if not bs:
                    continue
                per_seed = [statistics.fmean(s[b] for b in bs) for s in per.values() if all(_ok(s.get(b)) for b in bs)]
                rec[(suite, "ours")] = fmt(*summarize(per_seed))
                sv = [theirs.get(b) for b in bs]
                rec[(suite, "study")] = f"{statistics.fmean(sv):.1f}" if all(_ok(v) for v in sv) else ""
        out.append(pd.Series(rec, name=label))
    frame = pd.DataFrame(out)
    if len(frame.columns):
        frame.columns = pd.MultiIndex.from_tuples(frame.columns, names=["benchmark", ""])
    return frame.rename_axis("checkpoint")


def trajectory_frame(data: FinalData, benchmarks: Sequence[str] | None = None):
    """The sequential trajectory: base and every stage (rows, curriculum order) on every benchmark, mean ± std
    over seeds, beside the study's ``sequential`` rows (the study's order is math, search, ecom, if: its rows are
    matched by name, so another curriculum order shows no study figures)."""
    rows = [(r, r) for r in data.seq_runs]
    return _score_frame(data, rows, data.study.get("sequential", {}), benchmarks or BENCH_ORDER)


def main_rows(data: FinalData) -> list[tuple[str, str]]:
    """The main table's rows in the study's layout: oracles, seq_final, MMOPD, SDFT, the merges, MLE."""
    return [*[(o, o) for o in data.oracles], ("seq_final", data.final_run), ("mmopd", "mmopd"), ("sdft", "sdft"),
            *[(m, m) for m in MERGES], *[(m, m) for m in MLE_RUNS]]


def main_frame(data: FinalData, suite: str = "in_domain", include_missing: bool = False):
    """The main comparison, ``suite`` ``in_domain`` or ``ood`` columns, mean ± std over seeds beside the study's
    ``main_table``; with the suite's mean column. Rows without any evaluation are left out unless
    ``include_missing`` (they are listed by :func:`missing_frame`)."""
    bs = IN_DOMAIN_BENCHMARKS if suite == "in_domain" else OOD_BENCHMARKS
    rows = [(label, run) for label, run in main_rows(data) if include_missing or data.has(run)]
    return _score_frame(data, rows, data.study.get("main_table", {}), bs, means=True)


def missing_frame(data: FinalData):
    """What is not on disk: one row per run or diagnostics file missing for at least one seed, with the seeds
    and the notebook that writes it."""
    import pandas as pd

    rows = []
    for what, seeds in data.missing.items():
        rows.append({"missing": what, "seeds": ", ".join(map(str, seeds)), "written by": written_by(what),
                     "present for": ", ".join(str(s) for s in data.seeds if s not in seeds) or "none"})
    return pd.DataFrame(rows, columns=["missing", "seeds", "present for", "written by"]).set_index("missing")


def written_by(what: str) -> str:
    """The notebook that writes a run or a diagnostics file (for the missing list)."""
    if what == "base":
        return "00"
    if what.startswith("seq_") or what.startswith("seq"):
        return "01-04"
    if what.startswith("oracle_"):
        return "05"
    if what in ("diagnostics/weights.json", "diagnostics/cl_metrics.json"):
        return "06"
    if what == "diagnostics/tokens.json":
        return "07"
    if what.startswith("mmopd"):
        return "08"
    if what.startswith("sdft"):
        return "09"
    if what.startswith("merge_"):
        return "10"
    if what.startswith("mle"):
        return "11"
    return ""


CL_KEYS = [("average_accuracy", "average accuracy"), ("backward_transfer", "backward transfer"),
           ("forward_transfer", "forward transfer (vs base)"), ("mean_forgetting", "mean forgetting")]


def cl_per_seed(data: FinalData) -> dict[int, dict]:
    """Each seed's continual-learning metrics (``cl_metrics.json`` ``ours``); where the file is missing but the
    sequence was scored, computed from the scores with the same function (``diagnostics.cl_metrics``)."""
    from acl_lib.diagnostics.cl_metrics import capability_matrix, cl_metrics

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


def study_cl(data: FinalData) -> dict:
    """The study's metrics over its trajectory (``sequential``), as notebook 06 computes them."""
    from acl_lib.diagnostics.cl_metrics import capability_matrix, cl_metrics

    benchmarks = [IN_DOMAIN[d] for d in data.curriculum]
    R, b = capability_matrix(data.study.get("sequential", {}), [f"seq_{d}" for d in data.curriculum], benchmarks)
    return cl_metrics(R, b, benchmarks)


def cl_frame(data: FinalData):
    """The continual-learning metrics, mean ± std over seeds (and each seed's value), beside the study's."""
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
               "study": "" if study_v is None else f"{study_v:.1f}"}
        for s in data.seeds:
            v = vals.get(s)
            rec[f"seed {s}"] = "-" if not _ok(v) else f"{v:.1f}"
        rows.append(rec)
    frame = pd.DataFrame(rows).set_index("metric")
    frame.attrs["sources"] = {s: m["source"] for s, m in per.items()}
    return frame


# --- findings ---------------------------------------------------------------------------------------------------


def _finding(fid: str, data: FinalData, quantity: str, ours: str, study: str, verdict: str, rule: str,
             detail: str = "") -> dict:
    claims = {f["id"]: f["claim"] for f in data.study.get("findings", [])}
    return {"finding": fid, "claim": claims.get(fid, ""), "quantity": quantity, "ours": ours, "study": study,
            "verdict": verdict, "rule": rule, "detail": detail}


def _missing(data: FinalData, runs: Sequence[str]) -> list[str]:
    return [r for r in runs if not data.has(r)]


def _complete_seeds(data: FinalData, runs: Sequence[str]) -> list[int]:
    return [s for s in data.seeds if all(s in data.row(r) for r in runs)]


def rule_f1(data: FinalData) -> dict:
    """F1: forgetting of the earlier domains. Per seed, for each domain trained before the last stage whose
    benchmark rose (its best score along the sequence before the last stage above the base's), forgetting =
    that best score minus the final score; the seed's value is their mean. Reproduced when the mean over seeds
    exceeds the seed spread (mean > std; std 0 with one seed)."""
    rule = "mean forgetting of the earlier domains that rose > std over seeds"
    quantity = "mean forgetting of earlier domains (best earlier score - final, points)"
    theirs = study_cl(data).get("mean_forgetting")
    study = _fmt_study(theirs)
    seeds = _complete_seeds(data, data.seq_runs)
    if not seeds:
        return _finding("F1", data, quantity, "-", study, NOT_TESTABLE, rule,
                        f"runs missing: {', '.join(_missing(data, data.seq_runs)) or 'a complete sequence in one seed'}")
    per_seed, rose = [], set()
    for s in seeds:
        vals = []
        for d in data.curriculum[:-1]:
            b = IN_DOMAIN[d]
            base = data.row("base")[s].get(b) or 0.0
            earlier = [data.row(r)[s].get(b) for r in data.seq_runs[1:-1] if _ok(data.row(r)[s].get(b))]
            if not earlier or max(earlier) <= base:
                continue
            rose.add(d)
            vals.append(max(earlier) - (data.row(data.final_run)[s].get(b) or 0.0))
        if vals:
            per_seed.append(statistics.fmean(vals))
    never_rose = [d for d in data.curriculum[:-1] if d not in rose]
    if not per_seed:
        return _finding("F1", data, quantity, "-", study, NOT_TESTABLE, rule,
                        f"no earlier domain rose above the base ({', '.join(never_rose)}): nothing to forget")
    mean, std, n = summarize(per_seed)
    verdict = REPRODUCED if mean > std else NOT_REPRODUCED
    detail = (f"{n} seed(s) where an earlier domain rose"
              + (f"; never rose in any seed, left out: {', '.join(never_rose)}" if never_rose else ""))
    return _finding("F1", data, quantity, fmt(mean, std, n), study, verdict, rule, detail)


def stage_drops(scores: Mapping[str, Mapping[str, float]], seq_runs: Sequence[str],
                curriculum: Sequence[str]) -> dict[str, float]:
    """``{domain: drop}``: what each stage cost math and search, the mean over aime26 and nq (the stage's own
    benchmark left out) of the score before the stage minus after it (positive: a loss)."""
    out = {}
    for i, d in enumerate(curriculum, 1):
        before, after = scores.get(seq_runs[i - 1]), scores.get(seq_runs[i])
        bs = [IN_DOMAIN[x] for x in ("math", "search") if x != d]
        if not before or not after or not all(_ok(before.get(b)) and _ok(after.get(b)) for b in bs):
            continue
        out[d] = statistics.fmean(before[b] - after[b] for b in bs)
    return out


def rule_f2(data: FinalData) -> dict:
    """F2: the e-commerce stage's drop on math + search is the largest of the stages (mean over seeds)."""
    rule = "the ecom stage's mean drop on math+search (aime26, nq; a stage's own benchmark left out) is the largest of the stages and > 0"
    quantity = "drop on math+search caused by each stage (before - after, points)"
    theirs = stage_drops(data.study.get("sequential", {}), ["base", *[f"seq_{d}" for d in data.curriculum]],
                         data.curriculum)
    study = ", ".join(f"{d} {v:+.1f}" for d, v in theirs.items())
    seeds = _complete_seeds(data, data.seq_runs)
    if not seeds or "ecom" not in data.curriculum:
        return _finding("F2", data, quantity, "-", study, NOT_TESTABLE, rule,
                        f"runs missing: {', '.join(_missing(data, data.seq_runs))}")
    rose = [b for b in ("aime26", "nq")
            if max((data.mean(r, b) or 0.0) for r in data.seq_runs[1:]) > (data.mean("base", b) or 0.0)]
    if not rose:
        return _finding("F2", data, quantity, "-", study, NOT_TESTABLE, rule,
                        "neither aime26 nor nq rose above the base along the sequence: no interference to measure")
    per = {d: [] for d in data.curriculum}
    for s in seeds:
        for d, v in stage_drops({r: data.row(r)[s] for r in data.seq_runs}, data.seq_runs, data.curriculum).items():
            per[d].append(v)
    agg = {d: summarize(v) for d, v in per.items() if v}
    ours = ", ".join(f"{d} {fmt(m, sd, n)}" for d, (m, sd, n) in agg.items())
    worst = max(agg, key=lambda d: agg[d][0])
    verdict = REPRODUCED if worst == "ecom" and agg["ecom"][0] > 0 else NOT_REPRODUCED
    return _finding("F2", data, quantity, ours, study, verdict, rule, f"largest: {worst}; {len(seeds)} seed(s)")


def _diag_values(data: FinalData, name: str, get) -> list[float]:
    vals = []
    for d in (data.diagnostics.get(name) or {}).values():
        try:
            v = get(d)
        except (KeyError, TypeError, IndexError):
            v = None
        if _ok(v):
            vals.append(float(v))
    return vals


def _mean_over_checkpoints(tokens: dict, key: str) -> float | None:
    vals = [c.get(key) for c in (tokens.get("checkpoints") or {}).values() if _ok(c.get(key))]
    return statistics.fmean(vals) if vals else None


def rule_f3(data: FinalData) -> dict:
    """F3 from ``tokens.json``: low-entropy positions keep the reference's top-1 token (``low_entropy_stable``,
    mean over the later checkpoints) and high-entropy positions change more often than low-entropy ones."""
    rule = (f"low-entropy stable fraction >= {F3_STABLE_MIN} and high-entropy positions change more often than "
            "low-entropy ones (high_entropy_consistency < low_entropy_stable), means over checkpoints and seeds")
    quantity = "low-entropy stable fraction; changed share at high-entropy positions (their share of positions)"
    st = data.study.get("diagnostics", {})
    study = (f"{_fmt_study(st.get('low_entropy_positions_stable_fraction'))}; "
             f"share {_fmt_study(st.get('high_entropy_positions_fraction'))}")
    if not data.diagnostics.get("tokens"):
        return _finding("F3", data, quantity, "-", study, NOT_TESTABLE, rule, "diagnostics/tokens.json missing (notebook 07)")
    low = summarize(_diag_values(data, "tokens", lambda d: _mean_over_checkpoints(d, "low_entropy_stable")))
    high = summarize(_diag_values(data, "tokens", lambda d: _mean_over_checkpoints(d, "high_entropy_consistency")))
    share = summarize(_diag_values(data, "tokens", lambda d: _mean_over_checkpoints(d, "changed_share_in_high_entropy")))
    frac = summarize(_diag_values(data, "tokens", lambda d: d.get("high_entropy_fraction")))
    if low[0] is None or high[0] is None:
        return _finding("F3", data, quantity, "-", study, NOT_TESTABLE, rule, "tokens.json holds no later checkpoint")
    verdict = REPRODUCED if low[0] >= F3_STABLE_MIN and high[0] < low[0] else NOT_REPRODUCED
    ours = f"{fmt(*low, digits=2)}; share {fmt(*share, digits=3)} ({fmt(*frac, digits=3)})"
    return _finding("F3", data, quantity, ours, study, verdict, rule,
                    f"high-entropy consistency {fmt(*high, digits=2)}")


def rule_f4(data: FinalData) -> dict:
    """F4 from ``weights.json``: the mean cosine between unrelated oracles' task vectors is near 0."""
    rule = f"|mean cosine of unrelated oracle task vectors| <= {F4_NEAR_ZERO}"
    quantity = "cosine between unrelated oracles' task vectors"
    study = _fmt_study(data.study.get("diagnostics", {}).get("cosine_unrelated_sft_tasks"))
    vals = _diag_values(data, "weights", lambda d: d["cosine_summary"]["unrelated_oracles"]
                        if d["cosine_summary"].get("n_unrelated") else None)
    if not vals:
        why = ("diagnostics/weights.json missing (notebook 06)" if not data.diagnostics.get("weights")
               else "weights.json has no pair of unrelated oracles")
        return _finding("F4", data, quantity, "-", study, NOT_TESTABLE, rule, why)
    mean, std, n = summarize(vals)
    return _finding("F4", data, quantity, fmt(mean, std, n, digits=3), study,
                    REPRODUCED if abs(mean) <= F4_NEAR_ZERO else NOT_REPRODUCED, rule, f"{n} seed(s)")


def rule_f5(data: FinalData) -> dict:
    """F5 from ``weights.json``: SFT / RL displacement ratio (mean over the stages that have both) > 1."""
    rule = "mean SFT/RL displacement ratio (stages with both phases) > 1 beyond the seed spread (mean - std > 1)"
    quantity = "SFT displacement / RL displacement"
    study = _fmt_study(data.study.get("diagnostics", {}).get("sft_over_rl_displacement"))

    def ratio(d):
        xs = [r["sft_over_rl"] for r in d.get("sft_vs_rl", []) if _ok(r.get("sft_over_rl"))]
        return statistics.fmean(xs) if xs else None

    vals = _diag_values(data, "weights", ratio)
    if not vals:
        why = ("diagnostics/weights.json missing (notebook 06)" if not data.diagnostics.get("weights")
               else "no stage has both an SFT and an RL displacement")
        return _finding("F5", data, quantity, "-", study, NOT_TESTABLE, rule, why)
    mean, std, n = summarize(vals)
    return _finding("F5", data, quantity, fmt(mean, std, n), study,
                    REPRODUCED if mean - std > 1 else NOT_REPRODUCED, rule, f"{n} seed(s)")


def _consolidations(data: FinalData, merges_only_agentic: bool = False) -> list[str]:
    names = [c for c in CONSOLIDATIONS if data.has(c)]
    if merges_only_agentic:
        names = [c for c in names if c != "merge_oracles"]
    return names


def rule_f6(data: FinalData) -> dict:
    """F6: every shared-weight consolidation loses at least one in-domain benchmark to seq_final or to that
    domain's oracle (means over seeds)."""
    rule = ("every consolidation (mmopd, sdft, merges) scores below seq_final or below the domain's oracle on at "
            "least one in-domain benchmark (means over seeds; benchmarks where both are 0 left out)")
    quantity = "in-domain benchmarks each consolidation loses (to seq_final / the oracle)"
    needed = ["seq_final", *data.oracles]
    cons = _consolidations(data)
    if _missing(data, needed) or not cons:
        what = _missing(data, needed) + ([] if cons else ["any of " + ", ".join(CONSOLIDATIONS)])
        return _finding("F6", data, quantity, "-", "holds (study)", NOT_TESTABLE, rule, f"runs missing: {', '.join(what)}")
    live = [d for d in data.curriculum
            if (data.mean("seq_final", IN_DOMAIN[d]) or 0.0) > 0 or (data.mean(f"oracle_{d}", IN_DOMAIN[d]) or 0.0) > 0]
    if not live:
        return _finding("F6", data, quantity, "-", "holds (study)", NOT_TESTABLE, rule,
                        "no in-domain benchmark rose above 0 (seq_final, oracles): nothing to lose")
    parts, winners = [], []
    for c in cons:
        lost = []
        for d in live:
            b = IN_DOMAIN[d]
            mc, mf, mo = data.mean(c, b), data.mean("seq_final", b), data.mean(f"oracle_{d}", b)
            if mc is None:
                continue
            who = [n for n, v in (("seq_final", mf), ("oracle", mo)) if v is not None and mc < v]
            if who:
                lost.append(f"{b} ({'/'.join(who)})")
        parts.append(f"{c}: {', '.join(lost) if lost else 'none'}")
        if not lost:
            winners.append(c)
    verdict = NOT_REPRODUCED if winners else REPRODUCED
    detail = f"wins every domain: {', '.join(winners)}" if winners else f"{len(cons)} consolidation(s)"
    return _finding("F6", data, quantity, "; ".join(parts), "holds (study)", verdict, rule, detail)


def _suite_mean(data: FinalData, run: str, bs: Sequence[str]) -> float | None:
    vals = [data.mean(run, b) for b in bs]
    return statistics.fmean(vals) if vals and all(_ok(v) for v in vals) else None


def rule_f7(data: FinalData) -> dict:
    """F7: MLE within F7_POINTS of the oracles in-domain (mean gap over the four domains) and best or within
    F7_POINTS of the best OOD mean among seq_final, the consolidations and MLE."""
    rule = (f"mean over domains of (mle - oracle) >= -{F7_POINTS:g} points in-domain, and mle's OOD mean >= the best "
            f"OOD mean of seq_final and the consolidations - {F7_POINTS:g}; not testable when every oracle scores 0")
    quantity = "mle - oracle, in-domain mean gap; mle OOD mean vs the best other"
    mt = data.study.get("main_table", {})
    gaps = [mt.get("mle", {}).get(IN_DOMAIN[d], math.nan) - mt.get(f"oracle_{d}", {}).get(IN_DOMAIN[d], math.nan)
            for d in data.curriculum]
    study = f"gap {statistics.fmean(gaps):+.1f}" if all(_ok(g) for g in gaps) else ""
    missing = _missing(data, ["mle", "seq_final", *data.oracles])
    if missing:
        return _finding("F7", data, quantity, "-", study, NOT_TESTABLE, rule, f"runs missing: {', '.join(missing)}")
    if not any((data.mean(f"oracle_{d}", IN_DOMAIN[d]) or 0.0) > 0 for d in data.curriculum):
        return _finding("F7", data, quantity, "-", study, NOT_TESTABLE, rule,
                        "no oracle rose above 0 on its own benchmark: nothing for MLE to sit next to")
    per_seed = []
    for s in _complete_seeds(data, ["mle", *data.oracles]):
        per_seed.append(statistics.fmean((data.row("mle")[s].get(IN_DOMAIN[d]) or 0.0)
                                         - (data.row(f"oracle_{d}")[s].get(IN_DOMAIN[d]) or 0.0) for d in data.curriculum))
    gap = summarize(per_seed)
    ood = {r: _suite_mean(data, r, OOD_BENCHMARKS) for r in ["seq_final", *_consolidations(data), *MLE_RUNS]
           if data.has(r)}
    ood = {r: v for r, v in ood.items() if v is not None}
    others = {r: v for r, v in ood.items() if r != "mle"}
    if gap[0] is None or "mle" not in ood:
        return _finding("F7", data, quantity, "-", study, NOT_TESTABLE, rule, "no seed has mle and every oracle")
    best_other = max(others.values()) if others else -math.inf
    ok = gap[0] >= -F7_POINTS and ood["mle"] >= best_other - F7_POINTS
    best_name = max(others, key=others.get) if others else "-"
    ours = f"gap {fmt(*gap)}; OOD {ood['mle']:.1f} vs best other {best_other:.1f} ({best_name})"
    return _finding("F7", data, quantity, ours, study, REPRODUCED if ok else NOT_REPRODUCED, rule, f"{gap[2]} seed(s)")


def rule_f8(data: FinalData) -> dict:
    """F8: merge_uniform has the lowest agentic mean (nq, retail) among the consolidations (merge_oracles left
    out, as ``consolidate.figures.merge_reading`` does), means over seeds."""
    agentic = [IN_DOMAIN["search"], IN_DOMAIN["ecom"]]
    rule = ("merge_uniform's mean of nq and retail is strictly the lowest among mmopd, sdft and the merges "
            "(merge_oracles left out); not testable when no oracle lifts nq or retail above 0")
    quantity = "agentic mean (nq, retail) of each consolidation"
    mt = data.study.get("main_table", {})
    study = ", ".join(f"{c} {statistics.fmean(mt[c][b] for b in agentic):.1f}" for c in CONSOLIDATIONS
                      if c in mt and all(b in mt[c] for b in agentic))
    cons = _consolidations(data, merges_only_agentic=True)
    if "merge_uniform" not in cons or len(cons) < 2:
        what = ["merge_uniform"] if "merge_uniform" not in cons else ["another consolidation (mmopd, sdft, merges)"]
        return _finding("F8", data, quantity, "-", study, NOT_TESTABLE, rule, f"runs missing: {', '.join(what)}")
    rose = [b for b, d in zip(agentic, ("search", "ecom")) if (data.mean(f"oracle_{d}", b) or 0.0) > 0
            or (data.mean("seq_final", b) or 0.0) > 0]
    if not rose:
        return _finding("F8", data, quantity, "-", study, NOT_TESTABLE, rule,
                        "nq and retail never rose above 0 (oracles, seq_final): no agentic skill to lose")
    means = {c: _suite_mean(data, c, agentic) for c in cons}
    means = {c: v for c, v in means.items() if v is not None}
    lowest = min(means.values())
    at_lowest = [c for c, v in means.items() if v == lowest]
    verdict = REPRODUCED if at_lowest == ["merge_uniform"] else NOT_REPRODUCED
    ours = ", ".join(f"{c} {v:.1f}" for c, v in means.items())
    detail = f"lowest: {', '.join(at_lowest)}" + (" (a tie)" if len(at_lowest) > 1 else "")
    return _finding("F8", data, quantity, ours, study, verdict, rule, detail)


RULES = (rule_f1, rule_f2, rule_f3, rule_f4, rule_f5, rule_f6, rule_f7, rule_f8)


def findings(data: FinalData) -> list[dict]:
    """One row per finding F1-F8: claim, quantity, ours (mean ± std), the study's, verdict, rule, detail."""
    return [rule(data) for rule in RULES]


def findings_frame(data: FinalData | list[dict]):
    import pandas as pd

    rows = findings(data) if isinstance(data, FinalData) else data
    return pd.DataFrame(rows).set_index("finding")


def verdict_summary(rows: list[dict]) -> str:
    """``"3 reproduced, 1 not reproduced, 4 not testable at this scale"``."""
    counts = {v: sum(r["verdict"] == v for r in rows) for v in (REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE)}
    return ", ".join(f"{n} {v}" for v, n in counts.items())


def results_markdown(data: FinalData, provenance: str = "") -> str:
    """Markdown over every seed of ``data`` (what ``tools/readme_results.py --seeds`` puts in the README): the
    trajectory and the main table in-domain (ours mean ± std, the study's figure in parentheses), the findings
    with their verdicts, and what is missing. ``provenance``: a sentence for the first paragraph (when and by
    which code the runs were made)."""
    from acl_lib.report import _md_table

    def table(frame, benchmarks):
        rows = []
        for label, rec in frame.iterrows():
            cells = [label, int(rec[("seeds", "")])]
            for b in benchmarks:
                ours, theirs = rec.get((b, "ours"), "-"), rec.get((b, "study"), "")
                cells.append(f"{ours} ({theirs})" if theirs else ours)
            rows.append(cells)
        return _md_table(["checkpoint", "seeds", *benchmarks], rows)

    out = [f"Over seeds {', '.join(map(str, data.seeds))}: mean ± sample std of each seed's score (percent), the "
           "study's figure in parentheses where it reports one." + (f" {provenance}" if provenance else ""), "",
           "The sequence, in-domain benchmarks:", "",
           table(trajectory_frame(data, IN_DOMAIN_BENCHMARKS), IN_DOMAIN_BENCHMARKS), "",
           "The main table, in-domain (out-of-domain columns are in notebook 12 and the report):", "",
           table(main_frame(data, "in_domain"), [*IN_DOMAIN_BENCHMARKS, "in-domain mean"]), ""]
    rows = findings(data)
    esc = lambda v: str(v).replace("|", "\\|")  # noqa: E731  a rule may write |cosine|
    out += [f"The study's findings, judged by notebook 12's rules ({verdict_summary(rows)}):", "",
            _md_table(["finding", "verdict", "ours", "study", "rule"],
                      [[esc(r[k]) for k in ("finding", "verdict", "ours", "study", "rule")] for r in rows])]
    if data.missing:
        out += ["", "Missing for some seeds: " + "; ".join(f"{w} (seeds {', '.join(map(str, s))})"
                                                          for w, s in data.missing.items()) + "."]
    return "\n".join(out)


# --- figures ----------------------------------------------------------------------------------------------------


def trajectory_figure(data: FinalData, benchmarks: Sequence[str] | None = None):
    """One panel per benchmark: mean over seeds along the sequence with ± std error bars (ours) and the study's
    ``sequential`` figures (dashed)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    benchmarks = list(benchmarks or BENCH_ORDER)
    runs = data.seq_runs
    study = data.study.get("sequential", {})
    cols = 4
    nrows = (len(benchmarks) + cols - 1) // cols
    fig = make_subplots(rows=nrows, cols=cols, subplot_titles=benchmarks)
    for i, b in enumerate(benchmarks):
        r, c = i // cols + 1, i % cols + 1
        agg = [summarize([s.get(b) for s in data.row(x).values()]) for x in runs]
        fig.add_trace(go.Scatter(x=runs, y=[a[0] for a in agg], mode="lines+markers", name="ours (mean ± std)",
                                 error_y={"type": "data", "array": [a[1] or 0.0 for a in agg], "visible": True},
                                 line={"color": "#1f77b4"}, showlegend=i == 0, legendgroup="ours"), row=r, col=c)
        theirs = [(study.get(x) or {}).get(b) for x in runs]
        if any(v is not None for v in theirs):
            fig.add_trace(go.Scatter(x=runs, y=theirs, mode="lines+markers", name="study", connectgaps=True,
                                     line={"color": "#d62728", "dash": "dash"}, showlegend=i == 0 or None,
                                     legendgroup="study"), row=r, col=c)
        fig.update_yaxes(range=[0, 105], row=r, col=c)
    fig.update_layout(title=f"The sequential trajectory over {len(data.seeds)} seed(s): ours vs the study",
                      height=280 * nrows + 80)
    return fig


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


# --- the HTML report ----------------------------------------------------------------------------------------------


def report_path(output_dir: str | Path, profile: str) -> Path:
    """``<output_dir>/<profile>/report.html``."""
    return Path(output_dir) / profile / "report.html"


def run_configs(seed_dirs: Mapping[int, str | Path]) -> dict[int, dict[str, str]]:
    """``{seed: {run: config.yaml text}}`` for every run directory of each seed (nested evaluation runs included;
    superseded runs and trainer checkpoints left out)."""
    from acl_lib.runs import CONFIG, SUPERSEDED

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


def build_report(data: FinalData, title: str, *, tables: Mapping[str, tuple[str, object]] | None = None,
                 figures: Sequence[object] = (), configs: Mapping[int, Mapping[str, str]] | None = None,
                 notebooks: Mapping[str, Sequence[Path]] | None = None, where: Path | None = None,
                 intro: str = "") -> str:
    """The report as one HTML document: ``tables`` ``{id: (heading, DataFrame)}`` (default: trajectory, main
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
    for tid, (heading, frame) in tables.items():
        parts.append(f"<h2 id='h-{tid}'>{html.escape(heading)}</h2>")
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
                             f"{html.escape(head.lstrip('# '))}</span></summary><pre>{html.escape(text)}</pre></details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def default_tables(data: FinalData) -> dict:
    return {
        "findings": ("Findings F1-F8: verdicts computed from the numbers", findings_frame(data)),
        "trajectory": ("The sequential trajectory", trajectory_frame(data)),
        "main-in-domain": ("Main table, in-domain", main_frame(data, "in_domain")),
        "main-ood": ("Main table, out of domain", main_frame(data, "ood")),
        "cl-metrics": ("Continual-learning metrics", cl_frame(data)),
        "missing": ("Missing runs and diagnostics", missing_frame(data)),
    }


def write_report(profile: str, seeds: Sequence[int], overrides: Sequence[str] = (), path: str | Path | None = None) -> Path:
    """Collect the store of ``profile`` over ``seeds`` and write ``<output_dir>/<profile>/report.html`` (or
    ``path``); returns the file. What ``acl report`` and notebook 12's last cell call."""
    from acl_lib.atomic import atomic_write_text
    from acl_lib.config import load_config, project_root
    from acl_lib.pipeline import checkpoint_names

    seeds = parse_seeds(seeds)
    cfg = load_config(profile, list(overrides), seed=seeds[0])
    dirs = seed_dirs(profile, seeds, overrides)
    data = collect(dirs, cfg.pipeline.curriculum, checkpoint_names(cfg, oracles=False))
    out = Path(path) if path else dirs[seeds[0]].parent / "report.html"
    pm = Path(cfg.papermill_dir)
    pm = pm if pm.is_absolute() else project_root() / pm
    doc = build_report(
        data, f"ACLArena suite: final report (profile {profile}, seeds {', '.join(map(str, data.seeds))})",
        figures=[trajectory_figure(data), main_figure(data)], configs=run_configs(dirs),
        notebooks=executed_notebooks(pm, profile, data.seeds), where=out.parent,
        intro="Built from the run store only (metrics.json of every run, diagnostics/*.json); open it in any browser.")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, doc)
    out.chmod(0o644)
    return out
