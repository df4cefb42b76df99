"""One evaluation harness for every checkpoint: in-domain and OOD suites, multi-turn episodes, avg@k.

    acl eval --model outputs/mini/seed0/seq_math/model --profile mini [--suites all] [--k 4]

or, from Python, ``evaluate(cfg, model="...", out_dir=...)``. A *policy* turns a batch of
(task, conversation-so-far) into assistant texts: a HF model (batched ``generate`` on CPU), a vLLM engine
(the ``paper`` profile), the scripted experts (``--model expert``) or a do-nothing policy
(``--model null``), all run through the same episodes.

``acl eval`` writes to a directory of its own (``outputs/eval/<name>-<UTC time>/`` unless ``--out`` says
otherwise), never into a run of the run store (refused), and all at once: records and metrics are written
into a temporary directory that is renamed into place. The pipeline's evaluations are runs of their own,
``<run>/eval/`` (``acl_lib.pipeline.eval_run``).

Outputs in ``out_dir``:
- ``metrics.json``: ``{"scores": {benchmark: percent}, "mean_reward": {...}, "n_tasks": {...}, ...}``.
  A benchmark's score is the percentage of episodes with reward 1 (pass rate; for IFEval this is
  prompt-level strict accuracy), averaged over k samples per task (avg@k).
- ``records/<benchmark>.jsonl``: one line per episode with the transcript and the failure reason.
- ``eval_config.yaml`` (``acl eval`` only): the resolved config it ran with.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Protocol, Sequence

from acl_lib.envs import BENCHMARKS, Benchmark, benchmarks_for, make_env, scripted_expert
from acl_lib.envs.base import Episode, Task
from acl_lib.atomic import atomic_write_text

log = logging.getLogger(__name__)

PASS_EPS = 1e-9


class Policy(Protocol):
    """Maps a batch of (task, messages so far) to the next assistant texts (raw, as generated)."""

    def __call__(self, batch: Sequence[tuple[Task, list[dict]]]) -> list[str]: ...


# --- policies ---------------------------------------------------------------------------------------


class ExpertPolicy:
    """The scripted experts of every world, behind the policy interface."""

    name = "expert"

    def __call__(self, batch):
        return [scripted_expert(task.domain)(task, messages) for task, messages in batch]


class NullPolicy:
    """A policy that does nothing (empty turns): the floor every benchmark should score about 0 on."""

    name = "null"

    def __call__(self, batch):
        return ["" for _ in batch]


class HFPolicy:
    """Batched HF ``generate`` with the tokenizer's chat template (CPU or one GPU), each episode's KV cache kept
    across its turns (``acl_lib.eval.turns``): a turn encodes only what is new since the episode's last turn.
    ``reuse_kv=False`` re-encodes every prompt whole (the reference the cached path is tested against).

    Prompts longer than the model's context minus ``max_new_tokens`` are not generated: the episode ends
    with a "context limit" failure (``context_overflow`` marks them with ``None``).
    """

    def __init__(self, model_dir: str, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 batch_size: int = 16, dtype: str = "float32", reuse_kv: bool = True):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from acl_lib.eval.turns import TurnGenerator

        self.name = str(model_dir)
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.tok.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self.model.eval()
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.batch_size = batch_size
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        self.generated_tokens = 0
        self.generate_seconds = 0.0
        self.gen = TurnGenerator(self.model, self.tok.pad_token_id, self.tok.eos_token_id, batch_size, reuse=reuse_kv)

    @property
    def stats(self) -> dict:
        """What generation cost (``TurnGenerator.stats``; benchmarks/throughput.py)."""
        return self.gen.stats

    @staticmethod
    def _key(task: Task, messages: list[dict]):
        return (id(messages), task.id)  # the episode's own message list: stable across its turns

    def forget(self, task: Task, messages: list[dict]) -> None:
        """The episode has ended: drop its cache."""
        self.gen.forget(self._key(task, messages))

    def render(self, task: Task, messages: list[dict]) -> str:
        return self.tok.apply_chat_template(
            messages, tools=task.tools or None, add_generation_prompt=True, tokenize=False
        )

    def __call__(self, batch):
        prompts = [self.render(t, m) for t, m in batch]
        ids = [self.tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        out: list[str | None] = [None] * len(batch)
        limit = self.max_context - self.max_new_tokens
        fits = [i for i in range(len(batch)) if len(ids[i]) <= limit]
        sample = self.temperature > 0
        sampling = {"do_sample": sample, "top_k": None}
        if sample:
            sampling.update(temperature=self.temperature, top_p=self.top_p)
        t0 = time.perf_counter()
        news = self.gen.generate([(self._key(*batch[i]), ids[i]) for i in fits], self.max_new_tokens, **sampling)
        self.generate_seconds += time.perf_counter() - t0
        eos = self.tok.eos_token_id
        for i, toks in zip(fits, news):
            if eos in toks:
                toks = toks[: toks.index(eos)]
            self.generated_tokens += len(toks)
            out[i] = self.tok.decode(toks, skip_special_tokens=True)
        return out


class VLLMPolicy(HFPolicy):
    """vLLM generation (the ``paper`` profile). vLLM is in the ``gpu`` extra; it does not install on CPU."""

    def __init__(self, model_dir: str, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 batch_size: int = 256, dtype: str = "bfloat16"):
        try:
            from vllm import LLM, SamplingParams
        except ImportError as exc:  # pragma: no cover - GPU machines only
            raise RuntimeError("eval.backend=vllm needs vLLM: install the suite with the 'gpu' extra") from exc
        from transformers import AutoTokenizer

        self.name = str(model_dir)
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.llm = LLM(model=model_dir, dtype=dtype)
        self.params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        self.params_for = lambda n: SamplingParams(max_tokens=n, temperature=temperature, top_p=top_p)
        self.max_new_tokens = max_new_tokens
        self.max_context = self.llm.llm_engine.model_config.max_model_len
        self.generated_tokens = 0
        self.generate_seconds = 0.0

    def forget(self, task, messages) -> None:
        """Nothing to drop: vLLM's prefix cache manages itself."""

    def __call__(self, batch):  # pragma: no cover - GPU machines only
        prompts = [self.render(t, m) for t, m in batch]
        t0 = time.perf_counter()
        if self.params.max_tokens != self.max_new_tokens:  # evaluate() sets a benchmark's own budget
            self.params = self.params_for(self.max_new_tokens)
        outs = self.llm.generate(prompts, self.params, use_tqdm=False)
        self.generate_seconds += time.perf_counter() - t0
        texts = []
        for o in outs:
            self.generated_tokens += len(o.outputs[0].token_ids)
            texts.append(o.outputs[0].text)
        return texts


def make_policy(model: str, cfg) -> Policy:
    """``expert`` / ``null`` or a checkpoint directory / hub id, with the profile's sampling settings."""
    if model == "expert":
        return ExpertPolicy()
    if model == "null":
        return NullPolicy()
    cls = VLLMPolicy if cfg.eval.backend == "vllm" else HFPolicy
    return cls(model, cfg.eval.max_new_tokens, cfg.eval.temperature, cfg.eval.top_p, cfg.eval.batch_size,
               dtype=cfg.model.dtype)


# --- episodes ---------------------------------------------------------------------------------------


def run_episodes(policy: Policy, episodes: list[Episode], batch_size: int = 64,
                 progress: Callable[[int], None] | None = None) -> None:
    """Drive every episode to its end, one assistant turn per round for all active episodes."""
    while True:
        active = [e for e in episodes if not e.done]
        if not active:
            return
        for start in range(0, len(active), batch_size):
            chunk = active[start : start + batch_size]
            texts = policy([(e.task, e.messages) for e in chunk])
            for ep, text in zip(chunk, texts):
                if text is None:
                    ep.end("context limit: prompt longer than the model's context")
                else:
                    ep.step(text)
                if ep.done:
                    if hasattr(policy, "forget"):
                        policy.forget(ep.task, ep.messages)
                    if progress:
                        progress(1)


def _failure_key(reason: str | None) -> str:
    return (reason or "").split(":")[0].strip()[:80]


def world(cfg, env_name: str):
    """The environment a benchmark runs in: built from ``cfg.worlds`` with the world seed ``cfg.worlds.seed``,
    the very world training builds (``acl_lib.train.trl_env.make_env``), whatever the training seed."""
    return make_env(env_name, cfg.worlds, seed=cfg.worlds.seed)


def evaluate_benchmark(policy: Policy, bench: Benchmark, env, n: int, k: int, max_turns: int,
                       task_seed: int = 0, batch_size: int = 64, progress=None) -> tuple[dict, list[dict]]:
    """Score one benchmark: ``n`` tasks x ``k`` samples. Returns (summary, per-episode records)."""
    tasks = env.tasks(bench.split, n, seed=task_seed)
    episodes = [env.start(t, max_turns=max_turns) for t in tasks for _ in range(k)]
    run_episodes(policy, episodes, batch_size=batch_size, progress=progress)
    records = []
    for i, ep in enumerate(episodes):
        rec = ep.record()
        rec["sample"] = i % k
        records.append(rec)
    rewards = [r["reward"] for r in records]
    passed = [r >= 1.0 - PASS_EPS for r in rewards]
    summary = {
        "score": 100.0 * sum(passed) / max(1, len(passed)),
        "mean_reward": sum(rewards) / max(1, len(rewards)),
        "n_tasks": len(tasks),
        "k": k,
        "failures": dict(Counter(_failure_key(r["failure"]) for r in records if r["failure"]).most_common(8)),
    }
    return summary, records


def evaluate(cfg, model: str, out_dir: str | os.PathLike, suites: str | None = None, k: int | None = None,
             policy: Policy | None = None, benchmarks: list[str] | None = None) -> dict:
    """Evaluate ``model`` (a checkpoint dir, ``expert`` or ``null``) on the suite; write metrics + records.

    Tasks are drawn with the world seed ``cfg.worlds.seed`` (the same benchmark for every training seed).
    """
    from acl_lib.progress import Progress

    suites = suites or cfg.eval.suites
    if k is not None and k < 1:
        raise ValueError(f"k must be at least 1 (samples per task), got {k}")
    k = k or cfg.eval.k
    if k > 1 and cfg.eval.temperature == 0:
        log.warning("k=%d with temperature 0 repeats the same greedy sample; using k=1", k)
        k = 1
    benches = [BENCHMARKS[b] for b in benchmarks] if benchmarks else benchmarks_for(suites)
    if policy is None and model not in ("expert", "null"):
        from acl_lib.seeding import seed_and_threads

        # The same samples whatever ran before in this process (a notebook trains first, then evaluates).
        seed_and_threads(cfg.seed, cfg.torch_threads)
    policy = policy or make_policy(model, cfg)
    out = Path(out_dir)
    (out / "records").mkdir(parents=True, exist_ok=True)
    envs: dict[str, object] = {}
    t0 = time.perf_counter()
    results: dict[str, dict] = {}
    per_bench_seconds = {}
    limits = {b.key: dict(zip(("max_turns", "max_new_tokens"), cfg.eval.limits_for(b.key))) for b in benches}
    sizes = {b.key: (cfg.worlds.n_test if b.suite == "in_domain" else cfg.worlds.n_ood) for b in benches}
    with Progress(sum(sizes[b.key] * k for b in benches), "eval", unit="episode") as bar:
        for b in benches:
            tb = time.perf_counter()
            if b.env not in envs:
                envs[b.env] = world(cfg, b.env)
            max_turns, max_new_tokens = cfg.eval.limits_for(b.key)
            if hasattr(policy, "max_new_tokens"):  # a model's per-turn budget; the scripted policies have none
                policy.max_new_tokens = max_new_tokens
            summary, records = evaluate_benchmark(
                policy, b, envs[b.env], sizes[b.key], k, max_turns, task_seed=cfg.worlds.seed,
                batch_size=max(cfg.eval.batch_size, 1) * 4, progress=bar.update,
            )
            per_bench_seconds[b.key] = round(time.perf_counter() - tb, 2)
            results[b.key] = summary
            _write_jsonl(out / "records" / f"{b.key}.jsonl", records)
            bar.stats.clear()  # the line shows the last benchmark's score
            bar.update(0, **{b.key: round(summary["score"], 1)})
    elapsed = time.perf_counter() - t0
    metrics = {
        "scores": {key: round(r["score"], 2) for key, r in results.items()},
        "mean_reward": {key: round(r["mean_reward"], 4) for key, r in results.items()},
        "n_tasks": {key: r["n_tasks"] for key, r in results.items()},
        "failures": {key: r["failures"] for key, r in results.items()},
        "k": k,
        "model": str(model),
        "profile": cfg.profile,
        "seed": cfg.seed,
        "suites": suites,
        "elapsed_s": round(elapsed, 2),
        "seconds_per_benchmark": per_bench_seconds,
        "limits": limits,
        "generated_tokens": getattr(policy, "generated_tokens", None),
        "generate_seconds": round(getattr(policy, "generate_seconds", 0.0), 2),
    }
    _atomic_write_json(out / "metrics.json", metrics)
    return metrics


def _atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2))


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def default_out_dir(model: str, output_dir: str | os.PathLike = "outputs", now: float | None = None) -> Path:
    """Where ``acl eval`` writes without ``--out``: ``<output_dir>/eval/<name>-<UTC time>/``, outside every run
    of the run store (``outputs/<profile>/seed<k>/``), so scoring a run's checkpoint never touches that run.

    ``<name>`` is the run for a checkpoint ``<run>/model`` (``seq_math``), else the last path component
    (``Qwen3-8B-Base``, ``expert``). A relative ``output_dir`` is taken from the project root, as the run
    store's. A name already taken (two evaluations in one second) gets ``-2``, ``-3``, ..."""
    from datetime import datetime, timezone

    from acl_lib.config import project_root

    p = Path(str(model).rstrip("/"))
    name = p.parent.name if p.name == "model" and p.parent.name else p.name
    stamp = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
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
    from acl_lib.runs import COMPLETE, CONFIG, FAILED, RUNNING

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


def _is_model_dir_problem(model: str) -> str | None:
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


def _out_problem(out: Path) -> str | None:
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
    lines = [f"{'benchmark':<12} {'score':>7}  n"]
    for key, score in metrics["scores"].items():
        lines.append(f"{key:<12} {score:>7.1f}  {metrics['n_tasks'][key]}")
    return "\n".join(lines)


def cli_main(args) -> int:
    """``acl eval``: args has model, profile, suites, k, out, overrides (``--set``), seed.

    Every check that can fail on the arguments (config, --k, --model, --out) runs before any scoring and exits
    with code 2 and a one-paragraph message. The results (``metrics.json``, ``records/``, ``eval_config.yaml``)
    are written into a temporary directory beside ``out`` and renamed into place when complete, so ``out``
    never mixes the records of one evaluation with the metrics of another.
    """
    import yaml

    from acl_lib.atomic import atomic_dir
    from acl_lib.cli import EXIT_USAGE, _err, _load

    def usage(msg: str) -> None:
        _err(msg)
        raise SystemExit(EXIT_USAGE)

    if args.k is not None and args.k < 1:
        usage(f"--k must be at least 1 (samples per task), got {args.k}")
    cfg = _load(args.profile, getattr(args, "overrides", None) or [], getattr(args, "seed", None))
    problem = _is_model_dir_problem(args.model)
    if problem:
        usage(problem)
    out = Path(args.out).expanduser() if getattr(args, "out", None) else default_out_dir(args.model, cfg.output_dir)
    problem = _out_problem(out)
    if problem:
        usage(problem)

    policy = None
    if args.model not in ("expert", "null"):
        from acl_lib.seeding import seed_and_threads

        # as evaluate() does for a model it loads itself: the same samples whatever ran before
        seed_and_threads(cfg.seed, cfg.torch_threads)
        try:
            policy = make_policy(args.model, cfg)
        except Exception as exc:  # noqa: BLE001 - a bad checkpoint is a usage error, reported in one paragraph
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            usage(f"--model {args.model}: cannot load it as a checkpoint ({type(exc).__name__}: {first})")
    with atomic_dir(out) as tmp:
        mask = os.umask(0)
        os.umask(mask)
        tmp.chmod(0o777 & ~mask)  # a temporary directory is private; the results are not
        metrics = evaluate(cfg, args.model, tmp, suites=args.suites, k=args.k, policy=policy)
        (tmp / "eval_config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    print(format_scores(metrics))
    print(f"metrics: {out / 'metrics.json'}  records: {out / 'records'}  ({metrics['elapsed_s']:.1f} s)")
    return 0
