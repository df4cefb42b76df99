"""What notebook 10 shows: the validation search, the merges run and a reading computed from the scores (the
comparison with ``seq_final`` and the oracles: ``consolidate.compare``). Notebook 08's reading applies the same
rule to the distillation runs (``merge_reading``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from acl_lib.config import setting_text
from acl_lib.envs import BENCHMARKS, IN_DOMAIN
from acl_lib.steps import SEQ_FINAL, made_by

OTHER_CONSOLIDATIONS = ("mmopd", "sdft")  # the distillations (notebooks 08, 09)


def validation_frame(validation: Mapping, top: int = 8):
    """The validation search: the ``top`` candidates by mean validation score, and the two chosen ones, with
    each domain's validation score, the mean and the worst score relative to its oracle."""
    import pandas as pd

    chosen = validation["chosen"]
    rows = []
    ranked = sorted(validation["candidates"], key=lambda c: -c["mean"])
    for c in ranked[:top]:
        tags = [k for k, v in chosen.items() if v["weights"] == c["weights"]]
        rows.append({"lambda": _lam(c["weights"]), **c["scores"], "mean": c["mean"],
                     "worst / oracle": c["worst_relative"], "chosen as": ", ".join(tags)})
    for key, c in chosen.items():
        if not any(r["chosen as"] and key in r["chosen as"] for r in rows):
            rows.append({"lambda": _lam(c["weights"]), **c["scores"], "mean": c["mean"],
                         "worst / oracle": c["worst_relative"], "chosen as": key})
    rows.append({"lambda": "oracle", **validation["oracle_scores"], "mean": None, "worst / oracle": 1.0,
                 "chosen as": ""})
    return pd.DataFrame(rows).set_index("lambda")


def _lam(weights) -> str:
    """Coefficients as text (pandas would round a tuple of floats to the display precision)."""
    return ", ".join(f"{w:g}" for w in weights)


def _fmt(v: float) -> str:
    return f"{v:+.1f}"


def merge_reading(scores: Mapping[str, Mapping[str, float]], merges: Sequence[str],
                  study: Mapping[str, Mapping], validation: Mapping | None = None, kind: str = "merges") -> str:
    """Which domain each merge wins and loses against ``seq_final`` (in-domain benchmarks, then OOD), and the
    study's F6 / F8 checked on these rows. Markdown; every number comes from ``scores``."""
    if "seq_final" not in scores:
        return f"No `seq_final` evaluation yet: run {made_by(SEQ_FINAL)} first."
    final = scores["seq_final"]
    lines = []
    domains = list(IN_DOMAIN)
    wins_all = []
    for m in merges:
        if m not in scores:
            lines.append(f"- `{m}`: not evaluated.")
            continue
        s = scores[m]
        diffs = {d: s[IN_DOMAIN[d]] - final[IN_DOMAIN[d]] for d in domains
                 if IN_DOMAIN[d] in s and IN_DOMAIN[d] in final}
        if not diffs:
            continue
        best, worst = max(diffs, key=diffs.get), min(diffs, key=diffs.get)
        won = [d for d, v in diffs.items() if v > 0]
        lost = [d for d, v in diffs.items() if v < 0]
        ood = {b: s[b] - final[b] for b in s if BENCHMARKS[b].suite == "ood" and b in final}
        parts = []
        parts.append(f"wins {', '.join(f'{d} ({IN_DOMAIN[d]} {_fmt(diffs[d])})' for d in won)}" if won
                     else "wins no domain")
        parts.append(f"loses {', '.join(f'{d} ({IN_DOMAIN[d]} {_fmt(diffs[d])})' for d in lost)}" if lost
                     else "loses none")
        text = f"- `{m}` against `seq_final`: {'; '.join(parts)}"
        if best != worst and diffs[best] > 0 and diffs[worst] < 0:
            text += f" (largest gain {best}, largest loss {worst})"
        if ood:
            up = sum(v > 0 for v in ood.values())
            down = sum(v < 0 for v in ood.values())
            text += f"; out of domain {up} of {len(ood)} benchmarks up, {down} down"
        lines.append(text + ".")
        if len(diffs) == len(domains) and all(v >= 0 for v in diffs.values()) and any(v > 0 for v in diffs.values()):
            wins_all.append(m)
    ours_uniform, theirs_uniform = scores.get("merge_uniform"), study.get("merge_uniform") or {}
    if ours_uniform:
        cmp = ", ".join(f"{b} {ours_uniform[b]:.1f} (study {theirs_uniform[b]:.1f})" for b in theirs_uniform
                        if b in ours_uniform)
        lines.append(f"\nThe uniform merge, ours beside the study's: {cmp}.")
    present = [m for m in merges if m in scores]
    if present:
        lines.append(
            "\n**F6** (no shared-weight consolidation wins every domain): "
            + (f"holds among these {kind}: none is at or above `seq_final` on all four in-domain benchmarks."
               if not wins_all else f"does not hold here: {', '.join(f'`{m}`' for m in wins_all)} is at or above "
                                    "`seq_final` on all four in-domain benchmarks.")
        )
        agentic = [IN_DOMAIN["search"], IN_DOMAIN["ecom"]]
        consolidators = [m for m in present if m != "merge_oracles"] + [c for c in OTHER_CONSOLIDATIONS if c in scores]
        if "merge_uniform" in consolidators and len(consolidators) > 1:
            mean = {m: sum(scores[m].get(b, 0.0) for b in agentic) / len(agentic) for m in consolidators}
            weakest = min(mean, key=mean.get)
            lowest = [m for m in consolidators if mean[m] == mean[weakest]]
            verdict = ("holds here" if "merge_uniform" in lowest and len(lowest) == 1 else
                       "ties here" if "merge_uniform" in lowest else f"does not hold here (`{weakest}` is weaker)")
            lines.append(
                f"**F8** (uniform merging is the weakest consolidator on the agentic domains, mean of "
                f"{' and '.join(agentic)}): {verdict}; {', '.join(f'`{m}` {v:.1f}' for m, v in mean.items())}."
                + ("" if any(c in scores for c in OTHER_CONSOLIDATIONS) else
                   " Compared among the merges only: MMOPD and SDFT (notebooks 08, 09) are beside them in the "
                   "final tables (notebook 12).")
            )
    if validation is not None:
        ch = validation["chosen"]
        lines.append(
            f"\nCoefficients chosen on {validation['n_tasks']} validation tasks per domain "
            f"(the `{validation['split']}` "
            f"split, seed {validation['validation_seed']}; never the test tasks above): grid-searched "
            f"lambda = ({_lam(ch['grid']['weights'])}) (validation mean {ch['grid']['mean']:.1f}), "
            f"capability-balanced lambda = ({_lam(ch['balanced']['weights'])}) "
            + (f"(worst domain at {ch['balanced']['worst_relative']:.2f} of its oracle)."
               if ch['balanced']['worst_relative'] is not None
               else "(no oracle scores above 0 on validation, so it is chosen by the mean as well).")
        )
    return "\n".join(lines)


def specs_frame(specs):
    """The merges run: method, checkpoints merged, coefficients, density (TIES / DARE)."""
    import pandas as pd

    return pd.DataFrame([{"merge": s.name, "method": s.method, "sources": ", ".join(s.sources),
                          "lambda": _lam(s.weights),
                          "density": setting_text(s.density) if s.method != "task_arithmetic" else None} for s in specs]
                        ).set_index("merge")
