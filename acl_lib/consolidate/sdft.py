"""SDFT, self-distilled fine-tuning (notebook 09): the oracles' own filtered rollouts, SFT'd into one model.

    data = run_sdft_data(cfg)                    # sdft_data/dataset (HF Dataset on disk) + sdft_data/filter.json
    run = run_sdft(cfg, SDFTSpec("sdft"))        # SFT of seq_final on the union -> sdft/model + sdft/eval/metrics.json
    run_sdft(cfg, SDFTSpec("sdft_base", start="base"))       # the same SFT from the base
    for spec in ablation_specs(cfg, {"ecom": 2.0, "if": 2.0}):  # sdft_mix_*, sdft_staged, sdft_difficulty
        run_sdft(cfg, spec)
    directions = run_update_directions(cfg)      # sdft_directions/directions.json (the study's 0.77 vs 0.05)

Notebook 09 runs the specs through ``run_sdft_specs``, which skips (with a log line) a run whose union is empty
(``NoData``): the untrained oracles of the smoke profile solve nothing, so there only the sampling and the filter
run; ``run_update_directions(missing_ok=True)`` then returns None.

**Data** (``sdft_data``, one run keyed on the four oracles, the ``model`` / ``worlds`` sections, the sampling
fields of ``sdft`` and each domain's turn limits). Each single-task oracle ``oracle_<d>`` samples
``sdft.group_size`` rollouts at ``sdft.temperature`` (top-p 1) on each of ``sdft.n_prompts`` tasks of its own
world's *training* split, drawn with ``sample_seed(cfg)`` (``SAMPLE_SEED + cfg.seed``: no stage draws with it,
they use the training seed and the seed + 1, nor the merges' validation seed), through the evaluator's batched
model policy (``HFPolicy``; ``VLLMPolicy`` where ``eval.backend`` is vllm) with the turn and token limits the
stage trains with (``grpo.max_turns`` / ``grpo.max_new_tokens`` of ``cfg.for_stage(d)``). A trajectory is kept
only if, in this order (the first failed test is the one counted, ``filter.json``):

1. **reward**: its final reward is 1.0;
2. **protocol**: no protocol error (every tool call well formed, known, with valid arguments) and it follows the
   protocol (``protocol_violation``): the environment ended it (not the turn limit, a context overflow or an
   unfinished episode), no turn was cut off at the token budget, and the end is an end of the protocol:
   math, a single answer whose last non-empty line is ``Answer: <value>`` (the DAPO prompt's format; the
   scorer would also take an ``Answer:`` line earlier, or a ``\\boxed{}``); IF, a single answer; neither
   with tool-call markup or an unclosed ``<think>``; search, a last turn without a tool call that holds the
   ``<answer>`` and no ``<answer>`` in an earlier turn (a tool call after an answer); the retail desk, a last
   assistant turn without a tool call (the user ended the conversation) unless that call was the transfer to a
   human, which ends a desk episode by the protocol;
3. **duplicates**: within a domain, in sampling order, a trajectory whose normalised assistant text (every
   assistant turn's text and tool calls, lowercased, whitespace collapsed) shares a Jaccard similarity above
   ``sdft.dedup_threshold`` of word ``sdft.dedup_ngram``-grams with one kept before it is dropped.

The kept rows (chat rows as the cold starts train on, ``train.sft.episode_row``, plus their domain, task id,
sample index, task difficulty and length) are saved with ``datasets.Dataset.save_to_disk``.

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

**Training** (``run_sdft``): ``SFTTrainer`` with assistant-only loss (``train.sft.train_sft`` through the
launcher, so multi-process and multi-node jobs run as the stages' do), ``sft.max_steps`` / ``batch_size`` /
``learning_rate`` replaced by ``sdft``'s, into a run of its own keyed on those, the mixture, the order,
``sft.max_length`` and its inputs (the data run and the start checkpoint); skipped when complete; the model is
written atomically; then scored on the whole suite by the pipeline's evaluation run (``<run>/eval``).
``sdft.json`` records the rows per domain, the first and last loss and the weight displacement
``||theta_after - theta_before||`` (streamed over the safetensors files).

**Update directions** (``run_update_directions``): the cosine between the update of the SFT from the base
(``sdft_base - base``) and that of the same SFT from ``seq_final`` (``sdft - seq_final``), the study's 0.77,
against the cosine between two unrelated single-domain SFT updates, the study's 0.05: the oracles' cold-start
SFT models minus the base (``oracle_<d>/checkpoints/sft/model``; where fewer than two oracles cold-start, the
oracles' whole updates), every pair and their mean; ``acl_lib.diagnostics.weights``' streamed Gram.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from acl_lib.chat import THINK_CLOSE, THINK_OPEN, TOOL_CALL_OPEN, strip_think

logger = logging.getLogger("acl.consolidate.sdft")

SAMPLE_SEED = 104729  # + cfg.seed: the tasks the oracles sample on (stages use cfg.seed and cfg.seed + 1)
DATA_RUN = "sdft_data"
DIRECTIONS_RUN = "sdft_directions"
DATASET_DIR = "dataset"  # <sdft_data>/dataset: the kept rows of every domain (datasets.Dataset.save_to_disk)
FILTER_JSON = "filter.json"
TRAIN_DATA_DIR = "data"  # <sdft run>/data: the ordered union it trained on (save_to_disk)
TRAIN_ROWS = "train_rows.jsonl"  # the same rows as the SFT job reads them (chat rows only)
SUMMARY_JSON = "sdft.json"
DATA_SECTIONS = ("model", "worlds")  # + the sampling fields of sdft and each domain's limits (extra)
TRAIN_SECTIONS = ("model",)  # + sdft's training fields, the mixture, the order and sft.max_length (extra)
ORDERS = ("shuffle", "staged", "difficulty")
SAMPLING_FIELDS = ("n_prompts", "group_size", "temperature", "dedup_threshold", "dedup_ngram")
TRAINING_FIELDS = ("max_steps", "batch_size", "learning_rate")
ROW_KEYS = ("messages", "tools")  # what the SFT job reads of a row
STARTS = ("seq_final", "base")


# --- the filter --------------------------------------------------------------------------------------------

_ANSWER_LINE = re.compile(r"^[*\s]*answer[*\s]*:", re.I)


def _assistant_turns(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m.get("role") == "assistant"]


def protocol_violation(ep, cut: bool = False) -> str | None:
    """Why the finished episode ``ep`` does not follow its protocol, or None (see the module docstring, step 2).

    ``cut``: a turn of it ended at the token budget rather than at a stop token (``_CutWatch``)."""
    from acl_lib.envs.base import SingleTurnEpisode, ToolEpisode

    if not ep.done:
        return "not finished"
    if ep.end_reason:
        return f"not ended by the environment: {ep.end_reason}"
    if cut:
        return "a turn was cut off at the token budget"
    turns = _assistant_turns(ep.messages)
    if not turns:
        return "no assistant turn"
    if any(m.get("malformed_calls") for m in turns):
        return "malformed tool call"
    last = turns[-1]
    if isinstance(ep, SingleTurnEpisode):
        text = ep.response or ""
        if TOOL_CALL_OPEN in text:
            return "tool-call markup in a single-turn answer"
        if text.count(THINK_OPEN) != text.count(THINK_CLOSE):
            return "unclosed <think>"
        shown = strip_think(text) if THINK_OPEN in text or THINK_CLOSE in text else text
        if not shown.strip():
            return "empty answer"
        if ep.task.domain == "math" and ep.task.meta.get("format") != "mcq":
            lines = [ln for ln in shown.splitlines() if ln.strip()]
            if not _ANSWER_LINE.match(lines[-1]):
                return "the last line is not 'Answer: <value>'"
        return None
    if isinstance(ep, ToolEpisode):
        if last.get("tool_calls"):
            names = [c["function"]["name"] for c in last["tool_calls"]]
            if getattr(ep, "transferred", False) and "transfer_to_human_agents" in names:
                return None  # a desk's transfer hands the conversation over: the protocol's own end
            return "ended on a tool call"
        if ep.task.domain == "search":
            from acl_lib.envs.search import extract_answer

            if extract_answer(last.get("content") or "") is None:
                return "no <answer> in the final turn"
            if any("<answer>" in (m.get("content") or "") for m in turns[:-1]):
                return "a tool call after an answer"
        return None
    return None


def assistant_text(messages: list[dict]) -> str:
    """Every assistant turn's text and tool calls, lowercased with whitespace collapsed (what dedup compares)."""
    parts = []
    for m in _assistant_turns(messages):
        parts.append(m.get("content") or "")
        for c in m.get("tool_calls") or []:
            f = c["function"]
            args = f["arguments"] if isinstance(f["arguments"], str) else json.dumps(f["arguments"], sort_keys=True)
            parts.append(f"{f['name']} {args}")
    return " ".join(" ".join(parts).lower().split())


def ngrams(text: str, n: int) -> frozenset:
    """Word ``n``-grams of ``text`` (a text of fewer than ``n`` words is one gram of all its words)."""
    words = text.split()
    if len(words) < n:
        return frozenset([tuple(words)]) if words else frozenset()
    return frozenset(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def dedup(texts: Sequence[str], threshold: float, n: int) -> list[int]:
    """Indices of ``texts`` kept, in order: each is dropped when its ``n``-gram Jaccard similarity to one kept
    before it is above ``threshold``."""
    kept: list[int] = []
    grams: list[frozenset] = []
    for i, t in enumerate(texts):
        g = ngrams(t, n)
        if any(jaccard(g, h) > threshold for h in grams):
            continue
        kept.append(i)
        grams.append(g)
    return kept


def task_difficulty(task) -> float | None:
    """The task's difficulty from ``task.meta``: ``difficulty``, else ``level``, else the number of ``hops``."""
    meta = task.meta or {}
    for key in ("difficulty", "level"):
        v = meta.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    if isinstance(meta.get("hops"), list):
        return float(len(meta["hops"]))
    return None


def episode_length(messages: list[dict]) -> int:
    """Characters of the assistant turns (text and tool calls): the length ``difficulty`` order ranks by."""
    n = 0
    for m in _assistant_turns(messages):
        n += len(m.get("content") or "")
        for c in m.get("tool_calls") or []:
            a = c["function"]["arguments"]
            n += len(c["function"]["name"]) + len(a if isinstance(a, str) else json.dumps(a))
    return n


def filter_episodes(domain: str, episodes: list, cut: set | frozenset = frozenset(), threshold: float = 0.9,
                    n: int = 3, samples: Sequence[int] | None = None) -> tuple[list[dict], dict]:
    """The filter of the module docstring over finished ``episodes`` of ``domain`` (sampling order). ``cut``:
    ``id(episode.messages)`` of the episodes with a turn cut at the token budget. Returns ``(rows, stats)``;
    ``stats`` has ``tried``, ``reward_failed``, ``protocol_failed``, ``duplicates``, ``kept`` and the reasons."""
    from acl_lib.train.sft import episode_row

    passed, reasons = [], {"reward": Counter(), "protocol": Counter()}
    stats = {"tried": len(episodes), "reward_failed": 0, "protocol_failed": 0, "duplicates": 0, "kept": 0}
    for i, ep in enumerate(episodes):
        r = ep.reward()
        if r < 1.0:
            stats["reward_failed"] += 1
            reasons["reward"][(ep.failure or "reward below 1").split(":")[0][:80]] += 1
            continue
        why = ("protocol error: " + ep.protocol_errors[0]) if ep.protocol_errors else \
            protocol_violation(ep, id(ep.messages) in cut)
        if why:
            stats["protocol_failed"] += 1
            reasons["protocol"][why.split(":")[0][:80] if why.startswith("not ended") else why[:80]] += 1
            continue
        passed.append(i)
    keep = dedup([assistant_text(episodes[i].messages) for i in passed], threshold, n)
    stats["duplicates"] = len(passed) - len(keep)
    rows = []
    for j in keep:
        ep = episodes[passed[j]]
        row = episode_row(ep.messages, ep.task.tools)
        row.update(domain=domain, task_id=ep.task.id, sample=int(samples[passed[j]]) if samples else 0,
                   difficulty=task_difficulty(ep.task), length=episode_length(ep.messages), turns=ep.turns)
        rows.append(row)
    stats["kept"] = len(rows)
    stats["acceptance"] = stats["kept"] / stats["tried"] if stats["tried"] else 0.0
    stats["reasons"] = {k: dict(v.most_common()) for k, v in reasons.items()}
    return rows, stats


# --- sampling ----------------------------------------------------------------------------------------------


def sample_seed(cfg) -> int:
    """The seed the oracles' sampling tasks are drawn with (and sampling is seeded with); never a stage's
    (``cfg.seed``, ``cfg.seed + 1``) nor the merges' validation seed."""
    from acl_lib.consolidate.merging import validation_seed

    s = SAMPLE_SEED + cfg.seed
    while s in (cfg.seed, cfg.seed + 1, validation_seed(cfg)):
        s += 1
    return s


def domain_limits(cfg, domain: str) -> tuple[int, int]:
    """``(max_turns, max_new_tokens)`` a domain's rollouts run with: its stage's GRPO limits."""
    g = cfg.for_stage(domain).grpo
    return g.max_turns, g.max_new_tokens


class _Tap:
    """Wraps a policy's generator (``HFPolicy.gen``) or engine (``VLLMPolicy.llm``) and tells the watch, per
    generated row in order, whether it ran out of tokens (no stop token; vLLM: ``finish_reason == "length"``)."""

    def __init__(self, inner, watch, stops=()):
        self.inner, self.watch, self.stops = inner, watch, set(stops)

    def generate(self, *args, **kwargs):
        out = self.inner.generate(*args, **kwargs)
        for o in out:
            if hasattr(o, "outputs"):  # vLLM RequestOutput
                self.watch.flags.append(getattr(o.outputs[0], "finish_reason", None) == "length")
            else:
                self.watch.flags.append(not any(t in self.stops for t in o))
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _CutWatch:
    """A batched policy that remembers which episodes had a turn cut off at the token budget (``cut``:
    ``id(messages)`` of those episodes). The wrapped policies generate the rows that fit their context, in
    batch order, and return None for the others: the flags line up with the non-None texts."""

    def __init__(self, policy):
        self.policy = policy
        self.cut: set[int] = set()
        self.flags: list[bool] = []
        if getattr(policy, "gen", None) is not None:
            policy.gen = _Tap(policy.gen, self, policy.stop_ids)
        elif getattr(policy, "llm", None) is not None:
            policy.llm = _Tap(policy.llm, self)

    def __call__(self, batch):
        self.flags = []
        out = self.policy(batch)
        flags = iter(self.flags)
        for (task, messages), text in zip(batch, out):
            if text is not None and next(flags, False):
                self.cut.add(id(messages))
        return out

    def forget(self, task, messages) -> None:
        if hasattr(self.policy, "forget"):
            self.policy.forget(task, messages)

    def close(self) -> None:
        if hasattr(self.policy, "close"):
            self.policy.close()


def sampling_policy(cfg, model_dir: str, max_new_tokens: int):
    """The evaluator's batched model policy with SDFT's sampling settings (``sdft.temperature``, top-p 1)."""
    from acl_lib.eval.harness import HFPolicy, VLLMPolicy

    if cfg.eval.backend == "vllm":
        return VLLMPolicy(str(model_dir), max_new_tokens, cfg.sdft.temperature, 1.0, dtype=cfg.model.dtype,
                          max_model_len=cfg.model.max_position_embeddings, seed=sample_seed(cfg))
    return HFPolicy(str(model_dir), max_new_tokens, cfg.sdft.temperature, 1.0, cfg.eval.batch_size,
                    dtype=cfg.model.dtype)


def sample_domain(cfg, domain: str, policy, tasks: list | None = None, env=None) -> tuple[list[dict], dict]:
    """``sdft.group_size`` rollouts of ``policy`` (a batched policy: the oracle's ``sampling_policy``, or any
    other, e.g. ``ExpertPolicy`` in tests) on each of ``tasks`` (default: ``sdft.n_prompts`` training tasks of
    the domain's world drawn with ``sample_seed``), filtered (``filter_episodes``). Returns ``(rows, stats)``."""
    from acl_lib.envs import STAGE_ENV
    from acl_lib.eval.harness import run_episodes, world

    s = cfg.sdft
    env = env if env is not None else world(cfg, STAGE_ENV.get(domain, domain))
    tasks = tasks if tasks is not None else env.tasks("train", s.n_prompts, seed=sample_seed(cfg))
    max_turns, _ = domain_limits(cfg, domain)
    episodes, samples = [], []
    for t in tasks:
        for k in range(s.group_size):
            episodes.append(env.start(t, max_turns=max_turns))
            samples.append(k)
    watch = policy if isinstance(policy, _CutWatch) else _CutWatch(policy)
    run_episodes(watch, episodes, batch_size=max(cfg.eval.batch_size, 1) * 4)
    rows, stats = filter_episodes(domain, episodes, watch.cut, s.dedup_threshold, s.dedup_ngram, samples)
    stats.update(prompts=len(tasks), group_size=s.group_size, max_turns=max_turns,
                 cut_at_token_budget=len(watch.cut))
    return rows, stats


def data_run(cfg):
    """``sdft_data``: keyed on the oracles, ``model`` / ``worlds``, sdft's sampling fields and the limits."""
    from acl_lib import pipeline
    from acl_lib.runs import Run

    oracles = [pipeline.oracle_run(cfg, d) for d in cfg.pipeline.curriculum]
    extra = {"sdft": {k: getattr(cfg.sdft, k) for k in SAMPLING_FIELDS}, "seed": sample_seed(cfg),
             "limits": {d: list(domain_limits(cfg, d)) for d in cfg.pipeline.curriculum},
             "backend": cfg.eval.backend, "batch_size": cfg.eval.batch_size}
    return Run(cfg, DATA_RUN, sections=DATA_SECTIONS, inputs=oracles, extra=extra)


def _require(runs, what: str) -> None:
    missing = [r for r in runs if not r.is_complete()]
    if missing:
        lines = "; ".join(f"{r.name} ({r.status()}, {r.path})" for r in missing)
        raise RuntimeError(f"{what} needs complete runs: missing {lines} (notebooks 00-05 make them)")


def save_rows(rows: list[dict], path) -> Path:
    """Save rows as a ``datasets.Dataset`` (``save_to_disk``)."""
    from datasets import Dataset

    Dataset.from_list(rows).save_to_disk(str(path))
    return Path(path)


def _strip_none(m: dict) -> dict:
    return {k: v for k, v in m.items() if v is not None}


def load_rows(path) -> list[dict]:
    """The rows of a dataset saved by ``save_rows``, each message with only the keys it was saved with (Arrow
    gives every message every key of the column's struct, ``None`` where absent)."""
    from datasets import load_from_disk

    out = []
    for r in load_from_disk(str(path)).to_list():
        r["messages"] = [_strip_none(m) for m in r["messages"]]
        for m in r["messages"]:
            if "tool_calls" in m:
                m["tool_calls"] = [{k: v for k, v in c.items() if v is not None} for c in m["tool_calls"]]
        out.append(r)
    return out


def run_sdft_data(cfg, policy_for=None):
    """Sample and filter every domain from its oracle (skipped when ``sdft_data`` is complete). ``policy_for``:
    ``(domain, model_dir, max_new_tokens) -> policy`` instead of the oracle's ``sampling_policy`` (tests).
    Returns the run; ``filter.json`` holds the statistics per domain, ``dataset/`` the kept rows."""
    from acl_lib import pipeline
    from acl_lib.runs import run_once
    from acl_lib.seeding import seed_and_threads

    run = data_run(cfg)
    _require(run.inputs, "SDFT's data")

    def fn(r) -> None:
        from acl_lib.progress import Progress

        rows, stats = [], {}
        with Progress(len(cfg.pipeline.curriculum), "sdft: sampling", unit="domain") as bar:
            for d, oracle in zip(cfg.pipeline.curriculum, r.inputs):
                seed_and_threads(sample_seed(cfg), cfg.torch_threads)
                _, max_new = domain_limits(cfg, d)
                model = str(pipeline.model_dir(oracle))
                policy = policy_for(d, model, max_new) if policy_for else sampling_policy(cfg, model, max_new)
                try:
                    got, st = sample_domain(cfg, d, policy)
                finally:
                    if hasattr(policy, "close"):
                        policy.close()
                rows += got
                stats[d] = {"oracle": oracle.name, **st}
                bar.update(1, **{d: st["kept"]})
                r.logger.info("sdft data %s: kept %d of %d (%s)", d, st["kept"], st["tried"],
                              {k: st[k] for k in ("reward_failed", "protocol_failed", "duplicates")})
        if rows:  # an empty set (oracles that solve nothing, as the untrained ones of the smoke profile) has none
            with r.atomic_dir(DATASET_DIR) as tmp:
                save_rows(rows, tmp)
        else:
            r.logger.warning("sdft data: the filter kept no trajectory in any domain (%s)",
                             {d: st["reasons"] for d, st in stats.items()})
        r.write_json(FILTER_JSON, {"seed": sample_seed(cfg), "split": "train", "kept": len(rows), "domains": stats,
                                   "sdft": {k: getattr(cfg.sdft, k) for k in SAMPLING_FIELDS}})

    return run_once(run, fn)


def data_rows(data) -> list[dict]:
    """The kept rows of a complete ``sdft_data`` run (empty when its filter kept nothing)."""
    if data.read_json(FILTER_JSON)["kept"] == 0:
        return []
    return load_rows(data.path / DATASET_DIR)


class NoData(RuntimeError):
    """An SDFT run whose union is empty: the filter kept nothing its mixture selects."""


# --- mixture and order -------------------------------------------------------------------------------------


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
    for d, idx in by_domain.items():
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


# --- training runs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SDFTSpec:
    """One SDFT run: its name, the checkpoint it starts from (``seq_final`` or ``base``), the mixture (None:
    ``sdft.mixture``) and the order (None: ``sdft.order``)."""

    name: str
    start: str = "seq_final"
    mixture: dict | None = field(default=None, hash=False)
    order: str | None = None

    def __post_init__(self):
        if self.start not in STARTS:
            raise ValueError(f"SDFT run {self.name}: start must be one of {list(STARTS)}, got {self.start!r}")
        if self.order is not None and self.order not in ORDERS:
            raise ValueError(f"SDFT run {self.name}: unknown order {self.order!r}; orders are {list(ORDERS)}")
        if self.mixture is not None:
            from acl_lib.config import _check_mixture

            object.__setattr__(self, "mixture", dict(_check_mixture(dict(self.mixture))))

    def resolved(self, cfg) -> dict:
        return {"name": self.name, "start": self.start,
                "mixture": dict(self.mixture if self.mixture is not None else cfg.sdft.mixture),
                "order": self.order or cfg.sdft.order}


def mix_name(mixture: Mapping[str, float], curriculum: Sequence[str]) -> str:
    """``sdft_mix_math1_search1_ecom2_if2``: a mixture ablation's run name (every curriculum domain's weight)."""
    return "sdft_mix_" + "_".join(f"{d}{float(mixture.get(d, 0.0)):g}" for d in curriculum)


def ablation_specs(cfg, mixture: Mapping[str, float] | None = None, orders: Sequence[str] = ("staged", "difficulty")
                   ) -> list[SDFTSpec]:
    """The ablations notebook 09 runs, each from ``seq_final``: a non-uniform ``mixture`` (``sdft_mix_*``; None
    leaves it out) with ``sdft.order``, and each presentation order of ``orders`` other than ``sdft.order``
    (``sdft_staged``, ``sdft_difficulty``) with ``sdft.mixture``. ``sdft`` itself is ``sdft.order``
    (shuffle by default)."""
    specs = []
    if mixture is not None:
        specs.append(SDFTSpec(mix_name(mixture, cfg.pipeline.curriculum), mixture=dict(mixture)))
    for o in orders:
        if o != cfg.sdft.order:
            specs.append(SDFTSpec(f"sdft_{o}", order=o))
    return specs


def start_run(cfg, start: str):
    from acl_lib import pipeline

    return pipeline.base_run(cfg) if start == "base" else pipeline.sequential_run(cfg, len(cfg.pipeline.curriculum))


def sdft_cfg(cfg):
    """``cfg`` with ``sft.max_steps`` / ``batch_size`` / ``learning_rate`` replaced by ``sdft``'s (what the SFT
    job of an SDFT run reads; the other ``sft`` fields, ``max_length`` included, stay)."""
    from acl_lib.config import Config

    tree = cfg.to_dict()
    for k in TRAINING_FIELDS:
        tree["sft"][k] = getattr(cfg.sdft, k)
    return Config.model_validate(tree)


def sdft_run(cfg, spec: SDFTSpec):
    """The run of ``spec`` (``<seed_dir>/<spec.name>``), keyed on its recipe and inputs (data run, start)."""
    from acl_lib.runs import Run

    extra = {"spec": spec.resolved(cfg), "sdft": {k: getattr(cfg.sdft, k) for k in TRAINING_FIELDS},
             "max_length": cfg.sft.max_length, "seed": cfg.seed}
    return Run(cfg, spec.name, sections=TRAIN_SECTIONS, inputs=[data_run(cfg), start_run(cfg, spec.start)],
               extra=extra)


def displacement(before, after, progress: bool = False) -> dict:
    """``||theta_after - theta_before||`` and ``||theta_before||`` (streamed over the safetensors files)."""
    from acl_lib.diagnostics.weights import weight_change

    norm, ref = weight_change(before, after, progress)
    return {"displacement_norm": norm, "start_norm": ref, "relative_displacement": norm / ref if ref else None}


def run_sdft(cfg, spec: SDFTSpec, evaluate: bool = True):
    """Train ``spec`` on the union of ``sdft_data`` (skipped when complete), then score it on the whole suite
    (``<run>/eval/metrics.json``). Returns the run; ``<run>/sdft.json`` records what training did."""
    from acl_lib import pipeline
    from acl_lib.runs import run_once
    from acl_lib.train.sft import write_rows

    run = sdft_run(cfg, spec)
    data, start = run.inputs
    _require([start], f"SDFT run {spec.name}")
    _require([data], f"SDFT run {spec.name} (run_sdft_data first)")
    recipe = spec.resolved(cfg)
    rows = data_rows(data)
    union, counts = build_union(rows, recipe["mixture"], recipe["order"], cfg.pipeline.curriculum, sample_seed(cfg))
    if not union:
        raise NoData(f"SDFT run {spec.name}: nothing to train on: the mixture {recipe['mixture']} selects no row of "
                     f"the kept ones { {d: sum(x['domain'] == d for x in rows) for d in cfg.pipeline.curriculum} } "
                     f"({data.path / FILTER_JSON} says why)")

    def fn(r) -> None:
        from acl_lib.train import common
        from acl_lib.train.launcher import launch

        with r.atomic_dir(TRAIN_DATA_DIR) as tmp:
            save_rows(union, tmp)
        path = write_rows([{k: x[k] for k in ROW_KEYS} for x in union], r.path / TRAIN_ROWS)
        s = cfg.sdft
        seen = min(len(union), s.max_steps * s.batch_size)
        unseen = sorted({x["domain"] for x in union[seen:]} - {x["domain"] for x in union[:seen]})
        if unseen:
            r.logger.warning("sdft %s: %d steps x %d rows see only the first %d of %d rows (order %s): never %s",
                             spec.name, s.max_steps, s.batch_size, seen, len(union), recipe["order"], unseen)
        r.checkpoint_dir()
        start_dir = pipeline.model_dir(start)
        summary = launch(sdft_cfg(cfg), "sft", r.path, model_dir=str(start_dir), dataset=str(path), sequential=True)
        moved = displacement(start_dir, r.path / "model")
        log = common.read_log(r.path / common.TRAIN_LOG)
        losses = [x["loss"] for x in log if "loss" in x]
        r.write_json(SUMMARY_JSON, {
            **recipe, "start_run": start.name, "start_model": str(start_dir), "rows": len(union),
            "rows_per_domain": counts, "kept_per_domain": {d: sum(x["domain"] == d for x in rows)
                                                           for d in cfg.pipeline.curriculum},
            "rows_seen": seen, "domains_never_seen": unseen, "order_head": [x["task_id"] for x in union[:8]],
            "steps": summary.get("steps"), "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None, **moved,
            "train": {k: getattr(s, k) for k in TRAINING_FIELDS}, "wall_s": summary.get("wall_s"),
        })
        r.logger.info("sdft %s: %d rows %s, loss %s -> %s, ||d theta|| %.4g", spec.name, len(union), counts,
                      losses[0] if losses else None, losses[-1] if losses else None, moved["displacement_norm"])

    run_once(run, fn)
    if evaluate:
        pipeline.evaluate_checkpoint(cfg, run)
    return run


def run_sdft_specs(cfg, specs: Sequence[SDFTSpec], evaluate: bool = True) -> list[str]:
    """``run_sdft`` for each spec; a spec with nothing to train on (``NoData``) is skipped with a log line.
    Returns the names of the runs trained (or complete)."""
    done = []
    for spec in specs:
        try:
            run_sdft(cfg, spec, evaluate=evaluate)
        except NoData as exc:
            logger.warning("%s: skipped", exc)
            continue
        done.append(spec.name)
    return done


# --- update directions -------------------------------------------------------------------------------------


def _oracle_sft_models(cfg) -> dict:
    from acl_lib import pipeline
    from acl_lib.train.stage import SFT_DIR

    out = {}
    for d in cfg.pipeline.curriculum:
        m = pipeline.oracle_run(cfg, d).path / SFT_DIR / "model"
        if m.is_dir():
            out[d] = m
    return out


def directions_run(cfg, names: tuple[str, str] = ("sdft", "sdft_base")):
    from acl_lib import pipeline
    from acl_lib.runs import Run

    final = pipeline.sequential_run(cfg, len(cfg.pipeline.curriculum))
    oracles = [pipeline.oracle_run(cfg, d) for d in cfg.pipeline.curriculum]
    runs = [sdft_run(cfg, SDFTSpec(names[0])), sdft_run(cfg, SDFTSpec(names[1], start="base"))]
    return Run(cfg, DIRECTIONS_RUN, sections=(), inputs=[pipeline.base_run(cfg), final, *runs, *oracles],
               extra={"runs": list(names)})


def run_update_directions(cfg, names: tuple[str, str] = ("sdft", "sdft_base"), missing_ok: bool = False) -> dict | None:
    """The study's update-direction check (module docstring) as a run (``sdft_directions/directions.json``);
    ``names``: the SDFT runs from ``seq_final`` and from the base. Returns that JSON; with ``missing_ok``, None
    when those two runs are not complete (skipped for want of data) instead of an error."""
    from acl_lib import pipeline
    from acl_lib.runs import run_once

    run = directions_run(cfg, names)
    base, final, from_final, from_base, *oracles = run.inputs
    if missing_ok and not (from_final.is_complete() and from_base.is_complete()):
        absent = [n for n, r in zip(names, (from_final, from_base)) if not r.is_complete()]
        logger.warning("update directions: %s not complete, not computed", absent)
        return None
    _require([base, final, from_final, from_base, *oracles], "the update-direction check")

    def fn(r) -> None:
        from acl_lib.diagnostics.weights import resolve_model_dir, streamed_gram, update

        sft = _oracle_sft_models(cfg)
        kind = "cold-start SFT" if len(sft) >= 2 else "whole oracle"
        singles = sft if len(sft) >= 2 else {d: pipeline.model_dir(o) for d, o in zip(cfg.pipeline.curriculum, oracles)}
        models = {"base": resolve_model_dir(pipeline.model_dir(base)), "seq_final": pipeline.model_dir(final),
                  "sdft": pipeline.model_dir(from_final), "sdft_base": pipeline.model_dir(from_base),
                  **{f"single_{d}": p for d, p in singles.items()}}
        gram = streamed_gram(models, "base", progress=True)
        same = gram.cosine(update("sdft_base", "base"), update("sdft", "seq_final"))
        doms = list(singles)
        pairs = {f"{a} vs {b}": gram.cosine(update(f"single_{a}", "base"), update(f"single_{b}", "base"))
                 for i, a in enumerate(doms) for b in doms[i + 1:]}
        finite = [v for v in pairs.values() if v == v]
        r.write_json("directions.json", {
            "same_sft_from_base_vs_seq_final": same,
            "unrelated_single_domain_sft": {"kind": kind, "pairs": pairs,
                                            "mean": sum(finite) / len(finite) if finite else None},
            "norms": {"sdft - seq_final": gram.norm(update("sdft", "seq_final")),
                      "sdft_base - base": gram.norm(update("sdft_base", "base")),
                      **{f"{d} ({kind}) - base": gram.norm(update(f"single_{d}", "base")) for d in doms}},
            "study": {"same_sft_from_base_vs_seq_final": 0.77, "unrelated_single_domain_sft": 0.05},
            "runs": list(names),
        })

    run_once(run, fn)
    return run.read_json("directions.json")


# --- what notebook 09 shows --------------------------------------------------------------------------------


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


def training_frame(cfg, names: Sequence[str]):
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
    from acl_lib.envs import IN_DOMAIN

    lines = []
    final = scores.get("seq_final")
    if final is None:
        lines.append("No `seq_final` evaluation yet (notebooks 01-04): nothing to compare the SDFT runs with.")
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
