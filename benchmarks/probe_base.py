"""Calibration probe: build and pretrain a base with config overrides, then score a few benchmarks.

    python benchmarks/probe_base.py TAG [--profile mini] [--benchmarks aime26,nq,ifeval] [--whole-names]
                                        [--set KEY=VALUE ...]

``--whole-names``: the tokenizer keeps every word of the search world's entity names whole (one added token
per word, with and without a leading space; the BPE gets the rest of ``model.vocab_size``).

Writes ``outputs/<profile>/seed0/probe_<TAG>/`` (init/, model/, train_log.jsonl, eval/metrics.json). It does
not touch the pipeline's runs: use it to try a pretraining recipe or a world change before re-running
notebook 00. Prints one ``RESULT`` line with the wall time and the scores.
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tag")
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--benchmarks", default="aime26,nq,ifeval")
    ap.add_argument("--whole-names", action="store_true")
    ap.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)

    import torch

    from acl_lib.config import load_config
    from acl_lib.eval.harness import evaluate
    from acl_lib.model import BASE_SECTIONS
    from acl_lib.model.build import build_model, count_parameters, save, train_tokenizer
    from acl_lib.model.corpus import base_corpus
    from acl_lib.runs import Run
    from acl_lib.train.pretrain import train_pretrain

    cfg = load_config(args.profile, overrides=args.overrides, seed=0)
    run = Run(cfg, f"probe_{args.tag}", sections=BASE_SECTIONS)
    run.path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    corpus, stats = base_corpus(cfg)
    words: list[str] = []
    if args.whole_names:
        from acl_lib.envs import make_env

        world = make_env("search", cfg.worlds, seed=cfg.worlds.seed).world
        words = sorted({w for names in world.entities.values() for name in names for w in name.split()})
    tok = train_tokenizer(corpus, cfg.model.vocab_size, model_max_length=cfg.model.max_position_embeddings,
                          keep_whole=words)
    model = build_model(cfg.model, tok)
    print("parameters", count_parameters(model), "corpus", stats, flush=True)
    save(model, tok, run.path / "init")
    train_pretrain(cfg, run.path / "init", corpus, run.path)
    t1 = time.perf_counter()
    benches = args.benchmarks.split(",")
    metrics = evaluate(cfg, str(run.path / "model"), run.path / "eval", benchmarks=benches)
    print("RESULT", args.tag, "pretrain_s", round(t1 - t0), "eval_s", round(time.perf_counter() - t1),
          {b: metrics["scores"][b] for b in benches}, flush=True)


if __name__ == "__main__":
    main()
