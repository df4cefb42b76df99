"""The study's steps: which notebook makes which runs and files. The one table that error messages, the missing
lists and the "needs complete runs" checks read (as ``acl_lib.domains`` is for the domains' names).

    notebook  step                        makes (run names, or files of a seed directory)
    00        the base model              base
    01-04     the sequential stages       seq_<stage> (one notebook per stage of pipeline.curriculum)
    05        the oracles                 oracle_<stage>
    06        the weight diagnostics      diagnostics/weights.json, diagnostics/cl_metrics.json
    07        the token diagnostics       diagnostics/tokens.json
    08        MMOPD                       mmopd, mmopd_rkl, mmopd_single
    09        SDFT                        sdft*, sdft_directions/directions.json
    10        weight merging              merge_*
    11        MLE                         mle*
    12        the final tables            (reads every seed)
    13        the curriculum orders       (opt-in: the sequential runs of other curricula)

    notebook_of("oracle_if")                   # "05"
    made_by("oracle_if")                       # "notebook 05 (the oracles)"
    stage_notebook(1)                          # "notebook 01 (sequential stage 1)"
    require_complete(runs, "SDFT sampling")    # RuntimeError naming each incomplete run and its notebook

``seq_final`` is the last sequential stage's run (``pipeline.sequential_run``), made by notebook 04; the tables
name it so whatever the curriculum (``as_seq_final`` / ``from_seq_final`` map the names both ways).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class Step:
    notebook: str  # its notebook's prefix ("05"), or a range of them ("01-04")
    title: str
    makes: tuple[str, ...]  # run names or seed-directory files, as fnmatch patterns, checked in table order


TABLE: tuple[Step, ...] = (
    Step("00", "the base model", ("base",)),
    Step("01-04", "the sequential stages", ("seq*",)),  # seq_<stage>, and seq<i>_<order> of other curricula
    Step("05", "the oracles", ("oracle_*",)),
    Step("06", "the weight diagnostics", ("diagnostics/weights.json", "diagnostics/cl_metrics.json")),
    Step("07", "the token diagnostics", ("diagnostics/tokens.json",)),
    Step("08", "MMOPD", ("mmopd*",)),
    Step("09", "SDFT", ("sdft*",)),  # sdft, sdft_base, sdft_data, the ablations, sdft_directions/directions.json
    Step("10", "weight merging", ("merge_*",)),
    Step("11", "MLE", ("mle*",)),
    Step("12", "the final tables", ()),
    Step("13", "the curriculum orders", ()),  # seq_<stage> runs of other curricula
)


SEQ_FINAL = "seq_final"  # the sequential endpoint, as the tables name it


def as_seq_final(run: str, final: str) -> str:
    """The tables' name of ``run``: ``seq_final`` for the last stage's run ``final`` (``seq_if`` in the study's
    order), the run's own name otherwise."""
    return SEQ_FINAL if run == final else run


def from_seq_final(name: str, final: str) -> str:
    """The run a table's ``name`` stands for: the last stage's run ``final`` for ``seq_final``."""
    return final if name == SEQ_FINAL else name


def step_of(what: str) -> Step | None:
    """The step that makes run or file ``what`` (None when no step does)."""
    return next((s for s in TABLE if any(fnmatchcase(what, p) for p in s.makes)), None)


def notebook_of(what: str) -> str:
    """The prefix of the notebook that makes ``what`` ("05", "01-04"), or "" when none does."""
    step = step_of(what)
    return step.notebook if step else ""


def made_by(what: str) -> str:
    """``what``'s notebook, for messages: "notebook 05 (the oracles)", "notebooks 01-04 (the sequential stages)"."""
    step = step_of(what)
    if step is None:
        return "no notebook of the pipeline"
    word = "notebooks" if "-" in step.notebook else "notebook"
    return f"{word} {step.notebook} ({step.title})"


def stage_notebook(index: int) -> str:
    """The notebook of sequential stage ``index`` (1-based) of ``pipeline.curriculum``, for messages."""
    return f"notebook {index:02d} (sequential stage {index})"


def require_complete(runs: Iterable, what: str) -> None:
    """Raise a RuntimeError naming every run of ``runs`` (``acl_lib.runs.Run``) that is not complete: its status,
    its path and the notebook that makes it. ``what``: the step that needs them ("SDFT sampling")."""
    missing = [r for r in runs if not r.is_complete()]
    if missing:
        lines = "; ".join(f"{r.name} ({r.status()}, {r.path}; {made_by(r.name)})" for r in missing)
        raise RuntimeError(f"{what} needs complete runs: missing {lines}")
