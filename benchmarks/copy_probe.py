"""Can the profile's model learn to copy from its context within a step budget? (a diagnostic, not a test)

Every mini world asks the agent to copy something from its prompt: the operands of a math problem into its
worked steps, an entity name into a search query, an e-mail or an order id into a tool call. This script
trains a freshly initialised model of the profile's architecture (``cfg.model``; vocabulary replaced by
``--vocab`` random token ids) on three synthetic copy tasks and reports how far the loss falls towards the
loss of a model that copies perfectly:

    offset1    every token is repeated once (a a b b ...): needs a previous-token head
    offset9    segments of 8 random tokens, each repeated after a marker (fixed distance 9)
    induction  segments of 5-15 random tokens, each repeated after a marker (distance varies): needs an
               induction head (previous-token head + content match)

``copied`` = (no-copy loss - loss now) / (no-copy loss - perfect-copy loss): 0 for a model that predicts
the markers but guesses every repeated token, 1 for one that copies them all (noise can push it a little
outside [0, 1]). ``loss now`` is the mean of the last 20 steps.

    python benchmarks/copy_probe.py --profile mini --steps 400 --lr 3e-3 --tasks offset1,offset9,induction
    python benchmarks/copy_probe.py --tasks induction --set model.num_attention_heads=8 --set model.head_dim=24
"""

from __future__ import annotations

import argparse
import math
import random
import time


def make_batch(task: str, rng: random.Random, vocab: int, batch: int, length: int):
    import torch

    rows = []
    for _ in range(batch):
        seq: list[int] = []
        while len(seq) < length:
            if task == "offset1":
                seq += [t for t in (rng.randrange(10, vocab) for _ in range(8)) for _ in (0, 1)]
                continue
            n = 8 if task == "offset9" else rng.randint(5, 15)
            seg = [rng.randrange(10, vocab) for _ in range(n)]
            seq += [1] + seg + [2] + seg + [3]
        rows.append(seq[:length])
    return torch.tensor(rows)


def reference_losses(task: str, vocab: int) -> tuple[float, float]:
    """(no-copy, perfect-copy) mean loss per token: both predict the markers; the first guesses every
    token uniformly, the second copies every repeated one."""
    h = math.log(vocab - 10)
    if task == "offset1":
        return h, h / 2
    n = 8 if task == "offset9" else 10  # (mean) segment length
    return 2 * n * h / (2 * n + 3), n * h / (2 * n + 3)


def probe(cfg, task: str, steps: int, lr: float, vocab: int, batch: int, length: int, seed: int) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    rng = random.Random(seed)
    m = cfg.model
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=vocab, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_key_value_heads, head_dim=m.head_dim, max_position_embeddings=length,
        tie_word_embeddings=m.tie_word_embeddings))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    first = last = None
    t0 = time.perf_counter()
    window: list[float] = []
    for _step in range(steps):
        x = make_batch(task, rng, vocab, batch, length)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        first = loss.item() if first is None else first
        window = (window + [loss.item()])[-20:]
        last = sum(window) / len(window)
    no_copy, perfect = reference_losses(task, vocab)
    return {"task": task, "steps": steps, "lr": lr, "first_loss": round(first, 3), "last_loss": round(last, 3),
            "no_copy_loss": round(no_copy, 3), "perfect_copy_loss": round(perfect, 3),
            "copied": round((no_copy - last) / (no_copy - perfect), 2),
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--tasks", default="offset1,offset9,induction")
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                    help="config override, e.g. model.num_hidden_layers=2 (another architecture)")
    args = ap.parse_args(argv)

    import torch

    from acl_lib.config import load_config

    torch.set_num_threads(2)
    cfg = load_config(args.profile, overrides=args.overrides)
    for task in args.tasks.split(","):
        print(probe(cfg, task, args.steps, args.lr, args.vocab, args.batch, args.length, args.seed), flush=True)


if __name__ == "__main__":
    main()
