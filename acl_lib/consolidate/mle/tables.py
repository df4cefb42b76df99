"""What notebook 11 shows: DataFrames of the experts, the routers (accuracy, confusion), the cost and the stress
cases, and a reading computed from this run's numbers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from acl_lib.consolidate.mle.specs import EXPERT_JSON, MLESpec, expert_run
from acl_lib.envs import BENCHMARKS, IN_DOMAIN

if TYPE_CHECKING:
    from acl_lib.config import Config


def confusion_frame(conf: Mapping[str, Mapping[str, int]]):
    """The confusion table as a DataFrame: one row per benchmark (suite, the domain it measures), one column per
    expert, plus the share routed to the benchmark's own domain."""
    import pandas as pd

    rows = []
    for key, counts in conf.items():
        b = BENCHMARKS[key]
        n = sum(counts.values())
        rows.append({"benchmark": key, "suite": b.suite, "measures": b.domain, **counts,
                     "to its domain %": 100.0 * counts.get(b.domain, 0) / n if n else None})
    return pd.DataFrame(rows).set_index("benchmark")


def router_accuracy_frame(info: Mapping):
    import pandas as pd

    return pd.DataFrame([{"router": k, "train accuracy": info[k]["train_accuracy"],
                          "held-out accuracy": info[k]["heldout_accuracy"]} for k in ("context", "learned")]
                        ).set_index("router")


def measurements_frame(meas: Mapping):
    import pandas as pd

    lat = meas["latency"]
    rows = []
    for k, label in (("routed", "routed (mixed experts)"), ("backbone", "backbone alone"),
                     ("merged", f"one expert merged ({lat['merged_expert']})")):
        rows.append({"model": label, "best s": lat[k]["best_s"], "tokens/s": lat[k]["tokens_per_s"]})
    return pd.DataFrame(rows).set_index("model")


def stress_frame(res: Mapping):
    import pandas as pd

    return pd.DataFrame({who: {case: v["score"] for case, v in rows.items()} for who, rows in res.items()})


def stress_routes_frame(res: Mapping):
    """Which expert each router gave each stress case's episodes (first decision, and any re-routing)."""
    import pandas as pd

    rows = {}
    for who, cases in res.items():
        if not who.startswith("mle_"):
            continue
        rows[who] = {case: ", ".join(f"{k} x{v}" for k, v in Counter(v.get("routes", [])).most_common())
                     for case, v in cases.items()}
    return pd.DataFrame(rows)


def reading(scores: Mapping[str, Mapping[str, float]], study: Mapping[str, Mapping], router_info: Mapping | None,
            measurements: Mapping | None, stress: Mapping | None, names: Sequence[str] = ("mle", "mle_learned"),
            curriculum: Sequence[str] = ("math", "search", "ecom", "if")) -> str:
    """Markdown computed from this run's numbers: each MLE system against each domain's oracle and
    ``seq_final`` in-domain, the study's gap (``main_table.mle`` vs the oracles), the routers' accuracy, the
    cost and the stress cases."""
    lines = []
    for n in names:
        if n not in scores:
            lines.append(f"- `{n}`: not evaluated.")
            continue
        parts = []
        for d in curriculum:
            b = IN_DOMAIN[d]
            o = scores.get(f"oracle_{d}", {}).get(b)
            s = scores[n].get(b)
            if s is None:
                continue
            txt = f"{b} {s:.1f}"
            if o is not None:
                txt += f" (oracle {o:.1f}, {s - o:+.1f})"
            if "seq_final" in scores and b in scores["seq_final"]:
                txt += f" (seq_final {scores['seq_final'][b]:.1f})"
            parts.append(txt)
        lines.append(f"- `{n}` in domain: " + "; ".join(parts) + ".")
    theirs = study.get("mle") or {}
    gaps = []
    for d in curriculum:
        b = IN_DOMAIN[d]
        o = (study.get(f"oracle_{d}") or {}).get(b)
        if b in theirs and o is not None:
            gaps.append(f"{b} {theirs[b]:.1f} vs {o:.1f} ({theirs[b] - o:+.1f})")
    if gaps:
        lines.append("- The study's MLE against its oracles: " + "; ".join(gaps) + ".")
    if router_info:
        for k in ("context", "learned"):
            i = router_info[k]
            conf = i["confusion"]
            tot = sum(sum(v.values()) for v in conf.values())
            right = sum(v.get(BENCHMARKS[b].domain, 0) for b, v in conf.items())
            lines.append(f"- {k} router: held-out accuracy {100 * i['heldout_accuracy']:.1f}% (training "
                         f"{100 * i['train_accuracy']:.1f}%); {right} of {tot} benchmark episodes "
                         f"({100 * right / max(tot, 1):.1f}%) go to the expert of the domain the benchmark measures.")
    if measurements:
        lat = measurements["latency"]
        lines.append(f"- Cost: {measurements['extra_parameters_total']:,} LoRA parameters for "
                     f"{len(measurements['experts'])} experts ({100 * measurements['extra_share_total']:.2f}% of the "
                     f"backbone); one routed batch takes {lat['routed_over_backbone']:.2f}x the backbone's time and "
                     f"{lat['routed_over_merged']:.2f}x one merged expert's.")
    if stress:
        for who, s in stress.items():
            lines.append(f"- `{who}` stress cases: " + ", ".join(f"{k} {v['score']:.0f}" for k, v in s.items()) + ".")
        sw = {w: [v["score"] for k, v in s.items() if k.startswith("switch_")] for w, s in stress.items()}
        if "mle_context" in sw and "mle_context_reroute" in sw and sw["mle_context"]:
            a, b = (sum(sw[w]) / len(sw[w]) for w in ("mle_context", "mle_context_reroute"))
            lines.append(f"- Mid-episode change: re-routing at every turn {'helps' if b > a else 'does not help'} the "
                         f"context router here ({a:.0f} -> {b:.0f} on the switch cases).")
    return "\n".join(lines)


def experts_frame(cfg: Config, spec: MLESpec):
    """One row per expert of ``spec``: its run, rank, LoRA parameters, recipe (cold start, demos kept, SFT and
    GRPO steps), wall time and the backbone check."""
    import pandas as pd

    rows = []
    for d in cfg.pipeline.curriculum:
        r = expert_run(cfg, spec, d)
        if not r.is_complete():
            rows.append({"domain": d, "run": r.name, "status": r.status()})
            continue
        i = r.read_json(EXPERT_JSON)
        rows.append({"domain": d, "run": r.name, "backbone": i.get("start_run"), "rank": i["lora"]["r"],
                     "LoRA parameters": i["trainable_parameters"], "cold start": i["cold_start"],
                     "demos kept": (i.get("demos") or {}).get("kept"), "sft steps": i.get("sft_steps", 0),
                     "grpo steps": i.get("grpo_steps", 0), "wall s": i["wall_s"],
                     "backbone bit-identical": i["backbone_unchanged_in_memory"] and i["backbone_files_unchanged"]})
    return pd.DataFrame(rows).set_index("domain")
