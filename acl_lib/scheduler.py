"""Running the notebooks of one ``acl run`` (``acl_lib.cli.cmd_run`` checks the arguments, takes the seeds' locks
and hands the notebooks to one of these).

* ``run_in_order`` (``--jobs 1``, and the final tables after ``--jobs N``): the notebooks one after another in
  this process, per seed in prefix order, then the ones that read every seed (``metadata.acl.runs =
  "once_over_seeds"``) once over all of them; a header line per notebook and below it the progress lines its
  kernel writes. A notebook whose last execution with the same parameters finished, and whose runs are all still
  complete, is skipped unless ``--re-execute``.
* ``run_side_by_side`` (``--jobs N``): every seed's per-seed notebooks, up to N at once, each in a child ``acl run
  --seeds k --only NN --held-lock`` process. A notebook starts once the notebooks of its own seed whose runs it
  reads are done (``metadata.acl.after``, else every earlier notebook: ``notebooks.prerequisites``); a free place
  goes to the ready notebook most others wait on (``notebooks.waiting_on``), then to the first seed's. The config's
  ``torch_threads`` are divided among the children running and divided again whenever one starts or ends (each
  child follows the file ``seeding.THREADS_FILE_ENV`` names). A child's lines are prefixed ``[NN]`` (one seed) or
  ``[seed k · NN]``. A failed notebook stops only the notebooks that need it.

Ctrl-C: in order, the kernel is stopped (``notebooks.execute``) and the executed copy says where; side by side,
each child runs in a process session of its own and is handed every Ctrl-C pressed here once, so each stops as a
lone ``acl run`` does, and a child interrupted on its own stops the others. The return values are ``acl run``'s
exit statuses: 0 ok, 1 a notebook failed, 130 interrupted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from acl_lib import notebooks as nbs
from acl_lib.progress import fmt_duration
from acl_lib.seeding import THREADS_FILE_ENV, available_cpus

EXIT_FAILED = 1  # acl run's exit statuses (acl_lib.cli)
EXIT_INTERRUPTED = 130


def run_in_order(args, cfgs: dict, notebooks: list[Path], overrides: list[str]) -> int:
    """Execute the notebooks in order, printing one header line per notebook and, below it, the progress
    lines its kernel writes (which run, which training step, loss or reward, time left). ``args``: ``acl run``'s
    (profile, seeds, re_execute); ``cfgs``: the config of each seed; returns 0, 1 (a notebook failed) or 130."""
    # per seed, every notebook in prefix order; then the final tables once over all the seeds (nbs.plan_jobs)
    jobs = nbs.plan_jobs(notebooks, args.seeds)
    t0 = time.time()
    skipped = 0
    for i, job in enumerate(jobs, 1):
        nb, seed = job.notebook, job.seed
        cfg = cfgs[seed]
        out = job.output(cfg.papermill_dir, args.profile)
        print(f"[{i}/{len(jobs)}] {nb.name}  (profile {args.profile}, {job.label()})", flush=True)
        params = job.parameters(args.profile, overrides)
        done = None if (args.re_execute or job.seeds is not None) else nbs.is_done(cfg.seed_dir(), nb, params, out)
        if done:
            print(f"    skipped, {done}", flush=True)
            skipped += 1
            continue
        t_nb = time.time()
        try:
            with nbs.following_progress(out.parent / f".{nb.stem}.progress", prefix="    "):
                nbs.execute(nb, out, params, progress_bar=False)
        except nbs.NotebookFailed as exc:
            print(f"\nFAILED: {nb.name} (profile {args.profile}, {job.label()})\n{exc}", file=sys.stderr)
            return EXIT_FAILED
        except KeyboardInterrupt:
            print("\n" + nbs.interrupted_message(nb, out), file=sys.stderr)
            return EXIT_INTERRUPTED
        if job.seeds is None:
            nbs.write_done(cfg.seed_dir(), nb, params, out)
        print(f"    done in {fmt_duration(time.time() - t_nb)}", flush=True)
    print(f"\nacl run: {len(jobs) - skipped} notebook(s) executed in {fmt_duration(time.time() - t0)}"
          + (f", {skipped} skipped (complete; --re-execute runs them again)" if skipped else ""))
    for seed, cfg in cfgs.items():
        executed = Path(cfg.papermill_dir) / args.profile / f"seed{seed}"
        print(f"  seed {seed}: results in {cfg.seed_dir()}/  executed notebooks in {executed}/")
    over_seeds = [job.notebook.stem for job in jobs if job.seeds is not None]
    if over_seeds:
        first = cfgs[args.seeds[0]]
        print(f"  over all seeds: {Path(first.papermill_dir) / args.profile}/ ({', '.join(over_seeds)}), report "
              f"{first.seed_dir().parent / 'report.html'}")
    print(f"  see also: acl status --profile {args.profile} --seeds {' '.join(map(str, args.seeds))}")
    return 0


def run_side_by_side(args, cfgs: dict, notebooks: list[Path], overrides: list[str]) -> int:
    """Every seed's per-seed notebooks, up to ``args.jobs`` at once, each in a child ``acl run --seeds k --only
    NN``, a notebook started as soon as the notebooks of its seed that it reads are done (``nbs.prerequisites``:
    the oracles beside stages 2-4, the consolidations beside one another). A free place goes to the ready
    notebook most others wait on (``nbs.waiting_on``), then to the first seed's, so one seed's chain of stages
    starts before another seed's last tables. This process holds the seeds' locks for its children; each run they
    train still takes its own. Returns 0, 1 if a notebook failed (those that need it are not run, the rest
    finish), or 130."""
    per_seed = [nb for nb in notebooks if not nbs.across_seeds(nb)]
    if not per_seed:
        return 0
    seeds = list(args.seeds)
    budget = cfgs[seeds[0]].torch_threads or available_cpus()
    units = [(seed, nb) for seed in seeds for nb in per_seed]
    after = {(seed, nb): [(seed, d) for d in nbs.prerequisites(nb, per_seed)] for seed, nb in units}
    waiting = nbs.waiting_on(per_seed)
    rank = {unit: i for i, unit in enumerate(units)}  # seed order, then notebook order

    def tag(unit) -> str:
        seed, nb = unit
        return nb.name[:2] if len(seeds) == 1 else f"seed {seed} · {nb.name[:2]}"

    print(f"acl run: seed{'s' if len(seeds) > 1 else ''} {' '.join(map(str, seeds))}, notebooks side by side (up "
          f"to {args.jobs} at a time, {budget} torch thread(s) shared), each started once the notebooks whose runs "
          "it reads are done", flush=True)
    t0 = time.time()
    results, interrupted = _children_side_by_side(
        units, after,
        lambda unit, threads: _child_command(args, unit[0], [unit[1].name[:2]], overrides, threads, held_lock=True),
        tag, args.jobs, budget,
        # the notebook most others wait on first (a seed's stages before another's tables), then seed order
        priority=lambda unit: (-waiting[unit[1]], rank[unit]))
    print(f"\nacl run: notebooks side by side in {fmt_duration(time.time() - t0)}", flush=True)
    for seed in seeds:
        mine = {nb.name[:2]: results.get((seed, nb)) for nb in per_seed}
        not_run = " ".join(k for k, rc in mine.items() if rc is None)
        parts = [f"{sum(rc == 0 for rc in mine.values())} ok",
                 *(f"{k} {'interrupted' if rc == 130 else f'failed (exit {rc})'}" for k, rc in mine.items()
                   if rc not in (0, None)),
                 *([f"not run: {not_run}"] if not_run else [])]
        print(f"  seed {seed}: {', '.join(parts)}", flush=True)
    if interrupted:
        print("acl run: interrupted; the same command resumes: complete runs are skipped", file=sys.stderr)
        return EXIT_INTERRUPTED
    failed = [unit for unit in units if results.get(unit, 0) != 0]
    if failed:
        not_run = [unit for unit in units if unit not in results]
        named = [u[1].name if len(seeds) == 1 else f"{u[1].name} of seed {u[0]}" for u in failed]
        print(f"acl run: {', '.join(named)} failed (its lines above, "
              f"prefixed [{tag(failed[0])}]); not run: {', '.join(tag(u) for u in not_run) or 'none'}; the final "
              "tables were not run", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _child_command(args, seed: int, prefixes: list[str], overrides: list[str], threads: int,
                   held_lock: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "acl_lib.cli", "run", "--profile", args.profile, "--seeds", str(seed),
           "--only", *prefixes, "--notebooks-dir", str(args.notebooks_dir),
           "--set", *overrides, f"torch_threads={threads}"]
    if args.re_execute:
        cmd.append("--re-execute")
    if held_lock:
        cmd.append("--held-lock")
    return cmd


def _children_side_by_side(units: list, after: dict, command, tag, jobs: int, budget: int,
                           priority) -> tuple[dict, bool]:
    """One child ``acl run`` per unit (a seed, or one notebook of a seed), up to ``jobs`` at once, each started
    once every unit in ``after[unit]`` has exited 0; ``command(unit, threads)`` is its command line. The thread
    budget is divided among the children running, and divided again whenever one starts or ends: each child's
    share is in the file its ``ACL_THREADS_FILE`` names, which its trainers and evaluations follow
    (``seeding.follow_thread_share``), so a notebook left alone takes both cores. A free place goes to the ready
    unit with the smallest ``priority(unit)``. Each child is a session of its own, so
    Ctrl-C here is handed to each child once, and a second Ctrl-C once more: they stop as a single ``acl run``
    does. Returns ``{unit: exit status}`` (a unit never started is absent) and whether it was interrupted."""
    pending, running, results = list(units), {}, {}
    interrupted = 0
    out_lock = threading.Lock()
    share_dir = Path(tempfile.mkdtemp(prefix="acl-threads-"))
    share_files: dict = {}  # unit -> the file holding its thread share
    shared_among: list = []  # the running units the shares were last computed for

    def write_share(unit, threads: int) -> None:
        tmp = share_files[unit].with_suffix(".tmp")
        tmp.write_text(f"{threads}\n")
        os.replace(tmp, share_files[unit])  # a reader sees the old number or the new one, never half a file

    def share(j: int, n: int) -> int:
        """The threads of the j-th oldest of n children running: the budget split, the oldest get the remainder."""
        return max(1, budget // n + (1 if j < budget % n else 0))

    def reshare() -> None:
        """Rewrite every running child's share when the set of children running changed."""
        units_now = list(running)
        if units_now == shared_among or not units_now:
            return
        shared_among[:] = units_now
        for j, unit in enumerate(units_now):
            write_share(unit, share(j, len(units_now)))

    def relay(stream, unit, sink) -> None:
        for line in stream:
            with out_lock:
                sink.write(f"[{tag(unit)}] {line}")
                sink.flush()

    def start(unit, threads: int) -> None:
        share_files[unit] = share_dir / f"{len(share_files)}.threads"
        write_share(unit, threads)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **{THREADS_FILE_ENV: str(share_files[unit])})
        proc = subprocess.Popen(command(unit, threads), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, bufsize=1, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        readers = [threading.Thread(target=relay, args=(proc.stdout, unit, sys.stdout), daemon=True),
                   threading.Thread(target=relay, args=(proc.stderr, unit, sys.stderr), daemon=True)]
        for r in readers:
            r.start()
        running[unit] = (proc, readers)

    t0 = time.time()

    def reap() -> None:
        for unit, (proc, readers) in list(running.items()):
            if proc.poll() is not None:
                for r in readers:
                    r.join()
                results[unit] = proc.returncode
                del running[unit]
                # where the whole run stands, for a person watching a run of hours
                how = "done" if proc.returncode == 0 else f"exit {proc.returncode}"
                done = sum(rc == 0 for rc in results.values())
                now = ", ".join(tag(u) for u in running) or "nothing"
                with out_lock:
                    print(f"acl run: [{tag(unit)}] {how} · {done} of {len(units)} notebooks done · "
                          f"{fmt_duration(time.time() - t0)} elapsed · still running: {now}", flush=True)

    def blocked(unit) -> bool:
        """A prerequisite of ``unit`` failed, or will never run (it was itself dropped)."""
        return any(results.get(d, 0) != 0 or (d not in results and d not in running and d not in pending)
                   for d in after.get(unit, ()))

    def on_sigint(signum, frame) -> None:
        nonlocal interrupted
        interrupted += 1
        for proc, _ in list(running.values()):  # each child stops as a lone `acl run` would on this Ctrl-C
            try:
                proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass

    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:  # SIGINT ignored on entry (a background job) stays ignored
        signal.signal(signal.SIGINT, on_sigint)
    try:
        while True:
            # a unit whose prerequisite failed or never ran (transitively) is dropped, never started
            pending = [u for u in pending if not blocked(u)]
            ready = sorted((u for u in pending if all(results.get(d) == 0 for d in after.get(u, ()))),
                           key=priority)
            if not interrupted and any(rc == 130 for rc in results.values()):
                # a child interrupted on its own (SIGINT sent to it, not to this process; exit 130) stops the
                # rest as a Ctrl-C here would, rather than letting the schedule run on without it
                on_sigint(signal.SIGINT, None)
            if not interrupted and ready and len(running) < jobs:
                batch = ready[:jobs - len(running)]
                n = len(running) + len(batch)
                for unit in batch:
                    pending.remove(unit)
                    start(unit, share(len(running), n))
            reshare()  # after this round's starts: a child left alone takes the whole budget
            if not running and (interrupted or not ready):
                break
            time.sleep(0.2)
            reap()
    finally:
        if previous is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, previous)
        shutil.rmtree(share_dir, ignore_errors=True)
    return results, bool(interrupted) or any(rc == 130 for rc in results.values())
