"""One evaluation in processes of its own: in a fresh Python process, or split into shards run at once.

``evaluate_in_subprocess`` runs ``evaluate`` in a child process (``launcher.eval_subprocess``, the paper profile),
so whatever the model or vLLM engine held on the GPU goes with it; ``evaluate_sharded`` splits one evaluation over
``eval.shards`` children, one per GPU where there are GPUs, and scores their records as one evaluation. Each child
is ``python -m acl_lib.eval.sharding --job JOB.json`` (``_worker_main``), started by ``_run_children``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from acl_lib.config import Config, project_root
from acl_lib.eval.harness import (
    evaluate,
    evaluation_metrics,
    evaluation_plan,
    summarize_records,
    write_json,
    write_jsonl,
)

log = logging.getLogger(__name__)


def evaluate_in_subprocess(cfg: Config, model: str, out_dir: str | os.PathLike, suites: str | None = None,
                           k: int | None = None, benchmarks: list[str] | None = None) -> dict:
    """``evaluate`` in a fresh Python process (``launcher.eval_subprocess``, the paper profile): whatever the
    model or vLLM engine held on the GPU (weights, KV cache, CUDA context, vLLM's workers) is gone when the
    process ends, so a notebook that scores checkpoint after checkpoint never accumulates them. Same config, same
    seeds, same outputs in ``out_dir`` as in-process; the child's output (its progress line) is passed through.
    """
    if cfg.eval.shards > 1:
        return evaluate_sharded(cfg, model, out_dir, suites=suites, k=k, benchmarks=benchmarks)
    spec = {"config": cfg.to_dict(), "model": str(model), "out_dir": str(Path(out_dir).resolve()), "suites": suites,
            "k": k, "benchmarks": benchmarks}
    _run_children(spec, [None], what=f"evaluation of {model} in a subprocess")
    return json.loads((Path(out_dir) / "metrics.json").read_text())


def _run_children(spec: dict, shards: list[tuple[int, int] | None], what: str) -> None:
    """Run ``python -m acl_lib.eval.sharding --job`` once per entry of ``shards`` (None: the whole evaluation), all
    at once, each child on its own GPU where there are GPUs (``CUDA_VISIBLE_DEVICES``: the shard's index); their
    output is passed through (prefixed with the shard where several run). Raises naming the first that failed."""
    import subprocess
    import sys
    import tempfile
    import threading

    fd, job = tempfile.mkstemp(prefix="acl-eval-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f)
    base_env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the child imports this checkout even when not installed
    base_env["PYTHONPATH"] = root + (os.pathsep + base_env["PYTHONPATH"] if base_env.get("PYTHONPATH") else "")
    gpus = visible_gpus()
    procs, tails, lock = [], [], threading.Lock()

    def pump(proc, tail: list[str], prefix: str) -> None:
        for line in proc.stdout:
            with lock:
                sys.stdout.write(prefix + line)
            if line.strip():
                log.info("[eval %s] %s", prefix.strip() or "subprocess", line.rstrip())  # the run's log keeps them
            tail[:] = (tail + [line])[-40:]

    try:
        threads = []
        for shard in shards:
            env = dict(base_env)
            argv = [sys.executable, "-m", "acl_lib.eval.sharding", "--job", job]
            prefix = ""
            if shard is not None:
                argv += ["--shard", str(shard[0]), "--of", str(shard[1])]
                prefix = f"[shard {shard[0]}/{shard[1]}] "
                if gpus:
                    env["CUDA_VISIBLE_DEVICES"] = gpus[shard[0] % len(gpus)]
            proc = subprocess.Popen(argv, env=env, cwd=str(project_root()), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            tail: list[str] = []
            procs.append(proc)
            tails.append(tail)
            t = threading.Thread(target=pump, args=(proc, tail, prefix), daemon=True)
            t.start()
            threads.append(t)
        for proc, t in zip(procs, threads):
            proc.wait()
            t.join()
    finally:
        for proc in procs:  # an interrupt (Ctrl-C) or an error here: no child outlives the call
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        os.unlink(job)
    for proc, tail, shard in zip(procs, tails, shards):
        if proc.returncode != 0:
            where = f" (shard {shard[0]} of {shard[1]})" if shard else ""
            raise RuntimeError(f"{what}{where} failed (exit {proc.returncode}); its last lines:\n" + "".join(tail))


def visible_gpus() -> list[str]:
    """The GPU indices this process may hand to its children: ``CUDA_VISIBLE_DEVICES`` if set, else every GPU torch
    sees; empty on a machine without CUDA."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:  # pragma: no cover - torch is a dependency
        return []


def evaluate_sharded(cfg: Config, model: str, out_dir: str | os.PathLike, suites: str | None = None,
                     k: int | None = None, benchmarks: list[str] | None = None, shards: int | None = None,
                     policy_factory: str | None = None, factory_args: list | None = None) -> dict:
    """``evaluate`` split over ``shards`` processes (default ``eval.shards``), run at once, each on its own GPU
    where there are GPUs: shard i scores every n-th task of each benchmark from the i-th into
    ``<out_dir>/shards/<i>/``; the records are then put back in task order and scored as one evaluation
    (``summarize_records``), so ``metrics.json`` and ``records/`` have the unsharded layout. Greedy benchmarks give
    the unsharded scores; a sampled one draws its samples from a seed per shard. One evaluation of an 8B
    checkpoint on the full benchmarks thus uses every GPU of the node instead of one.

    ``policy_factory``: ``"module:function"``, called in each child as ``function(cfg, *factory_args)`` for the
    policy it scores with instead of ``model``'s checkpoint (a system that is not one checkpoint: MLE's backbone,
    adapters and router); a policy with a ``finish(out_dir)`` method is told its shard's directory at the end."""
    n = shards or cfg.eval.shards
    out = Path(out_dir)
    suites, benches, sampling = evaluation_plan(cfg, suites, k, benchmarks)
    t0 = time.perf_counter()
    spec = {"config": cfg.to_dict(), "model": str(model), "out_dir": str((out / "shards").resolve()),
            "suites": suites, "k": k, "benchmarks": [b.key for b in benches], "shard_dirs": True,
            "policy_factory": policy_factory, "factory_args": list(factory_args or [])}
    _run_children(spec, [(i, n) for i in range(n)], what=f"evaluation of {model}")
    parts = [json.loads((out / "shards" / str(i) / "metrics.json").read_text()) for i in range(n)]
    (out / "records").mkdir(parents=True, exist_ok=True)
    results, per_bench_seconds = {}, {}
    for b in benches:
        kb = sampling[b.key][0]
        shard_records = [_read_jsonl(out / "shards" / str(i) / "records" / f"{b.key}.jsonl") for i in range(n)]
        records = []
        for j in range(sum(p["n_tasks"][b.key] for p in parts)):  # task j was shard j % n's (j // n)-th
            i, at = j % n, j // n
            records += shard_records[i][at * kb:(at + 1) * kb]
        results[b.key] = summarize_records(records, len(records) // kb if kb else 0, kb)
        per_bench_seconds[b.key] = max(p["seconds_per_benchmark"][b.key] for p in parts)
        write_jsonl(out / "records" / f"{b.key}.jsonl", records)
    tokens = [p.get("generated_tokens") for p in parts]
    metrics = evaluation_metrics(cfg, model, suites, sampling, results, time.perf_counter() - t0, per_bench_seconds,
                                 {b.key: parts[0]["limits"][b.key] for b in benches},
                                 sum(tokens) if all(t is not None for t in tokens) else None,
                                 sum(p.get("generate_seconds", 0.0) for p in parts))
    metrics["shards"] = n
    write_json(out / "metrics.json", metrics)
    return metrics


def _read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _worker_main(argv: list[str] | None = None) -> None:
    """``python -m acl_lib.eval.sharding --job JOB.json``: the child of ``evaluate_in_subprocess``."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m acl_lib.eval.sharding")
    p.add_argument("--job", required=True, help="JSON written by evaluate_in_subprocess / evaluate_sharded")
    p.add_argument("--shard", type=int, default=None, help="this process's shard (evaluate_sharded)")
    p.add_argument("--of", type=int, default=None, help="the number of shards")
    args = p.parse_args(argv)
    spec = json.loads(Path(args.job).read_text())
    shard = (args.shard, args.of) if args.shard is not None else None
    out_dir = Path(spec["out_dir"]) / str(args.shard) if spec.get("shard_dirs") else spec["out_dir"]
    # The progress lines go to stderr, which the parent passes on (to the notebook cell and the run's log).
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    progress_log = logging.getLogger("acl.progress")
    progress_log.addHandler(handler)
    progress_log.setLevel(logging.INFO)
    cfg = Config.model_validate(spec["config"])
    policy = None
    if spec.get("policy_factory"):  # named, not imported: the factory may live in a layer above this one
        import importlib

        module, _, name = spec["policy_factory"].partition(":")
        policy = getattr(importlib.import_module(module), name)(cfg, *spec.get("factory_args", []))
    try:
        evaluate(cfg, spec["model"], out_dir, suites=spec["suites"], k=spec["k"], benchmarks=spec["benchmarks"],
                 shard=shard, policy=policy)
        if policy is not None and hasattr(policy, "finish"):
            policy.finish(out_dir)
    finally:
        if policy is not None and hasattr(policy, "close"):
            policy.close()


if __name__ == "__main__":
    _worker_main()
