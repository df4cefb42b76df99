"""Run a training job in-process, as several processes under DeepSpeed, or on several nodes.

    summary = launch(cfg, "sft", out_dir, model_dir=..., dataset=...)   # the same call at every scale

``cfg.launcher.mode`` picks how:

* ``in_process``: call the job function here (notebooks on CPU; the default).
* ``multi_process``: ``deepspeed --num_accelerators <num_processes> --module acl_lib.train.entry ...`` on this
  machine, every worker under the DeepSpeed ZeRO config of ``cfg.launcher.zero_stage`` (on a machine without
  GPUs, DeepSpeed's CPU accelerator: ``DS_ACCELERATOR=cpu``, gloo/ccl collectives). Blocks until the job ends;
  its output goes to ``<out_dir>/launch/job.log``.
* ``multi_node``: writes ``<out_dir>/launch/deepspeed.sh`` (hostfile-based ``deepspeed --hostfile ... --num_nodes
  --num_gpus``) and ``<out_dir>/launch/slurm.sbatch`` (one ``srun`` task per node running ``accelerate launch`` with
  the node's machine rank and the first node's address from ``scontrol``), then runs the first it can:
  the hostfile script if ``cfg.launcher.hostfile`` exists, else ``sbatch --wait`` if Slurm is there. Neither:
  it raises, naming the scripts to run by hand.

Job arguments must be JSON-serialisable (paths, names, lists of strings): workers read them from
``<out_dir>/launch/job.json`` with the resolved config and the output directory. The launcher knows nothing
of the run store: whoever owns ``out_dir`` marks and cleans it.
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib.config import project_root
from acl_lib.seeding import threads_per_rank
from acl_lib.train.common import DS_CONFIG_ENV, TRAIN_SUMMARY

if TYPE_CHECKING:
    from acl_lib.config import Config

CONFIG_DIR = Path(__file__).parent / "deepspeed_configs"
LAUNCH_DIR = "launch"


# job name -> "module:function" (resolved when the job runs: the consolidations sit above this layer and are
# never imported here). MLE's experts are adapters on a frozen backbone.
JOBS = {
    "pretrain": "acl_lib.train.pretrain:train_pretrain",
    "sft": "acl_lib.train.sft:train_sft",
    "grpo": "acl_lib.train.grpo:train_grpo",
    "mmopd": "acl_lib.consolidate.mmopd.training:train_mmopd",
    "lora_sft": "acl_lib.consolidate.mle.experts:train_lora_sft",
    "lora_grpo": "acl_lib.consolidate.mle.experts:train_lora_grpo",
}


def job_function(job: str):
    """The library function of a job name (``JOBS``): ``pretrain``, ``sft``, ``grpo``, ``mmopd`` (distillation),
    ``lora_sft`` and ``lora_grpo`` (MLE's experts)."""
    if job not in JOBS:
        raise ValueError(f"unknown job '{job}'; jobs are {', '.join(JOBS)}")
    module, name = JOBS[job].split(":")
    return getattr(importlib.import_module(module), name)


def deepspeed_config(cfg: Config) -> Path:
    """The shipped ZeRO config file for ``cfg.launcher`` (stage 3 -> ZeRO-3 bf16; otherwise ZeRO-2)."""
    return CONFIG_DIR / ("zero3_bf16.json" if cfg.launcher.zero_stage == 3 else "zero2_cpu.json")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_model(name: str) -> str:
    """``name`` itself when it is a directory here, else, for a hub id (``Qwen/Qwen3-8B-Base``), the local snapshot
    the hub cache holds (``snapshot_download(local_files_only=True)``): a worker on another node then loads a path
    (on the shared file system) instead of resolving an id, which needs the hub, or the same cache and
    ``HF_HUB_OFFLINE``. A name the cache does not hold is returned unchanged (the worker resolves it as before)."""
    if Path(name).expanduser().exists() or name.count("/") != 1:
        return name
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached (or not a hub id): leave it to the worker
        return name


def _local_models(job_args: dict) -> dict:
    """``job_args`` with every model argument (``*_dir``, ``*_dirs``) passed through ``local_model``."""
    out = dict(job_args)
    for key, value in job_args.items():
        if key.endswith("_dir") and isinstance(value, str):
            out[key] = local_model(value)
        elif key.endswith("_dirs") and isinstance(value, list):
            out[key] = [local_model(v) if isinstance(v, str) else v for v in value]
    return out


def write_job(cfg: Config, job: str, out_dir, job_args: dict) -> Path:
    """``<out_dir>/launch/job.json``: what a worker needs to rebuild the call (config, job, args, output dir).
    Hub ids among the model arguments are written as their local snapshots (``local_model``)."""
    d = Path(out_dir) / LAUNCH_DIR
    d.mkdir(parents=True, exist_ok=True)
    spec = {"job": job, "args": _local_models(job_args), "out_dir": str(Path(out_dir).resolve()),
            "config": cfg.to_dict()}
    path = d / "job.json"
    path.write_text(json.dumps(spec, indent=2))
    return path


def entry_args(job_file: Path, ds_config: Path | None = None) -> list[str]:
    """The worker's module and arguments. ``ds_config``: the ZeRO config passed on the command line, which every
    launcher hands to every worker on every node (environment variables do not all travel: see ``env_file``)."""
    args = ["--module", "acl_lib.train.entry", "--job-file", str(job_file)]
    return args + (["--deepspeed-config", str(ds_config)] if ds_config is not None else [])


def deepspeed_local_command(cfg: Config, job_file: Path, port: int | None = None) -> list[str]:
    """``deepspeed`` on this machine with ``cfg.launcher.num_processes`` workers."""
    exe = shutil.which("deepspeed") or str(Path(sys.executable).parent / "deepspeed")
    return [exe, "--num_accelerators", str(cfg.launcher.num_processes), "--master_port", str(port or _free_port()),
            "--no_local_rank", *entry_args(job_file)]


def worker_env(cfg: Config, ds_config: Path) -> dict:
    """Environment of the launched workers: the DeepSpeed config, CPU accelerator without GPUs, thread caps."""
    env = dict(os.environ)
    env.update(job_env(cfg, ds_config))
    import torch

    if not torch.cuda.is_available():  # DeepSpeed would otherwise look for a GPU accelerator and fail
        env["DS_ACCELERATOR"] = "cpu"
    if "OMP_NUM_THREADS" in os.environ:  # the user's own cap wins
        env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
    # Workers import acl_lib from this checkout even when it is not pip-installed.
    env["PYTHONPATH"] = env["PYTHONPATH"] + (os.pathsep + os.environ["PYTHONPATH"]
                                             if os.environ.get("PYTHONPATH") else "")
    return env


def job_env(cfg: Config, ds_config: Path) -> dict[str, str]:
    """The variables every worker of a launched job needs, on whichever node it runs: the ZeRO config, the
    checkout on ``PYTHONPATH``, quiet tokenizers / TRL, and OpenMP threads per rank (a node's ``torch_threads``
    over its ``launcher.num_processes`` ranks). With ``torch_threads: 0`` (all cores) no count is written here,
    where the launching machine may be a login node: each worker sets torch's threads from its own node's cores
    (``common.set_threads``)."""
    root = str(Path(__file__).resolve().parents[2])
    env = {DS_CONFIG_ENV: str(ds_config), "PYTHONPATH": root, "TOKENIZERS_PARALLELISM": "false",
           "TRL_EXPERIMENTAL_SILENCE": "1"}
    if cfg.torch_threads:
        env["OMP_NUM_THREADS"] = str(threads_per_rank(cfg.torch_threads, cfg.launcher.num_processes))
    return env


# Variables of the launching shell that workers on other nodes need and DeepSpeed's runner does not forward:
# the hub cache and offline switches (an offline node cannot resolve a model id without them), the hub token,
# vLLM's settings, and (forwarded_env) the variables the config names as holding API keys.
FORWARD_NAMES = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE",
                 "HF_TOKEN", "HF_ENDPOINT")
FORWARD_PREFIXES = ("VLLM_",)


def forwarded_env(cfg: Config, environ=None) -> dict[str, str]:
    """The variables of ``environ`` (default ``os.environ``) that the env file carries to the other nodes:
    ``FORWARD_NAMES``, every ``VLLM_*``, and the key variables the config names (``worlds.user_sim.api_key_env``:
    the simulated customer's key, without which retail GRPO fails at its first reset; ``sft.teacher_api_key_env``)."""
    environ = os.environ if environ is None else environ
    names = set(FORWARD_NAMES) | {k for k in environ if k.startswith(FORWARD_PREFIXES)}
    names |= {n for n in (cfg.worlds.user_sim.api_key_env, cfg.sft.teacher_api_key_env) if n}
    return {k: environ[k] for k in sorted(names) if k in environ}


def env_file(cfg: Config, ds_config: Path, path: Path, environ=None) -> Path:
    """Write ``job_env`` and ``forwarded_env`` as a DeepSpeed environment file (``KEY=VALUE`` per line) at
    ``path``, readable by its owner only (mode 0600: it may hold API keys; nothing prints or logs its content).

    DeepSpeed's multi-node runner (``deepspeed/launcher/runner.py``) forwards to the other nodes only the
    variables whose names start with ``MLFLOW``, ``PYTHON``, ``MV2``, ``UCX`` (and ``NCCL`` on CUDA) plus those
    listed in ``.deepspeed_env`` (read from ``~`` and the current directory, or from ``$DS_ENV_FILE``): an
    ``export ACL_DEEPSPEED_CONFIG=...`` before ``deepspeed`` reaches the first node's workers only. The scripts
    set ``DS_ENV_FILE`` to this run's own file, so concurrent jobs never share one. (The runner passes the file's
    variables to pdsh as ``export KEY=VALUE;`` on the remote command line: a key is visible there to the nodes'
    process lists, as DeepSpeed does it. Slurm's ``srun`` passes the environment itself and needs no file.)"""
    lines = []
    values = {k: v for k, v in job_env(cfg, ds_config).items() if k != "PYTHONPATH"}  # PYTHON*: forwarded already
    values.update(forwarded_env(cfg, environ))
    for key, value in values.items():
        if "\n" in value:
            raise ValueError(f"{key}: a DeepSpeed environment file holds one variable per line, its value has a "
                             "line break")
        lines.append(f"{key}={value}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # an older file of looser mode keeps its mode through O_TRUNC
        f.write("".join(lines))
    return path


def hostfile_path(cfg: Config) -> Path | None:
    """``launcher.hostfile`` as an absolute path (a relative one is taken from the suite's checkout, as the run
    store's ``output_dir`` is: a notebook in JupyterLab runs in ``notebooks/``), or None when unset."""
    if not cfg.launcher.hostfile:
        return None
    p = Path(cfg.launcher.hostfile).expanduser()
    return p if p.is_absolute() else project_root() / p


def multi_node_scripts(cfg: Config, job_file: Path, out_dir) -> dict[str, Path]:
    """Write the hostfile ``deepspeed`` script and the Slurm batch script into ``<out_dir>/launch/``."""
    L = cfg.launcher
    d = Path(out_dir) / LAUNCH_DIR
    ds_config = deepspeed_config(cfg)
    hostfile = hostfile_path(cfg) or d / "hostfile"
    root = Path(__file__).resolve().parents[2]
    # The first node's own processes see these exports; the other nodes get the same variables from the
    # environment file (hostfile launch) or from srun, which passes the batch script's environment on (Slurm).
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in job_env(cfg, ds_config).items()
                      if k != "PYTHONPATH")
    exports += f"export PYTHONPATH={shlex.quote(str(root))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
    ds_env = env_file(cfg, ds_config, d / "deepspeed_env")
    ds_cmd = ["deepspeed", "--hostfile", str(hostfile), "--num_nodes", str(L.num_nodes), "--num_gpus",
              str(L.num_processes), "--no_local_rank", *entry_args(job_file, ds_config)]
    free_port = (f"{shlex.quote(sys.executable)} -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); "
                 "print(s.getsockname()[1])'")
    port = str(L.master_port) if L.master_port else f"$({free_port})"
    # the hostfile's first host: its first field on the first line that is neither blank nor a comment
    first_host = f"$(awk 'NF && $1 !~ /^#/ {{print $1; exit}}' {shlex.quote(str(hostfile))})"
    rendezvous = (f"MASTER_ADDR={shlex.quote(L.master_addr) if L.master_addr else first_host}\n"
                  f"MASTER_PORT={port}\n")
    # The `deepspeed` on PATH, else the one beside the interpreter that wrote the script (a venv that is not
    # activated, as under `make`: a bare `deepspeed` was "command not found").
    ds_exe = str(Path(sys.executable).parent / "deepspeed")
    ds = d / "deepspeed.sh"
    ds.write_text("#!/bin/bash\n# Hostfile launch: 'node-1 slots=8' per line; deepspeed reaches the nodes by ssh.\n"
                  "# DeepSpeed forwards to the other nodes only a few variables and those of $DS_ENV_FILE (see\n"
                  "# acl_lib.train.launcher.env_file); the ZeRO config also travels as --deepspeed-config.\n"
                  f"set -euo pipefail\ncd {shlex.quote(str(root))}\n{exports}"
                  f"export DS_ENV_FILE={shlex.quote(str(ds_env.resolve()))}\n"
                  f"DEEPSPEED=$(command -v deepspeed || echo {shlex.quote(ds_exe)})\n{rendezvous}"
                  + '"$DEEPSPEED" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" '
                  + " ".join(shlex.quote(a) for a in ds_cmd[1:]) + "\n")
    acc_cfg = d / "accelerate.yaml"
    acc_cfg.write_text(
        "# accelerate + DeepSpeed plugin; machine rank and main process address are passed per node by srun.\n"
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
        f"deepspeed_config:\n  deepspeed_config_file: {ds_config}\n  deepspeed_multinode_launcher: standard\n"
        f"num_machines: {L.num_nodes}\nnum_processes: {L.num_nodes * L.num_processes}\n"
        "main_training_function: main\nrdzv_backend: static\nsame_network: true\nuse_cpu: false\n")
    partition = f"#SBATCH --partition={L.slurm_partition}\n" if L.slurm_partition else ""
    sb = d / "slurm.sbatch"
    sb.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --job-name=acl-{Path(out_dir).name}\n"
        f"#SBATCH --nodes={L.num_nodes}\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node={L.num_processes}\n"
        f"#SBATCH --time={L.slurm_time}\n{partition}"
        f"#SBATCH --output={d}/slurm-%j.out\n"
        f"set -euo pipefail\ncd {shlex.quote(str(root))}\n{exports}"
        + (f"MAIN_IP={shlex.quote(L.master_addr)}\n" if L.master_addr
           else 'MAIN_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n')
        + f"MAIN_PORT={port}  # the batch script runs on the allocation's first node\n"
        "srun bash -c 'accelerate launch "
        f"--config_file {shlex.quote(str(acc_cfg))} --machine_rank $SLURM_NODEID "
        "--main_process_ip '\"$MAIN_IP\"' --main_process_port '\"$MAIN_PORT\"' "
        f"--module acl_lib.train.entry --job-file {shlex.quote(str(job_file))} "
        f"--deepspeed-config {shlex.quote(str(ds_config))}'\n")
    return {"deepspeed": ds, "slurm": sb, "accelerate_config": acc_cfg, "deepspeed_env": ds_env}


def _run_logged(cmd: list[str], env: dict, log: Path) -> None:
    with log.open("w") as f:
        f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        raise RuntimeError(f"training job failed (exit {proc.returncode}); last lines of {log}:\n{tail}")


def launch(cfg: Config, job: str, out_dir, **job_args) -> dict:
    """Run ``job`` (``pretrain`` / ``sft`` / ``grpo``) into ``out_dir`` as ``cfg.launcher.mode`` says.

    Returns the job's summary (``<out_dir>/train_summary.json``); the model is in ``<out_dir>/model``.
    """
    from acl_lib import versions

    mode = cfg.launcher.mode
    fn = job_function(job)  # fail on a bad job name before anything is written
    versions.require()  # and on a training stack the suite is not written against
    if mode == "in_process":
        return fn(cfg, out_dir=out_dir, **job_args)
    job_file = write_job(cfg, job, out_dir, job_args)
    log = Path(out_dir) / LAUNCH_DIR / "job.log"
    if mode == "multi_process":
        env = worker_env(cfg, deepspeed_config(cfg))
        _run_logged(deepspeed_local_command(cfg, job_file), env, log)
    else:
        scripts = multi_node_scripts(cfg, job_file, out_dir)
        hostfile = hostfile_path(cfg)
        if hostfile is not None and hostfile.exists():
            _run_logged(["bash", str(scripts["deepspeed"])], dict(os.environ), log)
        elif shutil.which("sbatch"):
            _run_logged(["sbatch", "--wait", str(scripts["slurm"])], dict(os.environ), log)
        else:
            raise RuntimeError(
                f"multi_node launch: no hostfile at '{cfg.launcher.hostfile}' and no Slurm here. Run "
                f"{scripts['slurm']} (sbatch) or {scripts['deepspeed']} on the cluster, then re-run this step."
            )
    model = Path(out_dir) / "model"
    summary = Path(out_dir) / TRAIN_SUMMARY
    if not model.exists() or not summary.exists():
        raise RuntimeError(f"launched job finished but wrote no model and summary in {out_dir}; see {log}")
    return json.loads(summary.read_text())
