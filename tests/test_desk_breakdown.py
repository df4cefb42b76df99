"""benchmarks/desk_breakdown.py and the ``kind`` of a desk task's record: a retail evaluation's episodes are
counted per task kind, from the records' own field or, for older records, from the world's tasks by id."""

import json
from pathlib import Path

from acl_lib.config import load_config
from acl_lib.envs import BENCHMARKS
from acl_lib.eval.harness import benchmark_size, evaluate_benchmark, world
from acl_lib.eval.policies import ExpertPolicy
from bench_kit import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return load_benchmark("desk_breakdown")


def test_retail_records_name_their_kind_and_the_breakdown_counts_them(tmp_path, capsys):
    db = _module()
    cfg = load_config("mini", [], seed=0)
    bench = BENCHMARKS["retail"]
    env = world(cfg, bench.env)
    tasks = env.tasks(bench.split, benchmark_size(cfg, bench), seed=cfg.worlds.seed)[:6]
    _, records = evaluate_benchmark(ExpertPolicy(), bench, env, len(tasks), 1, cfg.eval.max_turns, tasks=tasks)
    kinds = {t.id: t.meta["kind"] for t in tasks}
    assert [r["kind"] for r in records] == [kinds[t.id] for t in tasks]
    counts = db.breakdown(records)
    assert sum(n for _, n in counts.values()) == 6 and set(counts) == set(kinds.values())
    # the expert passes every task; a record without its kind is matched to the world's tasks by id
    old = [dict({k: v for k, v in r.items() if k != "kind"}, reward=0.0) for r in records]
    assert db.breakdown(old, kinds) == {k: [0, n] for k, (_, n) in counts.items()}
    assert counts == {k: [n, n] for k, (_, n) in counts.items()}
    d = tmp_path / "eval" / "records"
    d.mkdir(parents=True)
    (d / "retail.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    db.main([str(tmp_path / "eval")])
    assert "| 6/6 |" in capsys.readouterr().out
