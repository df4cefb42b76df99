"""Figures and readings of the weight and token diagnostics, drawn from the dicts that
``weights.weight_diagnostics`` and ``tokens.token_diagnostics`` return (the same content as the JSON files they
write). Plotly figures; the notebooks show them and save them with ``views.save_figure``."""

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
    fig.add_trace(go.Scatter(x=["base"] + [r["checkpoint"] for r in seq],
                             y=[0.0] + [r["relative_distance"] for r in seq], mode="lines+markers",
                             name="sequential", line={"color": SEQ_COLOR}))
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
    floats = {"cos(update, oracle)": float, "cos(task vector, oracle)": float}
    return frame.set_index("checkpoint").astype(floats).round(3)


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


def weights_reading(diag: dict, cos: dict, study: dict, profile: str, seed: int,
                    directions: dict | None = None) -> str:
    """Markdown: what this run's weights measure for the study's weight-level claims (drift from the base, F4's
    update directions, F5's SFT/RL displacement), beside the study's figures where the study reports the same
    quantity. Measurements only: the verdicts are ``acl_lib.findings``' rules, the one place they are judged.
    ``directions``: the SDFT step's update-direction check (``weights.read_update_directions``), the quantity
    the study's 0.77 and 0.05 belong to."""
    lines = []
    seq = [r for r in diag["stages"] if r["kind"] == "seq"]
    if seq:
        d = [r["relative_distance"] for r in seq]
        grows = all(b >= a - 1e-12 for a, b in zip(d, d[1:]))
        lines.append(f"- **Drift from the base**: relative distance {' -> '.join(_fmt(x, '.3f') for x in d)} along "
                     f"{' -> '.join(r['checkpoint'] for r in seq)}: "
                     + ("each stage ends farther from the base (the study: later checkpoints drift farther)."
                        if grows else "not monotonic here (the study: later checkpoints drift farther)."))
    rows = diag["sft_vs_rl"]
    if rows:
        lo, hi = study["sft_over_rl_displacement"]
        parts = [f"{r['checkpoint']} {_fmt(r['sft_over_rl'], '.1f', 'RL did not move')}" for r in rows]
        lines.append(f"- **F5** (SFT displaces parameters more than RL; the study: {lo}-{hi}x): the L2 norm of the SFT "
                     f"phase's total parameter change over the RL phase's, per cold-started stage: {'; '.join(parts)}.")
    else:
        lines.append("- **F5**: no stage kept a cold-start model here, so SFT and RL cannot be told apart.")
    if directions is not None:
        un = directions["unrelated_single_domain_sft"]
        lines.append(f"- **F4**, the study's quantity: the same SFT mixture from the base and from the sequential "
                     f"endpoint, cosine {_fmt(directions['same_sft_from_base_vs_seq_final'])} (study "
                     f"{study['cosine_same_sft_from_base_vs_seq_endpoint']:.2f}); {un['kind']} updates of unrelated "
                     f"domains, mean cosine {_fmt(un['mean'])} over {len(un['pairs'])} pair(s) "
                     f"(study {study['cosine_unrelated_sft_tasks']:.2f}).")
    else:
        lines.append(f"- **F4**, the study's quantity (the same SFT mixture from the base and from the sequential "
                     f"endpoint, cosine {study['cosine_same_sft_from_base_vs_seq_endpoint']:.2f}; unrelated SFT "
                     f"tasks, {study['cosine_unrelated_sft_tasks']:.2f}) is the SDFT step's update-direction check: "
                     "not on disk for this seed yet.")
    same, cross = cos.get("same_domain_update_vs_oracle"), cos.get("unrelated_oracles")
    if same is not None:
        lines.append(f"- A stage's own update vs its domain's oracle vector: mean cosine {same:.2f} over "
                     f"{cos['n_same']} stage(s); the study reports no figure for this quantity.")
    if cross is not None:
        lines.append(f"- The oracles' task vectors, pairwise: mean cosine {cross:.2f} over {cos['n_unrelated']} "
                     "pair(s), how far single-task updates are aligned (the study: only partly; it gives no figure).")
    if diag["missing"]:
        lines.append(f"- Not in this reading (missing runs): {', '.join(m['checkpoint'] for m in diag['missing'])}.")
    return f"**Weights, {profile} seed {seed}**\n\n" + "\n".join(lines)


# --- tokens ------------------------------------------------------------------------------------------------


def decile_figure(summary: dict):
    """Per reference-entropy decile, the share of positions where a checkpoint still ranks the rollout's token
    first, one line per scoring checkpoint."""
    import plotly.graph_objects as go

    fig = go.Figure()
    ranges = summary["decile_entropy_range"]
    x = [f"D{i + 1}<br>{_fmt(r[0], '.2g')}-{_fmt(r[1], '.2g')}" for i, r in enumerate(ranges)]
    for name, s in summary["checkpoints"].items():
        fig.add_trace(go.Scatter(x=x, y=[None if v is None else 100 * v for v in s["by_decile"]],
                                 mode="lines+markers", name=name))
    fig.update_layout(title=f"{summary['reference']}'s rollout token still ranked first, by reference-entropy decile "
                            "(nats)", yaxis={"range": [0, 102], "title": "% of positions"}, height=420)
    return fig


def entropy_split_figure(summary: dict, study: dict | None = None):
    """Low- vs high-entropy consistency per checkpoint, and the share of changed positions at high entropy."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = list(summary["checkpoints"])
    cs = summary["checkpoints"]
    pct = lambda v: None if v is None else 100 * v  # noqa: E731
    fig = make_subplots(rows=1, cols=2, subplot_titles=[
        f"rollout's token still first (threshold {summary['entropy_threshold']:.2f} nats)",
        "share of changed positions at high entropy"])
    fig.add_trace(go.Bar(x=names, y=[pct(cs[n]["low_entropy_stable"]) for n in names], name="low entropy"),
                  row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=[pct(cs[n]["high_entropy_consistency"]) for n in names], name="high entropy"),
                  row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=[pct(cs[n]["changed_share_in_high_entropy"]) for n in names],
                         name="changes at high entropy", showlegend=False), row=1, col=2)
    if study:
        fig.add_hline(y=100 * study["low_entropy_positions_stable_fraction"], line_dash="dash", row=1, col=1,
                      annotation_text="study: low-entropy stable")
    share = summary.get("high_entropy_fraction")
    if share is not None:
        fig.add_hline(y=100 * share, line_dash="dot", row=1, col=2,
                      annotation_text="share of positions that are high-entropy")
    fig.update_yaxes(range=[0, 102])
    fig.update_layout(barmode="group", height=400, title="Where the top-1 changes")
    return fig


def tokens_reading(summary: dict, study: dict, profile: str, seed: int) -> str:
    """Markdown: what this run's token diagnostics measure for F3 (low-entropy positions keep the rollout's token;
    the changes concentrate at high entropy), beside the study's 94% and 6%. Measurements only: the verdict is
    ``acl_lib.findings``' F3 rule."""
    cs = summary["checkpoints"]
    if not cs:
        return f"**Tokens, {profile} seed {seed}**\n\n- No later checkpoint to score yet (run the later stages first)."
    hi_share = summary["high_entropy_fraction"]
    lines = [f"- {summary['positions']} assistant positions in {summary['episodes']} reference episodes of "
             f"{summary['reference']}; {100 * hi_share:.1f}% lie above the fixed threshold of "
             f"{summary['entropy_threshold']:.2f} nats (the study: "
             f"~{100 * study['high_entropy_positions_fraction']:.0f}% high-entropy positions)."]
    own = summary.get("reference_consistency") or {}
    if own.get("consistency") is not None and own["consistency"] < 1:
        lines.append(f"- The reference itself ranks its rollout's token first at {100 * own['consistency']:.1f}% of "
                     "the positions (it sampled the others).")
    for name, s in cs.items():
        conc = s["changed_share_in_high_entropy"]
        stable = (f"{_fmt(None if s['low_entropy_stable'] is None else 100 * s['low_entropy_stable'], '.1f')}% of "
                  f"low-entropy positions still rank the rollout's token first "
                  f"(study {100 * study['low_entropy_positions_stable_fraction']:.0f}%)")
        if conc is None:
            lines.append(f"- **{name}**: {stable}; no position changed.")
            continue
        ratio = conc / hi_share if hi_share else None
        lines.append(f"- **{name}**: {stable}; {100 * conc:.1f}% of its {s['changed_positions']} changed positions are "
                     f"high-entropy, {_fmt(ratio, '.1f')}x their share of all positions.")
    lowest = [s["by_decile"][0] for s in cs.values() if s["by_decile"][0] is not None]
    top = [s["by_decile"][-1] for s in cs.values() if s["by_decile"][-1] is not None]
    if lowest and top:
        lines.append(f"- Lowest-entropy decile {100 * min(lowest):.0f}-{100 * max(lowest):.0f}% consistent, highest "
                     f"{100 * min(top):.0f}-{100 * max(top):.0f}%.")
    if summary.get("missing"):
        lines.append(f"- Not scored (missing runs): {', '.join(summary['missing'])}.")
    return f"**Tokens, {profile} seed {seed}**\n\n" + "\n".join(lines)
