"""SDFT's data: the oracles' own rollouts, sampled and filtered into one dataset (``run_sdft_data``).

**Data** (``sdft_data``, one run keyed on the four oracles, the ``model`` / ``worlds`` sections, the sampling
fields of ``sdft`` and each domain's turn limits). Each single-task oracle ``oracle_<d>`` samples
``sdft.group_size`` rollouts at ``sdft.temperature`` (top-p 1) on each of ``sdft.n_prompts`` tasks of its own
world's *training* split, drawn with ``sample_seed(cfg)`` (``SAMPLE_SEED + cfg.seed``: no stage draws with it,
they use the training seed and the seed + 1, nor the merges' validation seed), through the evaluator's batched
model policy (``HFPolicy``; ``VLLMPolicy`` where ``eval.backend`` is vllm) with the turn and token limits the
stage trains with (``grpo.max_turns`` / ``grpo.max_new_tokens`` of ``cfg.for_stage(d)``). A trajectory is kept
only if it passes the filter (``filtering.filter_episodes``: reward, protocol, near-duplicates); ``filter.json``
counts why the others failed.

The kept rows (chat rows as the cold starts train on, ``train.sft.episode_row``, plus their domain, task id,
sample index, task difficulty and length) are saved with ``datasets.Dataset.save_to_disk``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.consolidate.merging import validation_seed
from acl_lib.consolidate.sdft.filtering import filter_verdicts, judge_episode
from acl_lib.envs import STAGE_ENV
from acl_lib.eval.harness import run_episodes, world
from acl_lib.eval.policies import HFPolicy, VLLMPolicy
from acl_lib.eval.sharding import visible_gpus
from acl_lib.processes import call_in_child, map_in_children
from acl_lib.progress import Progress
from acl_lib.runs import Run, run_once
from acl_lib.seeding import seed_and_threads
from acl_lib.steps import require_complete

if TYPE_CHECKING:
    from acl_lib.config import Config

SAMPLE_SEED = 104729  # + cfg.seed: the tasks the oracles sample on (stages use cfg.seed and cfg.seed + 1)
DATA_RUN = "sdft_data"
DATASET_DIR = "dataset"  # <sdft_data>/dataset: the kept rows of every domain (datasets.Dataset.save_to_disk)
FILTER_JSON = "filter.json"
DATA_SECTIONS = ("model", "worlds")  # + the sampling fields of sdft and each domain's limits (extra)
SAMPLING_FIELDS = ("n_prompts", "group_size", "temperature", "dedup_threshold", "dedup_ngram")


def sample_seed(cfg: Config) -> int:
    """The seed the oracles' sampling tasks are drawn with (and sampling is seeded with); never a stage's
    (``cfg.seed``, ``cfg.seed + 1``) nor the merges' validation seed."""
    s = SAMPLE_SEED + cfg.seed
    while s in (cfg.seed, cfg.seed + 1, validation_seed(cfg)):
        s += 1
    return s


def domain_limits(cfg: Config, domain: str) -> tuple[int, int]:
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
        for (_task, messages), text in zip(batch, out):
            if text is not None and next(flags, False):
                self.cut.add(id(messages))
        return out

    def forget(self, task, messages) -> None:
        if hasattr(self.policy, "forget"):
            self.policy.forget(task, messages)

    def close(self) -> None:
        if hasattr(self.policy, "close"):
            self.policy.close()


def sampling_policy(cfg: Config, model_dir: str, max_new_tokens: int):
    """The evaluator's batched model policy with SDFT's sampling settings (``sdft.temperature``, top-p 1)."""
    if cfg.eval.backend == "vllm":
        return VLLMPolicy(str(model_dir), max_new_tokens, cfg.sdft.temperature, 1.0, dtype=cfg.model.dtype,
                          max_model_len=cfg.model.max_position_embeddings, seed=sample_seed(cfg))
    return HFPolicy(str(model_dir), max_new_tokens, cfg.sdft.temperature, 1.0, cfg.eval.batch_size,
                    dtype=cfg.model.dtype)


def sampling_tasks(cfg: Config, domain: str, env=None) -> list:
    """The ``sdft.n_prompts`` training tasks of the domain's world its oracle samples on (``sample_seed``)."""
    env = env if env is not None else world(cfg, STAGE_ENV.get(domain, domain))
    return env.tasks("train", cfg.sdft.n_prompts, seed=sample_seed(cfg))


def sample_verdicts(cfg: Config, domain: str, policy, tasks: list, env=None) -> tuple[list[dict], int]:
    """``sdft.group_size`` rollouts of ``policy`` on each of ``tasks`` (task by task, sample by sample), each
    judged (``filtering.judge_episode``); returns the verdicts and how many had a turn cut at the token budget."""
    env = env if env is not None else world(cfg, STAGE_ENV.get(domain, domain))
    max_turns, _ = domain_limits(cfg, domain)
    episodes = [(env.start(t, max_turns=max_turns), k) for t in tasks for k in range(cfg.sdft.group_size)]
    watch = policy if isinstance(policy, _CutWatch) else _CutWatch(policy)
    run_episodes(watch, [ep for ep, _ in episodes], batch_size=max(cfg.eval.batch_size, 1) * 4)
    return [judge_episode(domain, ep, id(ep.messages) in watch.cut, k) for ep, k in episodes], len(watch.cut)


def sample_domain(cfg: Config, domain: str, policy, tasks: list | None = None, env=None) -> tuple[list[dict], dict]:
    """``sdft.group_size`` rollouts of ``policy`` (a batched policy: the oracle's ``sampling_policy``, or any
    other, e.g. ``ExpertPolicy`` in tests) on each of ``tasks`` (default: ``sampling_tasks``), filtered
    (``filter_verdicts``: reward, protocol, near-duplicates across the domain). Returns ``(rows, stats)``."""
    tasks = tasks if tasks is not None else sampling_tasks(cfg, domain, env)
    verdicts, cut = sample_verdicts(cfg, domain, policy, tasks, env)
    return _filtered(cfg, domain, verdicts, len(tasks), cut)


def _filtered(cfg: Config, domain: str, verdicts: list[dict], n_tasks: int, cut: int) -> tuple[list[dict], dict]:
    s = cfg.sdft
    rows, stats = filter_verdicts(verdicts, s.dedup_threshold, s.dedup_ngram)
    stats.update(prompts=n_tasks, group_size=s.group_size, max_turns=domain_limits(cfg, domain)[0],
                 cut_at_token_budget=cut)
    return rows, stats


def data_run(cfg: Config):
    """``sdft_data``: keyed on the oracles, ``model`` / ``worlds``, sdft's sampling fields and the limits."""
    oracles = [pipeline.oracle_run(cfg, d) for d in cfg.pipeline.curriculum]
    extra = {"sdft": {k: getattr(cfg.sdft, k) for k in SAMPLING_FIELDS}, "seed": sample_seed(cfg),
             "limits": {d: list(domain_limits(cfg, d)) for d in cfg.pipeline.curriculum},
             "backend": cfg.eval.backend, "batch_size": cfg.eval.batch_size}
    return Run(cfg, DATA_RUN, sections=DATA_SECTIONS, inputs=oracles, extra=extra)



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


def sample_oracle(cfg: Config, domain: str, model: str, policy_for=None) -> tuple[list[dict], dict]:
    """``sample_domain`` with the oracle in ``model`` (its ``sampling_policy``, or ``policy_for``'s), seeded; over
    ``eval.shards`` processes at once where that is above 1 (``sample_oracle_sharded``)."""
    if cfg.eval.shards > 1:
        return sample_oracle_sharded(cfg, domain, model, cfg.eval.shards, policy_for)
    verdicts, cut = sample_shard(cfg, domain, model, (0, 1), policy_for)
    return _filtered(cfg, domain, verdicts, cfg.sdft.n_prompts, cut)


def sample_shard(cfg: Config, domain: str, model: str, shard: tuple[int, int], policy_for=None
                 ) -> tuple[list[dict], int]:
    """Shard ``(i, n)`` of an oracle's sampling: its verdicts (``sample_verdicts``) on every n-th task of
    ``sampling_tasks`` from the i-th, with its own policy (the oracle's ``sampling_policy``, or ``policy_for``'s)."""
    seed_and_threads(sample_seed(cfg), cfg.torch_threads)
    _, max_new = domain_limits(cfg, domain)
    i, n = shard
    tasks = sampling_tasks(cfg, domain)[i::n]
    policy = policy_for(domain, model, max_new) if policy_for else sampling_policy(cfg, model, max_new)
    try:
        return sample_verdicts(cfg, domain, policy, tasks)
    finally:
        if hasattr(policy, "close"):
            policy.close()


def sample_oracle_sharded(cfg: Config, domain: str, model: str, shards: int, policy_for=None
                          ) -> tuple[list[dict], dict]:
    """An oracle's sampling split over ``shards`` processes run at once (``processes.map_in_children``), each on
    its own GPU where there are GPUs (shard i on GPU i modulo their number) and its share of the CPU threads
    elsewhere; their verdicts are put back in the unsharded order before the domain-wide filter, so the rows are
    those of one process wherever each episode's samples do not depend on its batch (the HF policy's per-episode
    streams; a vLLM engine seeds per engine, so there its samples differ from an unsharded run's)."""
    gpus = visible_gpus()
    threads = max(1, cfg.torch_threads // shards) if not gpus else cfg.torch_threads
    sub = cfg.model_copy(update={"torch_threads": threads})
    envs = [{"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} if gpus else {} for i in range(shards)]
    parts = map_in_children(sample_shard, [(sub, domain, model, (i, shards), policy_for) for i in range(shards)],
                            envs)
    g, n_tasks = cfg.sdft.group_size, cfg.sdft.n_prompts
    verdicts = [v for j in range(n_tasks) for v in parts[j % shards][0][(j // shards) * g:(j // shards + 1) * g]]
    return _filtered(cfg, domain, verdicts, n_tasks, sum(cut for _, cut in parts))


def run_sdft_data(cfg: Config, policy_for=None):
    """Sample and filter every domain from its oracle (skipped when ``sdft_data`` is complete). ``policy_for``:
    ``(domain, model_dir, max_new_tokens) -> policy`` instead of the oracle's ``sampling_policy`` (tests).
    Returns the run; ``filter.json`` holds the statistics per domain, ``dataset/`` the kept rows."""
    run = data_run(cfg)
    require_complete(run.inputs, "SDFT's data")

    def fn(r) -> None:
        rows, stats = [], {}
        with Progress(len(cfg.pipeline.curriculum), "sdft: sampling", unit="domain") as bar:
            for d, oracle in zip(cfg.pipeline.curriculum, r.inputs):
                model = str(pipeline.model_dir(oracle))
                if policy_for is None and cfg.launcher.eval_subprocess:
                    # each oracle's engine in a process of its own: its GPU memory is free for the next one
                    got, st = call_in_child(sample_oracle, cfg, d, model)
                else:
                    got, st = sample_oracle(cfg, d, model, policy_for)
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
