"""The releases of the training stack the suite is written against, checked before any job starts.

The suite relies on internals of these libraries that change between releases without notice: TRL's experimental
``rollout_func`` and ``environment_factory``, ``trainer.vllm_generation``, ``_generate_and_score_completions``,
``_compute_loss``, ``_get_per_token_logps_and_entropies`` and ``_metrics``; transformers' ``activation_checkpointing=``
(5.24 and later) and its cache classes; PEFT's LoRA layers (the engine computes them as PEFT does); DeepSpeed's
ZeRO-3 gathering. ``SUPPORTED`` holds the ranges it is tested with (``pyproject.toml`` carries the same,
``tests/test_versions.py`` checks it); ``environment.yml`` pins one release inside each.

``check()`` names every installed release outside its range and what to install instead; ``require()`` raises
with that list (``acl run`` and the launcher call it before any compute). ``ACL_SKIP_VERSION_CHECK=1`` turns it
into a warning for someone trying a newer release on purpose.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

SKIP_ENV = "ACL_SKIP_VERSION_CHECK"

# package -> (specifier, what in the suite depends on it being in that range)
SUPPORTED: dict[str, tuple[str, str]] = {
    "trl": (">=1.16,<1.17", "rollout_func, environment_factory, vllm_generation and the GRPO trainer's private "
                            "loss and log-probability methods"),
    "transformers": (">=5.24,<5.26", "activation_checkpointing= (5.24 and later) and the Qwen3 cache classes"),
    "peft": (">=0.21,<0.22", "LoRA layers as the engine's per-row adapters compute them"),
    "accelerate": (">=1.16,<1.17", "TRL 1.16's accelerator and DeepSpeed plugin"),
    "deepspeed": (">=0.19,<0.20", "ZeRO-3 gathering for rollouts and the launcher's configs"),
}
# vLLM is checked only where it is installed (the paper profile's GPU machines); the `gpu` extra pins it.
OPTIONAL: dict[str, tuple[str, str]] = {
    "vllm": ("==0.30.0", "TRL 1.16's colocated generation, accepting transformers 5.24-5.25"),
}


def installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def check(versions: dict[str, str | None] | None = None) -> list[str]:
    """One line per package outside its range (``versions``: package -> installed release, None = missing;
    default: what is installed here)."""
    from packaging.specifiers import SpecifierSet

    problems = []
    for table, required in ((SUPPORTED, True), (OPTIONAL, False)):
        for pkg, (spec, why) in table.items():
            have = installed(pkg) if versions is None else versions.get(pkg)
            if have is None:
                if required:
                    problems.append(f"{pkg} is not installed; the suite needs {pkg}{spec} ({why}): "
                                    f"pip install '{pkg}{spec}'")
                continue
            # a local label (+cpu) or a pre-release of a release in range is that release
            if not SpecifierSet(spec).contains(have, prereleases=True):
                problems.append(f"{pkg} {have} is installed; the suite needs {pkg}{spec} ({why}): "
                                f"pip install '{pkg}{spec}'")
    return problems


def require(versions: dict[str, str | None] | None = None) -> None:
    """Raise ``RuntimeError`` naming every package outside its range (a warning on stderr instead when
    ``ACL_SKIP_VERSION_CHECK=1``)."""
    problems = check(versions)
    if not problems:
        return
    text = "the installed training stack is not the one the suite is written against:\n  " + "\n  ".join(problems)
    if os.environ.get(SKIP_ENV) == "1":
        print(f"acl: warning: {text}\n  ({SKIP_ENV}=1: going on anyway)", file=sys.stderr)
        return
    raise RuntimeError(f"{text}\n(set {SKIP_ENV}=1 to go on anyway, at your own risk)")
