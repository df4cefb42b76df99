"""The mini model against this machine's roofline: matrix rate, memory bandwidth, and the engine's share of each.

    python benchmarks/roofline.py [--threads 1 2] [--rows 64] [--json FILE]

1. **Matrix rate** (GFLOP/s) of the products the mini model runs (hidden 192: q/k/v 192->384 fused, o 192->192,
   gate/up 192->1024 fused, down 512->192, the output layer 192->2048) at 64, 512 and 2,048 rows, at each thread
   count, at the instruction set the suite runs (``ATEN_CPU_CAPABILITY`` / ``MKL_CBWR`` as set in the
   environment; ``acl_lib.seeding``). The FLOP-weighted rate of the model's mix is the compute roofline.
2. **Memory bandwidth** (GB/s): reading a 512 MB tensor (a sum), the memory roofline of decoding over a long cache.
3. **The model's FLOPs per token**: prefill (every layer's products and attention over the context, the output
   layer for the last token only), decode (the same for one token over its context, the output layer included),
   training (three times a forward over every token: forward and two backward products).
4. **The engine** (``acl_lib.eval.engine``) on the shipped base: ``--rows`` rows of 60-token prompts decoding 64
   tokens each (no stop: every row runs to its budget), achieved GFLOP/s against the matrix rate at that many rows;
   then 32 rows over a 2,400-token desk context decoding 64 tokens, the key-value bytes each step reads against the
   bandwidth.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import acl_lib  # noqa: F401  (imported before torch: it pins the CPU kernels every run of the suite uses)

BASE = Path(__file__).resolve().parents[1] / "acl_lib" / "data" / "mini_base"


def _best(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def shapes(cfg) -> list[tuple[int, int]]:
    """(in, out) of each product of one layer, then the output layer."""
    d, hd, h, kv, ff = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads,
                        cfg.intermediate_size)
    return [(d, (h + 2 * kv) * hd), (h * hd, d), (d, 2 * ff), (ff, d)]


def matrix_rate(cfg, rows: int) -> float:
    """FLOP-weighted GFLOP/s of one layer's products and the output layer at ``rows`` rows."""
    import torch
    import torch.nn.functional as F

    total_flops, total_s = 0.0, 0.0
    for k, n in [*shapes(cfg), (cfg.hidden_size, cfg.vocab_size)]:
        x, w = torch.randn(rows, k), torch.randn(n, k)
        reps = max(1, int(2e8 // (2 * rows * k * n)))
        s = _best(lambda: [F.linear(x, w) for _ in range(reps)]) / reps  # noqa: B023
        total_flops += 2 * rows * k * n
        total_s += s
    return total_flops / total_s / 1e9


def bandwidth() -> float:
    """GB/s reading a 512 MB float32 tensor."""
    import torch

    x = torch.ones(128 * 2**20)
    return x.numel() * 4 / _best(lambda: x.sum(), 5) / 1e9


def flops_per_token(cfg, context: int, output_layer: bool) -> float:
    layer = sum(2 * k * n for k, n in shapes(cfg))
    attention = 4 * context * cfg.num_attention_heads * cfg.head_dim  # scores and weighted values
    head = 2 * cfg.hidden_size * cfg.vocab_size if output_layer else 0
    return cfg.num_hidden_layers * (layer + attention) + head


def engine_short(model, cfg, rows: int, prompt: int = 60, new: int = 64) -> dict:
    import torch

    from acl_lib.eval.engine import Engine, Row

    g = torch.Generator().manual_seed(0)
    eng = Engine(model, [cfg.vocab_size], max_rows=rows)  # a stop id outside the vocabulary: every row runs to 64
    reqs = [Row(torch.randint(5, cfg.vocab_size, (prompt,), generator=g).tolist()) for _ in range(rows)]
    s = _best(lambda: eng.generate(reqs, new), 3)
    fl = rows * (sum(flops_per_token(cfg, c, False) for c in range(1, prompt + 1)) +
                 flops_per_token(cfg, prompt, True) +
                 sum(flops_per_token(cfg, prompt + t, True) for t in range(1, new)))
    return {"rows": rows, "prompt": prompt, "new": new, "seconds": round(s, 4), "gflops": round(fl / 1e9, 2),
            "gflop_per_s": round(fl / s / 1e9, 1), "tokens_per_s": round(rows * new / s, 1)}


def engine_desk(model, cfg, rows: int = 32, context: int = 2400, new: int = 64) -> dict:
    import torch

    from acl_lib.eval.engine import Engine, Row

    g = torch.Generator().manual_seed(0)
    eng = Engine(model, [cfg.vocab_size], max_rows=rows)
    prefix = eng.encode(torch.randint(5, cfg.vocab_size, (context,), generator=g).tolist())
    reqs = [Row(torch.randint(5, cfg.vocab_size, (8,), generator=g).tolist(), prefix=prefix, prefix_key=i)
            for i in range(rows)]
    t_all = _best(lambda: eng.generate(reqs, new), 2)
    t_one = _best(lambda: eng.generate(reqs, 1), 2)  # the prefill of the 8 new tokens and the cache copies
    decode_s = max(t_all - t_one, 1e-9)
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4  # bytes of keys + values
    read = rows * sum((context + 8 + t) * per_token for t in range(1, new))
    return {"rows": rows, "context": context, "new": new, "decode_seconds": round(decode_s, 4),
            "cache_gb_read": round(read / 1e9, 3), "gb_per_s": round(read / decode_s / 1e9, 1),
            "tokens_per_s": round(rows * (new - 1) / decode_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import os

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(BASE).eval()
    cfg = model.config
    isa = {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")}
    cap = torch.backends.cpu.get_cpu_capability()
    print(f"instruction set: {isa}; torch {torch.__version__}, CPU capability {cap}")
    print(f"FLOPs per token: prefill at context 60 {flops_per_token(cfg, 60, False) / 1e6:.2f} M, decode at 2,400 "
          f"{flops_per_token(cfg, 2400, True) / 1e6:.2f} M, training (3 x forward, output layer) at 128 "
          f"{3 * flops_per_token(cfg, 128, True) / 1e6:.2f} M")
    out = {"isa": isa, "threads": {}}
    for th in args.threads:
        torch.set_num_threads(th)
        rates = {r: round(matrix_rate(cfg, r), 1) for r in (64, 512, 2048)}
        bw = round(bandwidth(), 1)
        with torch.no_grad():
            short = engine_short(model, cfg, args.rows)
            desk = engine_desk(model, cfg)
        short["share_of_matrix_rate"] = round(short["gflop_per_s"] / rates[64], 3)
        desk["share_of_bandwidth"] = round(desk["gb_per_s"] / bw, 3)
        out["threads"][th] = {"matrix_gflop_per_s": rates, "read_gb_per_s": bw, "engine_short": short,
                              "engine_desk": desk}
        print(f"{th} thread(s): matrix {rates} GFLOP/s (rows: rate); read {bw} GB/s")
        print(f"  engine, {short['rows']} rows x {short['new']} tokens after {short['prompt']}: {short['seconds']} s, "
              f"{short['gflop_per_s']} GFLOP/s = {100 * short['share_of_matrix_rate']:.0f}% of the matrix rate at 64 "
              f"rows; {short['tokens_per_s']} tokens/s")
        print(f"  engine, {desk['rows']} rows over {desk['context']} tokens: decode {desk['decode_seconds']} s, "
              f"{desk['gb_per_s']} GB/s of cache read = {100 * desk['share_of_bandwidth']:.0f}% of the bandwidth; "
              f"{desk['tokens_per_s']} tokens/s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
