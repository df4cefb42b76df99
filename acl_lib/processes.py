"""Stopping processes and everything they started, for Ctrl-C and for probes given up on.

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
