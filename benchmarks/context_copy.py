"""Does a checkpoint copy from its context? (a diagnostic, not a test; the measure is acl_lib.model.copying)

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
    from acl_lib.model.copying import copy_gain, world_word_lists

    torch.set_num_threads(2)
    cfg = load_config(args.profile)
    lists = world_word_lists(cfg, args.lists, args.length)
    for path in args.models:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        print(path, copy_gain(model, tok, lists), flush=True)


if __name__ == "__main__":
    main()
