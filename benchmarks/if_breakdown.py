"""Where a mini IFEval score comes from: prompts fully met, the commonest failed instructions, and whether the model
writes the held-out words the prompt asks for.

    python benchmarks/if_breakdown.py outputs/base_build_b6/mini/seed0/base/eval \\
        outputs/mini/seed0/pstage_gib6/eval_before outputs/mini/seed0/pstage_gib6/eval_after

Reads each evaluation directory's ``records/ifeval.jsonl`` (the mini IF world's test split, whose topics, keywords,
first words and end phrases no training prompt uses: ``acl_lib/envs/instruct.py``). For each held-out kind it
counts the prompts that ask for one and the responses that contain it: the topic's last word anywhere in the
response, every required keyword, the required first word, the required end phrase at the end.

This is how the mid-trained bases' instruction following was diagnosed (docs/mini-calibration.md): a base that
never writes a word it has not been trained on fails every prompt that asks for one, and GRPO on the training
prompts, whose words it knows, does not teach it to.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from acl_lib.envs.instruct import END_PHRASES, FIRST_WORDS, TOPICS


def breakdown(records: list[dict]) -> dict:
    asked, wrote = Counter(), Counter()
    failed = Counter()
    full = 0
    for r in records:
        prompt, answer = r["messages"][0]["content"], r["messages"][-1]["content"]
        low = answer.lower()
        full += r["reward"] == 1.0
        for part in (r.get("failure") or "").removeprefix("failed instructions: ").split(", "):
            if part:
                failed[part] += 1
        topic = next((t for t in TOPICS["test"] if t in prompt), None)
        if topic:
            asked["topic word"] += 1
            wrote["topic word"] += topic.split()[-1].lower() in low
        m = re.search(r"Include keywords (.*?) in the response", prompt)
        if m:
            asked["keywords"] += 1
            wrote["keywords"] += all(k in low for k in re.findall(r'"(\w+)"', m.group(1)))
        for w in FIRST_WORDS["test"]:
            if f"must start with word {w}" in prompt:
                asked["first word"] += 1
                wrote["first word"] += w in low
        for e in END_PHRASES["test"]:
            if e in prompt:
                asked["end phrase"] += 1
                wrote["end phrase"] += low.strip().strip('"').endswith(e.lower())  # as IFEval's end_checker
    return {"n": len(records), "full": full, "asked": asked, "wrote": wrote, "failed": failed}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("eval_dirs", nargs="+", help="evaluation directories (each with records/ifeval.jsonl)")
    ap.add_argument("--top", type=int, default=4, help="how many of the commonest failed instructions to list")
    args = ap.parse_args(argv)
    kinds = ["topic word", "keywords", "first word", "end phrase"]
    print("| evaluation | prompts fully met | " + " | ".join(f"{k} written" for k in kinds)
          + " | commonest failures |\n|---|---:|" + "---:|" * len(kinds) + "---|")
    for d in args.eval_dirs:
        path = Path(d) / "records" / "ifeval.jsonl"
        if not path.is_file():
            raise SystemExit(f"{path} not found: pass an evaluation directory that scored ifeval")
        b = breakdown([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
        cells = [f"{b['wrote'][k]}/{b['asked'][k]}" for k in kinds]
        top = ", ".join(f"{i} {n}" for i, n in b["failed"].most_common(args.top))
        print(f"| {d} | {b['full']}/{b['n']} | " + " | ".join(cells) + f" | {top} |")


if __name__ == "__main__":
    main()
