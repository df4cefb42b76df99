"""The curriculum-orders study: the sequential pipeline over several curriculum orders, and how each domain's
forgetting depends on its position and on the stage that follows it.

Each order is the sequential pipeline with ``pipeline.curriculum`` overridden (``order_config``):
``pipeline.sequential_run`` names a non-default order's runs ``seq<i>_<d1>-...-<di>``, so orders never share a
run; the study's order reuses the sequential stages' own runs (``seq_math`` ...). Every stage is a run of the run
store (skipped when complete) evaluated on the whole suite, so everything below reads ``<run>/eval/metrics.json``.

Quantities, per order and per domain ``d`` trained at position ``p``:

* ``after own stage``: its in-domain benchmark right after its stage; ``final``: after the last stage;
* ``forgetting`` = best score from its own stage to the one before the last, minus ``final`` (0 for the last);
* ``drop at stage s`` = score before stage ``s`` minus after it, for each later stage ``s`` (positive: a loss);
  the e-commerce stage's share is read from these drops wherever that stage sits.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from acl_lib import domains, pipeline
from acl_lib.config import load_config
from acl_lib.envs import IN_DOMAIN
from acl_lib.steps import made_by
from acl_lib.views import load_scores, md_table

if TYPE_CHECKING:
    from acl_lib.config import Config

STUDY_ORDER = list(domains.ORDER)  # the study's curriculum


def rotations(order: Sequence[str] = STUDY_ORDER) -> list[list[str]]:
    """The cyclic rotations of ``order`` (the study's first): each domain once at every position."""
    order = list(order)
    return [order[i:] + order[:i] for i in range(len(order))]


def order_config(profile: str, overrides: Sequence[str], seed: int, order: Sequence[str]):
    """The config of one order: ``profile`` + ``overrides`` + ``pipeline.curriculum=[...]``."""
    return load_config(profile, [*overrides, f"pipeline.curriculum=[{','.join(order)}]"], seed=seed)


def order_label(order: Sequence[str]) -> str:
    return " → ".join(order)


def stage_names(cfg: Config) -> list[str]:
    """base and the order's stages, as the run store names them."""
    return pipeline.checkpoint_names(cfg, oracles=False)


def run_order(cfg: Config) -> list:
    """Train and evaluate every stage of ``cfg``'s curriculum in order (complete ones skipped); the runs."""
    base = pipeline.base_run(cfg)
    if not base.is_complete():
        raise RuntimeError(f"the orders start from the complete base run ({base.path}); run {made_by('base')} first")
    return [pipeline.run_sequential_stage(cfg, i) for i in range(1, len(cfg.pipeline.curriculum) + 1)]


def order_scores(cfg: Config) -> dict[str, dict[str, float]]:
    """``{run: {benchmark: %}}`` for base and each stage of the order that has been evaluated."""
    return load_scores(cfg.seed_dir(), stage_names(cfg))


def scores_by_order(cfgs: Mapping[tuple[str, ...], object]) -> dict[tuple[str, ...], tuple[list[str], dict]]:
    """``{order: (run names, scores)}`` for ``{order: its config}``: what :func:`positions_frame` reads."""
    return {o: (stage_names(c), order_scores(c)) for o, c in cfgs.items()}


def order_durations(cfg: Config) -> dict[str, float | None]:
    """Training + evaluation seconds of each stage (from the runs' completion records; a stage skipped here
    reports the time it took when it ran)."""
    out = {}
    for name in stage_names(cfg)[1:]:
        total = None
        for rel in (name, f"{name}/eval"):
            p = cfg.seed_dir() / rel / "COMPLETE.json"
            if p.is_file():
                total = (total or 0.0) + (json.loads(p.read_text()).get("duration_s") or 0.0)
        out[name] = total
    return out


def position_rows(order: Sequence[str], names: Sequence[str], scores: Mapping[str, Mapping[str, float]]) -> list[dict]:
    """One row per domain of an order: position, the stage after it, its benchmark after its own stage, its best
    until the stage before the last, final, forgetting, and the drop each later stage caused (``drop <d>``)."""
    rows = []
    order = list(order)
    T = len(order)
    for p, d in enumerate(order, 1):
        b = IN_DOMAIN[d]

        def get(i: int, b: str = b) -> float | None:  # names[0] is base, names[i] stage i
            return (scores.get(names[i]) or {}).get(b)

        row = {"order": order_label(order), "domain": d, "benchmark": b, "position": p,
               "followed by": order[p] if p < T else "", "base": get(0), "after own stage": get(p), "final": get(T)}
        kept = [get(i) for i in range(p, T) if get(i) is not None]
        row["forgetting"] = (max(kept) - row["final"]) if kept and row["final"] is not None and p < T else None
        for s in range(p + 1, T + 1):
            before, after = get(s - 1), get(s)
            row[f"drop {order[s - 1]}"] = None if before is None or after is None else before - after
        rows.append(row)
    return rows


def positions_frame(results: Mapping[tuple[str, ...], tuple[Sequence[str], Mapping]]):
    """DataFrame of :func:`position_rows` over every order, ``results`` = ``{order: (run names, scores)}``."""
    import pandas as pd

    rows = [r for order, (names, scores) in results.items() for r in position_rows(order, names, scores)]
    cols = ["order", "domain", "benchmark", "position", "followed by", "base", "after own stage", "final",
            "forgetting"] + [f"drop {d}" for d in STUDY_ORDER]
    frame = pd.DataFrame(rows)
    for c in frame.columns:
        if c not in ("order", "domain", "benchmark", "position", "followed by"):
            frame[c] = frame[c].astype(float)
    return frame.reindex(columns=[c for c in cols if c in frame.columns]) if len(frame) else pd.DataFrame(columns=cols)


def ecom_damage(frame) -> list[dict]:
    """Per order: the mean drop the e-commerce stage caused on the domains trained before it, and the mean drop
    of every other later stage on those domains; ``ecom largest`` when the retail stage's drop is the largest."""
    out = []
    for order, part in frame.groupby("order", sort=False):
        drops = {}
        for d in STUDY_ORDER:
            col = f"drop {d}"
            if col in part:
                vals = [v for v in part[col].tolist() if v is not None and v == v]
                if vals:
                    drops[d] = statistics.fmean(vals)
        row = {"order": order, **{f"mean drop {d}": drops.get(d) for d in STUDY_ORDER}}
        # no stage lost anything (nothing rose at this scale): no largest
        row["largest"] = max(drops, key=drops.get) if drops and max(drops.values()) > 0 else None
        # an order that starts with ecom has nothing before the retail stage to damage: not comparable
        row["ecom largest"] = (row["largest"] == "ecom") if "ecom" in drops and row["largest"] else None
        out.append(row)
    return out


def ecom_frame(frame):
    import pandas as pd

    return pd.DataFrame(ecom_damage(frame)).set_index("order") if len(frame) else pd.DataFrame()


def forgetting_figure(frame):
    """Forgetting of each domain (points) against its position in the curriculum, one line per domain."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for d in STUDY_ORDER:
        part = frame[frame["domain"] == d].sort_values("position")
        if len(part):
            fig.add_trace(go.Scatter(x=part["position"], y=part["forgetting"], mode="lines+markers", name=d,
                                     text=part["order"], hovertemplate="%{text}: %{y:.1f}<extra>" + d + "</extra>"))
    fig.update_layout(title="Forgetting by position (best score from its own stage to the one before the last, minus "
                            "final)", xaxis={"title": "position in the curriculum", "dtick": 1},
                      yaxis={"title": "points"}, height=380)
    return fig


def reading(frame, ecom: list[dict]) -> str:
    """Markdown computed from the numbers: per domain, the position where it forgets most, and where the
    e-commerce stage's damage falls."""
    if not len(frame):
        return "No order has been scored yet."
    lines = []
    for d in STUDY_ORDER:
        part = frame[(frame["domain"] == d) & frame["forgetting"].notna()].sort_values("position")
        if not len(part):
            continue
        worst = part.loc[part["forgetting"].idxmax()]
        lines.append(f"- **{d}** ({worst['benchmark']}): forgetting "
                     + ", ".join(f"{f:.1f} at position {int(p)}" for p, f in zip(part["position"], part["forgetting"]))
                     + f"; most at position {int(worst['position'])} (followed by {worst['followed by'] or '-'}).")
    n_ecom = [e for e in ecom if e["ecom largest"] is not None]
    if not n_ecom:
        lines.append("\nNo order scored so far has a later stage that lowered the domains trained before the retail "
                     "stage: where the e-commerce damage falls cannot be read here.")
    else:
        k = sum(bool(e["ecom largest"]) for e in n_ecom)
        lines.append(f"\nThe e-commerce stage caused the largest mean drop on the domains trained before it in {k} of "
                     f"{len(n_ecom)} orders where a domain was trained before it"
                     + (": the damage follows the retail stage wherever it is placed." if k == len(n_ecom) else
                        "; elsewhere the largest drop came from: "
                        + ", ".join(f"{e['order']} ({e['largest']})" for e in n_ecom if not e["ecom largest"]) + "."))
    nxt = next_stage_largest(frame)
    if nxt:
        k = sum(r["next largest"] for r in nxt)
        lines.append(f"\nThe stage right after a domain caused its largest drop in {k} of {len(nxt)} cases (a domain "
                     "in an order with a later stage that lowered it)"
                     + (": here forgetting follows what comes next, whatever that stage is." if k == len(nxt) else
                        "; elsewhere a later stage did more: "
                        + ", ".join(f"{r['domain']} in {r['order']} ({r['largest']})"
                                    for r in nxt if not r["next largest"])
                        + "."))
    return "\n".join(lines)


def next_stage_largest(frame) -> list[dict]:
    """Per order and domain that some later stage lowered: the stage right after it, the later stage with the
    largest drop, and ``next largest`` when they are the same (ties count for the stage right after)."""
    out = []
    for _, r in frame.iterrows():
        if not r["followed by"]:
            continue
        drops = {d: r.get(f"drop {d}") for d in STUDY_ORDER}
        drops = {d: v for d, v in drops.items() if v is not None and v == v}
        if not drops or max(drops.values()) <= 0:
            continue
        top = max(drops.values())
        out.append({"order": r["order"], "domain": r["domain"], "next": r["followed by"],
                    "largest": max(drops, key=drops.get), "next largest": drops.get(r["followed by"]) == top})
    return out


def positions_markdown(frame) -> str:
    """Markdown of :func:`positions_frame` (the curriculum orders in the README's results): each domain's
    score after its own stage -> final, and its forgetting, at each position; then :func:`reading`."""
    if not len(frame):
        return reading(frame, [])
    positions = sorted(int(p) for p in frame["position"].unique())
    num = lambda v: "-" if v is None or v != v else f"{v:.1f}"  # noqa: E731  NaN: not scored
    rows = []
    for d in STUDY_ORDER:
        part = frame[frame["domain"] == d]
        if not len(part):
            continue
        cells = [f"{d} ({IN_DOMAIN[d]})"]
        for p in positions:
            r = part[part["position"] == p]
            if not len(r):
                cells.append("-")
                continue
            r = r.iloc[0]
            cells.append(f"{num(r['after own stage'])} -> {num(r['final'])}"
                         + (f", then {r['followed by']}" if r["followed by"] else " (last)"))
        rows.append(cells)
    head = ["domain"] + [f"position {p}" for p in positions]
    return "\n".join(["Each domain's in-domain score after its own stage -> at the end of the order, at each "
                      "position (and the stage that followed it):", "", md_table(head, rows), "",
                      reading(frame, ecom_damage(frame))])
