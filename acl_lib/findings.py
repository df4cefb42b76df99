"""The study's eight findings (F1-F8), each judged by a rule that can fail: the one place a verdict is computed.

Each rule is a function of :class:`acl_lib.final.FinalData` (one seed or several), registered with the finding's
claim and the rule in words beside it (:func:`finding`). It returns one row: the finding, its claim, the rule, the
quantity measured, ours (``value ± SE``: the combined standard error of :mod:`acl_lib.noise`), the study's (marked
:data:`acl_lib.final.STUDY_DERIVED` where the suite computed it from the study's table), the verdict
(:data:`REPRODUCED`, :data:`NOT_REPRODUCED`, or :data:`NOT_TESTABLE` when the runs or diagnostics a rule needs are
not there, or show nothing to test), a detail saying what the rule saw, and the numbers as JSON (``values``).

Every comparison of two numbers goes through :class:`acl_lib.noise.Estimate`: "beyond noise" means more than
``noise.BEYOND`` (2) combined standard errors apart. :func:`judge` applies the rules; the stage and diagnostics
notebooks show the verdicts of their findings on one seed with :func:`verdicts_markdown`, the final-tables notebook
over every seed, and writes them with :func:`write_findings` (``outputs/<profile>/findings.json``); ``acl report``
and the README's results show :func:`findings_frame` and :func:`judge`'s rows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from acl_lib.atomic import jsonable, write_json
from acl_lib.envs import IN_DOMAIN
from acl_lib.final import CONSOLIDATIONS, MERGES, STUDY_DERIVED, FinalData, has_value
from acl_lib.noise import BEYOND, FORMULA, Estimate, mean_of

REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE = "reproduced", "not reproduced", "not testable"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE)

# Thresholds of the rules (each written into its rule's text).
F3_LOW_STABLE_MIN = 0.9  # low-entropy positions that still rank the rollout's token first: "stay put" from here
F3_CONCENTRATION = 2.0  # changed positions' high-entropy share >= this x the high-entropy share of all positions
F4_SAME_MIN = 0.5  # the same SFT mixture from two starts: "aligned" from this cosine (the study: 0.77)
F4_UNRELATED_MAX = 0.15  # |cosine| of unrelated SFT updates: "nearly orthogonal" up to here (the study: 0.05)
F5_RANGE = (2.0, 15.0)  # the study's 3-7x with a factor-2 margin
F7_DOMAIN_GAP = 10.0  # points: every domain within this of its oracle
F7_MEAN_GAP = 5.0  # points: the mean gap over the domains at least minus this
# The out-of-domain benchmarks on which the study names MLE best: GPQA, single-hop, multi-hop, tau-Mock.
F7_OOD = ("gpqa", "single_hop", "multi_hop", "mock")
F8_AGENTIC = ("search", "ecom")  # the agentic domains: nq and retail

NOISE_FLOOR = f"± is the combined standard error: {FORMULA}"


@dataclass(frozen=True)
class Finding:
    """A finding: its id, the study's claim, the rule that judges it (in words) and the function applying it."""

    id: str
    claim: str
    rule: str
    judge: Callable[[FinalData], dict]


RULES: dict[str, Finding] = {}


def finding(fid: str, claim: str, rule: str):
    """Register a rule function as finding ``fid``, with the study's claim and the rule in words beside it."""

    def register(fn):
        RULES[fid] = Finding(fid, claim, rule, fn)
        fn.finding = RULES[fid]
        return fn

    return register


def _row(fid: str, quantity: str, ours: str, study: str, verdict: str, detail: str = "", values: dict | None = None,
         study_values: dict | None = None, study_source: str = "reported by the study") -> dict:
    f = RULES[fid]
    if study and study_source == STUDY_DERIVED and STUDY_DERIVED not in study:
        study = f"{study} ({STUDY_DERIVED})"
    return {"finding": fid, "claim": f.claim, "rule": f.rule, "quantity": quantity, "ours": ours, "study": study,
            "study_source": study_source, "verdict": verdict, "detail": detail, "values": values or {},
            "study_values": study_values or {}}


def _missing(data: FinalData, runs: Sequence[str]) -> list[str]:
    return [r for r in runs if not data.has(r)]


def _complete_seeds(data: FinalData, runs: Sequence[str]) -> list[int]:
    return [s for s in data.seeds if all(s in data.row(r) for r in runs)]


def _e(est: Estimate | None, digits: int = 1) -> str:
    return "-" if est is None else est.fmt(digits)


def _js(est: Estimate | None) -> dict | None:
    return None if est is None else est.as_dict()


def _study_seq(data: FinalData) -> dict[str, dict]:
    """The study's sequential table, keyed by our sequence's run names (base, then its stages in order)."""
    table = data.study.get("sequential", {})
    names = ["base", *[f"seq_{d}" for d in data.curriculum]]
    return {ours: table.get(theirs, {}) for ours, theirs in zip(data.seq_runs, names)}


# --- F1: non-monotonic forgetting ------------------------------------------------------------------------------


def _recoveries(traj: Sequence[Estimate | None], below, above) -> list[tuple[int, int, int]]:
    """``(i, j, l)`` with ``i < j < l`` (stages after the base) where the score falls from stage i to j and rises
    again from j to l, by ``below(traj[j], traj[i])`` and ``above(traj[l], traj[j])``."""
    out = []
    n = len(traj)
    for j in range(2, n - 1):
        if traj[j] is None:
            continue
        fell = [i for i in range(1, j) if traj[i] is not None and below(traj[j], traj[i])]
        rose = [m for m in range(j + 1, n) if traj[m] is not None and above(traj[m], traj[j])]
        if fell and rose:
            i = max(fell, key=lambda x: traj[x].value)
            m = max(rose, key=lambda x: traj[x].value)
            out.append((i, j, m))
    return out


@finding("F1", "Sequential training is non-monotonic: later stages both disrupt and partially recover earlier skills, "
               "and the final checkpoint ends below the earlier peaks on the earlier domains.",
         "two parts, each judged on the earlier domains' in-domain benchmarks (mean over seeds ± SE): (a) below the "
         "peak: for at least one domain whose peak before the last stage is above the base beyond noise, the final "
         "checkpoint is below that peak beyond noise; (b) recovery: at least one domain, after falling beyond noise "
         "from an earlier stage, rises again at a later stage beyond noise. Reproduced when both hold; monotone "
         "erasure (a without b) is not reproduced")
def rule_f1(data: FinalData) -> dict:
    quantity = "per earlier domain: peak before the last stage -> final; fall -> later rise (points)"
    runs = data.seq_runs
    domains = data.curriculum[:-1]
    study_seq = _study_seq(data)
    st_below, st_rec = [], []
    for d in domains:
        b = IN_DOMAIN[d]
        traj = [study_seq.get(r, {}).get(b) for r in runs]
        ex = [None if v is None else Estimate.exact(v) for v in traj]
        before = [v for v in traj[1:-1] if v is not None]
        if before and traj[-1] is not None and max(before) > traj[-1]:
            st_below.append(f"{b} {max(before):.1f} -> {traj[-1]:.1f}")
        rec = _recoveries(ex, lambda a, c: a.value < c.value, lambda a, c: a.value > c.value)
        if rec:
            i, j, m = max(rec, key=lambda t: ex[t[2]].value - ex[t[1]].value)
            st_rec.append(f"{b} {traj[i]:.1f} -> {traj[j]:.1f} -> {traj[m]:.1f}")
    study = (f"below the peak: {', '.join(st_below) or 'none'}; recovery: {', '.join(st_rec) or 'none'}"
             if st_below or st_rec else "")
    source = STUDY_DERIVED
    if not _complete_seeds(data, runs):
        missing = ", ".join(_missing(data, runs)) or "a complete sequence in one seed"
        return _row("F1", quantity, "-", study, NOT_TESTABLE, f"runs missing: {missing}", study_source=source)
    below, recovered, learned, never = [], [], [], []
    values: dict = {"domains": {}}
    for d in domains:
        b = IN_DOMAIN[d]
        traj = [data.estimate(r, b) for r in runs]
        rec = _recoveries(traj, Estimate.below, Estimate.above)
        entry = {"benchmark": b, "trajectory": [_js(t) for t in traj]}
        if rec:
            i, j, m = max(rec, key=lambda t: (traj[t[2]] - traj[t[1]]).value)
            recovered.append(f"{b} {_e(traj[i])} ({runs[i]}) -> {_e(traj[j])} ({runs[j]}) -> {_e(traj[m])} ({runs[m]})")
            entry["recovery"] = [runs[i], runs[j], runs[m]]
        before = [(i, t) for i, t in enumerate(traj[1:-1], start=1) if t is not None]
        if not before or traj[0] is None or traj[-1] is None:
            never.append(b)
            values["domains"][d] = entry
            continue
        i, peak = max(before, key=lambda it: it[1].value)
        if not peak.above(traj[0]):
            never.append(b)
            values["domains"][d] = entry
            continue
        learned.append(b)
        entry["peak"] = runs[i]
        if traj[-1].below(peak):
            below.append(f"{b} {_e(peak)} ({runs[i]}) -> {_e(traj[-1])}")
            entry["below_peak"] = True
        values["domains"][d] = entry
    values |= {"below_peak": bool(below), "recovery": bool(recovered)}
    ours = f"(a) below the peak: {'; '.join(below) or 'none'}; (b) recovery: {'; '.join(recovered) or 'none'}"
    skipped = f"; never above the base beyond noise, left out of (a): {', '.join(never)}" if never else ""
    if not learned:
        return _row("F1", quantity, ours, study, NOT_TESTABLE,
                    f"no earlier domain rose above the base beyond noise ({', '.join(never)}): nothing to forget",
                    values, study_source=source)
    fails = ([] if below else ["(a) fails: the final checkpoint is not below any earlier peak beyond noise"]) + \
        ([] if recovered else ["(b) fails: no earlier domain rises again after falling beyond noise, the forgetting "
                               "is monotone"])
    verdict, why = (NOT_REPRODUCED, "; ".join(fails)) if fails else (REPRODUCED, "both parts hold")
    return _row("F1", quantity, ours, study, verdict, f"{why}; {len(data.seeds)} seed(s){skipped}", values,
                study_source=source)


# --- F2: the e-commerce stage interferes most --------------------------------------------------------------------


def stage_drops(scores: Mapping[str, Mapping[str, float]], seq_runs: Sequence[str],
                curriculum: Sequence[str]) -> dict[str, float]:
    """``{domain: drop}``: what each stage cost math and search, the mean over aime26 and nq (the stage's own
    benchmark left out) of the score before the stage minus after it (positive: a loss)."""
    out = {}
    for i, d in enumerate(curriculum, 1):
        before, after = scores.get(seq_runs[i - 1]), scores.get(seq_runs[i])
        bs = [IN_DOMAIN[x] for x in ("math", "search") if x != d]
        if not before or not after or not all(has_value(before.get(b)) and has_value(after.get(b)) for b in bs):
            continue
        out[d] = statistics.fmean(before[b] - after[b] for b in bs)
    return out


@finding("F2", "The E-commerce stage (1 tool -> 15 tools) causes the largest interference on math and search.",
         "the ecom stage's drop on math+search (mean of aime26 and nq, a stage's own benchmark left out; score before "
         "the stage minus after, mean over seeds) is the largest of the stages and above 0 beyond noise")
def rule_f2(data: FinalData) -> dict:
    quantity = "drop on math+search caused by each stage (before - after, points)"
    theirs = stage_drops(data.study.get("sequential", {}), ["base", *[f"seq_{d}" for d in data.curriculum]],
                         data.curriculum)
    study = ", ".join(f"{d} {v:+.1f}" for d, v in theirs.items())
    if not _complete_seeds(data, data.seq_runs) or "ecom" not in data.curriculum:
        return _row("F2", quantity, "-", study, NOT_TESTABLE,
                    f"runs missing: {', '.join(_missing(data, data.seq_runs)) or 'ecom is not in the curriculum'}",
                    study_values=theirs, study_source=STUDY_DERIVED)
    rose = [b for b in ("aime26", "nq")
            if max((data.mean(r, b) or 0.0) for r in data.seq_runs[1:]) > (data.mean("base", b) or 0.0)]
    if not rose:
        return _row("F2", quantity, "-", study, NOT_TESTABLE,
                    "neither aime26 nor nq rose above the base along the sequence: no interference to measure",
                    study_values=theirs, study_source=STUDY_DERIVED)
    drops: dict[str, Estimate] = {}
    for i, d in enumerate(data.curriculum, 1):
        bs = [IN_DOMAIN[x] for x in ("math", "search") if x != d]
        parts = [(data.estimate(data.seq_runs[i - 1], b), data.estimate(data.seq_runs[i], b)) for b in bs]
        if all(x is not None and y is not None for x, y in parts):
            drops[d] = mean_of([x - y for x, y in parts])
    ours = ", ".join(f"{d} {_e(v)}" for d, v in drops.items())
    worst = max(drops, key=lambda d: drops[d].value)
    ok = worst == "ecom" and drops["ecom"].above(0.0)
    detail = f"largest: {worst}" + ("" if worst != "ecom" or ok else " but not above 0 beyond noise")
    return _row("F2", quantity, ours, study, REPRODUCED if ok else NOT_REPRODUCED, detail,
                {d: _js(v) for d, v in drops.items()}, theirs, STUDY_DERIVED)


# --- F3: tokens ------------------------------------------------------------------------------------------------


def _tokens_seed(d: dict) -> dict | None:
    """One seed's F3 numbers from its tokens.json: the means over the later checkpoints of the low-entropy stable
    fraction and of the changed positions' high-entropy share, the high-entropy share of positions, and the
    binomial SE of the stable fraction."""
    cks = [c for c in (d.get("checkpoints") or {}).values() if has_value(c.get("low_entropy_stable"))]
    if not cks:
        return None
    low = statistics.fmean(c["low_entropy_stable"] for c in cks)
    shares = [c["changed_share_in_high_entropy"] for c in cks if has_value(c.get("changed_share_in_high_entropy"))]
    n_low = d.get("low_entropy_positions")
    se = math.sqrt(low * (1 - low) / n_low) if n_low else None
    return {"low": low, "low_se": se, "share": statistics.fmean(shares) if shares else None,
            "fraction": d.get("high_entropy_fraction"), "threshold": d.get("entropy_threshold")}


@finding("F3", "Low-entropy positions stay stable across stages; prediction changes concentrate at high-entropy "
               "positions.",
         f"consistency = a later checkpoint still ranks the reference rollout's own token first; high entropy = the "
         f"reference's entropy above a fixed threshold in nats (the same for every profile; the share of positions "
         f"above it is measured, beside the study's 6%). Reproduced when the low-entropy stable fraction is >= "
         f"{F3_LOW_STABLE_MIN:g} and the share of changed positions that are high-entropy is >= {F3_CONCENTRATION:g}x "
         "the share of positions that are high-entropy (means over the later checkpoints and the seeds)")
def rule_f3(data: FinalData) -> dict:
    quantity = ("low-entropy stable fraction; share of changed positions at high entropy; share of positions above "
                "the threshold")
    st = data.study.get("diagnostics", {})
    study_values = {"low_entropy_stable": st.get("low_entropy_positions_stable_fraction"),
                    "high_entropy_fraction": st.get("high_entropy_positions_fraction")}
    study = (f"low-entropy stable ~{study_values['low_entropy_stable']}; changes: 'almost all' at high entropy; "
             f"high-entropy positions ~{study_values['high_entropy_fraction']}")
    tokens = data.diagnostics.get("tokens") or {}
    if not tokens:
        return _row("F3", quantity, "-", study, NOT_TESTABLE, "diagnostics/tokens.json missing (the token diagnostics)",
                    study_values=study_values)
    old = [s for s, d in tokens.items() if d.get("consistency_against") != "rollout token"
           or d.get("threshold_rule") != "fixed (nats)"]
    if old:
        return _row("F3", quantity, "-", study, NOT_TESTABLE,
                    f"tokens.json of seed(s) {', '.join(map(str, old))} measured consistency against the reference's "
                    "top-1 with a quantile threshold: re-run the token diagnostics", study_values=study_values)
    per = {s: _tokens_seed(d) for s, d in tokens.items()}
    per = {s: v for s, v in per.items() if v is not None}
    if not per:
        return _row("F3", quantity, "-", study, NOT_TESTABLE, "tokens.json holds no later checkpoint",
                    study_values=study_values)
    low = Estimate.of_values([v["low"] for v in per.values()], [v["low_se"] for v in per.values()])
    frac = Estimate.of_values([v["fraction"] for v in per.values()])
    share = Estimate.of_values([v["share"] for v in per.values()])
    thresholds = sorted({v["threshold"] for v in per.values()})
    values = {"low_entropy_stable": _js(low), "changed_share_in_high_entropy": _js(share),
              "high_entropy_fraction": _js(frac), "entropy_threshold_nats": thresholds}
    ours = (f"low-entropy stable {_e(low, 3)}; changed at high entropy {_e(share, 3)}; positions above "
            f"{'/'.join(f'{t:g}' for t in thresholds)} nats {_e(frac, 3)}")
    if frac is None or frac.value == 0:
        return _row("F3", quantity, ours, study, NOT_TESTABLE,
                    "no position lies above the entropy threshold: no high-entropy positions to concentrate on", values,
                    study_values=study_values)
    if share is None:
        return _row("F3", quantity, ours, study, NOT_TESTABLE, "no position changed in any later checkpoint", values,
                    study_values=study_values)
    stable = low.value >= F3_LOW_STABLE_MIN
    ratio = share.value / frac.value
    concentrated = ratio >= F3_CONCENTRATION
    values["concentration"] = ratio
    parts = [f"low-entropy stable {'>=' if stable else '<'} {F3_LOW_STABLE_MIN:g}",
             f"changes {ratio:.1f}x the high-entropy share ({'>=' if concentrated else '<'} {F3_CONCENTRATION:g}x)"]
    return _row("F3", quantity, ours, study, REPRODUCED if stable and concentrated else NOT_REPRODUCED,
                f"{'; '.join(parts)}; {len(per)} seed(s)", values, study_values=study_values)


# --- F4, F5: weights -----------------------------------------------------------------------------------------------


@finding("F4", "Task updates are only partly aligned: the same oracle-mixture SFT from the base model and from the "
               "sequential endpoint has cosine 0.77, unrelated SFT tasks sit at 0.05.",
         f"from the SDFT step's update-direction check: the same SFT mixture from the base and from the sequential "
         f"endpoint has cosine >= {F4_SAME_MIN:g}, and the cold-start SFT updates of unrelated domains from the base "
         f"have mean |cosine| <= {F4_UNRELATED_MAX:g} (means over seeds); the oracles' pairwise task-vector cosines "
         "are shown as how partly aligned they are, with no study figure (it gives none)")
def rule_f4(data: FinalData) -> dict:
    quantity = "cosine: same SFT from base vs from seq_final; |cosine| of unrelated SFT updates"
    st = data.study.get("diagnostics", {})
    study_values = {"same_sft_from_base_vs_seq_endpoint": st.get("cosine_same_sft_from_base_vs_seq_endpoint"),
                    "unrelated_sft_tasks": st.get("cosine_unrelated_sft_tasks")}
    study = (f"same SFT {study_values['same_sft_from_base_vs_seq_endpoint']}; "
             f"unrelated {study_values['unrelated_sft_tasks']}")
    cross = Estimate.of_values([(w.get("cosine_summary") or {}).get("unrelated_oracles")
                                for w in (data.diagnostics.get("weights") or {}).values()])
    partly = (f"; the oracles' task vectors, pairwise: mean cosine {_e(cross, 3)} (partly aligned; no study figure)"
              if cross is not None else "")
    dirs = data.diagnostics.get("directions") or {}
    if not dirs:
        return _row("F4", quantity, "-", study, NOT_TESTABLE,
                    "sdft_directions/directions.json missing (the SDFT step writes it once sdft and sdft_base are "
                    f"trained){partly}", {"oracles_pairwise": _js(cross)}, study_values)
    kinds = {d["unrelated_single_domain_sft"].get("kind") for d in dirs.values()}
    same = Estimate.of_values([d.get("same_sft_from_base_vs_seq_final") for d in dirs.values()])
    un_vals = []
    for d in dirs.values():
        pairs = [v for v in d["unrelated_single_domain_sft"].get("pairs", {}).values() if has_value(v)]
        un_vals.append(statistics.fmean(abs(v) for v in pairs) if pairs else None)
    unrelated = Estimate.of_values(un_vals)
    values = {"same_sft": _js(same), "unrelated_abs": _js(unrelated), "oracles_pairwise": _js(cross),
              "unrelated_kind": sorted(k for k in kinds if k)}
    ours = f"same SFT {_e(same, 3)}; unrelated |cos| {_e(unrelated, 3)}"
    if kinds != {"cold-start SFT"}:
        return _row("F4", quantity, ours, study, NOT_TESTABLE,
                    "fewer than two oracles kept a cold-start SFT model: the unrelated pair is whole oracle updates, "
                    f"not SFT updates{partly}", values, study_values)
    if same is None or unrelated is None:
        return _row("F4", quantity, ours, study, NOT_TESTABLE, f"a cosine is undefined (a zero update){partly}", values,
                    study_values)
    ok_same, ok_un = same.value >= F4_SAME_MIN, unrelated.value <= F4_UNRELATED_MAX
    detail = (f"same SFT {'>=' if ok_same else '<'} {F4_SAME_MIN:g}; unrelated {'<=' if ok_un else '>'} "
              f"{F4_UNRELATED_MAX:g}; {same.seeds} seed(s){partly}")
    return _row("F4", quantity, ours, study, REPRODUCED if ok_same and ok_un else NOT_REPRODUCED, detail, values,
                study_values)


@finding("F5", "SFT displaces parameters several times more than RL (3 to 7 times).",
         f"displacement = the L2 norm of a phase's total parameter change over the whole model (SFT: ||theta_sft - "
         f"theta_start||; RL: ||theta_end - theta_sft||), per cold-started stage; the mean SFT/RL ratio over the "
         f"stages that have both lies in {F5_RANGE[0]:g}-{F5_RANGE[1]:g} (the study's 3-7 with a factor-2 margin) "
         "and is above 1 beyond the seed spread")
def rule_f5(data: FinalData) -> dict:
    quantity = "SFT displacement / RL displacement (L2 norms of each phase's update)"
    lohi = data.study.get("diagnostics", {}).get("sft_over_rl_displacement")
    study = " to ".join(f"{x:g}" for x in lohi) if lohi else ""

    def ratio(d):
        xs = [r["sft_over_rl"] for r in d.get("sft_vs_rl", []) if has_value(r.get("sft_over_rl"))]
        return statistics.fmean(xs) if xs else None

    weights = data.diagnostics.get("weights") or {}
    est = Estimate.of_values([ratio(d) for d in weights.values()])
    if est is None:
        why = ("diagnostics/weights.json missing (the weight diagnostics)" if not weights
               else "no stage has both an SFT and an RL displacement")
        return _row("F5", quantity, "-", study, NOT_TESTABLE, why, study_values={"range": lohi})
    in_range = F5_RANGE[0] <= est.value <= F5_RANGE[1]
    above = est.above(1.0)
    parts = [f"{est.value:.1f} {'inside' if in_range else 'outside'} {F5_RANGE[0]:g}-{F5_RANGE[1]:g}",
             "above 1 beyond the seed spread" if above else "not above 1 beyond the seed spread"]
    return _row("F5", quantity, _e(est), study, REPRODUCED if in_range and above else NOT_REPRODUCED,
                f"{'; '.join(parts)}; {est.seeds} seed(s)", {"ratio": _js(est)}, {"range": lohi})


# --- F6, F7, F8: the consolidations ----------------------------------------------------------------------------


def _consolidations(data: FinalData) -> list[str]:
    return [c for c in CONSOLIDATIONS if data.has(c)]


def _study_f6(data: FinalData) -> str:
    """The study's main table read as F6 reads ours, without a noise floor (the study gives no task counts)."""
    mt = data.study.get("main_table", {})
    final = mt.get("seq_final", {})
    parts = []
    for c in ("mmopd", "sdft", "merge_uniform"):
        row = mt.get(c, {})
        both = [d for d in data.curriculum if IN_DOMAIN[d] in row and IN_DOMAIN[d] in final]
        won = [d for d in both if row[IN_DOMAIN[d]] > final[IN_DOMAIN[d]]]
        lost = [d for d in both if row[IN_DOMAIN[d]] < final[IN_DOMAIN[d]]]
        if both:
            parts.append(f"{c}: won {', '.join(won) or 'nothing'}; lost {', '.join(lost) or 'nothing'}")
    return "; ".join(parts)


@finding("F6", "No shared-weight consolidation (MMOPD, SDFT, merging) wins every domain: what one wins back, it pays "
               "for elsewhere.",
         "a consolidation wins back a domain when its in-domain score is above seq_final's beyond noise, and pays "
         "for a domain when it is below seq_final or that domain's oracle beyond noise there; reproduced when at "
         "least one consolidation (mmopd, sdft, the merges) wins back some domain and every consolidation that "
         "wins back a domain pays for another domain (one it did not win back); not reproduced when nothing is won "
         "back")
def rule_f6(data: FinalData) -> dict:
    quantity = "per consolidation: domains won back over seq_final; domains paid for (below seq_final / the oracle)"
    study = _study_f6(data)
    cons = _consolidations(data)
    if not data.has("seq_final") or not cons:
        what = _missing(data, ["seq_final"]) + ([] if cons else ["any of " + ", ".join(CONSOLIDATIONS)])
        return _row("F6", quantity, "-", study, NOT_TESTABLE, f"runs missing: {', '.join(what)}",
                    study_source=STUDY_DERIVED)
    live = [d for d in data.curriculum
            if any((data.mean(r, IN_DOMAIN[d]) or 0.0) > 0 for r in ["seq_final", f"oracle_{d}", *cons])]
    if not live:
        return _row("F6", quantity, "-", study, NOT_TESTABLE,
                    "no in-domain benchmark rose above 0 (seq_final, oracles, consolidations): nothing to win back",
                    study_source=STUDY_DERIVED)
    parts, values, winners, free = [], {}, [], []
    for c in cons:
        won, paid = [], {}
        for d in data.curriculum:
            b = IN_DOMAIN[d]
            mc, mf, mo = data.estimate(c, b), data.estimate("seq_final", b), data.estimate(f"oracle_{d}", b)
            if mc is None:
                continue
            if mf is not None and mc.above(mf):
                won.append(d)
            who = [n for n, v in (("seq_final", mf), (f"oracle_{d}", mo)) if v is not None and mc.below(v)]
            if who:
                paid[d] = who
        elsewhere = [d for d in paid if d not in won]
        values[c] = {"won_back": won, "paid": paid, "paid_elsewhere": elsewhere}
        if won:
            winners.append(c)
            if not elsewhere:
                free.append(c)
        parts.append(f"{c}: won back {', '.join(won) or 'nothing'}; below seq_final or the oracle on "
                     f"{', '.join(elsewhere) or 'nothing'}" + (" else" if won else ""))
    ours = "; ".join(parts)
    missing_oracles = _missing(data, data.oracles)
    note = f"; oracles missing, judged against seq_final only: {', '.join(missing_oracles)}" if missing_oracles else ""
    if not winners:
        verdict, why = NOT_REPRODUCED, "no consolidation wins back any domain over seq_final beyond noise"
    elif free:
        verdict, why = NOT_REPRODUCED, f"wins back without paying beyond noise on another domain: {', '.join(free)}"
    else:
        verdict, why = REPRODUCED, (f"{len(winners)} of {len(cons)} consolidation(s) win back a domain, each paying "
                                    "on another")
    return _row("F6", quantity, ours, study, verdict, why + note, values, study_source=STUDY_DERIVED)


@finding("F7", "MLE sits next to the single-task oracles in-domain and is best out of domain on GPQA, single-hop, "
               "multi-hop and tau-Mock.",
         f"in-domain: mle within {F7_DOMAIN_GAP:g} points of the oracle on every domain and the mean gap "
         f"(mle - oracle) >= -{F7_MEAN_GAP:g}; out of domain, on the benchmarks the study names "
         f"({', '.join(F7_OOD)}): mle best or within noise of the best among seq_final and the consolidations "
         "(mle_learned is a variant of MLE, not a competitor); not testable when every oracle scores 0")
def rule_f7(data: FinalData) -> dict:
    quantity = "mle - oracle per domain and its mean (points); mle vs the best other out of domain"
    mt = data.study.get("main_table", {})
    gaps = {d: mt.get("mle", {}).get(IN_DOMAIN[d], math.nan) - mt.get(f"oracle_{d}", {}).get(IN_DOMAIN[d], math.nan)
            for d in data.curriculum}
    study = (", ".join(f"{d} {g:+.1f}" for d, g in gaps.items()) + f"; mean {statistics.fmean(gaps.values()):+.1f} "
             f"({STUDY_DERIVED}); best on {', '.join(F7_OOD)} (the study's text)"
             if all(has_value(g) for g in gaps.values()) else "")
    source = f"in-domain gaps {STUDY_DERIVED}; the out-of-domain claim from the study's text"

    def untestable(why: str) -> dict:
        return _row("F7", quantity, "-", study, NOT_TESTABLE, why, study_values=gaps, study_source=source)

    missing = _missing(data, ["mle", *data.oracles])
    if missing:
        return untestable(f"runs missing: {', '.join(missing)}")
    if not any((data.mean(f"oracle_{d}", IN_DOMAIN[d]) or 0.0) > 0 for d in data.curriculum):
        return untestable("no oracle rose above 0 on its own benchmark: nothing for MLE to sit next to")
    ours_gaps = {}
    for d in data.curriculum:
        b = IN_DOMAIN[d]
        m, o = data.estimate("mle", b), data.estimate(f"oracle_{d}", b)
        if m is not None and o is not None:
            ours_gaps[d] = m - o
    if len(ours_gaps) < len(data.curriculum):
        return untestable("mle or an oracle has no in-domain score")
    mean_gap = mean_of(list(ours_gaps.values()))
    far = [d for d, g in ours_gaps.items() if g.value < -F7_DOMAIN_GAP]
    in_ok = not far and mean_gap.value >= -F7_MEAN_GAP
    others = ["seq_final", *_consolidations(data)]
    ood, lost = {}, []
    for b in F7_OOD:
        m = data.estimate("mle", b)
        rivals = {r: e for r in others if (e := data.estimate(r, b)) is not None}
        if m is None or not rivals:
            continue
        best = max(rivals, key=lambda r: rivals[r].value)
        ood[b] = {"mle": _js(m), "best_other": best, "best": _js(rivals[best])}
        if rivals[best].above(m):
            lost.append(f"{b} ({best} {_e(rivals[best])} vs mle {_e(m)})")
    values = {"gaps": {d: _js(g) for d, g in ours_gaps.items()}, "mean_gap": _js(mean_gap), "ood": ood}
    ours = (", ".join(f"{d} {_e(g)}" for d, g in ours_gaps.items()) + f"; mean {_e(mean_gap)}; out of domain: "
            + (f"behind beyond noise on {', '.join(lost)}" if lost else
               (f"best or within noise on {', '.join(ood)}" if ood else "nothing to compare")))
    if not ood:
        return _row("F7", quantity, ours, study, NOT_TESTABLE,
                    f"no score of mle and another run on {', '.join(F7_OOD)}", values, gaps, source)
    parts = []
    if far:
        parts.append(f"more than {F7_DOMAIN_GAP:g} points under the oracle: {', '.join(far)}")
    if mean_gap.value < -F7_MEAN_GAP:
        parts.append(f"mean gap below -{F7_MEAN_GAP:g}")
    if lost:
        parts.append("behind the best out of domain")
    ok = in_ok and not lost
    detail = ("; ".join(parts) if parts else "in-domain and out-of-domain parts hold") + \
        f"; compared with {', '.join(others)}"
    return _row("F7", quantity, ours, study, REPRODUCED if ok else NOT_REPRODUCED, detail, values, gaps, source)


@finding("F8", "Uniform merging is the weakest consolidator on the agentic domains.",
         "merge_uniform's mean of nq and retail is below both MMOPD's and SDFT's beyond noise (means over seeds); "
         "the other merges shown beside it; not testable when nq and retail never rose above 0")
def rule_f8(data: FinalData) -> dict:
    agentic = [IN_DOMAIN[d] for d in F8_AGENTIC]
    quantity = "agentic mean (nq, retail) of merge_uniform, mmopd, sdft (and the other merges)"
    mt = data.study.get("main_table", {})
    study_means = {c: statistics.fmean(mt[c][b] for b in agentic) for c in ("merge_uniform", "mmopd", "sdft")
                   if c in mt and all(b in mt[c] for b in agentic)}
    study = ", ".join(f"{c} {v:.1f}" for c, v in study_means.items())
    missing = _missing(data, ["merge_uniform", "mmopd", "sdft"])
    if missing:
        return _row("F8", quantity, "-", study, NOT_TESTABLE, f"runs missing: {', '.join(missing)}",
                    study_values=study_means, study_source=STUDY_DERIVED)
    shown = ["merge_uniform", "mmopd", "sdft", *[m for m in MERGES if m != "merge_uniform" and data.has(m)]]
    if not any((data.mean(r, b) or 0.0) > 0 for r in ["seq_final", *data.oracles, *shown] for b in agentic):
        return _row("F8", quantity, "-", study, NOT_TESTABLE,
                    "nq and retail never rose above 0 (oracles, seq_final, consolidations): no agentic skill to lose",
                    study_values=study_means, study_source=STUDY_DERIVED)
    means = {}
    for c in shown:
        ests = [data.estimate(c, b) for b in agentic]
        if all(e is not None for e in ests):
            means[c] = mean_of(ests)
    if any(c not in means for c in ("merge_uniform", "mmopd", "sdft")):
        return _row("F8", quantity, "-", study, NOT_TESTABLE, "a run lacks an nq or retail score",
                    study_values=study_means, study_source=STUDY_DERIVED)
    u = means["merge_uniform"]
    beaten = [c for c in ("mmopd", "sdft") if u.below(means[c])]
    ok = len(beaten) == 2
    ours = ", ".join(f"{c} {_e(v)}" for c, v in means.items())
    detail = ("below both beyond noise" if ok else
              f"not below {', '.join(c for c in ('mmopd', 'sdft') if c not in beaten)} beyond noise")
    return _row("F8", quantity, ours, study, REPRODUCED if ok else NOT_REPRODUCED, detail,
                {c: _js(v) for c, v in means.items()}, study_means, STUDY_DERIVED)


# --- all of them ------------------------------------------------------------------------------------------------


def judge(data: FinalData, ids: Sequence[str] | None = None) -> list[dict]:
    """One row per finding (``ids``, default F1-F8): claim, rule, quantity, ours (± SE), the study's, verdict,
    detail, values."""
    unknown = [i for i in ids or () if i not in RULES]
    if unknown:
        raise KeyError(f"unknown finding(s) {unknown}; the findings are {list(RULES)}")
    return [RULES[i].judge(data) for i in (ids or RULES)]


DISPLAY = ["claim", "quantity", "ours", "study", "verdict", "rule", "detail"]


def findings_frame(data: FinalData | list[dict]):
    """:func:`judge`'s rows (or ``data``'s, judged here) as a DataFrame indexed by finding, the columns a reader
    needs (``DISPLAY``; ``values`` stay in ``findings.json``)."""
    import pandas as pd

    rows = judge(data) if isinstance(data, FinalData) else data
    frame = pd.DataFrame([{k: r[k] for k in ["finding", *DISPLAY]} for r in rows]).set_index("finding")
    frame.attrs["noise_floor"] = NOISE_FLOOR
    return frame


def verdict_summary(rows: list[dict]) -> str:
    """``"3 reproduced, 1 not reproduced, 4 not testable"``."""
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    return ", ".join(f"{n} {v}" for v, n in counts.items())


def verdicts_markdown(data: FinalData, ids: Sequence[str] | None = None) -> str:
    """Markdown of the verdicts of ``ids`` on ``data``: what a stage or diagnostics notebook shows of its findings,
    computed by the same rules as the final tables."""
    lines = []
    for r in judge(data, ids):
        study = f" The study: {r['study']}." if r["study"] else ""
        lines.append(f"- **{r['finding']}: {r['verdict']}** ({r['claim']}) Ours: {r['ours']}.{study} "
                     f"*{r['detail']}.* Rule: {r['rule']}.")
    seeds = ", ".join(map(str, data.seeds))
    return (f"**The findings on seed(s) {seeds}** (`acl_lib.findings`, the rules of the final tables)\n\n"
            + "\n".join(lines) + f"\n\n{NOISE_FLOOR}.")


def write_findings(data: FinalData, path: str | Path, rows: list[dict] | None = None) -> Path:
    """Write the verdicts to ``path`` (``outputs/<profile>/findings.json``): the seeds, the noise floor, and per
    finding its claim, rule, our numbers with their standard errors, the study's numbers and where they come from,
    the verdict and what the rule saw. ``rows``: :func:`judge`'s rows on ``data`` when already computed. Returns
    the path."""
    rows = jsonable(rows if rows is not None else judge(data))
    doc = {"seeds": list(data.seeds), "curriculum": list(data.curriculum), "noise_floor": FORMULA,
           "beyond_noise_in_se": BEYOND, "verdicts": VERDICTS, "summary": verdict_summary(rows), "findings": rows}
    return write_json(Path(path), doc)
