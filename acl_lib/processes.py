"""Stopping processes and everything they started, for Ctrl-C and for probes given up on; and running a call in a
child process of its own (``call_in_child``), so an accelerator engine's memory goes when the child ends.

A kernel, or a headless Chrome, may start processes in sessions of their own: killing one process group
misses them. ``kill_tree`` collects the descendants first (before their parent dies and they are re-parented),
then signals every process group among them and every process, SIGTERM and then SIGKILL.
"""

from __future__ import annotations

import os
import signal

import psutil


def kill_tree(pid: int, include_root: bool = True, grace_s: float = 2.0) -> list[int]:
    """SIGTERM, then after ``grace_s`` SIGKILL, process ``pid`` (unless ``include_root`` is false) and all its
    descendants, with their process groups other than ours. Returns the pids signalled."""
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + ([root] if include_root else [])
    except psutil.NoSuchProcess:
        return []
    ours = os.getpgid(0)
    groups = set()
    for p in procs:
        try:
            groups.add(os.getpgid(p.pid))
        except ProcessLookupError:
            pass
    groups.discard(ours)
    signalled = [p.pid for p in procs]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        _, procs = psutil.wait_procs(procs, timeout=grace_s)
        if not procs:
            break
    return signalled


def kill_children(grace_s: float = 2.0) -> list[int]:
    """``kill_tree`` of everything this process started (not this process)."""
    return kill_tree(os.getpid(), include_root=False, grace_s=grace_s)


def call_in_child(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a fresh Python process (``spawn``), its return value sent back (picklable).

    For work that owns an accelerator engine (a vLLM engine sampling an oracle, scoring a merge candidate): what
    the engine held on the GPU (weights, KV cache, CUDA context, its worker processes) is gone when the child
    ends, so the next engine, or the SFT job that follows in the notebook's process, finds the memory free. ``fn``
    must be importable (a module-level function); the child's output goes where this process's goes. An exception
    in the child is raised here as ``RuntimeError`` with the child's traceback; an interrupt here stops the child
    and everything it started."""
    return _in_children(fn, [(args, kwargs)], [{}], lambda i, n: "a child process")[0]


def map_in_children(fn, calls: list[tuple], envs: list[dict] | None = None) -> list:
    """``[fn(*args) for args in calls]``, each call in a fresh Python process of its own (``spawn``), all at once;
    ``envs[i]``: environment variables of child ``i`` (e.g. ``CUDA_VISIBLE_DEVICES``: one GPU each). Results come
    back in the order of ``calls``. If one child fails (an exception, or it dies) the others are stopped and a
    ``RuntimeError`` names the first that failed with its traceback; an interrupt here stops every child."""
    return _in_children(fn, [(tuple(a), {}) for a in calls], envs or [{} for _ in calls],
                        lambda i, n: f"child {i} of {n}")


def _in_children(fn, calls: list[tuple[tuple, dict]], envs: list[dict], where) -> list:
    """Start one spawned child per ``(args, kwargs)`` with its environment, collect their results in order; on
    a failure or an interrupt stop every child still running. ``where(i, n)`` names child i in the errors."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    name = getattr(fn, "__qualname__", fn)
    procs, pipes = [], []
    try:
        for (args, kwargs), env in zip(calls, envs):
            parent_end, child_end = ctx.Pipe(duplex=False)
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update({k: str(v) for k, v in env.items()})  # a spawned child starts with this environment
            try:
                proc = ctx.Process(target=_child_main, args=(child_end, fn, args, kwargs), daemon=False)
                proc.start()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            child_end.close()
            procs.append(proc)
            pipes.append(parent_end)
        results = []
        for i, (proc, pipe) in enumerate(zip(procs, pipes)):
            try:
                ok, payload = pipe.recv()
            except EOFError:  # the child died without answering (killed, out of memory)
                proc.join()
                raise RuntimeError(f"{name} in {where(i, len(procs))} ended with exit code {proc.exitcode} before "
                                   "returning") from None
            if not ok:
                raise RuntimeError(f"{name} failed in {where(i, len(procs))}:\n{payload}")
            results.append(payload)
        for proc in procs:
            proc.join()
        return results
    except BaseException:
        for proc in procs:
            if proc.is_alive():
                kill_tree(proc.pid)
        raise
    finally:
        for pipe in pipes:
            pipe.close()


def _child_main(conn, fn, args, kwargs) -> None:
    import traceback

    try:
        result = (True, fn(*args, **kwargs))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent, which raises it
        result = (False, traceback.format_exc())
    try:
        conn.send(result)
    finally:
        conn.close()
