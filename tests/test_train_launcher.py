"""The launcher: DeepSpeed configs that DeepSpeed itself accepts, multi-node scripts, and a real 2-process
ZeRO-2 job on CPU.

The first multi-process DeepSpeed job on a machine JIT-builds DeepSpeed's shared-memory comm op for the CPU
accelerator (about 5 minutes on 2 cores, cached in ~/.cache/torch_extensions); later runs take ~40 s.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from acl_lib.config import load_config
from acl_lib.consolidate import mle, mmopd
from acl_lib.runs import Run, run_once
from acl_lib.train import entry, launcher, sft
from acl_lib.train.common import read_log
from train_kit import DeskEnv, desk_expert, tiny_cfg

torch.set_num_threads(1)


def _autos(tree) -> list:
    if isinstance(tree, dict):
        return [a for v in tree.values() for a in _autos(v)]
    return [tree] if tree == "auto" else []


@pytest.mark.parametrize("zero_stage,bf16", [(2, False), (3, True)])
def test_deepspeed_configs_pass_deepspeeds_validation(zero_stage, bf16, tmp_path, monkeypatch):
    """transformers fills the 'auto' values from the TrainingArguments, then DeepSpeed's own config class
    (pydantic models, extra keys forbidden) parses the result."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers import Qwen3Config, Qwen3ForCausalLM, TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    cfg = tiny_cfg(tmp_path, **{"launcher.zero_stage": zero_stage})
    path = launcher.deepspeed_config(cfg)
    args = TrainingArguments(output_dir=str(tmp_path / "x"), per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, bf16=bf16, use_cpu=True, report_to="none")
    hf = HfTrainerDeepSpeedConfig(str(path))
    hf.trainer_config_process(args)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    hf.trainer_config_finalize(args, model, num_training_steps=10)
    assert _autos(hf.config) == []
    ds = DeepSpeedConfig(hf.config)
    assert ds.zero_optimization_stage == zero_stage
    assert ds.train_batch_size == 8 and ds.bfloat16_config.enabled is bf16
    if zero_stage == 3:
        assert ds.zero_config.gather_16bit_weights_on_model_save
    # The validation is real: a misspelt ZeRO key is refused.
    broken = dict(hf.config, zero_optimization={**hf.config["zero_optimization"], "stage3_prefetch_bucketsize": 1})
    with pytest.raises(Exception, match="stage3_prefetch_bucketsize"):
        DeepSpeedConfig(broken)


def test_multi_node_scripts_for_the_paper_profile(tmp_path):
    cfg = load_config("paper", overrides={"output_dir": str(tmp_path / "outputs"), "launcher.hostfile": "",
                                          "launcher.slurm_partition": "gpu"})
    run = Run(cfg, "seq_math")
    job = launcher.write_job(cfg, "grpo", run.path, {"model_dir": "Qwen/Qwen3-8B-Base", "domain": "math"})
    scripts = launcher.multi_node_scripts(cfg, job, run.path)
    ds = scripts["deepspeed"].read_text()
    assert "--hostfile" in ds and "--num_nodes 2 --num_gpus 8" in ds and "zero3_bf16.json" in ds
    sb = scripts["slurm"].read_text()
    assert "#SBATCH --nodes=2" in sb and "#SBATCH --gpus-per-node=8" in sb and "#SBATCH --partition=gpu" in sb
    assert "scontrol show hostnames" in sb and "--machine_rank $SLURM_NODEID" in sb and "--main_process_ip" in sb
    acc = scripts["accelerate_config"].read_text()
    assert "num_machines: 2" in acc and "num_processes: 16" in acc and "distributed_type: DEEPSPEED" in acc
    for s in (scripts["deepspeed"], scripts["slurm"]):
        subprocess.run(["bash", "-n", str(s)], check=True)  # syntax
    assert '--master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"' in ds and "29500" not in ds + sb
    assert '--main_process_port \'"$MAIN_PORT"\'' in sb
    # the rendezvous lines: the hostfile's first host (comments and blank lines skipped), a free port
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# nodes\n\nnode-a slots=8\nnode-b slots=8\n")
    named = load_config("paper", overrides={"output_dir": str(tmp_path / "outputs"),
                                            "launcher.hostfile": str(hostfile)})
    lines = launcher.multi_node_scripts(named, job, run.path)["deepspeed"].read_text().splitlines()
    rendezvous = "\n".join(line for line in lines if line.startswith(("MASTER_ADDR=", "MASTER_PORT=")))
    out = subprocess.run(["bash", "-c", rendezvous + '\necho "$MASTER_ADDR $MASTER_PORT"'], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[0] == "node-a" and out[1].isdigit() and int(out[1]) > 0
    # given ones are used as they are
    fixed = load_config("paper", overrides={"output_dir": str(tmp_path / "outputs"), "launcher.hostfile": "",
                                            "launcher.master_addr": "10.0.0.7", "launcher.master_port": 29611})
    fixed_scripts = launcher.multi_node_scripts(fixed, job, run.path)
    assert "MASTER_ADDR=10.0.0.7\nMASTER_PORT=29611\n" in fixed_scripts["deepspeed"].read_text()
    assert "MAIN_IP=10.0.0.7\nMAIN_PORT=29611" in fixed_scripts["slurm"].read_text()
    spec = json.loads(job.read_text())
    assert spec["job"] == "grpo" and spec["config"]["launcher"]["zero_stage"] == 3
    assert spec["out_dir"] == str(run.path.resolve())
    # No hostfile and no Slurm here: launch says what to run instead of pretending.
    if not any(os.access(os.path.join(p, "sbatch"), os.X_OK) for p in os.environ["PATH"].split(os.pathsep)):
        with pytest.raises(RuntimeError, match="slurm.sbatch"):
            launcher.launch(cfg, "grpo", run.path, model_dir="Qwen/Qwen3-8B-Base", domain="math")


def test_every_job_resolves_and_the_launcher_imports_no_higher_layer():
    """Each job name resolves through ``JOBS`` to the library function a worker runs (the consolidations' jobs
    included); the launcher's own text imports nothing from the layers above it: they are strings there."""
    import ast
    import inspect

    assert launcher.job_function("mmopd") is mmopd.train_mmopd
    assert launcher.job_function("lora_sft") is mle.train_lora_sft
    assert launcher.job_function("lora_grpo") is mle.train_lora_grpo
    for job, target in launcher.JOBS.items():
        assert launcher.job_function(job).__name__ == target.split(":")[1]
    with pytest.raises(ValueError, match="unknown job 'nope'; jobs are pretrain, sft, grpo, mmopd"):
        launcher.job_function("nope")
    imported = []
    for node in ast.walk(ast.parse(inspect.getsource(launcher))):
        if isinstance(node, ast.Import):
            imported += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            imported += [f"{node.module}.{a.name}" for a in node.names]
    assert imported and not [m for m in imported if m.startswith(("acl_lib.consolidate", "acl_lib.diagnostics"))]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_process_zero2_sft_job(base_dir, tmp_path):
    """A real job: `deepspeed --num_accelerators 2`, ZeRO-2 on the CPU accelerator, 4 SFT steps."""
    cfg = tiny_cfg(tmp_path, **{"launcher.mode": "multi_process", "launcher.num_processes": 2, "torch_threads": 2,
                                "sft.max_steps": 4, "sft.batch_size": 4, "sft.learning_rate": 3e-3})
    env = DeskEnv()
    rows, _ = sft.collect_demos(env, desk_expert, env.tasks("train", 8), max_turns=6)
    data = sft.write_rows(rows, tmp_path / "demos.jsonl")
    run = Run(cfg, "sft_2proc")
    returned = {}

    def job(r):
        r.checkpoint_dir()  # the run store marks checkpoints/ with its hash, as the pipeline does
        returned.update(launcher.launch(cfg, "sft", r.path, model_dir=str(base_dir), dataset=str(data)))

    run_once(run, job)
    summary = json.loads((run.path / "train_summary.json").read_text())
    assert returned == summary  # launch returns the job's summary, read back from the workers' file
    assert summary["world_size"] == 2 and summary["deepspeed_zero_stage"] == 2, summary
    losses = [r["loss"] for r in read_log(run.path / "train_log.jsonl") if "loss" in r]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert (run.path / "checkpoints" / "checkpoint-4").is_dir()
    assert (run.path / "model" / "model.safetensors").exists() and run.is_complete()
    # The workers' checkpoints sit under the launching run's config hash (the run store keeps them).
    assert (run.path / "checkpoints" / ".config_hash").read_text() == run.config_hash


@pytest.mark.slow
def test_entry_point_runs_a_job_from_a_config_file(base_dir, tmp_path):
    """`python -m acl_lib.train.entry --config ... --job pretrain` (called in-process: same argv path)."""
    import yaml

    cfg = tiny_cfg(tmp_path, **{"pretrain.max_steps": 2, "pretrain.batch_size": 2, "pretrain.seq_len": 32})
    (tmp_path / "run_config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    run_dir = tmp_path / "base_pretrain"
    docs = [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)]
    entry.main(["--config", str(tmp_path / "run_config.yaml"), "--job", "pretrain", "--out-dir", str(run_dir),
                "--args", json.dumps({"model_dir": str(base_dir), "corpus": docs})])
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["job"] == "pretrain" and summary["steps"] == 2
    assert (run_dir / "model" / "model.safetensors").exists()
    with pytest.raises(SystemExit):
        entry.main(["--job", "sft"])  # neither a job file nor a config
