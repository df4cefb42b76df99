"""``acl``: the suite's command line. Run ``acl --help`` / ``acl <command> --help``.

    acl run    --profile mini --seeds 0 1 2 [--only 00 03] [--set key=value ...]   execute the notebooks
    acl status --profile mini [--seeds 0 1 2]                                       runs and executed notebooks
    acl report --profile mini [--seeds 0 1 2] [--out FILE]                          outputs/<profile>/report.html
    acl config --profile mini [--set key=value ...] [--seed 0]                      the resolved config as YAML
    acl eval   --model DIR --profile mini [--suites all] [--k 4] [--out DIR]        score a checkpoint (default --out:
                                                                                    outputs/eval/<name>-<time>/)
    acl env retail replay --db DB.json --tasks TASKS.json --out OUT.jsonl           replay retail gold actions
    acl data prepare --data-dir DIR [--only NAME ...]                              download + convert the paper data
    acl data check   --data-dir DIR [--full]                                       present / missing / malformed
    acl nbstrip [NOTEBOOK ...] [--check]                                            strip outputs before commit

Only argparse, the standard library and ``acl_lib.progress`` (standard library only) are imported at module
level: every heavy import (papermill, pydantic, torch) happens inside the command that needs it, so ``--help``
answers instantly.
Exit codes: 0 ok, 1 a notebook or command failed, 2 bad usage or configuration, an output location that cannot be
written, or an output directory in use by another ``acl run`` (all found before any compute), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from acl_lib.progress import fmt_duration

EXIT_FAILED = 1
EXIT_USAGE = 2
# Set by `acl run --jobs N` once it has printed the no-PNG hint, so that its per-seed children do not repeat it.
_PNG_HINT_SHOWN = "ACL_PNG_HINT_SHOWN"


@contextmanager
def _png_decided() -> Iterator[None]:
    """For the length of one ``acl run``: decide once (bounded in time) whether figures get PNG copies, hand the
    answer to every kernel and child run through the environment, and say once why not (a parent that already said
    it, ``acl run --jobs``, keeps its children quiet); then give the environment back as it was, so that an
    ``acl run`` called in-process (``main([...])``) leaves no decision behind for the caller's later children."""
    import os

    from acl_lib import png_export

    keys = (png_export.PNG_ENV, png_export.WHY_ENV, _PNG_HINT_SHOWN)
    saved = {k: os.environ.get(k) for k in keys}
    png = png_export.environment_for_children()
    os.environ.update(png)
    if png[png_export.PNG_ENV] == "0" and not os.environ.get(_PNG_HINT_SHOWN):
        print(png_export.hint(png[png_export.WHY_ENV]), flush=True)
        os.environ[_PNG_HINT_SHOWN] = "1"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _profiles() -> list[str]:
    # Listing the YAML files directly (not via acl_lib.config) keeps pydantic out of `--help`.
    return sorted(p.stem for p in (Path(__file__).parent / "profiles").glob("*.yaml"))


def _add_profile(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument(
        "--profile", choices=_profiles(), default=default, required=default is None,
        help="config profile (acl_lib/profiles/)",
    )


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        nargs="+",
        action="extend",
        default=[],
        help="config override(s), dotted keys, YAML values: --set eval.k=4 pipeline.curriculum=[if,math,search,ecom]. "
        "A training stage then applies the profile's pipeline.stage_overrides for its domain on top, so a key listed "
        "there (e.g. sft.max_steps in mini) is changed per stage with "
        "--set 'pipeline.stage_overrides={search: [sft.max_steps=600]}' (this replaces the profile's lists)",
    )


def _add_dirs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--notebooks-dir", default="notebooks",
                   help="where the NN_name.ipynb notebooks are (default: notebooks)")
    p.add_argument("--output-dir", default=None, help="run store root (default: the config's output_dir, 'outputs')")
    p.add_argument(
        "--papermill-dir", default=None,
        help="executed notebooks root (default: the config's papermill_dir, 'papermill_runs')",
    )


def _add_run_parser(sub) -> None:
    """``acl run``: execute the notebooks with papermill (``cmd_run``)."""
    p = sub.add_parser(
        "run",
        help="execute the notebooks in order with papermill",
        description="Execute notebooks/NN_*.ipynb in prefix order for each seed with papermill, passing the "
        "parameters profile, seed and overrides. Executed copies go to <papermill-dir>/<profile>/seed<k>/. The config "
        "is validated for every seed before the first notebook starts. Completed runs inside the notebooks are "
        "skipped, so re-running after an interruption only redoes what is missing; a notebook whose last execution "
        "with the same parameters finished and whose runs are all still complete is not executed again (--re-execute "
        "does). A notebook whose metadata says \"acl\": {\"runs\": \"once_over_seeds\"} (the final tables) reads every "
        "seed: it runs once, after all the seeds, with seeds=[...] (executed copy in <papermill-dir>/<profile>/). One "
        "marked \"acl\": {\"opt_in\": true} (the curriculum orders, four more sequences of training) runs only when "
        "named with --only.",
    )
    _add_profile(p)
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds to run, in order (default: 0)")
    p.add_argument("--only", nargs="+", metavar="NN", default=None,
                   help="run only notebooks with these prefixes: --only 00 03")
    p.add_argument("--re-execute", action="store_true",
                   help="execute every notebook again, even one whose last execution with the same parameters is "
                   "complete and whose runs are all still on disk (those are skipped by default); runs that are "
                   "complete are still not retrained")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="run up to N notebooks at once, each in an `acl run --only NN` process of its own with the "
                   "config's torch_threads divided among those running, each started once the notebooks of its seed "
                   "whose runs it reads (metadata.acl.after) are done; with several seeds the notebooks of every seed "
                   "share the N places, the notebook most others wait on first. Lines are prefixed [NN] (one seed) or "
                   "[seed k · NN]. The "
                   "final tables run last. Default 1 (one after another). On a small CPU machine the mini model "
                   "keeps about one core busy per process, so --jobs 2 on 2 cores finishes sooner "
                   "(docs/mini-calibration.md)")
    p.add_argument("--held-lock", action="store_true", help=argparse.SUPPRESS)  # a child of --jobs N
    _add_set(p)
    _add_dirs(p)
    p.set_defaults(func=cmd_run)


def _add_status_parser(sub) -> None:
    """``acl status``: the run store and the executed notebooks of a profile (``cmd_status``)."""
    p = sub.add_parser(
        "status",
        help="which runs are complete, running, failed or missing; which notebooks have executed copies",
        description="Table of the run store (outputs/<profile>/seed<k>/) and of the executed notebooks "
        "(papermill_runs/<profile>/seed<k>/) for a profile.",
    )
    _add_profile(p)
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="seeds to show (default: every seed found on disk, or 0)")
    _add_dirs(p)
    p.set_defaults(func=cmd_status)


def _add_report_parser(sub) -> None:
    """``acl report``: the final report as one HTML file (``cmd_report``)."""
    p = sub.add_parser(
        "report",
        help="write outputs/<profile>/report.html: the final tables over the seeds, figures, run configs",
        description="Build the final report (the final tables over the seeds, the findings verdict, the main "
        "figures, each run's config.yaml and links to the executed notebooks) from the run store alone, as one HTML "
        "file that opens in a browser without Jupyter, offline (plotly.js inlined). Missing runs are listed, not "
        "errors.",
    )
    _add_profile(p)
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="seeds to aggregate (default: every seed found in the run store, or 0)")
    p.add_argument("--out", metavar="FILE", default=None,
                   help="where to write (default: <output-dir>/<profile>/report.html)")
    _add_set(p)
    _add_dirs(p)
    p.set_defaults(func=cmd_report)


def _add_config_parser(sub) -> None:
    """``acl config``: the resolved config as YAML (``cmd_config``)."""
    p = sub.add_parser("config", help="print the resolved config as YAML",
                       description="Resolve and validate a profile plus overrides; print YAML.")
    _add_profile(p)
    _add_set(p)
    p.add_argument("--seed", type=int, default=None, help="seed to resolve the config for (default: the profile's)")
    p.set_defaults(func=cmd_config)


def _add_eval_parser(sub) -> None:
    """``acl eval``: score a checkpoint into a directory of its own (``cmd_eval``)."""
    p = sub.add_parser(
        "eval",
        help="evaluate a checkpoint on the benchmark suite",
        description="Score a checkpoint on the in-domain and/or OOD benchmarks; writes metrics.json and records/ "
        "to a directory of its own (--out), never into a run of the run store: the pipeline's own evaluations are "
        "the runs <run>/eval/.",
    )
    p.add_argument("--model", required=True, metavar="DIR", help="checkpoint directory (HF format) to evaluate")
    _add_profile(p, default="mini")
    p.add_argument("--suites", choices=["in_domain", "ood", "all"], default=None,
                   help="benchmarks to run (default: the config's eval.suites)")
    p.add_argument("--k", type=int, default=None,
                   help="samples per task, avg@k, for every benchmark (default: the config's eval.k, or a benchmark's "
                        "own eval.limits.<benchmark>.k)")
    p.add_argument(
        "--out", metavar="DIR", default=None,
        help="where metrics.json, records/ and eval_config.yaml go, written together (a temporary directory renamed "
        "into place); an earlier acl eval output there is replaced. Refused inside a run directory of the run store. "
        "Default: <output_dir>/eval/<run or model name>-<UTC time>/, e.g. outputs/eval/seq_math-20250101T120000Z/",
    )
    _add_set(p)
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    p.set_defaults(func=cmd_eval)


def _add_env_parser(sub) -> None:
    """``acl env retail replay``: the environments' tools (``cmd_retail_replay``)."""
    p = sub.add_parser("env", help="environment tools", description="Tools for the mini-world environments.")
    env_sub = p.add_subparsers(dest="env", metavar="ENV", required=True)
    retail = env_sub.add_parser("retail", help="the e-commerce (tau2 retail schema) environment")
    retail_sub = retail.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = retail_sub.add_parser(
        "replay",
        help="replay each task's gold actions on a fresh copy of the database",
        description="Replay every task's gold actions on a fresh copy of the retail database and write one JSON line "
        "per task (final database hash, tool outputs) to --out.",
    )
    r.add_argument("--db", required=True, metavar="PATH", help="retail database JSON (tau2 retail schema)")
    r.add_argument("--tasks", required=True, metavar="PATH", help="tasks JSON with gold actions")
    r.add_argument("--out", required=True, metavar="OUT.jsonl", help="output JSON lines")
    r.set_defaults(func=cmd_retail_replay)


def _add_data_parser(sub) -> None:
    """``acl data prepare`` / ``acl data check``: the paper profile's data sets."""
    p = sub.add_parser(
        "data", help="prepare and check the paper profile's data sets (worlds.data_dir)",
        description="The real data sets the paper profile reads, in the layout its loaders expect (README, 'Real "
        "data'): `prepare` downloads and converts them (hub access needed; GPQA-Diamond is gated), `check` reports "
        "what is present, missing, malformed or modified before any GPU time is spent.",
    )
    data_sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    d = data_sub.add_parser("prepare", help="download and convert every data set into --data-dir, with MANIFEST.json",
                            description="Download (Hugging Face Hub, tau2-bench on GitHub) and convert every data "
                            "set of the paper profile into --data-dir; writes MANIFEST.json (sha256 per file). Exit 1 "
                            "when a data set failed (the others are still prepared).")
    d.add_argument("--data-dir", required=True, metavar="DIR",
                   help="the paper profile's worlds.data_dir (e.g. data/paper)")
    d.add_argument("--only", nargs="+", metavar="NAME", default=None,
                   help="prepare only these data sets (math_dapo aime26 gpqa mmlu_redux flashrag wiki_corpus "
                   "tau2_retail tau2_mock tau2_telecom ifeval ifbench if_train)")
    d.set_defaults(func=cmd_data_prepare)
    d = data_sub.add_parser("check",
                            help="report present / missing / malformed / modified files; exit 1 unless complete",
                            description="Check every file the paper profile reads under --data-dir: present, in its "
                            "schema (required fields; first 1000 rows unless --full), unchanged since prepare "
                            "(MANIFEST.json). Exit 0 only when all are ok.")
    d.add_argument("--data-dir", required=True, metavar="DIR", help="the paper profile's worlds.data_dir")
    d.add_argument("--full", action="store_true", help="check every row of every file (slow for the corpus)")
    d.add_argument("--skip-checksums", action="store_true", help="do not compare sha256 sums with MANIFEST.json")
    d.set_defaults(func=cmd_data_check)


def _add_nbstrip_parser(sub) -> None:
    """``acl nbstrip``: strip outputs from notebooks before commit (``cmd_nbstrip``)."""
    p = sub.add_parser(
        "nbstrip",
        help="strip outputs and execution counts from notebooks before commit",
        description="Remove outputs, execution counts and papermill metadata from notebooks in place.",
    )
    p.add_argument("paths", nargs="*", help="notebooks to clean (default: notebooks/*.ipynb)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook would change")
    p.set_defaults(func=cmd_nbstrip)


def build_parser() -> argparse.ArgumentParser:
    """The ``acl`` parser: one ``_add_<command>_parser`` per subcommand, in the order ``acl --help`` lists them."""
    parser = argparse.ArgumentParser(
        prog="acl",
        description="ACLArena suite: run the study's notebooks headlessly, inspect runs and configs, evaluate "
        "checkpoints.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_run_parser(sub)
    _add_status_parser(sub)
    _add_report_parser(sub)
    _add_config_parser(sub)
    _add_eval_parser(sub)
    _add_env_parser(sub)
    _add_data_parser(sub)
    _add_nbstrip_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


# --- helpers ---------------------------------------------------------------------------------------------


def _err(msg: str) -> None:
    print(f"acl: error: {msg}", file=sys.stderr)


def _load(profile: str, overrides: list[str], seed: int | None):
    """load_config, or print the ConfigError and exit with EXIT_USAGE."""
    from acl_lib.config import ConfigError, load_config

    try:
        return load_config(profile, overrides, seed=seed)
    except ConfigError as exc:
        _err(str(exc))
        raise SystemExit(EXIT_USAGE) from None


def _dir_overrides(args) -> list[str]:
    """--output-dir/--papermill-dir become config overrides, as absolute paths so notebooks agree on them."""
    extra = []
    if getattr(args, "output_dir", None):
        extra.append(f"output_dir={Path(args.output_dir).resolve()}")
    if getattr(args, "papermill_dir", None):
        extra.append(f"papermill_dir={Path(args.papermill_dir).resolve()}")
    return extra


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


# --- commands -----------------------------------------------------------------------------------------------


def _writable_dir(path: Path, what: str) -> str | None:
    """Create ``path`` (and parents) and write a file in it; why that failed, or None. Run before any
    notebook starts, so a read-only or impossible location fails in a second, not after a kernel started."""
    import tempfile

    for d in (path, *path.parents):
        if d.exists():
            if not d.is_dir():
                return f"{what} {path}: {d} is a file, not a directory"
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return f"{what} {path}: cannot write there ({exc.strerror or exc})"
    return None


def _hold_run_locks(cfgs: dict, profile: str, stack) -> str | None:
    """Take the ``acl run`` lock of every seed's output directory (``<seed_dir>/.locks/acl-run.lock``) for the
    whole command; a message naming the process that holds one, or None. Two ``acl run`` on one output
    directory would train the same runs at once and overwrite each other's executed notebooks."""
    from acl_lib.runs import LOCKS, Busy, hold_lock

    for seed, cfg in cfgs.items():
        lock = cfg.seed_dir() / LOCKS / "acl-run.lock"
        try:
            stack.enter_context(hold_lock(lock, {"command": " ".join(["acl", *sys.argv[1:]])[:500]}))
        except Busy as exc:
            h = exc.holder
            who = f"pid {h.get('pid')} on {h.get('host')}" if h.get("pid") else "another process"
            return (f"{cfg.seed_dir()} (profile {profile}, seed {seed}) is in use by another acl run ({who}, since "
                    f"{h.get('started_at', '?')}: {h.get('command', '?')}). Two runs on one output directory would "
                    f"train the same runs at once; wait for it to finish, stop it, or give another --output-dir.")
    return None


def cmd_run(args) -> int:
    """``acl run``: every check on the arguments (exit 2), the seeds' locks, then the notebooks, one after another
    or ``--jobs N`` side by side (``acl_lib.scheduler``)."""
    from acl_lib import notebooks as nbs
    from acl_lib import scheduler

    overrides = list(args.overrides) + _dir_overrides(args)
    if args.jobs < 1:
        _err(f"--jobs {args.jobs}: give 1 or more (the number of notebooks run at once)")
        return EXIT_USAGE
    # Validate every seed's config before any notebook starts: a typo fails here, in seconds.
    cfgs = {seed: _load(args.profile, overrides, seed) for seed in args.seeds}
    from acl_lib import versions

    try:
        versions.require()  # a training stack the suite is not written against fails here too
    except RuntimeError as exc:
        _err(str(exc))
        return EXIT_USAGE
    nb_dir = Path(args.notebooks_dir)
    if not nb_dir.is_dir():
        _err(f"--notebooks-dir {nb_dir}: no such directory")
        return EXIT_USAGE
    try:
        # opt-in notebooks (metadata.acl.opt_in: the curriculum orders) run only when named with --only
        notebooks = nbs.default_notebooks(nbs.list_notebooks(args.notebooks_dir, args.only), args.only)
    except ValueError as exc:
        _err(str(exc))
        return EXIT_USAGE
    if not notebooks:
        _err(f"no notebooks named NN_name.ipynb in {args.notebooks_dir}")
        return EXIT_USAGE
    for seed, cfg in cfgs.items():
        problem = _writable_dir(cfg.seed_dir(), "--output-dir") or _writable_dir(
            Path(cfg.papermill_dir) / args.profile / f"seed{seed}", "--papermill-dir")
        if problem:
            _err(problem)
            return EXIT_USAGE
    with ExitStack() as locks:
        # a child of --jobs N runs under its parent's locks (the runs it trains take their own)
        problem = None if args.held_lock else _hold_run_locks(cfgs, args.profile, locks)
        if problem:
            _err(problem)
            return EXIT_USAGE
        with _png_decided():
            if args.jobs == 1:
                return scheduler.run_in_order(args, cfgs, notebooks, overrides)
            over_seeds = [nb for nb in notebooks if nbs.across_seeds(nb)]
            rc = scheduler.run_side_by_side(args, cfgs, notebooks, overrides)
            return rc or (scheduler.run_in_order(args, cfgs, over_seeds, overrides) if over_seeds else 0)


def cmd_status(args) -> int:
    from acl_lib import notebooks as nbs
    from acl_lib.runs import COMPLETE, CONFIG, SUPERSEDED, _read_json, disk_status

    base = _load(args.profile, _dir_overrides(args), None)
    for what, d in (("--notebooks-dir", Path(args.notebooks_dir)), ("--output-dir", Path(base.output_dir)),
                    ("--papermill-dir", Path(base.papermill_dir))):
        if d.exists() and not d.is_dir():
            _err(f"{what} {d}: a file, not a directory")
            return EXIT_USAGE
    if not Path(args.notebooks_dir).is_dir():
        _err(f"--notebooks-dir {args.notebooks_dir}: no such directory")
        return EXIT_USAGE
    out_root = Path(base.output_dir) / args.profile
    pm_root = Path(base.papermill_dir) / args.profile
    seeds = args.seeds
    if seeds is None:
        found = {int(p.name[4:]) for root in (out_root, pm_root) if root.is_dir() for p in root.glob("seed*")
                 if p.name[4:].isdigit()}
        seeds = sorted(found) or [0]

    rows = []
    for seed in seeds:
        seed_dir = out_root / f"seed{seed}"
        run_dirs = sorted(
            p.parent
            for p in seed_dir.rglob(CONFIG)
            if SUPERSEDED not in p.relative_to(seed_dir).parts and "checkpoints" not in p.relative_to(seed_dir).parts
        ) if seed_dir.is_dir() else []
        if not run_dirs:
            rows.append([str(seed), "(no runs)", "missing", "", "", ""])
        for d in run_dirs:
            done = _read_json(d / COMPLETE) or {}
            rows.append([str(seed), str(d.relative_to(seed_dir)), disk_status(d), done.get("config_hash", ""),
                         done.get("finished_at", ""), fmt_duration(done.get("duration_s"))])
    print(f"Runs in {out_root}/")
    print(_table(["seed", "run", "status", "config", "finished", "took"], rows))

    notebooks = nbs.list_notebooks(args.notebooks_dir)
    rows = []
    for seed in seeds:
        for nb in notebooks:
            if nbs.across_seeds(nb):
                continue
            path = nbs.executed_path(base.papermill_dir, args.profile, seed, nb)
            state, duration = nbs.notebook_state(path)
            rows.append([str(seed), nb.name, state, fmt_duration(duration), str(path) if state != "not run" else ""])
    for nb in notebooks:
        if nbs.across_seeds(nb):
            path = nbs.across_seeds_path(base.papermill_dir, args.profile, nb)
            state, duration = nbs.notebook_state(path)
            rows.append(["all", nb.name, state, fmt_duration(duration), str(path) if state != "not run" else ""])
    print(f"\nNotebooks in {args.notebooks_dir}/ (executed copies in {pm_root}/)")
    print(_table(["seed", "notebook", "state", "took", "executed copy"], rows) if rows else "(no notebooks)")
    return 0


def cmd_report(args) -> int:
    from acl_lib.report import seeds_on_disk, write_report

    overrides = list(args.overrides) + _dir_overrides(args)
    base = _load(args.profile, overrides, None)
    seeds = seeds_on_disk(base) if args.seeds is None else args.seeds
    for seed in seeds:
        _load(args.profile, overrides, seed)  # a config error is a usage error, reported before anything is read
    out = write_report(args.profile, seeds, overrides, path=args.out)
    print(f"acl report: {out} (profile {args.profile}, seeds {' '.join(map(str, seeds))})")
    return 0


def cmd_config(args) -> int:
    import yaml

    cfg = _load(args.profile, args.overrides, args.seed)
    sys.stdout.write(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return 0


def cmd_eval(args) -> int:
    """``acl eval``: score a checkpoint with ``acl_lib.eval.harness.evaluate`` into a directory of its own.

    Every check that can fail on the arguments (config, --k, --model, --out, the user simulator) runs before any
    scoring and exits with code 2 and a one-paragraph message. The results (``metrics.json``, ``records/``,
    ``eval_config.yaml``) are written into a temporary directory beside ``out`` and renamed into place when
    complete, so ``out`` never mixes the records of one evaluation with the metrics of another.
    """
    import os

    import yaml

    # inside the command: the harness loads pydantic (and torch with a model), which `acl --help` must not
    from acl_lib.atomic import atomic_dir
    from acl_lib.config import ConfigError
    from acl_lib.envs import benchmarks_for
    from acl_lib.envs.llm_user import preflight
    from acl_lib.eval import harness, policies
    from acl_lib.seeding import seed_and_threads

    def usage(msg: str) -> None:
        _err(msg)
        raise SystemExit(EXIT_USAGE)

    if args.k is not None and args.k < 1:
        usage(f"--k must be at least 1 (samples per task), got {args.k}")
    cfg = _load(args.profile, getattr(args, "overrides", None) or [], getattr(args, "seed", None))
    problem = harness.model_dir_problem(args.model)
    if problem:
        usage(problem)
    out = (Path(args.out).expanduser() if getattr(args, "out", None)
           else harness.default_out_dir(args.model, cfg.output_dir))
    problem = harness.out_dir_problem(out)
    if problem:
        usage(problem)
    try:  # the real desks' user simulator (worlds.user_sim): configured, reachable in principle, key present
        # here, before the checkpoint is loaded and as a usage error; evaluate() is told not to check it again
        preflight(cfg.worlds, {b.env for b in benchmarks_for(args.suites or cfg.eval.suites)})
    except ConfigError as exc:
        usage(str(exc))

    policy = None
    if args.model not in ("expert", "null"):
        # as evaluate() does for a model it loads itself: the same samples whatever ran before
        seed_and_threads(cfg.seed, cfg.torch_threads)
        try:
            policy = policies.make_policy(args.model, cfg)
        except Exception as exc:  # a bad checkpoint is a usage error, reported in one paragraph
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            usage(f"--model {args.model}: cannot load it as a checkpoint ({type(exc).__name__}: {first})")
    with atomic_dir(out) as tmp:
        mask = os.umask(0)
        os.umask(mask)
        tmp.chmod(0o777 & ~mask)  # a temporary directory is private; the results are not
        try:
            metrics = harness.evaluate(cfg, args.model, tmp, suites=args.suites, k=args.k, policy=policy,
                                       user_sim_checked=True)
        finally:
            if hasattr(policy, "close"):
                policy.close()
        (tmp / "eval_config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    print(harness.format_scores(metrics))
    print(f"metrics: {out / 'metrics.json'}  records: {out / 'records'}  ({metrics['elapsed_s']:.1f} s)")
    return 0


def cmd_retail_replay(args) -> int:
    from acl_lib.envs.retail import replay_cli

    return replay_cli(args)


def cmd_data_prepare(args) -> int:
    from acl_lib.paper_data import cli_prepare

    return cli_prepare(args)


def cmd_data_check(args) -> int:
    from acl_lib.paper_data import cli_check

    return cli_check(args)


def cmd_nbstrip(args) -> int:
    from acl_lib import notebooks as nbs

    paths = [Path(p) for p in args.paths] or sorted(Path("notebooks").glob("*.ipynb"))
    for p in paths:
        problem = None
        if not p.is_file():
            problem = "no such file" if not p.exists() else "not a file"
        else:
            try:
                nb = json.loads(p.read_text())
                if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
                    problem = "not a notebook (no cells)"
            except (OSError, ValueError) as exc:
                problem = f"not a notebook ({type(exc).__name__}: {str(exc)[:120]})"
        if problem:
            _err(f"nbstrip {p}: {problem}; nothing was changed")
            return EXIT_USAGE
    dirty = []
    for p in paths:
        if args.check:
            import shutil
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                copy = Path(tmp) / p.name
                shutil.copyfile(p, copy)
                if nbs.strip_outputs(copy):
                    dirty.append(p)
        elif nbs.strip_outputs(p):
            dirty.append(p)
    verb = "would strip" if args.check else "stripped"
    for p in dirty:
        print(f"{verb}: {p}")
    print(f"{len(paths)} notebook(s) checked, {len(dirty)} {verb}")
    return EXIT_FAILED if (args.check and dirty) else 0


if __name__ == "__main__":
    sys.exit(main())
