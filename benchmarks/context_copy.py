"""Does a checkpoint copy from its context? (a diagnostic, not a test)

Search and e-commerce ask the agent to copy what it cannot predict otherwise: an entity name from the question
into a query, a year out of a retrieved passage, an order id from the user into a tool call. This script
measures that skill directly on a trained checkpoint: it writes lists of words from the search world's
documents (names, numbers, places; 20 words each), each list twice on one line, and compares the model's
mean negative log-likelihood per token on the first and on the second copy:

    first   what the model predicts without the list in its context
    second  the same tokens again: a model that copies from its context predicts them almost for free

``gain`` = first - second (nats per token): ~0 for a model that does not copy, several nats for one that does.

    python benchmarks/context_copy.py outputs/mini/seed0/base/model [outputs/mini/seed0/seq_search/model ...]
"""

from __future__ import annotations

import argparse
import random


def word_lists(words: list[str], n: int, length: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(length)) for _ in range(n)]


def copy_gain(model, tokenizer, lists: list[str], sep: str = " |") -> dict:
    """Mean NLL per token of each list's first and second copy in ``" " + list + sep + " " + list``."""
    import torch

    first = second = 0.0
    for words in lists:
        text = " " + words  # both copies start with a space, so they tokenize alike
        ids = tokenizer(text + sep + text)["input_ids"]
        once = tokenizer(text)["input_ids"]
        n = len(once)
        if ids[-n:] != once or len(ids) < 2 * n + 1:
            raise ValueError(f"the list does not tokenize the same twice; use another separator than {sep!r}")
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
        nll = -logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        first += nll[: n - 1].mean().item()  # tokens 2..n of the first copy
        second += nll[-(n - 1):].mean().item()  # tokens 2..n of the second copy
    k = len(lists)
    return {"first": round(first / k, 3), "second": round(second / k, 3), "gain": round((first - second) / k, 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--lists", type=int, default=30)
    ap.add_argument("--length", type=int, default=20)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from acl_lib.config import load_config
    from acl_lib.envs import make_env

    torch.set_num_threads(2)
    cfg = load_config(args.profile)
    env = make_env("search", cfg.worlds, seed=cfg.worlds.seed)
    words = sorted({w.strip('.,"') for d in env.documents for w in d["contents"].split()} - {""})
    lists = word_lists(words, args.lists, args.length)
    for path in args.models:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        print(path, copy_gain(model, tok, lists), flush=True)


if __name__ == "__main__":
    main()
