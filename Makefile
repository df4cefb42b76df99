# Two commands on a fresh machine with Python 3.11:
#   make run    create .venv if missing, install the suite, execute every notebook (profile mini, seed 0)
#               JOBS=2 (the default): two notebooks at a time where one does not read the other's runs
#               (acl run --jobs); SEEDS="0 1 2": the three seeds' notebooks share the two places
#   make test   create .venv if missing, install with test extras, run the test suite (everything, on 2 workers;
#               what CI runs)
#   make test-fast  the inner loop: the tests not marked `slow` (training, processes, notebooks) on 2 workers, ~3 min
#   make curriculum  notebook 13, the curriculum-order study (opt-in: four more sequences of training; not in make run)
#   make report      outputs/<profile>/report.html from the run store (notebook 12 writes it too, at the end of make run)
#   make rehearsal  the paper profile's hostfile launch on two local DeepSpeed processes (tests marked
#               `rehearsal` in tests/test_paper_rehearsal.py; the rest of that rehearsal runs in make test).
#               The first run on a machine JIT-builds DeepSpeed's CPU comm extension (~5 min, then cached).
# Both are idempotent: the install step is skipped while .venv/.installed is newer than pyproject.toml.
# GPU machines: use environment.yml (conda: CUDA torch, vllm, deepspeed) instead of this venv.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU build of torch, installed before the suite so `pip install -e .` does not pull a CUDA build.
# Here pip finds the local file (pip's find-links); elsewhere add e.g.
#   TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC     ?= torch==2.13.0
TORCH_PIP_ARGS ?=
PROFILE ?= mini
SEEDS   ?= 0
JOBS    ?= 2
PYTEST_ARGS ?=

.PHONY: run test test-fast lint rehearsal install smoke status lab nbstrip clean-venv curriculum report

run: $(STAMP)
	$(VENV)/bin/acl run --profile $(PROFILE) --seeds $(SEEDS) --jobs $(JOBS)

# Two workers (pytest-xdist): the long tests (every notebook at smoke, the two-process reproducibility run, the
# Ctrl-C and SIGKILL runs) then overlap with the rest.
test: $(STAMP) lint
	$(VENV)/bin/pytest -n 2 $(PYTEST_ARGS)

# ruff (style and likely bugs) and the library's layers contract (pyproject.toml: each module imports only
# from the layers below it, imports inside functions included)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test-fast: $(STAMP) lint
	$(VENV)/bin/pytest -m "not slow and not rehearsal" -n 2 $(PYTEST_ARGS)

# The paper profile's CPU rehearsals: the tests marked `rehearsal` (two-process DeepSpeed jobs: the hostfile GRPO
# launch, MMOPD under ZeRO-3, MLE), then the others that rehearse a cluster defect (also in make test): the env
# file through DeepSpeed's own runner, a restart past a half-written checkpoint, the context-limit guard in a real
# GRPO step, an evaluation sharded over two processes.
REHEARSALS := tests/test_paper_launch.py::test_hostfile_launch_forwards_the_zero_config_to_every_node \
	tests/test_train_checkpoints.py::test_a_run_interrupted_while_saving_resumes_from_the_last_complete_checkpoint \
	tests/test_train_rollout.py::test_grpo_trainer_rollout_stops_at_the_models_context \
	tests/test_eval_harness.py::test_a_sharded_evaluation_merges_into_the_unsharded_one

rehearsal: $(STAMP)
	$(VENV)/bin/pytest -m rehearsal tests/test_paper_rehearsal.py tests/test_mle.py $(PYTEST_ARGS)
	$(VENV)/bin/pytest $(REHEARSALS) $(PYTEST_ARGS)

install: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -e ".[test]"
	# A "python3" kernel in the venv that starts this venv's python, for papermill and JupyterLab.
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (acl-suite)"
	touch $@

smoke: $(STAMP)
	$(VENV)/bin/acl run --profile smoke --seeds $(SEEDS)

curriculum: $(STAMP)
	$(VENV)/bin/acl run --profile $(PROFILE) --seeds $(SEEDS) --only 13

report: $(STAMP)
	$(VENV)/bin/acl report --profile $(PROFILE) --seeds $(SEEDS)

status: $(STAMP)
	$(VENV)/bin/acl status --profile $(PROFILE)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

nbstrip: $(STAMP)
	$(VENV)/bin/acl nbstrip

clean-venv:
	rm -rf $(VENV)
