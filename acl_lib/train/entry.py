"""Worker entry point of launched training jobs (one process per accelerator).

    deepspeed --num_accelerators 2 --no_local_rank --module acl_lib.train.entry --job-file RUN/launch/job.json
    python -m acl_lib.train.entry --config run_config.yaml --job sft --out-dir outputs/mini/seed0/seq_search \
        --args '{"model_dir": "...", "dataset": "demos.jsonl"}'

``launcher.launch`` writes ``job.json`` (resolved config, job name, JSON arguments, output directory)
and starts this module under ``deepspeed`` / ``accelerate launch``; it can also be run by hand with a config
file (YAML or JSON of a resolved ``Config``) and a job name. Heavy imports happen in the job's function only.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import yaml

from acl_lib.config import Config
from acl_lib.train import launcher
from acl_lib.train.common import DS_CONFIG_ENV


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m acl_lib.train.entry", description=__doc__.split("\n\n")[0])
    p.add_argument("--job-file", help="job.json written by acl_lib.train.launcher (config, job, args, out_dir)")
    p.add_argument("--config", help="a resolved config (YAML or JSON), instead of --job-file")
    p.add_argument("--job", choices=["pretrain", "sft", "grpo", "mmopd"], help="with --config: the job to run")
    p.add_argument("--out-dir", help="with --config: the output directory (default: <seed dir>/<job>)")
    p.add_argument("--args", default="{}", help="with --config: the job's arguments as JSON")
    p.add_argument("--deepspeed-config", help="the ZeRO config the trainers use (multi-node launches pass it here: "
                   "DeepSpeed's runner does not forward every environment variable to the other nodes)")
    a = p.parse_args(argv)
    if a.deepspeed_config:
        if not Path(a.deepspeed_config).is_file():
            p.error(f"--deepspeed-config {a.deepspeed_config}: no such file on this node")
        os.environ[DS_CONFIG_ENV] = a.deepspeed_config  # read by common.trainer_kwargs

    if a.job_file:
        spec = json.loads(Path(a.job_file).read_text())
        cfg = Config.model_validate(spec["config"])
        out_dir = Path(spec["out_dir"])
        job, args = spec["job"], spec["args"]
    elif a.config and a.job:
        cfg = Config.model_validate(yaml.safe_load(Path(a.config).read_text()))
        out_dir = Path(a.out_dir) if a.out_dir else cfg.seed_dir() / a.job
        job, args = a.job, json.loads(a.args)
    else:
        p.error("give --job-file, or --config with --job")
    launcher.job_function(job)(cfg, out_dir=out_dir, **args)


if __name__ == "__main__":
    main()
