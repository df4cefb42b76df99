"""What notebook 09 shows: the filter's statistics, the SDFT runs' training, the update directions, and a
reading computed from the scores."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from acl_lib.consolidate.sdft.training import SUMMARY_JSON
from acl_lib.envs import IN_DOMAIN
from acl_lib.steps import SEQ_FINAL, made_by

if TYPE_CHECKING:
    from acl_lib.config import Config


def filter_frame(filter_json: Mapping):
    """Per domain: tried, reward-failed, protocol-failed, duplicates, kept, acceptance, the main reasons."""
    import pandas as pd

    rows = []
    for d, s in filter_json["domains"].items():
        top = {k: ", ".join(f"{why} ({n})" for why, n in list(v.items())[:2]) for k, v in s["reasons"].items()}
        rows.append({"domain": d, "oracle": s["oracle"], "tried": s["tried"], "reward failed": s["reward_failed"],
                     "protocol failed": s["protocol_failed"], "duplicates": s["duplicates"], "kept": s["kept"],
                     "acceptance %": round(100 * s["acceptance"], 1), "reward: top reasons": top["reward"],
                     "protocol: top reasons": top["protocol"]})
    return pd.DataFrame(rows).set_index("domain")


def directions_frame(directions: Mapping | None):
    """The update-direction cosines, ours beside the study's."""
    import pandas as pd

    if directions is None:
        return pd.DataFrame({"note": ["not computed: sdft and sdft_base were not trained (no data)"]})
    un = directions["unrelated_single_domain_sft"]
    rows = [{"cosine between": "sdft_base - base  vs  sdft - seq_final (the same SFT, two starts)",
             "ours": directions["same_sft_from_base_vs_seq_final"],
             "study": directions["study"]["same_sft_from_base_vs_seq_final"]}]
    rows += [{"cosine between": f"{un['kind']} updates {pair}", "ours": v, "study": None}
             for pair, v in un["pairs"].items()]
    rows.append({"cosine between": f"unrelated single-domain SFT updates (mean of {len(un['pairs'])})",
                 "ours": un["mean"], "study": directions["study"]["unrelated_single_domain_sft"]})
    return pd.DataFrame(rows).set_index("cosine between")


def training_frame(cfg: Config, names: Sequence[str]):
    """Per SDFT run: start, order, rows per domain, rows seen, first / last loss, ||d theta|| (absolute and
    relative to the start's norm)."""
    import pandas as pd

    rows = []
    for n in names:
        p = cfg.seed_dir() / n / SUMMARY_JSON
        if not p.is_file():
            continue
        s = json.loads(p.read_text())
        rows.append({"run": n, "start": s["start_run"], "order": s["order"],
                     "rows per domain": ", ".join(f"{d} {k}" for d, k in s["rows_per_domain"].items()),
                     "rows": s["rows"], "rows seen": s["rows_seen"], "steps": s["steps"],
                     "first loss": s["first_loss"], "last loss": s["last_loss"],
                     "||d theta||": s["displacement_norm"], "||d theta|| / ||theta||": s["relative_displacement"]})
    if not rows:
        return pd.DataFrame({"note": ["no SDFT run trained: the filter kept nothing to train on"]})
    return pd.DataFrame(rows).set_index("run")


def sdft_reading(scores: Mapping[str, Mapping[str, float]], names: Sequence[str], study: Mapping[str, Mapping],
                 directions: Mapping | None = None) -> str:
    """Markdown computed from the scores: what each SDFT run wins and loses against ``seq_final`` on the
    in-domain benchmarks, the study's row beside ours, and the update-direction check."""
    lines = []
    final = scores.get("seq_final")
    if final is None:
        lines.append(f"No `seq_final` evaluation yet ({made_by(SEQ_FINAL)}): nothing to compare the SDFT runs with.")
    for n in names if final is not None else ():
        if n not in scores:
            lines.append(f"- `{n}`: not evaluated.")
            continue
        s = scores[n]
        diffs = {d: s[b] - final[b] for d, b in IN_DOMAIN.items() if b in s and b in final}
        won = [f"{d} ({IN_DOMAIN[d]} {v:+.1f})" for d, v in diffs.items() if v > 0]
        lost = [f"{d} ({IN_DOMAIN[d]} {v:+.1f})" for d, v in diffs.items() if v < 0]
        mean = sum(s[b] for b in IN_DOMAIN.values() if b in s) / max(1, sum(b in s for b in IN_DOMAIN.values()))
        lines.append(f"- `{n}` against `seq_final`: {'wins ' + ', '.join(won) if won else 'wins no domain'}; "
                     f"{'loses ' + ', '.join(lost) if lost else 'loses none'} (in-domain mean {mean:.1f}).")
    theirs, ours = study.get("sdft") or {}, scores.get("sdft")
    if ours and theirs:
        t_final = study.get("seq_final") or {}
        cmp = ", ".join(f"{b} {ours[b]:.1f} (study {theirs[b]:.1f}, study's seq_final "
                        f"{t_final.get(b, float('nan')):.1f})" for b in theirs if b in ours)
        lines.append(f"\n`sdft`, ours beside the study's: {cmp}.")
    if final is not None and not any(n in scores for n in names):
        lines.append("No SDFT run is scored: none was trained, the filter kept nothing to train on (the filter "
                     "statistics above say why).")
    if directions and directions["unrelated_single_domain_sft"]["mean"] is not None:
        same = directions["same_sft_from_base_vs_seq_final"]
        un = directions["unrelated_single_domain_sft"]
        lines.append(
            f"\n**Update directions.** The SFT from the base and the same SFT from `seq_final` move the weights in "
            f"directions with cosine **{same:.2f}** (study 0.77); two unrelated single-domain SFT updates "
            f"({un['kind']}, mean over {len(un['pairs'])} pairs) **{un['mean']:.2f}** (study 0.05). "
            + ("As in the study, the data, not the starting point, sets the direction of the update."
               if un["mean"] is not None and same > un["mean"] + 0.2 else
               "Here the gap the study reports does not appear: the direction is not set by the data alone.")
        )
    return "\n".join(lines)
