"""The suite's one decode engine for the Qwen3 architecture at smoke and mini: prefill and decode on token ids.

    engine = Engine(model, stop_ids=[2])
    outs = engine.generate([Row(new_ids=prompt) for prompt in prompts], max_new_tokens=64)
    outs[0].tokens          # the generated ids, up to and including the first stop id
    outs[0].kv              # per layer (keys, values) of every token fed: prompt + tokens[:-1]

Why not ``model.generate``: at the mini model's size (hidden 192, 4 layers) a decode step is a few hundred
microseconds of arithmetic wrapped in several hundred framework operations (cache objects, mask building, logits
processors, stopping criteria), a finished row rides along until the longest row of its batch ends, and a
static cache makes every step attend over the cache's whole capacity. Here one plain loop does only what a step
needs, top to bottom:

1. **Prefill.** Rows that are the same prompt over the same cached prefix (the k samples of a task, the
   generations of a GRPO group) are encoded once and their cache copied to each sample. Each row's cached prefix
   (``Row.prefix``: the keys and values of an episode's earlier turns, or a system prompt shared by many episodes)
   is copied into a preallocated cache; only the new tokens run through the model, right-padded, at their own
   positions.
2. **Decode.** Each step feeds every live row its last token at its own position, writes its keys and values in
   place, and attends over the cache up to the longest live row (not the capacity). Rows that reached a stop id
   or their token budget leave the batch: the cache is compacted once a quarter of the rows have finished.
3. **Sampling.** Greedy is argmax. Sampled rows (temperature > 0, optionally top-p) each draw from a
   ``torch.Generator`` of their own (``Row.generator``: one uniform per token, drawn for the row's whole budget at
   the start of a call), so a row's samples do not depend on which rows share its batch, or in which order.

Weights are read from the model when the engine is made (q/k/v and gate/up projections concatenated, which on the
suite's pinned CPU kernels gives the same bits as separate products): make a new engine after the weights change
(a trainer makes one per rollout). A PEFT model's LoRA adapters are applied per row (``Row.adapter``: a loaded
adapter's name, or ``None`` for the model's active adapters), as PEFT's ``adapter_names`` does: the base product
plus each adapter's ``B(A(x)) * scaling`` on the rows that use it.

``model.generate`` is the reference (``tests/test_engine.py``): greedy transcripts agree token for token; logits
agree to rounding (attention sums over a different padding layout), so a near-tie may flip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

KV = list  # per layer (keys, values), each (kv_heads, length, head_dim)


@dataclass
class Row:
    """One generation request. ``new_ids``: the tokens to encode after ``prefix`` (at least one); ``prefix``: the
    cached keys and values the row starts from (``KV``, all layers the same length), or None; ``max_new_tokens``:
    this row's budget (None: the call's); ``generator``: the row's random stream (needed when sampling);
    ``adapter``: the LoRA adapter the row runs (None: the model's active ones, if any)."""

    new_ids: Sequence[int]
    prefix: KV | None = None
    max_new_tokens: int | None = None
    generator: torch.Generator | None = None
    adapter: str | None = None
    prefix_key: object = None  # rows with equal (prefix_key, new_ids, adapter) share one prefill; None: identity


@dataclass
class Result:
    tokens: list[int]  # generated ids, up to and including the first stop id
    kv: KV  # keys and values of every token fed: the prefix, new_ids and tokens[:-1]
    stopped: bool  # True when it ended at a stop id (False: its budget ran out)


@dataclass
class _Proj:
    """One (possibly fused) linear map: ``x @ weight.T`` plus, for rows that use them, LoRA deltas on output
    slices. ``loras``: {adapter: [(A, B, scaling, output slice)]}."""

    weight: torch.Tensor
    loras: dict[str, list[tuple[torch.Tensor, torch.Tensor, float, slice]]] = field(default_factory=dict)

    def __call__(self, x: torch.Tensor, groups) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if not self.loras or groups is None:
            return y
        for name, index in groups:  # rows of one adapter, as PEFT's mixed-batch forward does
            for a, b, scaling, sl in self.loras.get(name, ()):
                sub = x if index is None else x[index]
                delta = F.linear(F.linear(sub, a), b) * scaling
                if index is None:
                    y[..., sl] = y[..., sl] + delta
                else:
                    y[index, ..., sl] = y[index, ..., sl] + delta
        return y


def _linear_parts(module) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor, float]], list[str]]:
    """(base weight, {adapter: (A, B, scaling)}, active adapters) of an ``nn.Linear`` or a PEFT LoRA ``Linear``."""
    if hasattr(module, "base_layer") and hasattr(module, "lora_A"):
        if getattr(module, "merged", False):
            raise ValueError("the engine reads unmerged LoRA layers; unmerge the adapters first")
        if module.base_layer.bias is not None:
            raise ValueError("the engine supports bias-free projections only (Qwen3 has none)")
        loras = {name: (module.lora_A[name].weight, module.lora_B[name].weight, float(module.scaling[name]))
                 for name in module.lora_A.keys()}
        active = [] if getattr(module, "disable_adapters", False) else list(module.active_adapters)
        return module.base_layer.weight, loras, active
    if getattr(module, "bias", None) is not None:
        raise ValueError("the engine supports bias-free projections only (Qwen3 has none)")
    return module.weight, {}, []


def _fused(modules) -> tuple[_Proj, list[str]]:
    """One ``_Proj`` for several linear maps of the same input (their outputs concatenated in order)."""
    weights, loras, active, start = [], {}, set(), 0
    for m in modules:
        w, parts, act = _linear_parts(m)
        sl = slice(start, start + w.shape[0])
        start += w.shape[0]
        weights.append(w)
        for name, (a, b, s) in parts.items():
            loras.setdefault(name, []).append((a, b, s, sl))
        active.update(act)
    weight = weights[0] if len(weights) == 1 else torch.cat(weights).detach()
    return _Proj(weight.detach(), {n: [(a.detach(), b.detach(), s, sl) for a, b, s, sl in v]
                                   for n, v in loras.items()}), sorted(active)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm, the same operations in the same order (float32 inside)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


class Engine:
    """Prefill and decode for a transformers Qwen3 causal LM (or a PEFT model around one), on token ids."""

    def __init__(self, model, stop_ids: Sequence[int], pad_id: int = 0, max_rows: int = 64):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = base.config
        if getattr(cfg, "model_type", None) != "qwen3":
            raise ValueError(f"the engine runs the Qwen3 architecture, not {getattr(cfg, 'model_type', None)!r}")
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", False):
            raise ValueError("the engine has no sliding-window attention")
        if not stop_ids:
            raise ValueError("the engine needs at least one stop id")
        self.stop_ids = sorted(set(int(s) for s in stop_ids))
        self.pad_id = int(pad_id)
        self.max_rows = max(1, int(max_rows))
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.max_positions = int(cfg.max_position_embeddings)
        inner = base.model
        self.embed = inner.embed_tokens.weight.detach()
        self.device, self.dtype = self.embed.device, self.embed.dtype
        self.norm = inner.norm.weight.detach()
        # an output layer that is not a plain linear map (a test's scripted head) is called as it is
        head = base.lm_head
        self.lm_head = head.weight.detach() if isinstance(head, torch.nn.Linear) else None
        self._head = head
        self.layers, active = [], set()
        for layer in inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            qkv, a1 = _fused([att.q_proj, att.k_proj, att.v_proj])
            o, a2 = _fused([att.o_proj])
            gate_up, a3 = _fused([mlp.gate_proj, mlp.up_proj])
            down, a4 = _fused([mlp.down_proj])
            active.update(a1 + a2 + a3 + a4)
            self.layers.append({
                "ln1": layer.input_layernorm.weight.detach(), "ln2": layer.post_attention_layernorm.weight.detach(),
                "qk_norm": torch.cat([att.q_norm.weight.detach().expand(self.n_heads, -1),
                                      att.k_norm.weight.detach().expand(self.n_kv, -1)]),
                "qkv": qkv, "o": o, "gate_up": gate_up, "down": down,
            })
        self.adapters = sorted({n for lay in self.layers for p in lay.values() if isinstance(p, _Proj)
                                for n in p.loras})
        self.active_adapters = sorted(active)
        rope = inner.rotary_emb
        self.inv_freq = rope.inv_freq.detach().to(self.device, torch.float32)
        self.rope_scaling = float(getattr(rope, "attention_scaling", 1.0))
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None
        if getattr(rope, "rope_type", "default") != "default":
            raise ValueError(f"the engine implements the default RoPE, not {rope.rope_type!r}")
        self.intermediate = self.layers[0]["gate_up"].weight.shape[0] // 2
        self.stats = {"prefill_tokens": 0, "prefill_rows_shared": 0, "decode_steps": 0, "decode_row_steps": 0,
                      "generated_tokens": 0, "compactions": 0}

    # -- building blocks -------------------------------------------------------------------------------------

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (its first half negated, for ``roll``) of shape positions.shape + (head_dim,): rows of a table
        computed once, as transformers' Qwen3RotaryEmbedding computes them."""
        if self._rope_table is None:
            freqs = torch.arange(self.max_positions, device=self.device)[:, None].float() * self.inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = (emb.cos() * self.rope_scaling).to(self.dtype), (emb.sin() * self.rope_scaling).to(self.dtype)
            half = self.head_dim // 2
            self._rope_table = (cos, torch.cat((-sin[:, :half], sin[:, half:]), dim=-1))
        cos, sin = self._rope_table
        return cos[positions], sin[positions]

    def _groups(self, adapters: list[str | None]):
        """Per-row adapter groups for ``_Proj``: [(adapter, row index or None for all rows)]."""
        unknown = sorted({a for a in adapters if a not in (None, "__base__") and a not in self.adapters})
        if unknown:
            raise ValueError(f"adapter {unknown[0]!r} is not loaded (loaded: {', '.join(self.adapters) or 'none'})")
        if not self.adapters:
            return None
        names = [a if a is not None else tuple(self.active_adapters) for a in adapters]
        out = []
        for name in dict.fromkeys(names):
            rows = [i for i, n in enumerate(names) if n == name]
            index = None if len(rows) == len(names) else torch.tensor(rows, device=self.device)
            for each in (name if isinstance(name, tuple) else (name,)):
                if each != "__base__":
                    out.append((each, index))
        return out

    def _layer(self, h, lay, groups, cos, sin, keys, values, write, attend):
        """One decoder layer on hidden states ``h`` (rows, tokens, hidden). ``write(keys, values, k, v)`` puts the
        new keys/values into the cache, ``attend(q, keys, values)`` returns (rows, tokens, heads * head_dim)."""
        rows, tokens, _ = h.shape
        x = _rms(h, lay["ln1"], self.eps)
        qkv = lay["qkv"](x, groups)
        nq, nk = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        # q and k heads together: one norm (q_norm's weight on the query heads, k_norm's on the key heads), one RoPE
        qk = _rms(qkv[..., :nq + nk].view(rows, tokens, self.n_heads + self.n_kv, self.head_dim), lay["qk_norm"],
                  self.eps).transpose(1, 2)
        v = qkv[..., nq + nk:].view(rows, tokens, self.n_kv, self.head_dim).transpose(1, 2)
        # rotate_half(x) * sin == roll(x, half) * sin with its first half negated, bit for bit
        qk = (qk * cos.unsqueeze(1)) + (qk.roll(self.head_dim // 2, -1) * sin.unsqueeze(1))
        q, k = qk[:, : self.n_heads], qk[:, self.n_heads:]
        write(keys, values, k, v)
        h = h + lay["o"](attend(q, keys, values), groups)
        x = _rms(h, lay["ln2"], self.eps)
        gu = lay["gate_up"](x, groups)
        return h + lay["down"](F.silu(gu[..., :self.intermediate]) * gu[..., self.intermediate:], groups)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        x = _rms(h, self.norm, self.eps)
        return F.linear(x, self.lm_head) if self.lm_head is not None else self._head(x)

    # -- encoding a shared prefix ----------------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, ids: Sequence[int], adapter: str | None = None, prefix: KV | None = None) -> KV:
        """The keys and values of ``ids`` (after ``prefix``, if given), for rows to start from (``Row.prefix``)."""
        if not ids:
            raise ValueError("encode: no tokens to encode")
        res = self._prefill([Row(new_ids=list(ids), prefix=prefix, adapter=adapter)], extra=0)[0]
        kv, lengths = res
        return [(k[0, :, :lengths[0]], v[0, :, :lengths[0]]) for k, v in kv]

    # -- generation ------------------------------------------------------------------------------------------

    def _check(self, rows: Sequence[Row], max_new_tokens: int) -> None:
        for i, r in enumerate(rows):
            if len(r.new_ids) == 0:
                raise ValueError(f"row {i}: an empty prompt (a row needs at least one new token to encode)")
            c = 0 if r.prefix is None else r.prefix[0][0].shape[1]
            budget = r.max_new_tokens if r.max_new_tokens is not None else max_new_tokens
            if budget < 1:
                raise ValueError(f"row {i}: max_new_tokens must be at least 1, got {budget}")
            if c + len(r.new_ids) + budget > self.max_positions:
                raise ValueError(f"row {i}: {c} cached + {len(r.new_ids)} new prompt tokens + {budget} to generate "
                                 f"exceed the model's context of {self.max_positions} tokens")
        self._groups([r.adapter for r in rows])  # an adapter that is not loaded fails before any work

    def _prefill(self, rows: Sequence[Row], extra: int):
        """Encode each row's new tokens after its prefix into a fresh cache with room for ``extra`` more tokens per
        row. Returns ((per-layer keys, values: (rows, kv_heads, capacity, head_dim)), lengths, last logits)."""
        n = len(rows)
        cached = [0 if r.prefix is None else r.prefix[0][0].shape[1] for r in rows]
        news = [len(r.new_ids) for r in rows]
        S = max(news)
        lengths = [c + s for c, s in zip(cached, news)]
        span = max(lengths)
        cap = max(span + extra, max(cached) + S)  # a pad after a short row's tokens is written too
        dev = self.device
        ids = torch.full((n, S), self.pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : news[i]] = torch.as_tensor(list(r.new_ids), dtype=torch.long)
        ids = ids.to(dev)
        start = torch.tensor(cached, device=dev)
        pos = start[:, None] + torch.arange(S, device=dev)[None, :]  # (rows, S): each token at its own position
        cos, sin = self._rope(pos)
        # Zeros, not empty: a masked position still meets its value with weight 0, and 0 * NaN is NaN.
        shape = (n, self.n_kv, cap, self.head_dim)
        kv = [(torch.zeros(shape, dtype=self.dtype, device=dev), torch.zeros(shape, dtype=self.dtype, device=dev))
              for _ in self.layers]
        for i, r in enumerate(rows):
            if r.prefix is not None:
                for (k, v), (pk, pv) in zip(kv, r.prefix):
                    k[i, :, : cached[i]] = pk
                    v[i, :, : cached[i]] = pv
        row_idx = torch.arange(n, device=dev)[:, None]
        rep = self.n_heads // self.n_kv
        # query j of row i sees keys 0 .. cached_i + j (its prefix and its own tokens up to itself)
        mask = (torch.arange(span, device=dev)[None, None, :] <= pos[:, :, None])[:, None]  # (rows, 1, S, span)

        def write(keys, values, k, v):
            keys[row_idx, :, pos] = k.transpose(1, 2)
            values[row_idx, :, pos] = v.transpose(1, 2)

        def attend(q, keys, values):
            # enable_gqa: each query head reads its key-value head in place (no repeated copy of the cache)
            o = F.scaled_dot_product_attention(q, keys[:, :, :span], values[:, :, :span], attn_mask=mask,
                                               enable_gqa=rep > 1)
            return o.transpose(1, 2).reshape(n, S, self.n_heads * self.head_dim)

        groups = self._groups([r.adapter for r in rows])
        h = F.embedding(ids, self.embed)
        for lay, (keys, values) in zip(self.layers, kv):
            h = self._layer(h, lay, groups, cos, sin, keys, values, write, attend)
        last = h[torch.arange(n, device=dev), torch.tensor(news, device=dev) - 1]  # (rows, hidden)
        self.stats["prefill_tokens"] += sum(news)
        return (kv, lengths), self._logits(last)

    @torch.no_grad()
    def generate(self, rows: Sequence[Row], max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0) -> list[Result]:
        """Generate for every row until its first stop id or its budget; rows beyond ``max_rows`` run in chunks."""
        self._check(rows, max_new_tokens)
        if temperature > 0 and any(r.generator is None for r in rows):
            raise ValueError("sampling (temperature > 0) needs a generator for every row (Row.generator)")
        out: list[Result] = []
        for start in range(0, len(rows), self.max_rows):
            out += self._generate_chunk(list(rows[start : start + self.max_rows]), max_new_tokens, temperature,
                                        top_p)
        return out

    def _generate_chunk(self, rows: list[Row], max_new_tokens: int, temperature: float, top_p: float):
        dev = self.device
        budgets = [r.max_new_tokens if r.max_new_tokens is not None else max_new_tokens for r in rows]
        # Rows that are the same prompt over the same prefix with the same adapter are encoded once.
        unique: dict[tuple, int] = {}
        source = []
        for r in rows:
            key = (id(r.prefix) if r.prefix_key is None else r.prefix_key,
                   tuple(r.new_ids), r.adapter)
            source.append(unique.setdefault(key, len(unique)))
        firsts = [rows[source.index(u)] for u in range(len(unique))]
        (kv, lengths_u), logits = self._prefill(firsts, extra=max(budgets))
        if len(unique) < len(rows):
            self.stats["prefill_rows_shared"] += len(rows) - len(unique)
            expand = torch.tensor(source, device=dev)
            kv = [(k.index_select(0, expand), v.index_select(0, expand)) for k, v in kv]
            logits = logits.index_select(0, expand)
        lengths = torch.tensor([lengths_u[u] for u in source], device=dev)  # tokens in each row's cache
        live = list(range(len(rows)))  # physical row p holds request live[p]
        tokens: list[list[int]] = [[] for _ in rows]
        results: list[Result | None] = [None] * len(rows)
        stops = torch.tensor(self.stop_ids, device=dev)
        adapters = [r.adapter for r in rows]
        groups = self._groups(adapters)
        rep = self.n_heads // self.n_kv
        finished = torch.zeros(len(rows), dtype=torch.bool)  # per physical row, since the last compaction
        # Sampled rows draw one uniform a step from their own stream, all of a call's at once: (requests, budget).
        draws = None
        if temperature > 0:
            draws = torch.zeros(len(rows), max(budgets), dtype=torch.float64)
            for i, r in enumerate(rows):
                draws[i, : budgets[i]] = torch.rand(budgets[i], generator=r.generator, dtype=torch.float64)
            draws = draws.to(dev)
        while True:
            u = None
            if draws is not None:  # each live row's next uniform (a finished row's draw is not used)
                steps = [min(len(tokens[i]), budgets[i] - 1) for i in live]
                u = draws[torch.tensor(live, device=dev), torch.tensor(steps, device=dev)]
            nxt = self._pick(logits, u, temperature, top_p)
            nxt_list = nxt.tolist()
            is_stop = torch.isin(nxt, stops).tolist()
            for p, i in enumerate(live):
                if finished[p]:
                    continue
                tokens[i].append(nxt_list[p])
                if is_stop[p] or len(tokens[i]) >= budgets[i]:
                    finished[p] = True
                    n_fed = int(lengths[p])
                    results[i] = Result(tokens[i], [(k[p, :, :n_fed], v[p, :, :n_fed]) for k, v in kv],
                                        bool(is_stop[p]))
            n_done = int(finished.sum())
            if n_done == len(live):
                break
            if n_done * 4 >= len(live):  # a quarter of the rows finished: drop them from the batch
                keep = (~finished).nonzero().squeeze(1)
                kv = [(k.index_select(0, keep), v.index_select(0, keep)) for k, v in kv]
                lengths, nxt = lengths.index_select(0, keep), nxt.index_select(0, keep)
                live = [live[p] for p in keep.tolist()]
                finished = torch.zeros(len(live), dtype=torch.bool)
                groups = self._groups([adapters[i] for i in live])
                self.stats["compactions"] += 1
            logits = self._decode_step(nxt, lengths, kv, groups, rep)
            lengths = lengths + 1
            self.stats["decode_steps"] += 1
            self.stats["decode_row_steps"] += len(live)
        self.stats["generated_tokens"] += sum(len(t) for t in tokens)
        return results

    def _decode_step(self, nxt, lengths, kv, groups, rep):
        """Feed each row's token at position ``lengths[row]``; returns the next logits (rows, vocab)."""
        n = nxt.shape[0]
        pos = lengths[:, None]  # (rows, 1)
        cos, sin = self._rope(pos)
        span = int(lengths.max()) + 1
        mask = (torch.arange(span, device=nxt.device)[None, :] <= pos)[:, None, None, :]  # (rows, 1, 1, span)
        rows = torch.arange(n, device=nxt.device)

        def write(keys, values, k, v):
            keys[rows, :, lengths] = k[:, :, 0]
            values[rows, :, lengths] = v[:, :, 0]

        def attend(q, keys, values):
            # one query per row: its heads grouped by key-value head, (rows, kv_heads, rep, head_dim), so no
            # key-value head is copied
            qg = q.reshape(n, self.n_kv, rep, self.head_dim)
            o = F.scaled_dot_product_attention(qg, keys[:, :, :span], values[:, :, :span], attn_mask=mask)
            return o.reshape(n, 1, self.n_heads * self.head_dim)

        h = F.embedding(nxt[:, None], self.embed)
        for lay, (keys, values) in zip(self.layers, kv):
            h = self._layer(h, lay, groups, cos, sin, keys, values, write, attend)
        return self._logits(h[:, 0])

    NUCLEUS_K = 64  # top-p is cut within the 64 likeliest tokens, and over the whole vocabulary where they fall short

    @classmethod
    def _pick(cls, logits: torch.Tensor, uniforms: torch.Tensor | None, temperature: float,
              top_p: float) -> torch.Tensor:
        """The next token per row: argmax (temperature 0), else a draw from softmax(logits / temperature) cut to
        the top-p nucleus (transformers' ``TopPLogitsWarper`` rule: a token stays while the mass of the tokens
        likelier than it is below ``top_p``), by inverse CDF with one uniform per row (``uniforms``, (rows,))."""
        if temperature <= 0:
            return logits.argmax(-1)
        scores = logits.float() / temperature
        k = scores.shape[-1] if top_p >= 1.0 else min(cls.NUCLEUS_K, scores.shape[-1])
        probs = scores.softmax(dim=-1)
        top, order = torch.topk(probs, k, dim=-1) if k < probs.shape[-1] else torch.sort(probs, -1, descending=True)
        if top_p < 1.0:
            short = top.sum(-1) < top_p  # the nucleus reaches past the top k: that row over the whole vocabulary
            if bool(short.any()):
                top, order = torch.sort(probs, -1, descending=True)
            above = top.cumsum(-1) - top  # mass of the tokens likelier than each one
            top = top.masked_fill(above >= top_p, 0.0)
        cdf = top.cumsum(-1)
        u = uniforms.to(cdf.dtype) * cdf[:, -1]
        idx = torch.searchsorted(cdf, u[:, None]).clamp_(max=cdf.shape[-1] - 1)
        return order.gather(1, idx).squeeze(1)
