"""The context-copy measure (acl_lib.model.copying, run by benchmarks/context_copy.py): an induction oracle
gains, a uniform model does not; the synthetic copy blocks repeat every segment."""

from types import SimpleNamespace

import torch

from acl_lib.model import copying as context_copy

VOCAB = 64


class WordTokenizer:
    def __init__(self):
        self.ids: dict[str, int] = {}

    def __call__(self, text):
        return {"input_ids": [self.ids.setdefault(w, len(self.ids)) for w in text.split()]}


class Uniform:
    def __call__(self, x):
        return SimpleNamespace(logits=torch.zeros(1, x.shape[1], VOCAB))


class InductionOracle:
    """Predicts the token that followed the last earlier occurrence of the current token (uniform otherwise)."""

    def __call__(self, x):
        ids = x[0].tolist()
        logits = torch.zeros(1, len(ids), VOCAB)
        for t, tok in enumerate(ids):
            earlier = [j for j in range(t) if ids[j] == tok and j + 1 < len(ids)]
            if earlier:
                logits[0, t, ids[earlier[-1] + 1]] = 20.0
        return SimpleNamespace(logits=logits)


def test_an_induction_oracle_gains_and_a_uniform_model_does_not():
    words = [f"w{i}" for i in range(40)]
    lists = [" ".join(words[i:i + 10]) for i in range(0, 30, 10)]  # no repeated word inside a list
    tok = WordTokenizer()
    flat = context_copy.copy_gain(Uniform(), tok, lists)
    assert abs(flat["gain"]) < 1e-6 and flat["first"] > 4
    copier = context_copy.copy_gain(InductionOracle(), tok, lists)
    assert copier["second"] < 0.01 and copier["gain"] > 4


def test_word_lists_are_n_lists_of_length_words_fixed_by_the_seed():
    words = [f"w{i}" for i in range(50)]
    lists = context_copy.word_lists(words, 3, 5, seed=1)
    assert len(lists) == 3 and all(len(x.split()) == 5 and set(x.split()) <= set(words) for x in lists)
    assert context_copy.word_lists(words, 3, 5, seed=1) == lists  # the same seed: the same lists
    assert context_copy.word_lists(words, 3, 5, seed=2) != lists  # another seed: others (p of a clash ~ 50**-15)


def test_induction_blocks_repeat_each_segment_with_no_marker():
    ids = list(range(10, 1000))
    blocks = context_copy.induction_blocks(4, 64, ids, seed=3)
    assert len(blocks) == 4 and all(len(b) == 64 and set(b) <= set(ids) for b in blocks)
    seq = blocks[0]
    # the first segment is followed at once by itself
    n = next(n for n in range(5, 21) if seq[:n] == seq[n:2 * n])
    assert 5 <= n <= 20
    assert context_copy.induction_blocks(4, 64, ids, seed=3) == blocks
