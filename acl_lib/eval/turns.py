"""Multi-turn generation that encodes each conversation once: every episode keeps its KV cache across turns.

A desk episode's prompt is a system prompt with tool schemas (about 2k tokens at mini) followed by the turns so
far; without a cache every turn re-encodes all of it. ``TurnGenerator`` keeps, per episode (any hashable key),
the token ids whose keys and values it has computed and those keys and values. On the next turn it takes the
longest common prefix of the cached ids and the new prompt, and encodes only the rest: the observation, the
next user turn, the template's markup, and whatever the chat template re-rendered differently from what the
model generated (a tool call re-serialised from parsed JSON, for instance; matching on token ids keeps the
result exact whatever the template does).

A call batches rows into chunks of ``batch_size`` (sorted by the number of new tokens, so rows of a chunk need
little padding) and runs ``model.generate`` on each chunk with a ``StaticCache`` pre-filled from the rows' cached
prefixes:

    row i:  [pad .. pad | cached prefix (c_i) | pad .. pad | new tokens (s_i)] -> generate
             <---------- C = max c_i -------->  <------ S = max s_i ------->

The attention mask zeroes the pads (also the ones in the middle) and ``generate`` derives position ids from the
mask, so each row sees exactly its own tokens at their own positions, as if its prompt had been encoded whole.
After the call the keys and values of each row's real tokens (prompt and generated) are gathered back into
that row's entry.

Why not transformers' continuous batching (``generate_batch`` / ``init_continuous_batching``): it does prefix
sharing across requests (block hashing, so turns of an episode reuse the blocks of the previous turn), stops each
sequence at its eos and lets waiting requests join, and gave the same greedy transcripts here. But on CPU its
packed-batch attention attends every query over the keys of all requests in the batch (a dense mask), so a
32-episode retail evaluation was no faster than plain ``generate`` re-encoding everything (97 s against 91 s,
measured when this module was written). The benchmark of this path: ``benchmarks/throughput.py``; its numbers
are in docs/mini-calibration.md. ``generate`` with per-row caches keeps attention per row; what it cannot do is drop a
finished row from the running batch: a row that has written its eos rides along (its extra tokens are
discarded) until the longest row of its chunk ends. Chunks are sorted by length, not by expected answer length,
which no one knows in advance.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass
class _Entry:
    ids: list[int]  # the tokens whose keys/values are in ``kv``
    kv: list[tuple[object, object]]  # per layer (keys, values), each (kv_heads, len(ids), head_dim)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(a[lo:mid]) == list(b[lo:mid]):
            lo = mid
        else:
            hi = mid
    return lo


class TurnGenerator:
    """Batched ``generate`` over episodes, each with a KV cache kept across its turns.

    ``generate(rows, max_new_tokens, **sampling)``: ``rows`` are ``(key, prompt ids)``; returns, per row, the
    generated ids up to and including the first eos (or ``max_new_tokens`` ids when no eos came). ``forget(key)``
    drops an episode's cache (the harness does it when an episode ends). The model must not change between
    calls that share keys (a trainer makes a new ``TurnGenerator`` per rollout).

    ``stats``: ``prompt_tokens`` (sum of prompt lengths), ``encoded_tokens`` (prompt tokens actually run through
    the model), ``reencoded_tokens`` (of those, the ones the same episode had already had, prompt or generated:
    what a perfect cache would not encode), ``pad_tokens`` (pads fed with the new tokens), ``calls``
    (rows, prompt width, new tokens) per ``generate`` call.
    """

    def __init__(self, model, pad_token_id: int, eos_token_id: int | list[int], batch_size: int = 16,
                 reuse: bool = True):
        self.model = model
        self.pad = pad_token_id
        self.eos = set(eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id])
        self.batch_size = max(1, int(batch_size))
        self.reuse = reuse
        self.entries: dict[Hashable, _Entry] = {}
        self.seen: dict[Hashable, list[int]] = {}  # per episode: its last prompt and what was generated after it
        self.stats = {"prompt_tokens": 0, "encoded_tokens": 0, "reencoded_tokens": 0, "pad_tokens": 0, "calls": []}

    def forget(self, key: Hashable) -> None:
        self.entries.pop(key, None)
        self.seen.pop(key, None)

    def clear(self) -> None:
        self.entries.clear()
        self.seen.clear()

    # -- one call ------------------------------------------------------------------------------------------

    def generate(self, rows: Sequence[tuple[Hashable, list[int]]], max_new_tokens: int, **sampling) -> list[list[int]]:
        out: list[list[int] | None] = [None] * len(rows)
        for i, (key, ids) in enumerate(rows):
            if not ids:
                raise ValueError(f"row {i} (episode {key!r}) has an empty prompt")
        if self.reuse:
            self._share_first_prefix(rows)
        plan = []  # (row index, cached length used)
        for i, (key, ids) in enumerate(rows):
            entry = self.entries.get(key) if self.reuse else None
            c = min(common_prefix(entry.ids, ids), len(ids) - 1) if entry else 0  # >= 1 token to encode
            seen = common_prefix(self.seen[key], ids) if key in self.seen else 0
            self.stats["prompt_tokens"] += len(ids)
            self.stats["encoded_tokens"] += len(ids) - c
            self.stats["reencoded_tokens"] += max(0, seen - c)
            plan.append((i, c))
        # Bucket by the number of tokens to encode: pads among those go through the whole model, while pads in
        # the cached part only widen the attention.
        plan.sort(key=lambda p: (len(rows[p[0]][1]) - p[1], len(rows[p[0]][1])))
        for start in range(0, len(plan), self.batch_size):
            chunk = plan[start : start + self.batch_size]
            for (i, _), new in zip(chunk, self._generate_chunk(rows, chunk, max_new_tokens, sampling)):
                out[i] = new
        return out  # type: ignore[return-value]

    def _share_first_prefix(self, rows, min_shared: int = 32) -> None:
        """Episodes starting together share their system prompt (a desk's policy and tool schemas): encode the
        prefix common to all of the call's first turns once and start each of those episodes from it."""
        import torch

        fresh = [(key, ids) for key, ids in rows if key not in self.entries]
        if len(fresh) < 2:
            return
        shared = min(min(len(ids) for _, ids in fresh) - 1, min(common_prefix(fresh[0][1], ids) for _, ids in fresh))
        if shared < min_shared:
            return
        prefix = fresh[0][1][:shared]
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        with torch.no_grad():
            self.model(input_ids=torch.tensor([prefix], device=self._device()), cache=cache, use_cache=True,
                       logits_to_keep=1, **self.row_kwargs([fresh[0][0]]))
        kv = [(k[0], v[0]) for k, v in _layers(cache)]
        self.stats["encoded_tokens"] += shared
        for key, _ in fresh:
            self.entries[key] = _Entry(ids=list(prefix), kv=kv)

    def _generate_chunk(self, rows, chunk, max_new_tokens, sampling) -> list[list[int]]:
        import torch
        from transformers import StaticCache

        n_rows = len(chunk)
        C = max(c for _, c in chunk)
        S = max(len(rows[i][1]) - c for i, c in chunk)
        input_ids = torch.full((n_rows, C + S), self.pad, dtype=torch.long)
        mask = torch.zeros((n_rows, C + S), dtype=torch.long)
        for r, (i, c) in enumerate(chunk):
            ids = rows[i][1]
            s = len(ids) - c
            if c:
                input_ids[r, C - c : C] = torch.tensor(ids[:c])
                mask[r, C - c : C] = 1
            input_ids[r, C + S - s :] = torch.tensor(ids[c:])
            mask[r, C + S - s :] = 1
            self.stats["pad_tokens"] += S - s
        device = self._device()
        input_ids, mask = input_ids.to(device), mask.to(device)
        # A static cache: written in place. A DynamicCache concatenates its tensors at every step, which cost more
        # than the attention itself on long desk prompts (measured when this module was written).
        cache = StaticCache(config=self.model.config, max_cache_len=C + S + max_new_tokens)
        if C:
            for layer in range(len(cache.layers)):
                k0, v0 = self._some_kv(rows, chunk, layer)
                keys = k0.new_zeros((n_rows, k0.shape[0], C, k0.shape[2]))
                values = v0.new_zeros((n_rows, v0.shape[0], C, v0.shape[2]))
                for r, (i, c) in enumerate(chunk):
                    if c:
                        k, v = self.entries[rows[i][0]].kv[layer]
                        keys[r, :, C - c :] = k[:, :c]
                        values[r, :, C - c :] = v[:, :c]
                cache.layers[layer].update(keys, values)
        with torch.no_grad():
            res = self.model.generate(
                input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=self.pad,
                eos_token_id=sorted(self.eos), return_dict_in_generate=True, use_cache=True, cache=cache, **sampling,
                **self.row_kwargs([rows[i][0] for i, _ in chunk]),
            )
        seqs = res.sequences
        T = seqs.shape[1] - (C + S)
        self.stats["calls"].append((n_rows, C + S, int(T)))
        outs = []
        for r, (i, c) in enumerate(chunk):
            key, ids = rows[i]
            new = seqs[r, C + S :].tolist()
            end = next((j for j, t in enumerate(new) if t in self.eos), None)
            new = new[: end + 1] if end is not None else new
            outs.append(new)
            kept = new[:end] if end is not None else new
            kept = kept[: max(0, T - 1)]  # the last token generated was never fed back: it has no keys/values
            self.seen[key] = list(ids) + (new[:end] if end is not None else new)
            if self.reuse:
                s = len(ids) - c
                pos = torch.cat([torch.arange(C - c, C), torch.arange(C + S - s, C + S + len(kept))]).to(device)
                kv = [(k[r].index_select(1, pos).clone(), v[r].index_select(1, pos).clone())
                      for k, v, *_ in _layers(cache)]
                self.entries[key] = _Entry(ids=list(ids) + kept, kv=kv)
        return outs

    def row_kwargs(self, keys: Sequence[Hashable]) -> dict:
        """Extra keyword arguments of the model call for rows of these episode keys, in row order: none here (a
        subclass passes PEFT's per-row ``adapter_names``, ``acl_lib.consolidate.mle``)."""
        return {}

    def _device(self):
        return next(self.model.parameters()).device

    def _some_kv(self, rows, chunk, layer):
        for i, c in chunk:
            if c:
                return self.entries[rows[i][0]].kv[layer]
        raise AssertionError("no cached row in chunk")


def _layers(cache):
    """(keys, values) per layer of a transformers cache, each (batch, kv_heads, length, head_dim)."""
    return [(layer.keys, layer.values) for layer in cache.layers]
