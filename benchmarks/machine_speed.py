"""How fast this machine runs the mini model: a reference to read the suite's timings against.

    python benchmarks/machine_speed.py [--threads 1 2] [--repeats 3] [--json]

The wall-clock budgets of the mini profile (one seed's notebooks in 60 min, three seeds in 3 h) are measured on a
2-core machine, and two machines of that description can differ by a third (the math stage's GRPO step at two
threads: 1.5 s on one, 2.0 s on another; docs/mini-calibration.md). This runs
one fixed piece of the mini profile's work on the shipped base, ``acl_lib/data/mini_base``: five AdamW steps on
32 random rows of 200 tokens (forward, backward, step), then 30 greedy tokens for the same 32 rows, at each thread
count, and prints the best of ``--repeats`` seconds. docs/mini-calibration.md gives this number beside every
timing measured since it exists, so that a timing from another machine can be scaled before it is compared.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import acl_lib  # noqa: F401  (imported before torch: it pins the CPU kernels every run of the suite uses)

BASE = Path(__file__).resolve().parents[1] / "acl_lib" / "data" / "mini_base"


def reference_work(threads: int) -> float:
    """Seconds for the reference work at ``threads`` torch threads (the model loaded before the clock starts)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(BASE), dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(10, model.config.vocab_size, (32, 200), generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    for _ in range(5):
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        model.generate(input_ids=x[:, :40], attention_mask=torch.ones_like(x[:, :40]), max_new_tokens=30,
                       min_new_tokens=30, do_sample=False, pad_token_id=model.config.pad_token_id)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help='end with one line {"<threads>": seconds, ...}')
    args = ap.parse_args(argv)
    best = {}
    for threads in args.threads:
        best[str(threads)] = round(min(reference_work(threads) for _ in range(args.repeats)), 2)
        print(f"{threads} thread(s): {best[str(threads)]:.2f} s (best of {args.repeats})", flush=True)
    if args.json:
        print(json.dumps(best), flush=True)


if __name__ == "__main__":
    main()
