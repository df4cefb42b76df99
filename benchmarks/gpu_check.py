"""GPU check of the paper profile's training paths, in one command that fits in 10 minutes on one H200.

    python benchmarks/gpu_check.py                       # on a GPU: a ~1.7B Qwen3, bf16, activation checkpointing
    python benchmarks/gpu_check.py --size smoke          # anywhere (make test runs it on CPU)
    python benchmarks/gpu_check.py --json outputs/benchmarks/gpu_check.json

What it does, with nothing downloaded:

1. Builds a Qwen3-architecture model from its config with random weights: at ``--size 1.7b`` Qwen3-1.7B's shape
   (28 layers, hidden 2048, 16 heads / 8 KV heads of 128, MLP 6144, vocabulary 151,936, tied embeddings;
   ~1.7B parameters), at ``--size smoke`` a tiny one. The shipped mini base's tokenizer and chat template drive it
   (its 2,048 ids; ids the model samples beyond them decode to nothing, which only shortens a random model's text).
2. One multi-turn GRPO step on the mini search world (tool calls and their results in the rollouts) with the HF
   generation backend, bf16 and activation checkpointing on a GPU: ``acl_lib.train.grpo.train_grpo``, the stages'
   own code.
3. One MMOPD step with two teachers (copies of the same random model) on math and search prompts through the
   chunked divergence: ``acl_lib.consolidate.mmopd.train_mmopd``.
4. For each phase: wall seconds, peak accelerator memory (``torch.cuda.max_memory_allocated``; CPU: the process's
   peak RSS), generated tokens per second from the trainer's log, and the memory plan's prediction for it
   (16 bytes per trained parameter for weights, gradients and Adam states; MMOPD: ``mmopd.memory_plan`` on one
   GPU, its divergence and teachers included), printed and written as JSON.

The predictions leave out activations, KV caches and the allocator's slack, so measured above predicted by a few
GiB is expected; measured below is a plan that over-counts. Put the figures in ``docs/paper-checklist.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {
    # Qwen3-1.7B's config (hidden 2048, 28 layers, 16 heads of 128, 8 KV heads, MLP 6144, vocab 151,936, tied)
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151_936),
    "smoke": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=4096),
}


def build_random_model(size: str, out: Path, dtype: str) -> tuple[Path, int]:
    """A Qwen3-architecture checkpoint of ``SIZES[size]`` with random weights and the mini base's tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(ROOT / "acl_lib" / "data" / "mini_base")
    shape = SIZES[size]
    config = Qwen3Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    return out, n


def check_config(size: str, out: Path, on_gpu: bool):
    """The smoke profile with the paper profile's training precision and memory settings where a GPU is there."""
    from acl_lib.config import load_config

    small = size == "smoke"
    over = {
        "output_dir": str(out / "outputs"), "torch_threads": 0 if on_gpu else 2,
        "model.dtype": "bfloat16" if on_gpu else "float32",
        "launcher.mixed_precision": "bf16" if on_gpu else "no",
        "launcher.activation_checkpointing": on_gpu,
        "worlds.n_train": 16,
        "grpo.max_steps": 1, "grpo.batch_size": 8 if small else 16, "grpo.num_generations": 4,
        "grpo.max_new_tokens": 24 if small else 128, "grpo.max_turns": 3,
        "grpo.max_episode_tokens": 256 if small else 2048, "grpo.max_completion_length": 24 if small else 512,
        "grpo.micro_batch_size": 0 if small else 4,
        "mmopd.max_steps": 1, "mmopd.batch_size": 4 if small else 8, "mmopd.n_prompts": 4,
        "mmopd.chunk_tokens": 64 if small else 1024, "mmopd.teacher_placement": "resident",
    }
    return load_config("smoke", overrides=over)


class Phase:
    """Wall time and peak memory of one phase (GPU: max_memory_allocated, reset at the start; CPU: peak RSS)."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        import torch

        self.gpu = torch.cuda.is_available()
        if self.gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import torch

        self.seconds = time.perf_counter() - self.t0
        if self.gpu:
            self.peak_gib = torch.cuda.max_memory_allocated() / 2**30
        else:  # ru_maxrss: kilobytes on Linux; the process's peak so far, not this phase's alone
            self.peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        return False


def _tokens_per_s(train_log: Path) -> float | None:
    rows = [json.loads(line) for line in train_log.read_text().splitlines()] if train_log.is_file() else []
    vals = [r["gen_tokens_per_s"] for r in rows if r.get("gen_tokens_per_s")]
    return round(sum(vals) / len(vals), 1) if vals else None


def main(argv: list[str] | None = None) -> dict:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default=None, help="default: 1.7b on a GPU, smoke elsewhere")
    ap.add_argument("--json", default="outputs/benchmarks/gpu_check.json")
    ap.add_argument("--workdir", default=None, help="where the random checkpoints go (default: a temporary dir)")
    args = ap.parse_args(argv)
    on_gpu = torch.cuda.is_available()
    size = args.size or ("1.7b" if on_gpu else "smoke")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="acl-gpu-check-"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from acl_lib.consolidate import mmopd
    from acl_lib.train import grpo

    cfg = check_config(size, work, on_gpu)
    report = {"size": size, "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
              "torch": torch.__version__, "dtype": cfg.model.dtype,
              "activation_checkpointing": cfg.launcher.activation_checkpointing, "phases": {}}
    with Phase("build") as ph:
        model_dir, n_params = build_random_model(size, work / "model", cfg.model.dtype)
    report["parameters"] = n_params
    report["phases"]["build"] = {"seconds": round(ph.seconds, 1)}
    print(f"gpu_check: {size} Qwen3, {n_params / 1e9:.2f}B parameters, {report['device']}", flush=True)

    states = 16 * n_params / 2**30  # bf16 weights and gradients, fp32 master weights and Adam moments
    with Phase("grpo") as ph:
        grpo.train_grpo(cfg, model_dir, "search", work / "grpo")
    report["phases"]["grpo"] = {"seconds": round(ph.seconds, 1), "peak_gib": round(ph.peak_gib, 2),
                                "predicted_gib": round(states, 2),
                                "gen_tokens_per_s": _tokens_per_s(work / "grpo" / "train_log.jsonl")}

    conf = json.loads((model_dir / "config.json").read_text())
    plan = mmopd.memory_plan(cfg.model_copy(update={"launcher": cfg.launcher.model_copy(
        update={"num_nodes": 1, "num_processes": 1})}), n_params, 2, conf["vocab_size"], conf["hidden_size"])
    with Phase("mmopd") as ph:
        mmopd.train_mmopd(cfg, work / "mmopd", str(model_dir), {"t_math": str(model_dir), "t_search": str(model_dir)},
                          {"math": "t_math", "search": "t_search"}, {"math": 1.0, "search": 1.0}, alpha=1.0)
    report["phases"]["mmopd"] = {"seconds": round(ph.seconds, 1), "peak_gib": round(ph.peak_gib, 2),
                                 "predicted_gib": round(plan["total_gib_per_gpu"], 2),
                                 "predicted": {k: round(v, 2) for k, v in plan.items() if k.endswith("_gib_per_gpu")},
                                 "gen_tokens_per_s": _tokens_per_s(work / "mmopd" / "train_log.jsonl")}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for name, ph in report["phases"].items():
        line = f"  {name:6s} {ph['seconds']:7.1f} s"
        if "peak_gib" in ph:
            where = "GPU" if on_gpu else "RSS"
            line += (f"  peak {ph['peak_gib']:.2f} GiB ({where}), plan {ph['predicted_gib']:.2f} GiB"
                     f"  gen {ph['gen_tokens_per_s']} tokens/s")
        print(line, flush=True)
    print(f"gpu_check: written {out}", flush=True)
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
