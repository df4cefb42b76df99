"""F6, F7 and F8: the consolidations of ``seq_final`` (MMOPD, SDFT, the merges) and MLE against it, the oracles and
each other. Every gap is a difference of checkpoints on the same tasks, paired by task and seed
(:meth:`FinalData.contrast`)."""

from __future__ import annotations

import math
import statistics

from acl_lib.envs import IN_DOMAIN
from acl_lib.final import CONSOLIDATIONS, MERGES, STUDY_DERIVED, FinalData, has_value
from acl_lib.findings.core import (
    F7_DOMAIN_GAP,
    F7_MEAN_GAP,
    F7_OOD,
    F8_AGENTIC,
    HOLDS,
    NOT_REPRODUCED,
    NOT_TESTABLE,
    REPRODUCED,
    UNDERPOWERED,
    Part,
    _row,
    above,
    all_of,
    any_of,
    below,
    decide,
    e,
    failing,
    finding,
    js,
    mde_of,
    missing_runs,
    within,
)
from acl_lib.noise import BEYOND, mean_of


def _consolidations(data: FinalData) -> list[str]:
    return [c for c in CONSOLIDATIONS if data.has(c)]


def _study_row(data: FinalData, run: str) -> dict:
    """The study's main-table row that stands for ``run``: its own, or the uniform merge's for another merge (the
    study reports only that one); {} where the study has none."""
    mt = data.study.get("main_table", {})
    if run in mt:
        return mt[run]
    return mt.get("merge_uniform", {}) if run.startswith("merge_") else {}


def _study_gap(data: FinalData, run: str, other: str, benchmark: str) -> float | None:
    """The study's ``run - other`` on ``benchmark`` (main table; None where either is not reported)."""
    a, b = _study_row(data, run).get(benchmark), _study_row(data, other).get(benchmark)
    return a - b if a is not None and b is not None else None


def _positive(x: float | None) -> float | None:
    return x if x is not None and x > 0 else None


# --- F6 -----------------------------------------------------------------------------------------------------------


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
         "against the sequential endpoint, differences paired by task and seed: a consolidation wins back a domain "
         "when its in-domain score is above seq_final's beyond noise, and pays for a domain when it is below "
         "seq_final's beyond noise there (the oracles are shown beside, not judged); reproduced when at least one "
         "consolidation (mmopd, sdft, the merges) wins back some domain and every consolidation that wins back a "
         "domain pays for another domain (one it did not win back); not reproduced when nothing is won back, or a "
         "winner pays nowhere, where the test could have seen the study's own gaps (its consolidation's row; a merge "
         "the study does not report is read by the uniform merge's), else underpowered")
def rule_f6(data: FinalData) -> dict:
    quantity = "per consolidation: domains won back over seq_final; domains paid for (below seq_final)"
    study = _study_f6(data)
    cons = _consolidations(data)
    if not data.has("seq_final") or not cons:
        what = missing_runs(data, ["seq_final"]) + ([] if cons else ["any of " + ", ".join(CONSOLIDATIONS)])
        return _row("F6", quantity, "-", study, NOT_TESTABLE, f"runs missing: {', '.join(what)}",
                    study_source=STUDY_DERIVED)
    live = [d for d in data.curriculum
            if any((data.mean(r, IN_DOMAIN[d]) or 0.0) > 0 for r in ["seq_final", f"oracle_{d}", *cons])]
    if not live:
        return _row("F6", quantity, "-", study, NOT_TESTABLE,
                    "no in-domain benchmark rose above 0 (seq_final, oracles, consolidations): nothing to win back",
                    study_source=STUDY_DERIVED)
    texts, values, wins, pays, under_oracle = [], {}, [], [], []
    for c in cons:
        won, paid, gaps, pay_parts, vs_oracle = [], [], {}, {}, {}
        for d in data.curriculum:
            b = IN_DOMAIN[d]
            x = data.diff(c, "seq_final", b)
            if x is None:
                continue
            g = _study_gap(data, c, "seq_final", b)
            win = above(f"{c} wins back {d}", x, 0.0, _positive(g))
            wins.append(win)
            if win.status == HOLDS:
                won.append(d)
            pay = below(f"{c} pays on {d}", x, 0.0, _positive(None if g is None else -g))
            pay_parts[d] = pay
            if pay.status == HOLDS:
                paid.append(d)
            gaps[d] = js(x)
            o = data.diff(c, f"oracle_{d}", b)
            if o is not None:
                vs_oracle[d] = js(o)
                if o.value + BEYOND * o.se < 0:
                    under_oracle.append(f"{c} on {d}")
        elsewhere = [d for d in paid if d not in won]
        values[c] = {"won_back": won, "paid": paid, "paid_elsewhere": elsewhere, "minus_seq_final": gaps,
                     "minus_oracle": vs_oracle}
        if won:
            pays.append((c, any_of(f"{c} pays on a domain it did not win back",
                                   [p for d, p in pay_parts.items() if d not in won])))
        texts.append(f"{c}: won back {', '.join(won) or 'nothing'}; below seq_final on "
                     f"{', '.join(elsewhere) or 'nothing'}" + (" else" if won else ""))
    win_part = any_of("a consolidation wins back a domain", wins)
    parts = [win_part] + ([all_of("every winner pays on another domain", [p for _, p in pays])]
                          if win_part.status == HOLDS else [])
    verdict = decide(parts)
    free = [c for c, p in pays if p.status != HOLDS]
    if verdict == REPRODUCED:
        why = f"{len(pays)} of {len(cons)} consolidation(s) win back a domain, each paying on another"
    elif win_part.status != HOLDS:
        why = ("no consolidation wins back any domain over seq_final beyond noise"
               + ("" if win_part.status != UNDERPOWERED else ", and none could have seen the study's gains"))
    else:
        why = (f"wins back without paying beyond noise on another domain: {', '.join(free)}"
               + ("" if verdict == NOT_REPRODUCED else " (the payments the study saw are below our precision)"))
    shown = (f"; below its oracle beyond noise (shown, not judged): {', '.join(under_oracle)}" if under_oracle
             else "; below no oracle beyond noise (shown, not judged)")
    return _row("F6", quantity, "; ".join(texts), study, verdict, why + shown, values, study_source=STUDY_DERIVED,
                parts=parts)


# --- F7 -----------------------------------------------------------------------------------------------------------


@finding("F7", "MLE sits next to the single-task oracles in-domain and is best out of domain on GPQA, single-hop, "
               "multi-hop and tau-Mock.",
         f"in-domain, an equivalence test with the gaps' standard errors (mle - oracle, paired by task and seed): "
         f"every domain's gap within ±{F7_DOMAIN_GAP:g} points on both confidence bounds (gap ± 2 SE) and the mean gap "
         f"at least -{F7_MEAN_GAP:g} on its lower bound; underpowered where 2.84 SE exceeds the room the study's own "
         f"gap leaves to the margin. Out of domain, on the benchmarks the study names ({', '.join(F7_OOD)}): mle "
         "best or within noise of the best among seq_final and the consolidations (mle_learned is a variant of MLE, "
         "not a competitor); this half is not testable on a benchmark where every compared run scores 0. Not "
         "testable when every oracle scores 0")
def rule_f7(data: FinalData) -> dict:
    quantity = "mle - oracle per domain and its mean (points); mle vs the best other out of domain"
    mt = data.study.get("main_table", {})
    gaps = {d: mt.get("mle", {}).get(IN_DOMAIN[d], math.nan) - mt.get(f"oracle_{d}", {}).get(IN_DOMAIN[d], math.nan)
            for d in data.curriculum}
    known = all(has_value(g) for g in gaps.values())
    study = (", ".join(f"{d} {g:+.1f}" for d, g in gaps.items()) + f"; mean {statistics.fmean(gaps.values()):+.1f} "
             f"({STUDY_DERIVED}); best on {', '.join(F7_OOD)} (the study's text)" if known else "")
    source = f"in-domain gaps {STUDY_DERIVED}; the out-of-domain claim from the study's text"

    def untestable(why: str) -> dict:
        return _row("F7", quantity, "-", study, NOT_TESTABLE, why, study_values=gaps, study_source=source)

    missing = missing_runs(data, ["mle", *data.oracles])
    if missing:
        return untestable(f"runs missing: {', '.join(missing)}")
    if not any((data.mean(f"oracle_{d}", IN_DOMAIN[d]) or 0.0) > 0 for d in data.curriculum):
        return untestable("no oracle rose above 0 on its own benchmark: nothing for MLE to sit next to")
    ours_gaps = {d: g for d in data.curriculum if (g := data.diff("mle", f"oracle_{d}", IN_DOMAIN[d])) is not None}
    if len(ours_gaps) < len(data.curriculum):
        return untestable("mle or an oracle has no in-domain score")
    mean_gap = mean_of(list(ours_gaps.values()))
    room = {d: F7_DOMAIN_GAP - abs(g) if has_value(g) else None for d, g in gaps.items()}
    in_parts = [within(f"{d} within ±{F7_DOMAIN_GAP:g}", g, -F7_DOMAIN_GAP, F7_DOMAIN_GAP, _positive(room[d]))
                for d, g in ours_gaps.items()]
    study_mean = statistics.fmean(gaps.values()) if known else None
    in_parts.append(above(f"mean gap >= -{F7_MEAN_GAP:g}", mean_gap, -F7_MEAN_GAP,
                          None if study_mean is None else _positive(study_mean + F7_MEAN_GAP), strict=False))
    in_domain = all_of("in-domain: next to the oracles", in_parts)

    others = ["seq_final", *_consolidations(data)]
    ood, lost, flat, ood_parts = {}, [], [], []
    for b in F7_OOD:
        m = data.estimate("mle", b)
        rivals = {r: x for r in others if (x := data.estimate(r, b)) is not None}
        if m is None or not rivals:
            continue
        if all((data.mean(r, b) or 0.0) == 0 for r in ["mle", *rivals]):
            flat.append(b)
            continue
        best = max(rivals, key=lambda r: rivals[r].value)
        ahead = data.diff(best, "mle", b)
        margin = (_study_row(data, "mle").get(b, math.nan)
                  - max((v for r in others if has_value(v := _study_row(data, r).get(b))), default=math.nan))
        behind = above(f"{b}: {best} ahead of mle", ahead, 0.0, None).status == HOLDS
        ood_parts.append(Part(f"{b}: mle not behind {best}", "fails" if behind else HOLDS, mde_of(ahead),
                              _positive(margin) if has_value(margin) else None))
        ood[b] = {"mle": js(m), "best_other": best, "best": js(rivals[best]), "best_minus_mle": js(ahead)}
        if behind:
            lost.append(f"{b} ({best} {e(rivals[best])} vs mle {e(m)})")
    values = {"gaps": {d: js(g) for d, g in ours_gaps.items()}, "mean_gap": js(mean_gap), "ood": ood,
              "ood_all_zero": flat}
    ours = (", ".join(f"{d} {e(g)}" for d, g in ours_gaps.items()) + f"; mean {e(mean_gap)}; out of domain: "
            + (f"behind beyond noise on {', '.join(lost)}" if lost else
               (f"best or within noise on {', '.join(ood)}" if ood else "nothing to compare")))
    ood_part = all_of("out of domain: best or within noise", ood_parts) if ood_parts else None
    parts = [in_domain] + ([ood_part] if ood_part else [])
    verdict = decide(parts)
    halves = [f"in-domain {in_domain.status}" + ("" if in_domain.status == HOLDS else f" ({failing(in_parts)})")]
    if ood_part is None:
        halves.append("out of domain not testable: " + (f"every compared run scores 0 on {', '.join(flat)}" if flat
                                                        else f"no score of mle and another run on {', '.join(F7_OOD)}"))
        if verdict == REPRODUCED:  # the in-domain half holds, the other half cannot be tried
            verdict = NOT_TESTABLE
    else:
        halves.append("out of domain " + ("fails: behind the best out of domain" if lost else "holds")
                      + (f" (every compared run scores 0 on {', '.join(flat)}, left out)" if flat else ""))
    detail = "; ".join(halves) + f"; compared with {', '.join(others)}"
    return _row("F7", quantity, ours, study, verdict, detail, values, gaps, source, parts=parts)


# --- F8 -----------------------------------------------------------------------------------------------------------


@finding("F8", "Uniform merging is the weakest consolidator on the agentic domains.",
         "merge_uniform's mean of nq and retail is below both MMOPD's and SDFT's beyond noise (differences paired by "
         "task and seed, the two benchmarks independent); the other merges shown beside it; underpowered where the "
         "test could not have seen the study's own gaps (11.1 to MMOPD, 9.9 to SDFT); not testable when nq and "
         "retail never rose above 0")
def rule_f8(data: FinalData) -> dict:
    agentic = [IN_DOMAIN[d] for d in F8_AGENTIC]
    quantity = "agentic mean (nq, retail) of merge_uniform, mmopd, sdft (and the other merges)"
    mt = data.study.get("main_table", {})
    study_means = {c: statistics.fmean(mt[c][b] for b in agentic) for c in ("merge_uniform", "mmopd", "sdft")
                   if c in mt and all(b in mt[c] for b in agentic)}
    study = ", ".join(f"{c} {v:.1f}" for c, v in study_means.items())
    missing = missing_runs(data, ["merge_uniform", "mmopd", "sdft"])
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
        if all(x is not None for x in ests):
            means[c] = mean_of(ests)
    if any(c not in means for c in ("merge_uniform", "mmopd", "sdft")):
        return _row("F8", quantity, "-", study, NOT_TESTABLE, "a run lacks an nq or retail score",
                    study_values=study_means, study_source=STUDY_DERIVED)
    parts, gaps = {}, {}
    for c in ("mmopd", "sdft"):
        gap = mean_of([data.diff(c, "merge_uniform", b) for b in agentic])
        gaps[c] = js(gap)
        theirs = (study_means[c] - study_means["merge_uniform"]
                  if c in study_means and "merge_uniform" in study_means else None)
        parts[c] = above(f"merge_uniform below {c}", gap, 0.0, _positive(theirs))
    verdict = decide(list(parts.values()))
    ours = ", ".join(f"{c} {e(v)}" for c, v in means.items())
    detail = ("below both beyond noise" if verdict == REPRODUCED else
              f"not below {', '.join(c for c, p in parts.items() if p.status != HOLDS)} beyond noise"
              + ("" if verdict == NOT_REPRODUCED else " (gaps as large as the study's are below our precision)"))
    return _row("F8", quantity, ours, study, verdict, detail,
                {**{c: js(v) for c, v in means.items()}, "minus_merge_uniform": gaps}, study_means, STUDY_DERIVED,
                parts=list(parts.values()))
