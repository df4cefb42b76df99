"""acl_lib: the thin library behind the ACLArena notebooks (config, run store, environments, training, eval).

Importing the package is cheap on purpose (no torch, no transformers): submodules are imported where used,
so ``acl --help`` answers instantly.
"""

__version__ = "0.1.0"

import warnings as _warnings

from acl_lib.seeding import pin_cpu_kernels as _pin_cpu_kernels

_pin_cpu_kernels()  # before torch loads: the same CPU kernels on every x86 processor (see acl_lib.seeding)

# tqdm.auto, imported by transformers and TRL, warns in every kernel without ipywidgets; the suite draws its
# own progress lines (acl_lib.progress), so the warning says nothing a user can act on.
_warnings.filterwarnings("ignore", message="IProgress not found")
