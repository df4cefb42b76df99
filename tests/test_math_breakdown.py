"""benchmarks/math_breakdown.py: the family read from a problem's text is the generator's, and arithmetic lines
are judged right or wrong as computed."""

import json
from pathlib import Path

import pytest

from acl_lib.envs.math import generate_math, solution_text, wrong_solution_text
from bench_kit import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mb():
    return load_benchmark("math_breakdown")


NAMES = {"algebra": "algebra", "arith": "arithmetic", "word": "word"}


@pytest.mark.parametrize("max_operand", [0, 9])
def test_the_family_read_from_the_text_is_the_generators(mb, max_operand):
    tasks = generate_math("test", 200, world_seed=3, max_operand=max_operand,
                          level_weights={"test": [1, 1, 1, 1]})
    assert {t.meta["family"] for t in tasks} == set(NAMES)
    for t in tasks:
        assert mb.family(t.user_prompt) == NAMES[t.meta["family"]], t.user_prompt


def _record(task, text, reward):
    return {"reward": reward, "messages": [{"role": "user", "content": task.user_prompt},
                                           {"role": "assistant", "content": text}]}


def test_right_and_wrong_solutions_are_counted_as_such(mb, tmp_path, capsys):
    import random

    tasks = generate_math("test", 40, world_seed=1, max_operand=9, level_weights={"test": [1, 0, 0, 0]})
    rng = random.Random(0)
    right = [_record(t, solution_text(t), 1.0) for t in tasks]
    wrong = [_record(t, wrong_solution_text(t, rng), 0.0) for t in tasks]
    b = mb.breakdown(right)
    assert b["lines_right"] == 1.0 and b["lines"] >= len(tasks)
    assert all(v["score"] == 100.0 for v in b["families"].values())
    b = mb.breakdown(wrong)  # one operation per problem: the slipped step is the only line, and it is wrong
    assert b["lines_right"] == 0.0
    assert sum(v["episodes"] for v in b["families"].values()) == len(tasks)
    assert mb.line_is_right(7, "/", 2, 3) and not mb.line_is_right(7, "/", 0, 0)

    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "aime26.jsonl").write_text("\n".join(json.dumps(r) for r in right + wrong))
    mb.main([str(tmp_path)])
    assert "arithmetic lines right 50%" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no math records"):
        mb.main([str(tmp_path / "nowhere")])
