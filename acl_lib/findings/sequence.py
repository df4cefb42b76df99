"""F1 and F2: what the sequential pipeline does to the earlier domains (the trajectory of ``base``, ``seq_*``).

Every gap is a difference of checkpoints on the same tasks, paired by task and seed (:meth:`FinalData.contrast`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

from acl_lib.envs import IN_DOMAIN
from acl_lib.final import STUDY_DERIVED, FinalData, has_value
from acl_lib.findings.core import (
    FAILS,
    HOLDS,
    NOT_REPRODUCED,
    NOT_TESTABLE,
    REPRODUCED,
    Part,
    _row,
    above,
    all_of,
    any_of,
    complete_seeds,
    decide,
    e,
    failing,
    finding,
    js,
    mde_of,
    missing_runs,
    study_seq,
    undecided,
)
from acl_lib.noise import BEYOND, Estimate, combine

# --- F1: non-monotonic forgetting ------------------------------------------------------------------------------


def recoveries(n: int, own: int, trains: Callable[[int], bool], fell: Callable[[int, int], bool],
               rose: Callable[[int, int], bool]) -> list[tuple[int, int, int]]:
    """``(i, j, m)`` along a trajectory of ``n`` checkpoints (0 the base) where a domain trained at stage ``own``
    falls from stage ``i`` to ``j`` and rises again at ``m``: ``own <= i < j < m``, ``fell(i, j)``, ``rose(j, m)``
    and the stage ``m`` did not train the domain (``not trains(m)``)."""
    return [(i, j, m) for j in range(max(own, 1) + 1, n - 1) for i in range(max(own, 1), j) for m in range(j + 1, n)
            if not trains(m) and fell(i, j) and rose(j, m)]


def point_recoveries(traj: Sequence[float | None], own: int,
                     trains: Callable[[int], bool]) -> list[tuple[int, int, int]]:
    """:func:`recoveries` on point values (the study's trajectory, which has no noise floor); None: not reported."""
    known = [v is not None for v in traj]
    return recoveries(len(traj), own, trains, lambda i, j: known[i] and known[j] and traj[j] < traj[i],
                      lambda j, m: known[j] and known[m] and traj[m] > traj[j])


def _paired(data: FinalData, benchmark: str) -> Callable[[int, int], Estimate | None]:
    """``diff(x, y)``: stage ``x`` minus stage ``y`` of the sequence on ``benchmark``, paired, computed once."""
    cache: dict[tuple[int, int], Estimate | None] = {}

    def diff(x: int, y: int) -> Estimate | None:
        if (x, y) not in cache:
            cache[(x, y)] = data.diff(data.seq_runs[x], data.seq_runs[y], benchmark)
        return cache[(x, y)]

    return diff


def _beyond(d: Estimate | None) -> bool:
    """Whether a difference is above 0 beyond noise (on the point value where nothing gives it an error)."""
    return d is not None and d.value > BEYOND * d.se


def _study_f1(data: FinalData) -> tuple[str, dict]:
    """The study's trajectory read as F1 reads ours, on point values: per earlier domain the drop from the peak
    before the last stage to the final, and its largest recovery ``(j, m, rise)``."""
    runs, traj_all = data.seq_runs, study_seq(data)
    below, rec, out = [], [], {}
    for own, d in enumerate(data.curriculum[:-1], start=1):
        b = IN_DOMAIN[d]
        traj = [traj_all.get(r, {}).get(b) for r in runs]
        before = [v for v in traj[1:-1] if v is not None]
        entry: dict = {}
        if before and traj[-1] is not None and max(before) > traj[-1]:
            below.append(f"{b} {max(before):.1f} -> {traj[-1]:.1f}")
            entry["drop"] = max(before) - traj[-1]
        found = point_recoveries(traj, own, lambda m, d=d: data.curriculum[m - 1] == d)
        if found:
            i, j, m = max(found, key=lambda t: traj[t[2]] - traj[t[1]])
            rec.append(f"{b} {traj[i]:.1f} -> {traj[j]:.1f} -> {traj[m]:.1f}")
            entry["recovery"] = (j, m, traj[m] - traj[j])
        out[d] = entry
    text = (f"below the peak: {', '.join(below) or 'none'}; recovery: {', '.join(rec) or 'none'}"
            if below or rec else "")
    return text, out


@finding("F1", "Sequential training is non-monotonic: later stages both disrupt and partially recover earlier skills, "
               "and the final checkpoint ends below the earlier peaks on the earlier domains.",
         "two parts, each judged on the earlier domains' in-domain benchmarks (differences paired by task and seed, "
         "beyond noise = more than 2 SE): (a) below the peak: for at least one domain whose peak before the last stage "
         "is above the base beyond noise, the final checkpoint is below that peak beyond noise; (b) recovery: at least "
         "one domain falls beyond noise from a stage at or after its own stage and rises again beyond noise at a later "
         "stage that did not train it (a domain relearned at its own stage is no recovery). Reproduced when both hold; "
         "monotone erasure (a without b) is not reproduced; a part that could not have seen the study's own effect "
         "(its drop from the peak, its largest recovery, at the study's stages) is underpowered")
def rule_f1(data: FinalData) -> dict:
    quantity = "per earlier domain: peak before the last stage -> final; fall -> later rise (points)"
    runs = data.seq_runs
    study, theirs = _study_f1(data)
    source = STUDY_DERIVED
    if not complete_seeds(data, runs):
        missing = ", ".join(missing_runs(data, runs)) or "a complete sequence in one seed"
        return _row("F1", quantity, "-", study, NOT_TESTABLE, f"runs missing: {missing}", study_source=source)
    below, recovered, learned, never = [], [], [], []
    parts_a, parts_b = [], []
    values: dict = {"domains": {}}
    for own, d in enumerate(data.curriculum[:-1], start=1):
        b = IN_DOMAIN[d]
        traj = [data.estimate(r, b) for r in runs]
        diff = _paired(data, b)
        found = recoveries(len(runs), own, lambda m, d=d: data.curriculum[m - 1] == d,
                           lambda i, j, diff=diff: _beyond(diff(i, j)), lambda j, m, diff=diff: _beyond(diff(m, j)))
        entry = {"benchmark": b, "trajectory": [js(t) for t in traj]}
        if found:
            i, j, m = max(found, key=lambda t: diff(t[2], t[1]).value)
            recovered.append(f"{b} {e(traj[i])} ({runs[i]}) -> {e(traj[j])} ({runs[j]}) -> {e(traj[m])} ({runs[m]})")
            entry["recovery"] = [runs[i], runs[j], runs[m]]
            study_rise = theirs[d]["recovery"][2] if "recovery" in theirs[d] else None
            parts_b.append(Part(f"(b) recovery on {b}", HOLDS, mde_of(diff(m, j)), study_rise))
        elif "recovery" in theirs[d]:  # the study recovered here: could we have seen a rise as large at its stages?
            j, m, rise = theirs[d]["recovery"]
            parts_b.append(undecided(f"(b) recovery on {b} ({runs[j]} -> {runs[m]})", diff(m, j), rise))
        else:  # no recovery in the study either: the precision of a rise into the last stage, for the record
            parts_b.append(Part(f"(b) recovery on {b}", FAILS, mde_of(diff(len(runs) - 1, len(runs) - 2))))
        before = [(i, t) for i, t in enumerate(traj[1:-1], start=1) if t is not None]
        if not before or traj[0] is None or traj[-1] is None:
            never.append(b)
            values["domains"][d] = entry
            continue
        i, peak = max(before, key=lambda it: it[1].value)
        if not _beyond(diff(i, 0)):
            never.append(b)
            values["domains"][d] = entry
            continue
        learned.append(b)
        entry["peak"] = runs[i]
        drop = diff(i, len(runs) - 1)
        part = above(f"(a) {b} below its peak ({runs[i]})", drop, 0.0, theirs[d].get("drop"))
        parts_a.append(part)
        if part.status == HOLDS:
            below.append(f"{b} {e(peak)} ({runs[i]}) -> {e(traj[-1])}")
            entry["below_peak"] = True
        entry["drop_from_peak"] = js(drop)
        values["domains"][d] = entry
    values |= {"below_peak": bool(below), "recovery": bool(recovered)}
    ours = f"(a) below the peak: {'; '.join(below) or 'none'}; (b) recovery: {'; '.join(recovered) or 'none'}"
    skipped = f"; never above the base beyond noise, left out of (a): {', '.join(never)}" if never else ""
    if not learned:
        return _row("F1", quantity, ours, study, NOT_TESTABLE,
                    f"no earlier domain rose above the base beyond noise ({', '.join(never)}): nothing to forget",
                    values, study_source=source)
    parts = [any_of("(a) final below an earlier peak", parts_a), any_of("(b) recovery", parts_b)]
    verdict = decide(parts)
    why = "both parts hold" if verdict == REPRODUCED else failing(parts)
    if parts[0].status == HOLDS and verdict == NOT_REPRODUCED:
        why += ": no earlier domain rises again after falling beyond noise, the forgetting is monotone"
    return _row("F1", quantity, ours, study, verdict, f"{why}; {len(data.seeds)} seed(s){skipped}", values,
                study_source=source, parts=parts)


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


def drops_contrast(data: FinalData, terms: Sequence[tuple[float, int]]) -> Estimate | None:
    """``sum c * drop_i`` over ``terms`` ``[(c, stage index)]`` (:func:`stage_drops`' drops, 1 the first stage),
    as one contrast of the sequence's runs per benchmark (paired by task and seed), the benchmarks independent."""
    per: dict[str, dict[str, float]] = {}
    for coef, i in terms:
        bs = [IN_DOMAIN[x] for x in ("math", "search") if x != data.curriculum[i - 1]]
        for b in bs:
            w = per.setdefault(b, {})
            for run, sign in ((data.seq_runs[i - 1], 1.0), (data.seq_runs[i], -1.0)):
                w[run] = w.get(run, 0.0) + coef * sign / len(bs)
    ests = [data.contrast(w, b) for b, w in per.items()]
    return None if not ests or any(x is None for x in ests) else combine(ests, [1.0] * len(ests))


@finding("F2", "The E-commerce stage (1 tool -> 15 tools) causes the largest interference on math and search.",
         "the ecom stage's drop on math+search (mean of aime26 and nq, a stage's own benchmark left out; score before "
         "the stage minus after, paired by task and seed) is above 0 beyond noise and above every other stage's drop "
         "beyond noise; a part that could not have seen the study's own gap (its ecom drop, ecom's drop over each "
         "other stage's) is underpowered")
def rule_f2(data: FinalData) -> dict:
    quantity = "drop on math+search caused by each stage (before - after, points)"
    theirs = stage_drops(data.study.get("sequential", {}), ["base", *[f"seq_{d}" for d in data.curriculum]],
                         data.curriculum)
    study = ", ".join(f"{d} {v:+.1f}" for d, v in theirs.items())
    if not complete_seeds(data, data.seq_runs) or "ecom" not in data.curriculum:
        return _row("F2", quantity, "-", study, NOT_TESTABLE,
                    f"runs missing: {', '.join(missing_runs(data, data.seq_runs)) or 'ecom is not in the curriculum'}",
                    study_values=theirs, study_source=STUDY_DERIVED)
    rose = [b for b in ("aime26", "nq")
            if max((data.mean(r, b) or 0.0) for r in data.seq_runs[1:]) > (data.mean("base", b) or 0.0)]
    if not rose:
        return _row("F2", quantity, "-", study, NOT_TESTABLE,
                    "neither aime26 nor nq rose above the base along the sequence: no interference to measure",
                    study_values=theirs, study_source=STUDY_DERIVED)
    stage = {d: i for i, d in enumerate(data.curriculum, 1)}
    drops = {d: x for d, i in stage.items() if (x := drops_contrast(data, [(1.0, i)])) is not None}
    ours = ", ".join(f"{d} {e(v)}" for d, v in drops.items())
    worst = max(drops, key=lambda d: drops[d].value)
    over = []
    for o, i in stage.items():
        if o == "ecom":
            continue
        gap = theirs["ecom"] - theirs[o] if "ecom" in theirs and o in theirs else None
        over.append(above(f"ecom's drop above {o}'s", drops_contrast(data, [(1.0, stage["ecom"]), (-1.0, i)]), 0.0,
                          gap if gap is not None and gap > 0 else None))
    parts = [above("ecom's drop above 0", drops.get("ecom"), 0.0, theirs.get("ecom")),
             all_of("ecom's drop the largest", [p for p in over if p is not None])]
    parts = [p for p in parts if p is not None]
    verdict = decide(parts)
    detail = f"largest: {worst}; " + ("both parts hold" if verdict == REPRODUCED else failing(parts))
    if verdict == NOT_REPRODUCED and parts[0].status != HOLDS:
        detail += " (not above 0 beyond noise)"
    return _row("F2", quantity, ours, study, verdict, detail, {d: js(v) for d, v in drops.items()}, theirs,
                STUDY_DERIVED, parts=parts)
