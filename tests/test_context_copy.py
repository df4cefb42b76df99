"""The context-copy diagnostic (benchmarks/context_copy.py): an induction oracle gains, a uniform model does not."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import torch

spec = importlib.util.spec_from_file_location(
    "context_copy", Path(__file__).resolve().parents[1] / "benchmarks" / "context_copy.py")
context_copy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(context_copy)

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


def test_word_lists_are_deterministic():
    assert context_copy.word_lists(["a", "b", "c"], 3, 5, seed=1) == context_copy.word_lists(["a", "b", "c"], 3, 5, seed=1)
