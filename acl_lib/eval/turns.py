"""Multi-turn generation that encodes each conversation once: every episode keeps its KV cache across turns.

A desk episode's prompt is a system prompt with tool schemas (about 2k tokens at mini) followed by the turns so
far; without a cache every turn re-encodes all of it. ``TurnGenerator`` keeps, per episode (any hashable key),
the token ids whose keys and values it has computed and those keys and values. On the next turn it takes the
longest common prefix of the cached ids and the new prompt, and encodes only the rest: the observation, the
next user turn, the template's markup, and whatever the chat template re-rendered differently from what the
model generated (a tool call re-serialised from parsed JSON, for instance; matching on token ids keeps the
result exact whatever the template does).

Generation itself is the engine's (``acl_lib.eval.engine``): each row starts from its episode's cached prefix
(``Row.prefix``) and only its new tokens run through the model; the engine takes all the call's rows in one batch
(up to ``batch_size``), encodes rows that are the same prompt over the same prefix once (the k samples of a task),
lets finished rows leave the batch, and samples each episode from a random stream of its own (``seeds``), so an
episode's samples do not depend on the episodes beside it. After the call each row's keys and values (prompt and
generated, views into the engine's cache: no copy) become that episode's entry.

Why not transformers' continuous batching (``generate_batch`` / ``init_continuous_batching``): on CPU its
packed-batch attention attends every query over the keys of all requests in the batch (a dense mask), so a
32-episode retail evaluation was no faster than plain ``generate`` re-encoding everything (97 s against 91 s,
measured when this module was written). The benchmark of this path: ``benchmarks/throughput.py``; its numbers
are in docs/engine.md.
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
    """Batched generation over episodes, each with a KV cache kept across its turns (``acl_lib.eval.engine``).

    ``generate(rows, max_new_tokens, temperature=0, top_p=1, seeds=None)``: ``rows`` are ``(key, prompt ids)``;
    returns, per row, the generated ids up to and including the first stop id (or ``max_new_tokens`` ids when
    none came). Sampling (temperature > 0) draws each episode from its own generator, seeded on the episode's
    first call from ``seeds`` (one int per row) or, without them, from torch's global generator. ``forget(key)``
    drops an episode's cache and stream (the harness does it when an episode ends). The model must not change
    between calls that share keys (a trainer makes a new ``TurnGenerator`` per rollout).

    ``stats``: ``prompt_tokens`` (sum of prompt lengths), ``encoded_tokens`` (prompt tokens actually run through
    the model), ``reencoded_tokens`` (of those, the ones the same episode had already had, prompt or generated:
    what a perfect cache would not encode), ``calls`` (rows, longest prompt, new tokens) per ``generate`` call,
    and the engine's own counters under ``engine``.
    """

    def __init__(self, model, pad_token_id: int, eos_token_id: int | list[int], batch_size: int = 64,
                 reuse: bool = True):
        self.model = model
        self.pad = pad_token_id
        self.eos = set(eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id])
        self.batch_size = max(1, int(batch_size))
        self.reuse = reuse
        self.entries: dict[Hashable, _Entry] = {}
        self.seen: dict[Hashable, list[int]] = {}  # per episode: its last prompt and what was generated after it
        self.generators: dict[Hashable, object] = {}  # per episode: its random stream
        self._engine = None
        self.stats = {"prompt_tokens": 0, "encoded_tokens": 0, "reencoded_tokens": 0, "calls": []}

    @property
    def engine(self):
        """The engine over the model's current weights, made on first use (``acl_lib.eval.engine.Engine``)."""
        if self._engine is None:
            from acl_lib.eval.engine import Engine

            self._engine = Engine(self.model, sorted(self.eos), self.pad, max_rows=self.batch_size)
        return self._engine

    def forget(self, key: Hashable) -> None:
        self.entries.pop(key, None)
        self.seen.pop(key, None)
        self.generators.pop(key, None)

    def clear(self) -> None:
        self.entries.clear()
        self.seen.clear()
        self.generators.clear()

    def adapter(self, key: Hashable) -> str | None:
        """The LoRA adapter the rows of episode ``key`` run: none here (a subclass routes them,
        ``acl_lib.consolidate.mle``)."""
        return None

    # -- one call ------------------------------------------------------------------------------------------

    def generate(self, rows: Sequence[tuple[Hashable, list[int]]], max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seeds: Sequence[int] | None = None) -> list[list[int]]:
        import torch

        from acl_lib.eval.engine import Row

        for i, (key, ids) in enumerate(rows):
            if not ids:
                raise ValueError(f"row {i} (episode {key!r}) has an empty prompt")
        if not rows:
            return []
        if seeds is not None and len(seeds) != len(rows):
            raise ValueError(f"{len(seeds)} seeds for {len(rows)} rows")
        if self.reuse:
            self._share_first_prefix(rows)
        reqs = []
        for i, (key, ids) in enumerate(rows):
            entry = self.entries.get(key) if self.reuse else None
            c = min(common_prefix(entry.ids, ids), len(ids) - 1) if entry else 0  # >= 1 token to encode
            seen = common_prefix(self.seen[key], ids) if key in self.seen else 0
            self.stats["prompt_tokens"] += len(ids)
            self.stats["encoded_tokens"] += len(ids) - c
            self.stats["reencoded_tokens"] += max(0, seen - c)
            gen = None
            if temperature > 0:
                gen = self.generators.get(key)
                if gen is None:
                    seed = int(seeds[i]) if seeds is not None else int(torch.randint(0, 2**62, (1,)).item())
                    gen = self.generators[key] = torch.Generator(device=self.engine.device).manual_seed(seed)
            prefix = [(k[:, :c], v[:, :c]) for k, v in entry.kv] if c else None
            reqs.append(Row(new_ids=ids[c:], prefix=prefix, generator=gen, adapter=self.adapter(key),
                            prefix_key=(id(entry.kv), c) if c else None))
        results = self.engine.generate(reqs, max_new_tokens, temperature=temperature, top_p=top_p)
        self.stats["calls"].append((len(rows), max(len(ids) for _, ids in rows), int(max_new_tokens)))
        outs = []
        for (key, ids), res in zip(rows, results):
            new = res.tokens
            outs.append(new)
            self.seen[key] = list(ids) + (new[:-1] if res.stopped else new)
            if self.reuse:  # what the engine fed: the prompt and every generated token but the last
                self.entries[key] = _Entry(ids=list(ids) + new[:-1], kv=res.kv)
        return outs

    def _share_first_prefix(self, rows, min_shared: int = 32) -> None:
        """Episodes starting together share their system prompt (a desk's policy and tool schemas): encode the
        prefix common to all of the call's first turns once (per adapter) and start each of those episodes from
        it."""
        groups: dict[str | None, list] = {}
        for key, ids in rows:
            if key not in self.entries:
                groups.setdefault(self.adapter(key), []).append((key, ids))
        for adapter, fresh in groups.items():
            if len(fresh) < 2:
                continue
            shared = min(min(len(ids) for _, ids in fresh) - 1,
                         min(common_prefix(fresh[0][1], ids) for _, ids in fresh))
            if shared < min_shared:
                continue
            prefix = fresh[0][1][:shared]
            kv = self.engine.encode(prefix, adapter=adapter)
            self.stats["encoded_tokens"] += shared
            for key, _ in fresh:
                self.entries[key] = _Entry(ids=list(prefix), kv=kv)


class ReferenceTurnGenerator(TurnGenerator):
    """The reference the engine is tested against: transformers' ``model.generate``, greedy, one row at a time on
    its whole prompt (no padding, no cache kept across turns). Slow; for tests and ``benchmarks/engine_check.py``."""

    def generate(self, rows, max_new_tokens, temperature=0.0, top_p=1.0, seeds=None):
        import torch

        if temperature > 0:
            raise ValueError("the reference generator is greedy only")
        outs = []
        for i, (key, ids) in enumerate(rows):
            if not ids:
                raise ValueError(f"row {i} (episode {key!r}) has an empty prompt")
            with torch.no_grad():
                seq = self.model.generate(input_ids=torch.tensor([ids], device=self.model.device),
                                          attention_mask=torch.ones(1, len(ids), dtype=torch.long,
                                                                    device=self.model.device),
                                          max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=self.pad,
                                          eos_token_id=sorted(self.eos), **self.reference_kwargs(key))
            new = seq[0, len(ids):].tolist()
            end = next((j for j, t in enumerate(new) if t in self.eos), None)
            outs.append(new[: end + 1] if end is not None else new)
            self.stats["prompt_tokens"] += len(ids)
            self.stats["encoded_tokens"] += len(ids)
        self.stats["calls"].append((len(rows), max((len(ids) for _, ids in rows), default=0), int(max_new_tokens)))
        return outs

    def reference_kwargs(self, key) -> dict:
        """Extra ``generate`` arguments for a row: PEFT's ``adapter_names`` where the row runs an adapter."""
        name = self.adapter(key)
        return {"adapter_names": [name]} if name is not None else {}
