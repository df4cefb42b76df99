"""benchmarks/if_breakdown.py: the held-out words a prompt asks for are found where the expert writes them, and
missed where a response leaves them out."""

import json
from pathlib import Path

from acl_lib.config import WorldsConfig
from acl_lib.envs.instruct import InstructEnv, scripted_expert
from bench_kit import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return load_benchmark("if_breakdown")


def _records(tasks, respond):
    out = []
    for t in tasks:
        ep = InstructEnv(WorldsConfig()).start(t)
        ep.step(respond(t))
        out.append({"reward": ep.reward(), "failure": ep.failure,
                    "messages": [{"role": "user", "content": t.user_prompt},
                                 {"role": "assistant", "content": respond(t)}]})
    return out


def test_the_experts_answers_write_every_held_out_word_and_an_off_topic_answer_none(tmp_path, capsys):
    ib = _module()
    tasks = InstructEnv(WorldsConfig(), seed=0).tasks("test", 200, seed=0)
    expert = ib.breakdown(_records(tasks, lambda t: scripted_expert(t, t.initial_messages())))
    kinds = ["topic word", "keywords", "first word", "end phrase"]
    assert all(expert["asked"][k] > 0 for k in kinds), expert["asked"]
    assert expert["full"] == expert["n"] == 200 and not expert["failed"]
    # every word an instruction requires; the topic's in all but the answers whose constraints leave no room for it
    assert all(expert["wrote"][k] == expert["asked"][k] for k in kinds[1:])
    assert expert["wrote"]["topic word"] >= 0.95 * expert["asked"]["topic word"]
    off = ib.breakdown(_records(tasks, lambda t: "Tea is a topic that many people like."))
    assert not any(off["wrote"][k] for k in kinds) and off["full"] < 200 and off["failed"]
    # the script: one table row per evaluation directory
    d = tmp_path / "eval" / "records"
    d.mkdir(parents=True)
    (d / "ifeval.jsonl").write_text("\n".join(json.dumps(r) for r in _records(tasks[:20], lambda t: "")))
    ib.main([str(tmp_path / "eval")])
    out = capsys.readouterr().out
    assert "| 0/20 |" in out and str(tmp_path / "eval") in out
