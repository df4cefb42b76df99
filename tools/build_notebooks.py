"""Write the pipeline notebooks 01-05 from one template, so the four stage notebooks stay identical.

    python tools/build_notebooks.py        # rewrites notebooks/01..05 (no outputs)

Notebooks are thin: a parameters cell, the config, one acl_lib call per step, then tables and figures.
Edit this file, not the notebooks, and re-run it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
STUDY_ORDER = ["math", "search", "ecom", "if"]


def _params(extra: str = "") -> nbformat.NotebookNode:
    src = (
        'profile = "smoke"  # smoke | mini | paper\n'
        "seed = 0  # training seed (the worlds and benchmarks are fixed by worlds.seed)\n"
        "overrides = []  # dotted config overrides: key, equals sign, YAML value (see: acl config --help)\n"
        + extra
    )
    cell = new_code_cell(src)
    cell.metadata["tags"] = ["parameters"]
    return cell


def _setup() -> nbformat.NotebookNode:
    return new_code_cell(
        "from acl_lib.config import load_config\n"
        "from acl_lib import pipeline, report\n\n"
        "cfg = load_config(profile, overrides, seed=seed)\n"
        "cfg.seed_dir()"
    )


def _cmd(name: str, extra: str = "") -> str:
    return (
        f"```bash\npapermill notebooks/{name}.ipynb papermill_runs/mini/seed0/{name}.ipynb "
        f"-p profile mini -p seed 0{extra}\n```\n"
        f"or, with every notebook and seed: `acl run --profile mini --seeds 0 1 2 --only {name[:2]}`."
    )


BASE_MD = """# 00 · Base model

**What this step is in the study.** Every stage of the curriculum (Math -> Search -> E-commerce -> IF), every
oracle and every consolidation starts from one *base checkpoint*. In the study that is **Qwen3-8B-Base**, used
as released: with `profile = "paper"` this notebook records the hub id and scores it; it trains nothing.

The `mini` profile does the same with a **pretrained base shipped with the suite** (`acl_lib/data/mini_base/`,
`pretrain.source: shipped`): built once by the suite's own recipe (`python benchmarks/build_mini_base.py`, about
an hour on 2 CPU cores), committed with its model card. This notebook checks its sha256 against the card, copies
it into the run store, shows the card and scores it. The recipe, which `--set pretrain.source=pretrain` re-runs
here from scratch (as a user who wants another base would):
1. a corpus of chat-rendered transcripts of a *noisy* scripted expert on the four training worlds' train
   splits (a fraction `pretrain.noise` of assistant turns corrupted) plus the search world's documents, drawn
   from worlds built with **other seeds** than the evaluated one (`pretrain.world_seeds`): the base learns the
   formats and how to read, not the facts of the worlds it is tested on (`acl_lib/corpus.py`);
2. a byte-level BPE tokenizer trained on it, with the Qwen3 chat convention (`<|im_start|>`, `<|im_end|>`,
   `<tool_call>`, `<tool_response>`, `<think>`) and the response template TRL parses tool calls with;
3. a small Qwen3-architecture model sized by `cfg.model`, pretrained in two phases (HF `Trainer`, through the
   launcher): a *copy warm-up* on synthetic induction blocks, where the model forms an induction head (it learns
   to copy from its context, which the search and e-commerce worlds need), then the corpus with a share of copy
   blocks mixed in. The context-copy gain is logged as it trains.

The `smoke` profile builds a tiny base in seconds with the same code. The base is scored on the whole suite by
its own run, `base/eval` (`metrics.json`, `records/`).

```bash
papermill notebooks/00_base_model.ipynb papermill_runs/mini/seed0/00_base_model.ipynb -p profile mini -p seed 0
```
or `acl run --profile mini --seeds 0 --only 00`.
"""

BASE_LOAD = 'import torch\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\ntokenizer = AutoTokenizer.from_pretrained(base)\nmodel = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, cfg.model.dtype))\nprint(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()):,} parameters, vocabulary {len(tokenizer)}")\n\nprompt = tokenizer.apply_chat_template(\n    [{"role": "user", "content": "What is 12 + 30?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True\n)\ntorch.manual_seed(cfg.seed)\nout = model.generate(**prompt, max_new_tokens=cfg.eval.max_new_tokens, do_sample=False)\nprint(tokenizer.decode(out[0]))'


def base_notebook() -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell(BASE_MD),
        _params(),
        _setup(),
        new_code_cell("from acl_lib.model import build_base\n\nbase = build_base(cfg)  # a hub id (paper) or outputs/<profile>/seed<k>/base/model\nprint((cfg.seed_dir() / 'base' / 'base.json').read_text())"),
        new_code_cell(
            "# The shipped base's model card (mini), or the pretraining curves of a base built here\n"
            "from IPython.display import Markdown\n\n"
            "card = cfg.seed_dir() / 'base' / 'model' / 'MODEL_CARD.md'\n"
            "Markdown(card.read_text()) if card.exists() else report.training_curves(cfg.seed_dir() / 'base')"
        ),
        new_code_cell(
            "# The base's scores on the whole suite, beside the study's base (Qwen3-8B-Base)\n"
            "scores = report.load_scores(cfg.seed_dir(), ['base'])\n"
            "print(report.format_matrix(scores, report.paper_results()['sequential']))"
        ),
        new_markdown_cell("## Load the checkpoint back\n\nThe same `AutoTokenizer` / `AutoModelForCausalLM` calls load Qwen3-8B-Base in the `paper` profile. A greedy sample shows what the base writes."),
        new_code_cell(BASE_LOAD),
    ]
    return nb


def stage_notebook(index: int) -> nbformat.NotebookNode:
    name = f"{index:02d}_seq_stage_{index}"
    study = STUDY_ORDER[index - 1]
    md = (
        f"# {index:02d} · Sequential stage {index} of the curriculum\n\n"
        f"The study trains Math -> Search -> E-commerce -> IF, each stage from the previous checkpoint. "
        f"This notebook runs stage {index} of `pipeline.curriculum` (in the study's order: **{study}**, "
        f"producing `seq_{study}`). In the study's recipe Math and IF run GRPO with their verifiable rewards, "
        "Search and E-commerce first a rejection-sampled SFT cold start, then GRPO with multi-turn tool use "
        "(tool and user output masked out of the loss); `pipeline.cold_start` says which domains cold-start "
        "(the mini profile cold-starts all four). The checkpoint is then scored on the whole suite "
        "(in-domain and OOD) by an evaluation run of its own, `seq_<domain>/eval/metrics.json`: changing an "
        "`eval` setting re-runs the evaluation only, never the training.\n\n" + _cmd(name)
    )
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell(md),
        _params(f"stage_index = {index}  # position in pipeline.curriculum (1-based)\n"),
        _setup(),
        new_code_cell("run = pipeline.run_sequential_stage(cfg, stage_index)\nrun.path"),
        new_code_cell(
            "# Training curves of this stage (reward per GRPO step; SFT loss where a cold start ran)\n"
            "fig = report.training_curves(run.path)\nfig"
        ),
        new_code_cell(
            "# Scores of the incoming checkpoint and of this one, beside the study's\n"
            "names = [run.inputs[0].name, run.name]\n"
            "scores = report.load_scores(cfg.seed_dir(), names)\n"
            "print(report.format_matrix(scores, report.paper_results()['sequential']))"
        ),
    ]
    if index == 4:
        nb.cells += [
            new_markdown_cell(
                "## The whole sequence\n\nThe capability matrix (checkpoint x benchmark) and each benchmark's "
                "trajectory across stages, ours beside the study's (`paper_results.yaml`, `sequential`). "
                "Whatever it shows about forgetting is what this run measured."
            ),
            new_code_cell(
                "names = pipeline.checkpoint_names(cfg, oracles=False)\n"
                "scores = report.load_scores(cfg.seed_dir(), names)\n"
                "fig = report.capability_heatmap(scores, title=f'Sequential checkpoints, {cfg.profile} seed {cfg.seed}')\n"
                "report.save_figure(fig, cfg.seed_dir() / 'figures' / 'sequential_matrix')\nfig"
            ),
            new_code_cell(
                "paper_seq = report.paper_results()['sequential']\n"
                "fig = report.trajectory_figure(scores, paper_seq, ['aime26', 'nq', 'retail', 'ifeval', 'multi_hop', 'telecom'])\n"
                "report.save_figure(fig, cfg.seed_dir() / 'figures' / 'sequential_trajectories')\nfig"
            ),
            new_code_cell(
                "# Peak vs final for each stage's own benchmark (forgetting as measured here)\n"
                "report.forgetting_table(cfg)"
            ),
        ]
    return nb


def oracles_notebook() -> nbformat.NotebookNode:
    name = "05_oracles"
    md = (
        "# 05 · Single-task oracles\n\n"
        "Each oracle runs the same stage recipe as the sequential pipeline, from the base, on one domain "
        "only (`oracle_math`, `oracle_search`, `oracle_ecom`, `oracle_if`): the per-domain ceiling the "
        "study compares every consolidation against. Each is scored on the whole suite. The oracle of the "
        "curriculum's first domain is the same job as sequential stage 1 (same recipe, base and seed): when that "
        "stage is complete, its outputs are copied rather than trained twice (`same_as.json` says so).\n\n"
        + _cmd(name)
    )
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell(md),
        _params('domains = "all"  # "all" or a comma-separated subset of math,search,ecom,if\n'),
        _setup(),
        new_code_cell(
            "todo = cfg.pipeline.curriculum if domains == 'all' else [d.strip() for d in domains.split(',')]\n"
            "runs = [pipeline.run_oracle(cfg, d) for d in todo]\n"
            "[r.path for r in runs]"
        ),
        new_code_cell(
            "names = pipeline.checkpoint_names(cfg, oracles=True)\n"
            "scores = report.load_scores(cfg.seed_dir(), names)\n"
            "print(report.format_matrix(scores, report.paper_results()['main_table']))"
        ),
        new_code_cell(
            "fig = report.capability_heatmap(scores, title=f'Base, sequential and oracle checkpoints, {cfg.profile} seed {cfg.seed}')\n"
            "report.save_figure(fig, cfg.seed_dir() / 'figures' / 'capability_matrix')\nfig"
        ),
    ]
    return nb


def write(nb: nbformat.NotebookNode, path: Path) -> None:
    """Write ``nb`` with the Python 3 kernel and cell ids fixed by file name and position, so that
    rebuilding an unchanged notebook changes no byte."""
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    for i, cell in enumerate(nb.cells):
        cell.id = hashlib.sha1(f"{path.name}:{i}".encode()).hexdigest()[:8]
    nbformat.write(nb, path)


def main() -> None:
    out = ROOT / "notebooks"
    out.mkdir(exist_ok=True)
    write(base_notebook(), out / "00_base_model.ipynb")
    for i in range(1, 5):
        write(stage_notebook(i), out / f"{i:02d}_seq_stage_{i}.ipynb")
    write(oracles_notebook(), out / "05_oracles.ipynb")


if __name__ == "__main__":
    main()
