"""SDFT's training union: how many rows of each domain (the mixture) and in which order (``build_union``).

**Mixture** (``rows_per_domain``): with kept counts ``k_d`` and weights ``w_d`` (``sdft.mixture``; a domain
absent from it weighs 0 and is left out), ``K = max k_d`` over the domains of positive weight and
``n_d = min(k_d, floor(w_d / max_w * K))``: the most-weighted domains give up to ``K`` rows, the others in
proportion to their weight, each capped at what it kept. The shares are the weights' wherever no cap binds; a
domain that kept too few gives all it has (its realised share is reported). Which ``n_d`` rows: the first of a
seeded shuffle of the domain's kept rows.

**Order** (``order_rows``, ``sdft.order``): ``shuffle``, one seeded shuffle of the union (domains interleaved);
``staged``, domain by domain in ``pipeline.curriculum`` order; ``difficulty``, easiest first: within each domain
the rows are ranked by the task's difficulty from ``task.meta`` (``difficulty``, else ``level``, else the number
of ``hops``; absent: 0) then by episode length (characters of the assistant turns), the ranks are turned into
quantiles in [0, 1] so that domains with different scales interleave, and the union is sorted by (quantile,
length, curriculum position). The SFT presents the rows in exactly that order: ``train_sft(sequential=True)``
gives the trainer transformers' ``SequentialSampler`` (TRL's ``shuffle_dataset`` is off by default), every
epoch in the same order; with ``max_steps * batch_size`` below the union's size only its first rows are seen
(``rows_seen`` in ``sdft.json``; a staged order would then never reach the last domains, which it warns of).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

ORDERS = ("shuffle", "staged", "difficulty")


def rows_per_domain(kept: Mapping[str, int], mixture: Mapping[str, float]) -> dict[str, int]:
    """Rows of each domain in the union (module docstring): ``n_d = min(k_d, floor(w_d / max_w * K))``."""
    live = {d: float(mixture.get(d, 0.0)) for d in kept if mixture.get(d, 0.0) > 0 and kept[d] > 0}
    if not live:
        return {d: 0 for d in kept}
    top = max(live.values())
    scale = max(kept[d] for d in live)
    return {d: (min(kept[d], int(math.floor(live[d] / top * scale + 1e-9))) if d in live else 0) for d in kept}


def order_rows(rows: Sequence[dict], order: str, curriculum: Sequence[str], seed: int) -> list[dict]:
    """The union in presentation order ``order`` (module docstring). Deterministic in ``seed``."""
    if order not in ORDERS:
        raise ValueError(f"unknown SDFT order {order!r}; orders are {list(ORDERS)}")
    rows = list(rows)
    pos = {d: i for i, d in enumerate(curriculum)}
    if order == "shuffle":
        random.Random(f"sdft-order:{seed}").shuffle(rows)
        return rows
    if order == "staged":
        return sorted(rows, key=lambda r: pos.get(r["domain"], len(pos)))  # stable: a domain keeps its order
    quantile = {}
    by_domain: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_domain.setdefault(r["domain"], []).append(i)
    for _d, idx in by_domain.items():
        ranked = sorted(idx, key=lambda i: (rows[i].get("difficulty") or 0.0, rows[i]["length"], i))
        for rank, i in enumerate(ranked):
            quantile[i] = rank / (len(ranked) - 1) if len(ranked) > 1 else 0.0
    order_idx = sorted(range(len(rows)), key=lambda i: (quantile[i], rows[i]["length"],
                                                        pos.get(rows[i]["domain"], len(pos)), i))
    return [rows[i] for i in order_idx]


def build_union(rows: Sequence[dict], mixture: Mapping[str, float], order: str, curriculum: Sequence[str],
                seed: int) -> tuple[list[dict], dict[str, int]]:
    """The training union: ``rows_per_domain`` rows of each domain (the first of a seeded shuffle of its kept
    rows), in ``order``. Returns ``(rows, counts)``."""
    by_domain: dict[str, list[dict]] = {d: [] for d in curriculum}
    for r in rows:
        by_domain.setdefault(r["domain"], []).append(r)
    counts = rows_per_domain({d: len(v) for d, v in by_domain.items()}, mixture)
    picked = []
    for d, v in by_domain.items():
        v = list(v)
        random.Random(f"sdft-mix:{seed}:{d}").shuffle(v)
        picked += v[:counts[d]]
    return order_rows(picked, order, curriculum, seed), counts
