"""Token-level diagnostics: fixed reference rollouts, scored by later checkpoints with teacher forcing.

    ref = build_reference(cfg, n_per_benchmark=16)          # run diagnostics/reference: saved once
    scores = score_reference(ref_rollouts(ref), {"seq_math": dir0, "seq_search": dir1, ...}, reference="seq_math")
    summary = consistency_summary(scores, threshold=cfg.diagnostics.entropy_threshold)

**Reference rollouts.** The first stage's checkpoint (``seq_math`` in the study's order) answers a fixed set
of prompts from every domain; whole episodes for the tool worlds (tool outputs and the simulated user
included). They are the episodes its evaluation already played (``<seq_math>/eval/records/``, the first
``n`` of each benchmark, sample 0), copied once into the run ``diagnostics/reference`` with each task's tool
schemas, so a later re-scoring of ``seq_math`` with other ``eval`` settings does not change them.

**Scoring.** Each episode is rendered with the tokenizer's chat template (``return_assistant_tokens_mask``:
the template marks what the assistant wrote with ``{% generation %}``) and every checkpoint reads it with
teacher forcing. At each assistant token (system, user and tool tokens excluded) we record the reference
model's predictive entropy (nats) and its top-1 token, and each scoring checkpoint's top-1 token. A position
is *consistent* for a checkpoint when the checkpoint still ranks **the rollout's own token** first, the token
the reference wrote there, as the study records "whether Seq-Math's original token is still ranked first".
(The reference's own top-1 is that token only where it decoded greedily; the paper profile samples at 0.6, so
the summary also gives the reference's own consistency with its rollout.)

**High entropy** is a fixed threshold in nats, the config's ``diagnostics.entropy_threshold``, the same for every
profile: the share of positions above it is *measured* and shown beside the study's ~6%, never chosen to match
it. The study: about 94% of low-entropy positions keep their token across stages, and the changes concentrate in
the ~6% of positions with high entropy.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from acl_lib.atomic import atomic_write_text
from acl_lib.envs import BENCHMARKS, IN_DOMAIN
from acl_lib.eval.harness import benchmark_size, world
from acl_lib.eval.policies import eval_device
from acl_lib.pipeline import sequential_run
from acl_lib.progress import maybe_progress
from acl_lib.runs import Run, run_once
from acl_lib.steps import stage_notebook

if TYPE_CHECKING:
    from acl_lib.config import Config

REFERENCE_RUN = "diagnostics/reference"
ROLLOUTS = "rollouts.jsonl"


# --- the reference rollouts --------------------------------------------------------------------------------


def reference_source(cfg: Config):
    """The run whose checkpoint wrote the reference rollouts: stage 1 of the curriculum (``seq_math``)."""
    return sequential_run(cfg, 1)


def reference_run(cfg: Config, n_per_benchmark: int, benchmarks: list[str]):
    return Run(cfg, REFERENCE_RUN, sections=("worlds",), inputs=[reference_source(cfg)],
               extra={"n_per_benchmark": int(n_per_benchmark), "benchmarks": list(benchmarks)})


def build_reference(cfg: Config, n_per_benchmark: int, benchmarks: list[str] | None = None):
    """The reference rollouts as a run of the run store (``<seed_dir>/diagnostics/reference/rollouts.jsonl``),
    skipped when complete. ``benchmarks`` defaults to the in-domain benchmark of every domain. Raises naming
    what is missing when the source checkpoint or its evaluation records are not there."""
    benchmarks = list(benchmarks or IN_DOMAIN.values())
    unknown = [b for b in benchmarks if b not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; benchmarks are {list(BENCHMARKS)}")
    source = reference_source(cfg)
    if not source.is_complete():
        raise FileNotFoundError(f"the reference rollouts are {source.name}'s: that run is not complete "
                                f"({source.path}); run {stage_notebook(1)} first")
    records = source.path / "eval" / "records"
    absent = [b for b in benchmarks if not (records / f"{b}.jsonl").is_file()]
    if absent:
        raise FileNotFoundError(f"no evaluation records of {source.name} for {absent} in {records}: "
                                f"run {stage_notebook(1)} (its evaluation writes them)")

    def fn(run):
        rows = []
        for key in benchmarks:
            bench = BENCHMARKS[key]
            tasks = {t.id: t for t in world(cfg, bench.env).tasks(bench.split, benchmark_size(cfg, bench),
                                                                   seed=cfg.worlds.seed)}
            recs = [json.loads(line) for line in (records / f"{key}.jsonl").read_text().splitlines() if line.strip()]
            recs = [r for r in recs if r.get("sample", 0) == 0][:n_per_benchmark]
            for r in recs:
                task = tasks.get(r["id"])
                rows.append({"benchmark": key, "id": r["id"], "reward": r.get("reward"),
                             "tools": task.tools if task is not None else [], "messages": r["messages"]})
        atomic_write_text(run.path / ROLLOUTS, "".join(json.dumps(row) + "\n" for row in rows))
        run.write_json("reference.json", {"source": source.name, "model": str(source.path / "model"),
                                          "episodes": len(rows), "benchmarks": benchmarks,
                                          "from": str(records)})
        run.logger.info("reference rollouts: %d episodes of %s from %s", len(rows), source.name, records)

    return run_once(reference_run(cfg, n_per_benchmark, benchmarks), fn)


def ref_rollouts(run_or_path) -> list[dict]:
    """The reference episodes (``{"benchmark", "id", "tools", "messages"}``) of a reference run or file."""
    p = Path(getattr(run_or_path, "path", run_or_path))
    p = p / ROLLOUTS if p.is_dir() else p
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


# --- teacher forcing ---------------------------------------------------------------------------------------


@dataclass
class TokenScores:
    """Per assistant position of the reference episodes (arrays of one length, ``positions``):
    ``episode`` (index into ``benchmarks``/``ids``), ``pos`` (index of the token in its episode), ``token``
    (the rollout's token), ``ref_entropy`` (nats), ``ref_top1``, and ``top1[checkpoint]``."""

    reference: str
    benchmarks: list[str]
    ids: list[list[int]]
    episode: np.ndarray
    pos: np.ndarray
    token: np.ndarray
    ref_entropy: np.ndarray
    ref_top1: np.ndarray
    top1: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def positions(self) -> int:
        return int(self.episode.size)

    def save(self, path: str | Path) -> Path:
        """Write the per-position arrays as one ``.npz`` (atomically: temp file + rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.stem}-", suffix=".npz", dir=path.parent)
        os.close(fd)
        arrays = {f"top1__{k}": v for k, v in self.top1.items()}
        np.savez_compressed(tmp, episode=self.episode, pos=self.pos, token=self.token, ref_entropy=self.ref_entropy,
                            ref_top1=self.ref_top1, benchmarks=np.array(self.benchmarks), **arrays)
        os.replace(tmp, path)
        return path


_GENERATION = re.compile(r"{%-?\s*generation\s*-?%}")


def mask_template(tokenizer) -> str | None:
    """The chat template that marks the assistant's tokens: None (the tokenizer's own) when it has
    ``{% generation %}`` spans, as the suite's does; else TRL's training variant of it (Qwen3-8B-Base ships
    Qwen3's template, which has none: ``trl/chat_templates/qwen3_training.jinja``). Raises ``ValueError`` for a
    template without spans that TRL has no variant of."""
    if _GENERATION.search(tokenizer.chat_template or ""):
        return None
    from trl.chat_template_utils import get_training_chat_template

    try:
        template = get_training_chat_template(tokenizer)
    except ValueError as exc:
        template, why = None, f" ({exc})"
    else:
        why = ""
    if not template or not _GENERATION.search(template):
        raise ValueError("the tokenizer's chat template does not mark assistant turns with {% generation %} and TRL "
                         f"has no training variant of it{why}: the token diagnostics cannot tell assistant tokens "
                         "apart")
    return template


def encode_episodes(tokenizer, episodes: list[dict], max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """``(input_ids, assistant_mask)`` of each episode rendered by the chat template (``mask_template``), cut at
    ``max_tokens``."""
    template = mask_template(tokenizer)
    out = []
    for ep in episodes:
        enc = tokenizer.apply_chat_template(ep["messages"], tools=ep.get("tools") or None, tokenize=True,
                                            return_dict=True, return_assistant_tokens_mask=True, chat_template=template)
        ids, mask = list(enc["input_ids"])[:max_tokens], list(enc["assistant_masks"])[:max_tokens]
        if not any(mask):
            raise ValueError(f"episode {ep.get('id')}: no assistant token found; does the chat template mark "
                             "assistant turns with {% generation %}?")
        out.append((ids, mask))
    return out


def _load_model(model_dir: str, dtype: str, device):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
    model.eval()
    return model


def _forward_positions(model, encoded, batch_size: int, pad_id: int, device, want_entropy: bool):
    """Top-1 (and entropy) of the next-token distribution at every assistant position, in episode order. The
    LM head runs on the selected positions only (the paper vocabulary is 152k: full logits would not fit)."""
    import torch

    decoder = getattr(model, model.base_model_prefix)
    head = model.get_output_embeddings()
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    top1: dict[int, np.ndarray] = {}
    ent: dict[int, np.ndarray] = {}
    with torch.inference_mode():
        for lo in range(0, len(order), batch_size):
            chunk = order[lo:lo + batch_size]
            width = max(len(encoded[i][0]) for i in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            att = torch.zeros((len(chunk), width), dtype=torch.long)
            for r, i in enumerate(chunk):
                n = len(encoded[i][0])
                ids[r, :n] = torch.tensor(encoded[i][0])
                att[r, :n] = 1
            hidden = decoder(input_ids=ids.to(device), attention_mask=att.to(device)).last_hidden_state
            for r, i in enumerate(chunk):
                at = [t - 1 for t, m in enumerate(encoded[i][1]) if m and t > 0]  # logits at t-1 predict token t
                logits = head(hidden[r, at]).float()
                top1[i] = logits.argmax(-1).cpu().numpy()
                if want_entropy:
                    logp = torch.log_softmax(logits, -1)
                    ent[i] = (-(logp.exp() * logp).sum(-1)).cpu().numpy()
    cat = lambda d: np.concatenate([d[i] for i in range(len(encoded))]) if encoded else np.zeros(0)  # noqa: E731
    return cat(top1).astype(np.int64), (cat(ent).astype(np.float64) if want_entropy else None)


def score_reference(episodes: list[dict], models: Mapping[str, str], reference: str, batch_size: int = 8,
                    max_tokens: int = 4096, dtype: str = "float32", device: str | None = None,
                    progress: bool = True) -> TokenScores:
    """Teacher-force the reference ``episodes`` through ``models`` (``{name: model dir}``, ``reference`` among
    them) and return the per-position :class:`TokenScores`. Every checkpoint must share the reference's
    tokenizer vocabulary (they descend from one base)."""
    from transformers import AutoConfig, AutoTokenizer

    if reference not in models:
        raise KeyError(f"the reference checkpoint {reference!r} is not among {list(models)}")
    for name, d in models.items():
        if not (Path(d) / "config.json").is_file() and Path(d).is_absolute():
            raise FileNotFoundError(f"checkpoint {name}: {d} holds no model (config.json missing)")
    tok = AutoTokenizer.from_pretrained(models[reference])
    ctx = int(getattr(AutoConfig.from_pretrained(models[reference]), "max_position_embeddings", max_tokens))
    encoded = encode_episodes(tok, episodes, min(max_tokens, ctx))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    dev = eval_device(device)
    episode = np.concatenate([np.full(sum(1 for t, m in enumerate(mk) if m and t > 0), i)
                              for i, (_, mk) in enumerate(encoded)]).astype(np.int64)
    pos = np.concatenate([[t for t, m in enumerate(mk) if m and t > 0] for _, mk in encoded]).astype(np.int64)
    token = np.array([encoded[e][0][p] for e, p in zip(episode, pos)], dtype=np.int64)
    order = [reference] + [n for n in models if n != reference]
    top1, ref_entropy = {}, None
    with maybe_progress(progress, len(order), "tokens: teacher forcing", "checkpoint") as bar:
        for name in order:
            model = _load_model(str(models[name]), dtype, dev)
            if model.config.vocab_size < len(tok):
                raise ValueError(f"checkpoint {name}: vocabulary {model.config.vocab_size} < the reference's "
                                 f"{len(tok)}")
            t1, ent = _forward_positions(model, encoded, batch_size, pad, dev, want_entropy=name == reference)
            top1[name] = t1
            if ent is not None:
                ref_entropy = ent
            del model
            bar.update(1)
    return TokenScores(reference, [ep["benchmark"] for ep in episodes], [ids for ids, _ in encoded], episode, pos,
                       token, ref_entropy, top1[reference], {n: top1[n] for n in order if n != reference})


# --- summaries ---------------------------------------------------------------------------------------------


def deciles(values: np.ndarray, buckets: int = 10) -> np.ndarray:
    """Equal-count bucket (0 .. buckets-1) of each value by rank, ties broken by position (so a model with many
    near-zero entropies still gets ten buckets of one size)."""
    ranks = np.empty(values.size, dtype=np.int64)
    ranks[np.argsort(values, kind="stable")] = np.arange(values.size)
    return (ranks * buckets) // max(values.size, 1)


def _consistency(same: np.ndarray, high: np.ndarray, dec: np.ndarray, bench: np.ndarray, buckets: int,
                 benchmarks: list[str], episode: np.ndarray) -> dict:
    """One checkpoint's consistency (``same[i]``: it ranks the rollout's token first at position i), with the
    counts per reference episode (``per_episode``: low-entropy positions, those stable, changed positions, those
    at high entropy) that cluster the fractions' standard errors by episode (``acl_lib.findings``, F3)."""
    changed = ~same

    def frac(sel):
        return float(same[sel].mean()) if sel.any() else None

    def per_episode(sel):
        return np.bincount(episode[sel], minlength=len(benchmarks)).tolist()

    return {
        "consistency": float(same.mean()) if same.size else None,
        "low_entropy_stable": frac(~high),
        "high_entropy_consistency": frac(high),
        "changed_positions": int(changed.sum()),
        "changed_share_in_high_entropy": float((changed & high).sum() / changed.sum()) if changed.any() else None,
        "by_decile": [frac(dec == b) for b in range(buckets)],
        "by_benchmark": {b: frac(bench == b) for b in dict.fromkeys(benchmarks)},
        "per_episode": {"low": per_episode(~high), "low_stable": per_episode(~high & same),
                        "changed": per_episode(changed), "changed_high": per_episode(changed & high)},
    }


def consistency_summary(scores: TokenScores, threshold: float, buckets: int = 10) -> dict:
    """Per scoring checkpoint: the share of positions where it still ranks the rollout's token first, overall,
    at low- and high-entropy positions (reference entropy at or below / above ``threshold`` nats), per entropy
    decile and per benchmark; the share of its changed positions that are high-entropy. Beside them the measured
    share of positions above the threshold (``high_entropy_fraction``, the study's ~6%) and the same figures
    for the reference itself (``reference_consistency``: below 1 where it sampled). Fractions in [0, 1]."""
    if threshold is None or not threshold >= 0:
        raise ValueError(f"the entropy threshold is a number of nats >= 0, got {threshold}")
    thr = float(threshold)
    high = scores.ref_entropy > thr
    dec = deciles(scores.ref_entropy, buckets)
    bench = np.array([scores.benchmarks[e] for e in scores.episode]) if scores.positions else np.array([])
    edges = [[float(scores.ref_entropy[dec == b].min()), float(scores.ref_entropy[dec == b].max())]
             if (dec == b).any() else [None, None] for b in range(buckets)]
    args = (high, dec, bench, buckets, scores.benchmarks, scores.episode)
    return {"reference": scores.reference, "positions": scores.positions, "consistency_against": "rollout token",
            "entropy_threshold": thr, "threshold_rule": "fixed (nats)",
            "high_entropy_positions": int(high.sum()), "low_entropy_positions": int((~high).sum()),
            "high_entropy_fraction": float(high.mean()) if high.size else None,
            "decile_entropy_range": edges,
            "reference_self_consistency": float((scores.ref_top1 == scores.token).mean()) if scores.positions else None,
            "reference_consistency": _consistency(scores.ref_top1 == scores.token, *args),
            "checkpoints": {name: _consistency(t1 == scores.token, *args) for name, t1 in scores.top1.items()}}


def summary_frame(summary: dict, study: Mapping | None = None):
    """DataFrame, one row per scoring checkpoint (and the reference itself, against its own rollout): the share of
    positions that still rank the rollout's token first, overall, at low and at high entropy, the changed
    positions and the share of them at high entropy, and the measured share of positions above the threshold
    (percent); with ``study`` (``paper_results()["diagnostics"]``), a row of the study's figures."""
    import pandas as pd

    pct = lambda x: None if x is None else 100 * x  # noqa: E731
    above = pct(summary.get("high_entropy_fraction"))
    rows = []
    own = {f"{summary['reference']} (reference)": summary["reference_consistency"]} \
        if summary.get("reference_consistency") else {}
    for name, s in {**own, **summary["checkpoints"]}.items():
        rows.append({"checkpoint": name, "top-1 consistency %": pct(s["consistency"]),
                     "low-entropy stable %": pct(s["low_entropy_stable"]),
                     "high-entropy consistency %": pct(s["high_entropy_consistency"]),
                     "changed positions": s["changed_positions"],
                     "changes at high entropy %": pct(s["changed_share_in_high_entropy"]),
                     "positions above threshold %": above})
    if study:
        rows.append({"checkpoint": "study",
                     "low-entropy stable %": 100 * study["low_entropy_positions_stable_fraction"],
                     "changes at high entropy %": None,
                     "positions above threshold %": 100 * study["high_entropy_positions_fraction"]})
    cols = ["checkpoint", "top-1 consistency %", "low-entropy stable %", "high-entropy consistency %",
            "changed positions", "changes at high entropy %", "positions above threshold %"]
    frame = pd.DataFrame(rows, columns=cols).set_index("checkpoint")
    return frame.astype({"changed positions": "Int64"})


def changed_examples(scores: TokenScores, tokenizer, checkpoint: str, n: int = 4, context: int = 24) -> list[dict]:
    """Up to ``n`` positions (from different episodes, highest reference entropy first) where ``checkpoint`` no
    longer ranks the rollout's token first: the decoded context before it, the rollout's token, the reference's
    and the checkpoint's top-1 tokens and the entropy."""
    t1 = scores.top1[checkpoint]
    idx = np.flatnonzero(t1 != scores.token)
    idx = idx[np.argsort(-scores.ref_entropy[idx], kind="stable")]
    out, seen = [], set()
    for i in idx:
        e = int(scores.episode[i])
        if e in seen:
            continue
        seen.add(e)
        p = int(scores.pos[i])
        ids = scores.ids[e]
        out.append({"benchmark": scores.benchmarks[e], "episode": e, "position": p,
                    "entropy": float(scores.ref_entropy[i]),
                    "context": tokenizer.decode(ids[max(0, p - context):p]),
                    "reference_top1": tokenizer.decode([int(scores.ref_top1[i])]),
                    "checkpoint_top1": tokenizer.decode([int(t1[i])]),
                    "rollout_token": tokenizer.decode([int(scores.token[i])])})
        if len(out) >= n:
            break
    return out


def examples_markdown(examples: list[dict]) -> str:
    """The examples of :func:`changed_examples` as a Markdown table (strings shown as Python literals, so
    newlines and spaces are visible)."""
    if not examples:
        return "*At every position the checkpoint still ranks the rollout's token first.*"

    def lit(s: str) -> str:
        return "`" + repr(s).replace("|", "\\|").replace("`", "'") + "`"

    lines = ["| benchmark | entropy (nats) | text before the position | rollout | reference top-1 | checkpoint top-1 |",
             "|---|---:|---|---|---|---|"]
    for ex in examples:
        lines.append(f"| {ex['benchmark']} | {ex['entropy']:.2f} | {lit(ex['context'])} | {lit(ex['rollout_token'])} | "
                     f"{lit(ex['reference_top1'])} | {lit(ex['checkpoint_top1'])} |")
    return "\n".join(lines)


# --- the token diagnostics in one call -------------------------------------------------------------------------


def token_diagnostics(cfg: Config, found, scorers: list[str], n_per_benchmark: int, benchmarks: list[str] | None = None,
                      batch_size: int = 8, max_tokens: int = 4096,
                      progress: bool = True) -> tuple[dict, TokenScores]:
    """Build (or reuse) the reference rollouts, teacher-force them through the reference and every present
    checkpoint of ``scorers`` and summarise (:func:`consistency_summary` at ``cfg.diagnostics.entropy_threshold``
    nats). Checkpoints of
    ``scorers`` that are missing are listed in the summary's ``missing``, not scored. Returns
    ``(summary, scores)``."""
    ref_run = build_reference(cfg, n_per_benchmark, benchmarks)
    source = reference_source(cfg).name
    present = {c.name: c.model for c in found.present()}
    if source not in present:
        raise FileNotFoundError(f"the reference checkpoint {source} is missing: run {stage_notebook(1)} first")
    unknown = [s for s in scorers if s not in found]
    if unknown:
        raise KeyError(f"unknown checkpoint(s) {unknown}; this run store has {[c.name for c in found.items]}")
    models = {source: present[source]} | {s: present[s] for s in scorers if s in present and s != source}
    episodes = ref_rollouts(ref_run)
    scores = score_reference(episodes, models, source, batch_size=batch_size, max_tokens=max_tokens,
                             dtype=cfg.model.dtype, progress=progress)
    summary = consistency_summary(scores, cfg.diagnostics.entropy_threshold)
    summary["missing"] = [s for s in scorers if s not in present]
    summary["episodes"] = len(episodes)
    summary["benchmarks"] = list(dict.fromkeys(ep["benchmark"] for ep in episodes))
    return summary, scores
