"""F3, F4 and F5: where forgetting lives inside the model (the token and weight diagnostics of notebooks 06, 07 and
the SDFT step's update-direction check), each number judged on its confidence bound."""

from __future__ import annotations

import statistics

from acl_lib.final import FinalData, has_value
from acl_lib.findings.core import (
    F3_CHANGED_HIGH_MIN,
    F3_LOW_STABLE_MIN,
    F3_STUDY_ALMOST_ALL,
    F4_SAME_MIN,
    F4_UNRELATED_MAX,
    F5_BAND,
    NOT_TESTABLE,
    REPRODUCED,
    _row,
    above,
    below,
    decide,
    e,
    failing,
    finding,
    js,
    within,
)
from acl_lib.noise import Estimate, TaskCounts, binomial_se, clustered_se

# --- F3: tokens ------------------------------------------------------------------------------------------------


def _fraction_se(ck: dict, key: str, hits: str, of: str, fallback_n: int | None) -> tuple[float | None, str]:
    """The standard error (fraction) of one checkpoint's ``key`` fraction: clustered by reference episode from its
    ``per_episode`` counts (``per_episode[hits]`` of ``per_episode[of]`` positions per episode) where tokens.json
    has them, else binomial over ``fallback_n`` positions (the positions of one episode taken as independent: too
    small). Returns ``(se, basis)``."""
    per = ck.get("per_episode") or {}
    hits, n = per.get(hits), per.get(of)
    if hits is not None and n is not None:
        keep = [(h, m) for h, m in zip(hits, n) if m]
        if keep:
            return clustered_se(TaskCounts.from_arrays([h for h, _ in keep], [m for _, m in keep])) / 100.0, "episode"
    v = ck.get(key)
    if not has_value(v) or not fallback_n:
        return None, "none"
    return binomial_se(100.0 * v, fallback_n) / 100.0, "position"


def _tokens_seed(d: dict) -> dict | None:
    """One seed's F3 numbers from its tokens.json: the means over the later checkpoints of the low-entropy stable
    fraction and of the changed positions' high-entropy share, each with its standard error (the mean of the
    checkpoints' errors: the checkpoints share their positions, so their errors are not independent), the
    high-entropy share of positions and the threshold."""
    cks = [c for c in (d.get("checkpoints") or {}).values() if has_value(c.get("low_entropy_stable"))]
    if not cks:
        return None
    low = statistics.fmean(c["low_entropy_stable"] for c in cks)
    low_se = [_fraction_se(c, "low_entropy_stable", "low_stable", "low", d.get("low_entropy_positions")) for c in cks]
    with_share = [c for c in cks if has_value(c.get("changed_share_in_high_entropy"))]
    share_se = [_fraction_se(c, "changed_share_in_high_entropy", "changed_high", "changed",
                             c.get("changed_positions"))
                for c in with_share]

    def mean_se(ses):
        return statistics.fmean(s for s, _ in ses) if ses and all(s is not None for s, _ in ses) else None

    return {"low": low, "low_se": mean_se(low_se),
            "share": statistics.fmean(c["changed_share_in_high_entropy"] for c in with_share) if with_share else None,
            "share_se": mean_se(share_se), "basis": sorted({b for _, b in low_se + share_se}),
            "fraction": d.get("high_entropy_fraction"), "threshold": d.get("entropy_threshold")}


@finding("F3", "Low-entropy positions stay stable across stages; prediction changes concentrate at high-entropy "
               "positions.",
         f"consistency = a later checkpoint still ranks the reference rollout's own token first; high entropy = the "
         f"reference's entropy above a fixed threshold in nats (the same for every profile; the share of positions "
         f"above it is reported beside the study's 6%). Reproduced when, on their lower confidence bounds (mean "
         f"over the later checkpoints and the seeds - 2 SE), the low-entropy stable fraction is >= "
         f"{F3_LOW_STABLE_MIN:g} and the share of changed positions that are high-entropy (the study's 'almost all') "
         f"is >= {F3_CHANGED_HIGH_MIN:g}; a part that could not have seen the study's own margin over its bar (0.94 "
         f"stable; 'almost all' read as {F3_STUDY_ALMOST_ALL:g}) is underpowered")
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
    share = Estimate.of_values([v["share"] for v in per.values()], [v["share_se"] for v in per.values()])
    thresholds = sorted({v["threshold"] for v in per.values()})
    basis = sorted({b for v in per.values() for b in v["basis"]} - {"none"})
    values = {"low_entropy_stable": js(low), "changed_share_in_high_entropy": js(share),
              "high_entropy_fraction": js(frac), "entropy_threshold_nats": thresholds, "se_clustered_by": basis}
    study_frac = study_values["high_entropy_fraction"]
    ours = (f"low-entropy stable {e(low, 3)}; changed at high entropy {e(share, 3)}; positions above "
            f"{'/'.join(f'{t:g}' for t in thresholds)} nats {e(frac, 3)}"
            + (f" (the study: ~{study_frac:g})" if study_frac is not None else ""))
    if frac is None or frac.value == 0:
        return _row("F3", quantity, ours, study, NOT_TESTABLE,
                    "no position lies above the entropy threshold: no high-entropy positions to concentrate on", values,
                    study_values=study_values)
    if share is None:
        return _row("F3", quantity, ours, study, NOT_TESTABLE, "no position changed in any later checkpoint", values,
                    study_values=study_values)
    stable_study = study_values["low_entropy_stable"]
    fmt = {"unit": "", "digits": 3}
    parts = [above(f"low-entropy stable >= {F3_LOW_STABLE_MIN:g}", low, F3_LOW_STABLE_MIN,
                   None if stable_study is None else stable_study - F3_LOW_STABLE_MIN, strict=False, **fmt),
             above(f"changes at high entropy >= {F3_CHANGED_HIGH_MIN:g}", share, F3_CHANGED_HIGH_MIN,
                   F3_STUDY_ALMOST_ALL - F3_CHANGED_HIGH_MIN, strict=False, **fmt)]
    verdict = decide(parts)
    why = "both parts hold on their lower bounds" if verdict == REPRODUCED else failing(parts)
    se_note = ("; SE over positions (tokens.json has no per-episode counts: too small)" if "position" in basis
               else "; SE clustered by reference episode")
    return _row("F3", quantity, ours, study, verdict, f"{why}; {len(per)} seed(s){se_note}", values,
                study_values=study_values, parts=parts)


# --- F4, F5: weights -----------------------------------------------------------------------------------------------


@finding("F4", "Task updates are only partly aligned: the same oracle-mixture SFT from the base model and from the "
               "sequential endpoint has cosine 0.77, unrelated SFT tasks sit at 0.05.",
         f"from the SDFT step's update-direction check: the same SFT mixture from the base and from the sequential "
         f"endpoint has cosine >= {F4_SAME_MIN:g} on its lower bound, and the cold-start SFT updates of unrelated "
         f"domains from the base have mean |cosine| <= {F4_UNRELATED_MAX:g} on its upper bound (means over seeds, "
         "± the spread over seeds; one seed is judged on its value); the oracles' pairwise task-vector cosines are "
         "shown as how partly aligned they are, with no study figure (it gives none)")
def rule_f4(data: FinalData) -> dict:
    quantity = "cosine: same SFT from base vs from seq_final; |cosine| of unrelated SFT updates"
    st = data.study.get("diagnostics", {})
    study_values = {"same_sft_from_base_vs_seq_endpoint": st.get("cosine_same_sft_from_base_vs_seq_endpoint"),
                    "unrelated_sft_tasks": st.get("cosine_unrelated_sft_tasks")}
    study = (f"same SFT {study_values['same_sft_from_base_vs_seq_endpoint']}; "
             f"unrelated {study_values['unrelated_sft_tasks']}")
    cross = Estimate.of_values([(w.get("cosine_summary") or {}).get("unrelated_oracles")
                                for w in (data.diagnostics.get("weights") or {}).values()])
    partly = (f"; the oracles' task vectors, pairwise: mean cosine {e(cross, 3)} (partly aligned; no study figure)"
              if cross is not None else "")
    dirs = data.diagnostics.get("directions") or {}
    if not dirs:
        return _row("F4", quantity, "-", study, NOT_TESTABLE,
                    "sdft_directions/directions.json missing (the SDFT step writes it once sdft and sdft_base are "
                    f"trained){partly}", {"oracles_pairwise": js(cross)}, study_values)
    kinds = {d["unrelated_single_domain_sft"].get("kind") for d in dirs.values()}
    same = Estimate.of_values([d.get("same_sft_from_base_vs_seq_final") for d in dirs.values()])
    un_vals = []
    for d in dirs.values():
        pairs = [v for v in d["unrelated_single_domain_sft"].get("pairs", {}).values() if has_value(v)]
        un_vals.append(statistics.fmean(abs(v) for v in pairs) if pairs else None)
    unrelated = Estimate.of_values(un_vals)
    values = {"same_sft": js(same), "unrelated_abs": js(unrelated), "oracles_pairwise": js(cross),
              "unrelated_kind": sorted(k for k in kinds if k)}
    ours = f"same SFT {e(same, 3)}; unrelated |cos| {e(unrelated, 3)}"
    if kinds != {"cold-start SFT"}:
        return _row("F4", quantity, ours, study, NOT_TESTABLE,
                    "fewer than two oracles kept a cold-start SFT model: the unrelated pair is whole oracle updates, "
                    f"not SFT updates{partly}", values, study_values)
    if same is None or unrelated is None:
        return _row("F4", quantity, ours, study, NOT_TESTABLE, f"a cosine is undefined (a zero update){partly}", values,
                    study_values)
    fmt = {"unit": "", "digits": 3}
    s_same, s_un = study_values["same_sft_from_base_vs_seq_endpoint"], study_values["unrelated_sft_tasks"]
    parts = [above(f"same SFT >= {F4_SAME_MIN:g}", same, F4_SAME_MIN, None if s_same is None else s_same - F4_SAME_MIN,
                   strict=False, **fmt),
             below(f"unrelated |cos| <= {F4_UNRELATED_MAX:g}", unrelated, F4_UNRELATED_MAX,
                   None if s_un is None else F4_UNRELATED_MAX - s_un, strict=False, **fmt)]
    verdict = decide(parts)
    why = "both parts hold on their bounds" if verdict == REPRODUCED else failing(parts)
    return _row("F4", quantity, ours, study, verdict, f"{why}; {same.seeds} seed(s){partly}", values, study_values,
                parts=parts)


@finding("F5", "SFT displaces parameters several times more than RL (3 to 7 times).",
         f"displacement = the L2 norm of a phase's total parameter change over the whole model (SFT: ||theta_sft - "
         f"theta_start||; RL: ||theta_end - theta_sft||), per cold-started stage; the mean SFT/RL ratio over the "
         f"stages that have both (mean over seeds ± the spread over seeds) lies in the study's band "
         f"{F5_BAND[0]:g}-{F5_BAND[1]:g} on both confidence bounds (mean ± 2 SE); not reproduced when it lies outside "
         "the band beyond noise, or could have been placed inside it and was not; underpowered when its 2.84 SE "
         "exceeds the 2 the study's own centre (5) leaves to either edge; one seed is judged on its value")
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
    lo, hi = (float(lohi[0]), float(lohi[1])) if lohi else F5_BAND
    part = within(f"inside {lo:g}-{hi:g}", est, lo, hi, (hi - lo) / 2, unit="x")
    where = ("inside" if lo <= est.value <= hi else "outside") + f" {lo:g}-{hi:g}"
    bounds = f"bounds {est.value - 2 * est.se:.1f}-{est.value + 2 * est.se:.1f}" if est.seeds > 1 else "one seed"
    verdict = decide([part])
    why = "inside the band on both bounds" if verdict == REPRODUCED else failing([part])
    return _row("F5", quantity, e(est), study, verdict, f"{est.value:.1f} {where} ({bounds}); {why}; "
                f"{est.seeds} seed(s)", {"ratio": js(est)}, {"range": lohi}, parts=[part])
