"""Figures and readings of notebooks 06 and 07, drawn from the dicts that ``weights.weight_diagnostics`` and
``tokens.token_diagnostics`` return (the same content as the JSON files they write). Plotly figures; the
notebooks show them and save them with ``report.save_figure``."""

from __future__ import annotations

import math

SEQ_COLOR, ORACLE_COLOR, BASE_COLOR = "#1f77b4", "#d62728", "#444444"


def _fmt(x, spec=".2f", none="-"):
    return none if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


# --- weights -----------------------------------------------------------------------------------------------


def pca_figure(diag: dict, title: str = "Unit-normalised task vectors on their first two principal components"):
    """The study's PCA: the sequential checkpoints as a path from the base, the oracles as separate markers."""
    import plotly.graph_objects as go

    fig = go.Figure()
    pca = diag.get("pca")
    if not pca:
        fig.update_layout(title="PCA: fewer than two checkpoints moved from the base", height=200)
        return fig
    pts, origin = pca["points"], pca["origin"]
    seq = [r["checkpoint"] for r in diag["stages"] if r["kind"] == "seq" and r["checkpoint"] in pts]
    path = [origin] + [pts[n] for n in seq]
    fig.add_trace(go.Scatter(x=[p[0] for p in path], y=[p[1] for p in path], mode="lines+markers+text",
                             text=["base"] + seq, textposition="top center", name="sequential path",
                             line={"color": SEQ_COLOR}, marker={"size": 10}))
    oracles = [n for n in pts if n.startswith("oracle_")]
    fig.add_trace(go.Scatter(x=[pts[n][0] for n in oracles], y=[pts[n][1] for n in oracles], mode="markers+text",
                             text=oracles, textposition="bottom center", name="oracles",
                             marker={"symbol": "diamond", "size": 13, "color": ORACLE_COLOR}))
    others = [n for n in pts if n not in seq and n not in oracles]
    if others:
        fig.add_trace(go.Scatter(x=[pts[n][0] for n in others], y=[pts[n][1] for n in others], mode="markers+text",
                                 text=others, name="other checkpoints", marker={"symbol": "square", "size": 11}))
    ev = pca["explained"]
    fig.update_layout(title=title, height=520, xaxis_title=f"PC1 ({100 * ev[0]:.0f}% of variance)",
                      yaxis_title=f"PC2 ({100 * ev[1]:.0f}% of variance)")
    return fig


def distance_figure(diag: dict):
    """Distance to the base (relative to the base's weight norm) along the sequence, the oracles as markers."""
    import plotly.graph_objects as go

    seq = [r for r in diag["stages"] if r["kind"] == "seq"]
    orc = [r for r in diag["stages"] if r["kind"] == "oracle"]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=["base"] + [r["checkpoint"] for r in seq], y=[0.0] + [r["relative_distance"] for r in seq],
                             mode="lines+markers", name="sequential", line={"color": SEQ_COLOR}))
    fig.add_trace(go.Scatter(x=[r["checkpoint"] for r in orc], y=[r["relative_distance"] for r in orc], mode="markers",
                             name="oracles", marker={"symbol": "diamond", "size": 12, "color": ORACLE_COLOR}))
    fig.update_layout(title="Distance to the base, ||theta - theta_base|| / ||theta_base||", height=380,
                      yaxis_title="relative distance")
    return fig


def cosine_figure(diag: dict):
    """Cosine matrix between every task vector (tau: checkpoint - base) and stage update (delta: checkpoint -
    the checkpoint it started from)."""
    import plotly.graph_objects as go

    labels, M = diag["cosine"]["labels"], diag["cosine"]["matrix"]
    text = [[_fmt(v) for v in row] for row in M]
    fig = go.Figure(go.Heatmap(z=M, x=labels, y=labels, text=text, texttemplate="%{text}", zmin=-1, zmax=1,
                               colorscale="RdBu", reversescale=True, colorbar={"title": "cos"}))
    fig.update_layout(title="Cosine between task vectors (tau) and stage updates (delta)",
                      yaxis={"autorange": "reversed"}, height=160 + 42 * len(labels))
    return fig


def sft_rl_figure(diag: dict):
    """Per cold-started stage: the SFT phase's and the RL phase's update norms relative to the starting weights
    (log scale), with their ratio above the bars."""
    import plotly.graph_objects as go

    rows = diag["sft_vs_rl"]
    names = [r["checkpoint"] for r in rows]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=names, y=[r["sft_relative"] for r in rows], name="SFT cold start"))
    fig.add_trace(go.Bar(x=names, y=[r["rl_relative"] or None for r in rows], name="RL (GRPO)",
                         text=[f"SFT/RL {_fmt(r['sft_over_rl'], '.1f', 'RL did not move')}" for r in rows],
                         textposition="outside"))
    fig.update_layout(barmode="group", yaxis_type="log", height=400,
                      title="SFT vs RL displacement, ||update|| / ||theta_start|| (the study: SFT moves 3-7x more)")
    return fig


def breakdown_figure(diag: dict):
    """Relative displacement of each phase by module type and by layer (heatmaps: rows = stage / phase)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = diag["breakdown"]
    keys = list(dict.fromkeys(f"{r['checkpoint']} · {r['phase']}" for r in rows))
    types = list(dict.fromkeys(r["group"] for r in rows if r["group"].startswith("type:")))
    layers = list(dict.fromkeys(r["group"] for r in rows if r["group"].startswith("layer:")))
    val = {(f"{r['checkpoint']} · {r['phase']}", r["group"]): r["relative"] for r in rows}
    fig = make_subplots(rows=1, cols=2, subplot_titles=["by module type", "by layer"], horizontal_spacing=0.18)
    for col, groups in ((1, types), (2, layers)):
        z = [[val.get((k, g)) for g in groups] for k in keys]
        fig.add_trace(go.Heatmap(z=z, x=[g.split(":", 1)[1] for g in groups], y=keys, coloraxis="coloraxis",
                                 text=[[_fmt(v, ".3f") for v in row] for row in z], texttemplate="%{text}"),
                      row=1, col=col)
    fig.update_layout(title="Where each phase moves the weights: ||update|| / ||theta_start|| per group",
                      coloraxis={"colorscale": "Viridis"}, height=180 + 34 * len(keys))
    fig.update_yaxes(autorange="reversed")
    return fig


def stages_frame(diag: dict):
    """Per checkpoint: distance to the base (L2 norm, and in % of the base's weight norm), the norm of its stage's
    own update, and the cosines with its domain's oracle vector (rounded for reading; the JSON keeps all digits)."""
    import pandas as pd

    rows = [{"checkpoint": r["checkpoint"], "domain": r["domain"], "start": r["start"],
             "distance to base": r["distance_to_base"], "distance, % of base norm": 100 * r["relative_distance"],
             "update norm": r["update_norm"], "cos(update, oracle)": r["cos_update_vs_oracle"],
             "cos(task vector, oracle)": r["cos_task_vector_vs_oracle"]} for r in diag["stages"]]
    frame = pd.DataFrame(rows, columns=["checkpoint", "domain", "start", "distance to base", "distance, % of base norm",
                                        "update norm", "cos(update, oracle)", "cos(task vector, oracle)"])
    return frame.set_index("checkpoint").astype({"cos(update, oracle)": float, "cos(task vector, oracle)": float}).round(3)


def sft_rl_frame(diag: dict, study: dict | None = None):
    """Per cold-started stage: the SFT and RL update norms, in % of the starting weights' norm, and their ratio."""
    import pandas as pd

    rows = [{"checkpoint": r["checkpoint"], "domain": r["domain"], "SFT norm": r["sft_norm"], "RL norm": r["rl_norm"],
             "SFT, % of weights": 100 * r["sft_relative"], "RL, % of weights": 100 * r["rl_relative"],
             "SFT / RL": r["sft_over_rl"], "cos(SFT, RL)": r["cos_sft_rl"]} for r in diag["sft_vs_rl"]]
    frame = pd.DataFrame(rows, columns=["checkpoint", "domain", "SFT norm", "RL norm", "SFT, % of weights",
                                        "RL, % of weights", "SFT / RL", "cos(SFT, RL)"]).set_index("checkpoint")
    frame = frame.astype({"SFT / RL": float, "cos(SFT, RL)": float}).round(3)
    if study:
        lo, hi = study["sft_over_rl_displacement"]
        frame["study SFT / RL"] = f"{lo}-{hi}"
    return frame


def weights_reading(diag: dict, cos: dict, study: dict, profile: str, seed: int) -> str:
    """Markdown: the study's weight-level claims (F4, F5, stages drift farther from the base) checked on this run."""
    lines = []
    seq = [r for r in diag["stages"] if r["kind"] == "seq"]
    if seq:
        d = [r["relative_distance"] for r in seq]
        grows = all(b >= a - 1e-12 for a, b in zip(d, d[1:]))
        lines.append(f"- **Drift from the base**: relative distance {' -> '.join(_fmt(x, '.3f') for x in d)} along "
                     f"{' -> '.join(r['checkpoint'] for r in seq)}: "
                     + ("each stage ends farther from the base, as in the study." if grows else
                        "not monotonic here (the study: later checkpoints drift farther)."))
    rows = diag["sft_vs_rl"]
    if rows:
        lo, hi = study["sft_over_rl_displacement"]
        parts = [f"{r['checkpoint']} {_fmt(r['sft_over_rl'], '.1f', 'RL did not move')}" for r in rows]
        ratios = [r["sft_over_rl"] for r in rows if r["sft_over_rl"] is not None]
        more = all(r["sft_norm"] > r["rl_norm"] for r in rows)
        verdict = "SFT moves the weights more than RL in every stage" if more else "SFT does not move the weights more than RL everywhere"
        if ratios:
            where = "within" if lo <= min(ratios) and max(ratios) <= hi else "outside"
            verdict += f"; the finite ratios ({min(ratios):.1f}-{max(ratios):.1f}) lie {where} the study's range"
        else:
            verdict += "; no RL phase moved the weights at all, so there is no finite ratio"
        lines.append(f"- **F5** (SFT displaces parameters {lo}-{hi}x more than RL): SFT/RL norm ratio {'; '.join(parts)}. "
                     f"{verdict}.")
    else:
        lines.append("- **F5**: no stage kept a cold-start model here, so SFT and RL cannot be told apart.")
    same, cross = cos.get("same_domain_update_vs_oracle"), cos.get("unrelated_oracles")
    if same is not None:
        lines.append(f"- A stage's own update vs its domain's oracle vector: mean cosine {same:.2f} over {cos['n_same']} "
                     f"stage(s) (study {study['cosine_same_sft_from_base_vs_seq_endpoint']:.2f}): each stage moves "
                     + ("toward its oracle without aligning with it." if 0 < same < 0.95 else
                        ("in its oracle's direction." if same >= 0.95 else "away from its oracle.")))
    else:
        lines.append("- A stage's update vs its oracle: needs the oracles of the stages after the first (notebook 05).")
    if cross is not None:
        lines.append(f"- **F4** (unrelated task vectors nearly orthogonal): mean cosine between different oracles' task "
                     f"vectors {cross:.2f} over {cos['n_unrelated']} pair(s) (study {study['cosine_unrelated_sft_tasks']:.2f}): "
                     + ("nearly orthogonal, as in the study." if abs(cross) < 0.1 else
                        "not nearly orthogonal here; the oracles share part of their direction."))
    else:
        lines.append("- **F4**: needs at least two oracles of different domains (notebook 05).")
    if diag["missing"]:
        lines.append(f"- Not in this reading (missing runs): {', '.join(m['checkpoint'] for m in diag['missing'])}.")
    return f"**Weights, {profile} seed {seed}**\n\n" + "\n".join(lines)


# --- tokens ------------------------------------------------------------------------------------------------


def decile_figure(summary: dict):
    """Top-1 consistency per reference-entropy decile, one line per scoring checkpoint."""
    import plotly.graph_objects as go

    fig = go.Figure()
    ranges = summary["decile_entropy_range"]
    x = [f"D{i + 1}<br>{_fmt(r[0], '.2g')}-{_fmt(r[1], '.2g')}" for i, r in enumerate(ranges)]
    for name, s in summary["checkpoints"].items():
        fig.add_trace(go.Scatter(x=x, y=[None if v is None else 100 * v for v in s["by_decile"]],
                                 mode="lines+markers", name=name))
    fig.update_layout(title=f"Top-1 consistency with {summary['reference']} by reference-entropy decile (nats)",
                      yaxis={"range": [0, 102], "title": "% of positions whose top-1 is unchanged"}, height=420)
    return fig


def entropy_split_figure(summary: dict, study: dict | None = None):
    """Low- vs high-entropy consistency per checkpoint, and the share of changed positions at high entropy."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = list(summary["checkpoints"])
    cs = summary["checkpoints"]
    pct = lambda v: None if v is None else 100 * v  # noqa: E731
    fig = make_subplots(rows=1, cols=2, subplot_titles=[
        f"top-1 consistency (threshold {summary['entropy_threshold']:.2f} nats)", "share of changed positions at high entropy"])
    fig.add_trace(go.Bar(x=names, y=[pct(cs[n]["low_entropy_stable"]) for n in names], name="low entropy"), row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=[pct(cs[n]["high_entropy_consistency"]) for n in names], name="high entropy"), row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=[pct(cs[n]["changed_share_in_high_entropy"]) for n in names],
                         name="changes at high entropy", showlegend=False), row=1, col=2)
    if study:
        fig.add_hline(y=100 * study["low_entropy_positions_stable_fraction"], line_dash="dash", row=1, col=1,
                      annotation_text="study: low-entropy stable")
    share = summary.get("high_entropy_fraction")
    if share is not None:
        fig.add_hline(y=100 * share, line_dash="dot", row=1, col=2, annotation_text="share of positions that are high-entropy")
    fig.update_yaxes(range=[0, 102])
    fig.update_layout(barmode="group", height=400, title="Where the top-1 changes")
    return fig


def tokens_reading(summary: dict, study: dict, profile: str, seed: int) -> str:
    """Markdown: the study's F3 (low-entropy positions stay stable, changes concentrate at high entropy) on this run."""
    cs = summary["checkpoints"]
    if not cs:
        return f"**Tokens, {profile} seed {seed}**\n\n- No later checkpoint to score yet (run notebooks 02-04)."
    hi_share = summary["high_entropy_fraction"]
    lines = [f"- {summary['positions']} assistant positions in {summary['episodes']} reference episodes of "
             f"{summary['reference']}; {100 * hi_share:.1f}% are high-entropy (above {summary['entropy_threshold']:.2f} nats)."]
    concentrated = []
    for name, s in cs.items():
        conc = s["changed_share_in_high_entropy"]
        stable = f"{100 * s['low_entropy_stable']:.1f}% of low-entropy positions keep their top-1 " \
                 f"(study {100 * study['low_entropy_positions_stable_fraction']:.0f}%)"
        if conc is None:
            lines.append(f"- **{name}**: {stable}; no position changed its top-1.")
            continue
        ratio = conc / hi_share if hi_share else None
        concentrated.append(ratio is not None and ratio > 2)
        lines.append(f"- **{name}**: {stable}; {100 * conc:.1f}% of its {s['changed_positions']} changes sit at high "
                     f"entropy ({_fmt(ratio, '.1f')}x the high-entropy share of positions"
                     + ("; the changes concentrate there)." if ratio and ratio > 2 else "; no concentration)."))
    stable = [s["low_entropy_stable"] for s in cs.values() if s["low_entropy_stable"] is not None]
    lowest, top = [], []
    for s in cs.values():
        if s["by_decile"][0] is not None and s["by_decile"][-1] is not None:
            lowest.append(s["by_decile"][0])
            top.append(s["by_decile"][-1])
    is_stable = bool(stable) and min(stable) >= study["low_entropy_positions_stable_fraction"] - 0.05
    halves = ["low-entropy positions stay stable, as in the study" if is_stable else
              "low-entropy positions change too, unlike the study"]
    if concentrated:
        halves.append("the changes concentrate at high entropy, as in the study" if all(concentrated) else
                      "the changes do not concentrate at high entropy" + (" for every checkpoint" if any(concentrated) else ""))
    lines.append("- **F3** (low-entropy positions stay stable; changes concentrate at high entropy): " + "; ".join(halves)
                 + "." + (f" Lowest-entropy decile {100 * min(lowest):.0f}-{100 * max(lowest):.0f}% consistent, highest "
                          f"{100 * min(top):.0f}-{100 * max(top):.0f}%." if lowest else ""))
    if summary.get("missing"):
        lines.append(f"- Not scored (missing runs): {', '.join(summary['missing'])}.")
    return f"**Tokens, {profile} seed {seed}**\n\n" + "\n".join(lines)
