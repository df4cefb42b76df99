"""One evaluation harness for every checkpoint: in-domain and OOD suites, multi-turn episodes, avg@k.

    evaluate(cfg, model="outputs/mini/seed0/seq_math/model", out_dir=...)

or from the command line, ``acl eval --model ... --profile mini [--suites all] [--k 4]`` (``acl_lib.cli``).
A *policy* (``acl_lib.eval.policies``) turns a batch of (task, conversation-so-far) into assistant texts: a HF
model (batched ``generate`` on CPU), a vLLM engine (the ``paper`` profile), the scripted experts (``--model
expert``) or a do-nothing policy (``--model null``), all run through the same episodes.

This module holds the evaluation itself: the episodes (``run_episodes``), the tasks each benchmark draws, the
benchmark loop (``evaluate``), the scores and ``metrics.json``, and the checks ``acl eval`` runs on its
arguments. Beside it: ``acl_lib.eval.sharding`` (an evaluation in a child process, or split into shards) and
``acl_lib.eval.sizing`` (what an evaluation will do, before it starts).

``acl eval`` writes to a directory of its own (``outputs/eval/<name>-<UTC time>/`` unless ``--out`` says
otherwise), never into a run of the run store (refused), and all at once: records and metrics are written
into a temporary directory that is renamed into place. The pipeline's evaluations are runs of their own,
``<run>/eval/`` (``acl_lib.pipeline.eval_run``).

Outputs in ``out_dir``:
- ``metrics.json``: ``{"scores": {benchmark: percent}, "se": {...}, "mean_reward": {...}, "n_tasks": {...}, ...}``.
  A benchmark's score is the percentage of episodes with reward 1 (pass rate; for IFEval this is
  prompt-level strict accuracy), averaged over k samples per task (avg@k). Each benchmark has its own k and
  temperature (``eval.limits.<benchmark>``, else ``eval.k`` / ``eval.temperature``; ``sampling_plan``):
  ``k_by_benchmark`` and ``temperature`` hold them per benchmark; ``k`` is their common value when all are equal,
  else the same ``{benchmark: k}`` as ``k_by_benchmark`` (read it with ``acl_lib.noise.samples_per_task``, which
  also reads files written before the per-benchmark k). ``se``: each score's standard error in points, clustered
  by task (``acl_lib.noise.clustered_se``: a task's k samples are one cluster; at k = 1 the binomial one).
- ``records/<benchmark>.jsonl``: one line per episode with the transcript and the failure reason.
- ``eval_config.yaml`` (``acl eval`` only): the resolved config it ran with.
"""

from __future__ import annotations

import json
import logging
import os
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib.atomic import atomic_write_text
from acl_lib.config import project_root
from acl_lib.envs import BENCHMARKS, Benchmark, benchmarks_for, llm_user, make_env
from acl_lib.envs.base import Episode, Task, map_concurrently, prefetch, step_workers
from acl_lib.eval.policies import (
    CountsTokens,
    FailedTurn,
    HasTemperature,
    HasTokenBudget,
    HFPolicy,
    Policy,
    SupportsClose,
    SupportsForget,
    TimesGeneration,
    make_policy,
)
from acl_lib.noise import TaskCounts, clustered_se, samples_per_task
from acl_lib.progress import Progress
from acl_lib.runs import COMPLETE, CONFIG, FAILED, RUNNING
from acl_lib.seeding import follow_thread_share, seed_and_threads

if TYPE_CHECKING:
    from acl_lib.config import Config

log = logging.getLogger(__name__)

PASS_EPS = 1e-9


# --- episodes ---------------------------------------------------------------------------------------


def run_episodes(policy: Policy, episodes: list[Episode], batch_size: int = 64,
                 progress: Callable[[int], None] | None = None) -> None:
    """Drive every episode to its end, one assistant turn per round for all active episodes."""
    # a policy's state per episode (a KV cache, a random stream) is dropped as each episode ends
    forget = policy.forget if isinstance(policy, SupportsForget) else None
    while True:
        active = [e for e in episodes if not e.done]
        if not active:
            return
        for start in range(0, len(active), batch_size):
            follow_thread_share()  # both cores once the notebook beside this one has ended (acl run --jobs)
            chunk = active[start : start + batch_size]
            texts = policy([(e.task, e.messages) for e in chunk])
            _step_all(chunk, texts)
            for ep in chunk:
                if ep.done:
                    if forget is not None:
                        forget(ep.task, ep.messages)
                    if progress:
                        progress(1)


def _step_all(chunk: list[Episode], texts: list[str | None]) -> None:
    """Feed each episode its turn: in threads where the episodes wait on a remote user simulator
    (``envs.base.step_workers``), else in order in this thread."""

    def step(item: tuple[Episode, str | None]) -> None:
        ep, text = item
        if text is None:
            ep.end("context limit: prompt longer than the model's context")
        elif isinstance(text, FailedTurn):
            ep.end(text.reason)
        else:
            ep.step(text)

    prefetch(chunk, [t if not isinstance(t, FailedTurn) else None for t in texts])  # the round's searches, batched
    map_concurrently(step, list(zip(chunk, texts)), step_workers(chunk))


def _failure_key(reason: str | None) -> str:
    return (reason or "").split(":")[0].strip()[:80]


def world(cfg: Config, env_name: str):
    """The environment a benchmark runs in: built from ``cfg.worlds`` with the world seed ``cfg.worlds.seed``,
    the very world training builds (``acl_lib.train.trl_env.make_env``), whatever the training seed."""
    return make_env(env_name, cfg.worlds, seed=cfg.worlds.seed)


def benchmark_size(cfg: Config, bench: Benchmark) -> int:
    """Tasks to draw for ``bench``: ``eval.limits.<bench>.max_tasks`` where set, else ``worlds.n_test``
    (in-domain) or ``worlds.n_ood`` (OOD). A real test set smaller than that is scored whole; a generated desk
    caps it at the tasks it can tell apart (``TelecomEnv.MAX_TASKS``)."""
    own = cfg.eval.limits.get(bench.key, {}).get("max_tasks")
    if own is not None:
        return own
    return cfg.worlds.n_test if bench.suite == "in_domain" else cfg.worlds.n_ood


def evaluate_benchmark(policy: Policy, bench: Benchmark, env, n: int, k: int, max_turns: int,
                       task_seed: int = 0, batch_size: int = 64, progress=None,
                       tasks: list[Task] | None = None) -> tuple[dict, list[dict]]:
    """Score one benchmark: ``n`` tasks (or the ``tasks`` given) x ``k`` samples. Returns (summary, records)."""
    tasks = tasks if tasks is not None else env.tasks(bench.split, n, seed=task_seed)
    episodes = [env.start(t, max_turns=max_turns) for t in tasks for _ in range(k)]
    run_episodes(policy, episodes, batch_size=batch_size, progress=progress)
    records = []
    for i, ep in enumerate(episodes):
        rec = ep.record()
        rec["sample"] = i % k
        meta = ep.task.meta or {}
        for key in ("source", "kind"):  # a real dataset's name; a desk task's kind (retail: cancel, return...)
            if meta.get(key) is not None:
                rec[key] = str(meta[key])
        records.append(rec)
    return summarize_records(records, len(tasks), k), records


def summarize_records(records: list[dict], n_tasks: int, k: int) -> dict:
    """A benchmark's summary (score, mean reward, tasks, k, the most frequent failures, per-dataset scores) from its
    episodes' records: the same whether they were scored in one process or gathered from shards."""
    rewards = [r["reward"] for r in records]
    passed = [r >= 1.0 - PASS_EPS for r in rewards]
    counts = TaskCounts.from_episodes((r["id"], ok) for r, ok in zip(records, passed)) if records else None
    summary = {
        "score": 100.0 * sum(passed) / max(1, len(passed)),
        "se": clustered_se(counts) if counts is not None else None,
        "mean_reward": sum(rewards) / max(1, len(rewards)),
        "n_tasks": n_tasks,
        "k": k,
        "failures": dict(Counter(_failure_key(r["failure"]) for r in records if r["failure"]).most_common(8)),
    }
    by_dataset = dataset_scores([r.get("source") for r in records], passed)
    if by_dataset:
        summary["by_dataset"] = by_dataset
        summary["dataset_mean"] = sum(by_dataset.values()) / len(by_dataset)
    return summary


def dataset_scores(sources: list[str | None], passed: list[bool]) -> dict[str, float]:
    """Pass rate (percent) per source dataset of a benchmark that pools several (``single_hop``: PopQA +
    TriviaQA; ``multi_hop``: 2Wiki, HotpotQA, Bamboogle, MuSiQue), keyed by each task's ``meta["source"]`` (the
    records' ``source``); empty when the benchmark has one source. The study reports each dataset and their
    unweighted mean; the pooled score weights datasets by size (PopQA's 14k questions would swamp Bamboogle's 125)."""
    groups: dict[str, list[bool]] = {}
    for source, ok in zip(sources, passed):
        if source is not None:
            groups.setdefault(str(source), []).append(ok)
    if len(groups) < 2:
        return {}
    return {name: 100.0 * sum(v) / len(v) for name, v in sorted(groups.items())}


def benchmark_seed(seed: int, benchmark: str) -> int:
    """The sampling seed of one benchmark in an evaluation with training seed ``seed`` (stable across processes)."""
    return zlib.crc32(f"{seed}:{benchmark}".encode())


def sampling_plan(cfg: Config, benches: Sequence[Benchmark], k: int | None = None) -> dict[str, tuple[int, float]]:
    """``{benchmark: (k, temperature)}``: each benchmark's samples per task and sampling temperature
    (``cfg.eval.sampling_for``). An explicit ``k`` (``acl eval --k``) replaces every benchmark's k. A benchmark
    scored greedily (temperature 0) with k > 1 would repeat one sample k times: it is scored with k=1, and a
    warning names it."""
    if k is not None and k < 1:
        raise ValueError(f"k must be at least 1 (samples per task), got {k}")
    plan, greedy = {}, []
    for b in benches:
        own_k, temperature = cfg.eval.sampling_for(b.key)
        kb = k or own_k
        if kb > 1 and temperature == 0:
            greedy.append(f"{b.key} (k={kb})")
            kb = 1
        plan[b.key] = (kb, temperature)
    if greedy:
        log.warning("k > 1 with temperature 0 repeats the same greedy sample; using k=1 for %s", ", ".join(greedy))
    return plan


def evaluation_plan(cfg: Config, suites: str | None, k: int | None, benchmarks: list[str] | None,
                    check_user_sim: bool = True):
    """``(suites, benchmarks, sampling plan)`` of one evaluation, the user simulator checked first (a missing one
    fails now, not after math and search) unless the caller checked it already."""
    suites = suites or cfg.eval.suites
    benches = [BENCHMARKS[b] for b in benchmarks] if benchmarks else benchmarks_for(suites)
    sampling = sampling_plan(cfg, benches, k)
    if check_user_sim:
        llm_user.preflight(cfg.worlds, {b.env for b in benches})
    return suites, benches, sampling


def evaluate(cfg: Config, model: str, out_dir: str | os.PathLike, suites: str | None = None, k: int | None = None,
             policy: Policy | None = None, benchmarks: list[str] | None = None,
             shard: tuple[int, int] | None = None, user_sim_checked: bool = False) -> dict:
    """Evaluate ``model`` (a checkpoint dir, ``expert`` or ``null``) on the suite; write metrics + records.

    Tasks are drawn with the world seed ``cfg.worlds.seed`` (the same benchmark for every training seed). Each
    benchmark is scored with its own k and temperature (``sampling_plan``; ``k`` given here replaces every
    benchmark's k). A policy built here (no ``policy`` given) is built once for the whole suite and closed at the
    end, its model or vLLM engine released (``close``), so evaluating checkpoints one after another does not pile
    them up. ``shard=(i, n)``: score only every n-th task of each benchmark from the i-th (a shard of
    ``sharding.evaluate_sharded``; its metrics cover that share). ``user_sim_checked``: the caller ran
    ``llm_user.preflight`` for these benchmarks already (``acl eval``, before loading the checkpoint), so it is not
    run again.
    """
    suites, benches, sampling = evaluation_plan(cfg, suites, k, benchmarks, check_user_sim=not user_sim_checked)
    if policy is None and model not in ("expert", "null"):
        # The same samples whatever ran before in this process (a notebook trains first, then evaluates).
        seed_and_threads(cfg.seed, cfg.torch_threads)
    own_policy = policy is None  # built here: released here, so the next checkpoint's model finds the memory free
    policy = policy or make_policy(model, cfg)
    try:
        return _evaluate(cfg, model, out_dir, suites, sampling, policy, benches, shard)
    finally:
        if own_policy and isinstance(policy, SupportsClose):
            policy.close()


def _evaluate(cfg: Config, model, out_dir, suites, sampling: dict[str, tuple[int, float]], policy: Policy, benches,
              shard: tuple[int, int] | None = None) -> dict:
    out = Path(out_dir)
    (out / "records").mkdir(parents=True, exist_ok=True)
    envs: dict[str, object] = {}
    t0 = time.perf_counter()
    results: dict[str, dict] = {}
    per_bench_seconds = {}
    limits = {b.key: dict(zip(("max_turns", "max_new_tokens"), cfg.eval.limits_for(b.key))) for b in benches}
    sizes = {b.key: benchmark_size(cfg, b) for b in benches}
    tasks: dict[str, list[Task]] = {}
    for b in benches:  # drawn first: a real test set may hold fewer tasks than asked, and the line counts them
        if b.env not in envs:
            envs[b.env] = world(cfg, b.env)
        tasks[b.key] = envs[b.env].tasks(b.split, sizes[b.key], seed=cfg.worlds.seed)
        if shard is not None:  # this process's share: every n-th task from the i-th (evaluate_sharded)
            tasks[b.key] = tasks[b.key][shard[0]::shard[1]]
    with Progress(sum(len(tasks[b.key]) * sampling[b.key][0] for b in benches), "eval", unit="episode") as bar:
        tokens_by: dict[str, int] = {}
        for b in benches:
            tb = time.perf_counter()
            tokens_before = policy.generated_tokens if isinstance(policy, CountsTokens) else None
            max_turns, max_new_tokens = cfg.eval.limits_for(b.key)
            k, temperature = sampling[b.key]
            if isinstance(policy, HasTokenBudget):  # a model's per-turn budget; the scripted policies have none
                policy.max_new_tokens = max_new_tokens
            if isinstance(policy, HasTemperature):  # a model's sampling; the scripted policies have none
                policy.temperature = temperature
            if isinstance(policy, HFPolicy):
                # each benchmark's episodes draw from streams of their own seed (HFPolicy.episode_seed): its samples
                # are the same whether it is scored alone or after others, whole or in shards
                policy.set_sampling_seed(benchmark_seed(cfg.seed, b.key))
            summary, records = evaluate_benchmark(
                policy, b, envs[b.env], sizes[b.key], k, max_turns, task_seed=cfg.worlds.seed,
                batch_size=max(cfg.eval.batch_size, 1) * 4, progress=bar.update, tasks=tasks[b.key],
            )
            per_bench_seconds[b.key] = round(time.perf_counter() - tb, 2)
            if tokens_before is not None:
                tokens_by[b.key] = policy.generated_tokens - tokens_before
            results[b.key] = summary
            write_jsonl(out / "records" / f"{b.key}.jsonl", records)
            bar.stats.clear()  # the line shows the last benchmark's score
            bar.update(0, **{b.key: round(summary["score"], 1)})
    metrics = evaluation_metrics(cfg, model, suites, sampling, results, time.perf_counter() - t0, per_bench_seconds,
                                 limits, policy.generated_tokens if isinstance(policy, CountsTokens) else None,
                                 policy.generate_seconds if isinstance(policy, TimesGeneration) else 0.0)
    if tokens_by:
        metrics["generated_tokens_by_benchmark"] = tokens_by
    if shard is not None:
        metrics["shard"] = list(shard)
    write_json(out / "metrics.json", metrics)
    return metrics


def evaluation_metrics(cfg: Config, model, suites, sampling, results: dict[str, dict], elapsed: float,
                       per_bench_seconds: dict, limits: dict, generated_tokens, generate_seconds: float) -> dict:
    """``metrics.json`` from the benchmarks' summaries (``summarize_records``)."""
    k_by = {key: r["k"] for key, r in results.items()}
    return {
        "scores": {key: round(r["score"], 2) for key, r in results.items()},
        # standard error of each score clustered by task, in points (acl_lib.noise); None for a benchmark without tasks
        "se": {key: round(r["se"], 2) if r.get("se") is not None else None for key, r in results.items()},
        "mean_reward": {key: round(r["mean_reward"], 4) for key, r in results.items()},
        "n_tasks": {key: r["n_tasks"] for key, r in results.items()},
        # Benchmarks pooling several datasets (single_hop, multi_hop on real data): each dataset's score and their
        # unweighted mean, as the study reports them; "scores" keeps the pooled pass rate.
        "scores_by_dataset": {key: {d: round(v, 2) for d, v in r["by_dataset"].items()}
                              for key, r in results.items() if "by_dataset" in r},
        "dataset_mean_scores": {key: round(r["dataset_mean"], 2) for key, r in results.items() if "by_dataset" in r},
        "failures": {key: r["failures"] for key, r in results.items()},
        # one number when every benchmark has the same k (what readers of a single k expect), else {benchmark: k}
        "k": next(iter(set(k_by.values()))) if len(set(k_by.values())) == 1 else k_by,
        "k_by_benchmark": k_by,
        "temperature": {key: sampling[key][1] for key in results},
        "model": str(model),
        "profile": cfg.profile,
        "seed": cfg.seed,
        "suites": suites,
        "elapsed_s": round(elapsed, 2),
        "seconds_per_benchmark": per_bench_seconds,
        "limits": limits,
        "generated_tokens": generated_tokens,
        "generate_seconds": round(generate_seconds, 2),
    }


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2))


def write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def default_out_dir(model: str, output_dir: str | os.PathLike = "outputs", now: float | None = None) -> Path:
    """Where ``acl eval`` writes without ``--out``: ``<output_dir>/eval/<name>-<UTC time>/``, outside every run
    of the run store (``outputs/<profile>/seed<k>/``), so scoring a run's checkpoint never touches that run.

    ``<name>`` is the run for a checkpoint ``<run>/model`` (``seq_math``), else the last path component
    (``Qwen3-8B-Base``, ``expert``). A relative ``output_dir`` is taken from the project root, as the run
    store's. A name already taken (two evaluations in one second) gets ``-2``, ``-3``, ..."""
    from datetime import datetime

    p = Path(str(model).rstrip("/"))
    name = p.parent.name if p.name == "model" and p.parent.name else p.name
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y%m%dT%H%M%SZ")
    root = project_root() / output_dir / "eval"
    out = root / f"{name or 'model'}-{stamp}"
    n = 2
    while out.exists():
        out, n = root / f"{name or 'model'}-{stamp}-{n}", n + 1
    return out


# What an ``acl eval`` output directory holds; one holding anything else is not replaced.
EVAL_OUTPUTS = {"metrics.json", "records", "eval_config.yaml"}


def run_dir_holding(path: str | os.PathLike) -> Path | None:
    """The run directory of the run store that ``path`` is, or is inside, or None. A run directory holds a
    marker (COMPLETE.json, RUNNING.json, FAILED.json) or the config.yaml a run writes (``# run <name>: ...``)."""
    p = Path(path).expanduser().resolve()
    for d in (p, *p.parents):
        if any((d / m).is_file() for m in (COMPLETE, RUNNING, FAILED)):
            return d
        try:
            with open(d / CONFIG) as f:
                if f.read(6) == "# run ":
                    return d
        except OSError:
            pass
    return None


def model_dir_problem(model: str) -> str | None:
    """Why ``model`` cannot be a checkpoint to load, or None (a local directory that looks like a checkpoint,
    ``expert`` / ``null``, or what can only be a hub id; loading decides the rest)."""
    if model in ("expert", "null"):
        return None
    p = Path(model).expanduser()
    if p.exists():
        if not p.is_dir():
            return f"--model {model}: a file, not a checkpoint directory"
        missing = []
        if not (p / "config.json").is_file():
            missing.append("config.json")
        if not any((p / w).is_file() for w in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                                                "pytorch_model.bin.index.json")):
            missing.append("weights (model.safetensors)")
        if not any((p / t).is_file() for t in ("tokenizer.json", "tokenizer_config.json")):
            missing.append("a tokenizer (tokenizer.json)")
        if missing:
            return (f"--model {model}: not a checkpoint directory (no {', '.join(missing)}); a checkpoint is a "
                    f"directory written by save_pretrained, e.g. outputs/<profile>/seed<k>/<run>/model")
        return None
    parts = p.parts
    hub_id = (len(parts) == 2 and not str(model).startswith((".", "/", "~")) and not Path(parts[0]).exists()
              and all(c.isalnum() or c in "-_." for c in "".join(parts)))
    if hub_id:
        return None
    return f"--model {model}: no such directory (give a checkpoint directory, a hub id, 'expert' or 'null')"


def out_dir_problem(out: Path) -> str | None:
    """Why ``acl eval`` must not write its results to ``out``, or None."""
    run = run_dir_holding(out)
    if run is not None:
        return (f"--out {out} is inside the run directory {run} of the run store. An evaluation written there "
                f"would overwrite or mix with that run's own results while its markers still call it complete. "
                f"Leave out --out (results go to outputs/eval/<name>-<time>/) or give a directory outside the "
                f"run store.")
    for d in (out, *out.parents):
        if d.exists():
            if not d.is_dir():
                return f"--out {out}: {d} is a file, not a directory"
            break
    try:  # the results are first written beside ``out``: that must work before any scoring starts
        import tempfile

        out.parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(prefix=".tmp-probe-", dir=out.parent).cleanup()
    except OSError as exc:
        return f"--out {out}: cannot write in {out.parent} ({exc.strerror or exc})"
    if out.is_dir():
        extra = sorted(p.name for p in out.iterdir() if p.name not in EVAL_OUTPUTS and not p.name.startswith(".tmp-"))
        if extra:
            return (f"--out {out} already holds other files ({', '.join(extra[:5])}); acl eval replaces its output "
                    f"directory as a whole (records and metrics together), so give a new directory or the output of "
                    f"an earlier acl eval")
    return None


def format_scores(metrics: dict) -> str:
    """The scores as ``acl eval`` prints them: score, its standard error (clustered by task), tasks, samples per
    task."""
    lines = [f"{'benchmark':<12} {'score':>7} {'± se':>6}  {'n':>4}  k"]
    for key, score in metrics["scores"].items():
        n = metrics["n_tasks"][key]
        k = samples_per_task(metrics, key)
        se = (metrics.get("se") or {}).get(key)
        se = f"{se:.1f}" if se is not None else "-"
        lines.append(f"{key:<12} {score:>7.1f} {se:>6}  {n:>4}  {k}")
    return "\n".join(lines)
