"""In-context copying: the skill the tool worlds need, measured and taught.

Search and e-commerce ask the agent to copy what it cannot predict otherwise: an entity name from the question
into a query, a year out of a retrieved passage, an order id from the user into a tool call. A model learns
that through an *induction head* (attend to the token after an earlier occurrence of the current token, copy
it), which small models form late and only under the right batch shape (docs/mini-calibration.md).

- ``copy_gain(model, tokenizer, lists)``: lists of words written twice on one line; mean NLL per token of the
  first and of the second copy, and ``gain`` = first - second (nats): ~0 for a model that does not copy,
  several nats for one that does. ``benchmarks/context_copy.py`` runs it on checkpoints.
- ``world_word_lists(cfg)``: the standard lists, drawn from the search world's documents.
- ``induction_blocks(...)``: synthetic copy sequences (random token segments, each repeated) for the base
  recipe's copy warm-up (``pretrain.copy_warmup_*``).
- ``echo_documents(texts, ...)``: text copy documents for the corpus phase (``pretrain.copy_mix``): a run of
  words drawn from the corpus, then the same run again, with nothing marking where the copy starts.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from acl_lib.envs import make_env

if TYPE_CHECKING:
    from acl_lib.config import Config


def word_lists(words: list[str], n: int, length: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(length)) for _ in range(n)]


def world_word_lists(cfg: Config, n: int = 30, length: int = 20) -> list[str]:
    """``n`` lists of ``length`` words (names, numbers, places) from the search world of ``cfg.worlds``."""
    env = make_env("search", cfg.worlds, seed=cfg.worlds.seed)
    words = sorted({w.strip('.,"') for d in env.documents for w in d["contents"].split()} - {""})
    return word_lists(words, n, length)


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


def induction_blocks(n_blocks: int, seq_len: int, token_ids: list[int], seed: int = 0,
                     min_len: int = 5, max_len: int = 20) -> list[list[int]]:
    """``n_blocks`` blocks of ``seq_len`` ids: segments of ``min_len``-``max_len`` random ids from
    ``token_ids``, each followed at once by itself, with nothing marking where a copy starts. Only a copy
    predicts a segment's second half, and only an induction head (match the current token to an earlier
    occurrence, predict what followed it) finds it: a separator before each copy would let the model copy by
    position from the separator instead, which does not carry over to text (measured: docs/mini-calibration.md)."""
    rng = random.Random(seed)
    blocks = []
    for _ in range(n_blocks):
        seq: list[int] = []
        while len(seq) < seq_len:
            seg = [rng.choice(token_ids) for _ in range(rng.randint(min_len, max_len))]
            seq += seg + seg
        blocks.append(seq[:seq_len])
    return blocks


def echo_documents(texts: list[str], n_chars: int, seed: int = 0, min_words: int = 4,
                   max_words: int = 16) -> list[str]:
    """About ``n_chars`` characters of echo documents: each is a run of ``min_words``-``max_words`` words drawn
    at random from the words of ``texts`` (the corpus: names, numbers, places of worlds other than the
    evaluated one), followed by the same run. Only copying from the context predicts the second run; no
    separator marks where it starts, so position from a marker does not predict it (only an induction head
    does)."""
    rng = random.Random(seed)
    words = sorted({w for t in texts for w in t.split() if w.isprintable() and len(w) < 24})
    if not words:
        raise ValueError("echo_documents: the corpus has no words to draw from")
    docs, total = [], 0
    while total < n_chars:
        run = " ".join(rng.choice(words) for _ in range(rng.randint(min_words, max_words)))
        doc = run + " " + run
        docs.append(doc)
        total += len(doc)
    return docs
