"""Issue 15, the launch path of the paper profile: what reaches the workers on the other nodes, activation
checkpointing per profile, CPU threads per rank.

The hostfile test runs the generated ``deepspeed.sh`` through DeepSpeed's own multi-node runner
(``deepspeed.launcher.runner.main``), with only the processes it would start replaced: the ssh reachability
check, the ``hostname -I`` probe and the ``pdsh`` fan-out. What the runner would have pdsh run on every node
is captured and read.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
import torch

from acl_lib.config import load_config
from acl_lib.train import launcher
from acl_lib.train.common import DS_CONFIG_ENV
from train_kit import DeskEnv, desk_expert, tiny_cfg

torch.set_num_threads(1)

# A stand-in for the `deepspeed` command: DeepSpeed's real runner, with the processes it starts replaced.
_SHIM = """#!{python}
import json, os, subprocess, sys

from deepspeed.launcher import multinode_runner, runner

captured = {{}}


class _Pdsh:  # the pdsh process that would log into every node
    returncode = 0

    def __init__(self, cmd, env=None, **kw):
        captured["cmd"] = cmd

    def wait(self):
        return 0


subprocess.Popen = _Pdsh
subprocess.check_call = lambda *a, **k: 0  # passwordless-ssh check
def _no_probe(*a, **k):  # `ssh node-a hostname -I`: the launcher names the master, so the runner must not ask
    raise AssertionError(f"master address probed: {{a}}")


subprocess.check_output = _no_probe
multinode_runner.PDSHRunner.backend_exists = lambda self: True
runner.main(sys.argv[1:])
with open(os.environ["ACL_TEST_CAPTURE"], "w") as f:
    json.dump(captured["cmd"], f)
"""


def _paper_cfg(tmp_path, **extra):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=8\nnode-b slots=8\n")
    return load_config("paper", overrides={"output_dir": str(tmp_path / "outputs"), "launcher.hostfile": str(hostfile),
                                           **extra})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hostfile_launch_forwards_the_zero_config_to_every_node(tmp_path):
    from acl_lib.runs import Run

    cfg = _paper_cfg(tmp_path, torch_threads=96)
    run = Run(cfg, "seq_math")
    # What an offline cluster's login shell holds: the simulated customer's key, the hub cache, offline switches.
    secrets = {"OPENAI_API_KEY": "sk-test-not-a-key", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
               "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in secrets.items():
            mp.setenv(k, v)
        mp.setenv("ACL_UNRELATED_SECRET", "never-forwarded")
        job = launcher.write_job(cfg, "grpo", run.path, {"model_dir": "Qwen/Qwen3-8B-Base", "domain": "math"})
        scripts = launcher.multi_node_scripts(cfg, job, run.path)
    env_file = scripts["deepspeed_env"]
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600  # it holds a key
    assert "sk-test-not-a-key" not in scripts["deepspeed"].read_text()  # the script (and its log) never does
    ds_config = str(launcher.deepspeed_config(cfg))

    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "deepspeed"
    shim.write_text(_SHIM.format(python=sys.executable))
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    capture = tmp_path / "pdsh_cmd.json"
    env = {k: v for k, v in os.environ.items() if k not in (DS_CONFIG_ENV, "DS_ENV_FILE")}
    env.update(PATH=f"{bindir}{os.pathsep}{env['PATH']}", DS_ACCELERATOR="cpu", ACL_TEST_CAPTURE=str(capture),
               OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(scripts["deepspeed"])], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    cmd = json.loads(capture.read_text())
    assert cmd[0] == "pdsh" and "node-a,node-b" in cmd
    assert any("--master_addr=node-a" in c for c in cmd)  # the hostfile's first host, by its name
    (port,) = {c.split("--master_port=")[1].split()[0] for c in cmd if "--master_port=" in c}
    assert port.isdigit() and 1024 <= int(port) <= 65535 and port != "29500"  # a free port, picked at launch
    exports = next(c for c in cmd if c.startswith("export "))  # what every node runs before its workers
    assert f"export {DS_CONFIG_ENV}={ds_config};" in exports
    assert "export TRL_EXPERIMENTAL_SILENCE=1;" in exports and "export TOKENIZERS_PARALLELISM=false;" in exports
    assert "export OMP_NUM_THREADS=12;" in exports  # 96 threads of a node over its 8 ranks
    for k, v in secrets.items():  # read by the real runner from DS_ENV_FILE, not from this test's environment
        assert f"export {k}={v};" in exports, k
    assert "ACL_UNRELATED_SECRET" not in exports
    root = str(launcher.CONFIG_DIR.parents[2])
    assert f"export PYTHONPATH={root}" in exports  # the checkout, first, on every node
    # The ZeRO config also travels as an argument of the worker module, whatever the launcher forwards.
    i = cmd.index("--deepspeed-config")
    assert cmd[i + 1] == ds_config and "acl_lib.train.entry" in cmd
    # The Slurm script passes it the same way (srun forwards the batch script's environment too).
    assert f"--deepspeed-config {ds_config}" in scripts["slurm"].read_text()
    subprocess.run(["bash", "-n", str(scripts["slurm"])], check=True)


def test_worker_sets_the_zero_config_from_its_argument(tmp_path, monkeypatch):
    """A worker on another node gets no ACL_DEEPSPEED_CONFIG from its environment: the argument sets it."""
    from acl_lib.train import entry

    monkeypatch.setenv(DS_CONFIG_ENV, "")  # recorded, so the value entry.main sets is undone afterwards
    monkeypatch.delenv(DS_CONFIG_ENV)
    calls = {}
    monkeypatch.setattr(launcher, "job_function",
                        lambda job: lambda cfg, out_dir, **kw: calls.update(env=os.environ.get(DS_CONFIG_ENV)))
    cfg = tiny_cfg(tmp_path)
    job = launcher.write_job(cfg, "sft", tmp_path / "run", {})
    ds_config = launcher.deepspeed_config(cfg)
    entry.main(["--job-file", str(job), "--deepspeed-config", str(ds_config)])
    assert calls["env"] == str(ds_config)
    with pytest.raises(SystemExit):  # a config path that does not exist on this node is refused at once
        entry.main(["--job-file", str(job), "--deepspeed-config", str(tmp_path / "missing.json")])


def test_threads_per_rank_divides_a_node_over_its_own_ranks(monkeypatch):
    from acl_lib.seeding import threads_per_rank

    monkeypatch.setenv("WORLD_SIZE", "16")  # 2 nodes x 8 ranks: the node's budget is split 8 ways, not 16
    monkeypatch.setenv("LOCAL_SIZE", "8")  # DeepSpeed's launcher
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert threads_per_rank(96) == 12
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun / accelerate
    assert threads_per_rank(96) == 24
    monkeypatch.setattr("acl_lib.seeding.available_cpus", lambda: 64)
    assert threads_per_rank(0) == 16  # 0: every core this process may use
    assert threads_per_rank(2, local_ranks=8) == 1
    with pytest.raises(ValueError):
        threads_per_rank(-1)
    cfg = load_config("paper")
    assert cfg.torch_threads == 0  # the paper profile gives the ranks the node's cores


def test_set_threads_uses_the_local_ranks(tmp_path, monkeypatch):
    from acl_lib.train.common import set_threads

    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_SIZE", "2")
    before = torch.get_num_threads()
    try:
        set_threads(tiny_cfg(tmp_path, torch_threads=4))
        assert torch.get_num_threads() == 2  # 4 // 2 local ranks (the old code divided by 16: 1 thread)
    finally:
        torch.set_num_threads(before)


# --- activation checkpointing ------------------------------------------------------------------------------


def test_activation_checkpointing_is_a_profile_setting(tmp_path):
    from acl_lib.train.grpo import grpo_args
    from acl_lib.train.pretrain import pretrain_args
    from acl_lib.train.sft import sft_args

    assert load_config("paper").launcher.activation_checkpointing is True
    for profile in ("smoke", "mini"):
        assert load_config(profile).launcher.activation_checkpointing is False
    for on in (False, True):
        cfg = tiny_cfg(tmp_path, **{"launcher.activation_checkpointing": on})
        out = tmp_path / f"out{on}"
        for args in (sft_args(cfg, out), grpo_args(cfg, out),
                     pretrain_args(cfg, out, max_steps=2, batch_size=2, lr=1e-3, warmup=0, scheduler="constant")):
            assert args.activation_checkpointing is on and args.gradient_checkpointing is on, type(args).__name__
            if on:
                assert args.activation_checkpointing_kwargs == {"use_reentrant": False}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sft_trains_with_activation_checkpointing(base_dir, tmp_path, monkeypatch):
    """The setting reaches the model: a real SFT job with checkpointing on trains with it enabled."""
    from transformers import TrainerCallback

    from acl_lib.train import sft

    seen = {}

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            seen["checkpointing"] = model.is_activation_checkpointing

    cfg = tiny_cfg(tmp_path, **{"launcher.activation_checkpointing": True, "sft.max_steps": 1, "sft.batch_size": 2})
    env = DeskEnv()
    rows, _ = sft.collect_demos(env, desk_expert, env.tasks("train", 2), max_turns=6)
    import trl

    class Probed(trl.SFTTrainer):  # train_sft imports trl.SFTTrainer when it runs
        def __init__(self, *a, callbacks=(), **kw):
            super().__init__(*a, callbacks=[*callbacks, Probe()], **kw)

    monkeypatch.setattr(trl, "SFTTrainer", Probed)
    summary = sft.train_sft(cfg, base_dir, rows, tmp_path / "sft")
    assert summary["steps"] == 1 and seen["checkpointing"] is True


def test_grpo_vllm_rollouts_stop_at_a_turn_and_know_the_context(tmp_path):
    """vLLM rollouts (paper): the engine's context from the config, one turn per call, stop at eos/<|im_end|>."""
    from acl_lib.train.grpo import grpo_args

    cfg = tiny_cfg(tmp_path, **{"grpo.use_vllm": True})
    multi = grpo_args(cfg, tmp_path / "m", multi_turn=True, stop_ids=[5, 6])
    assert multi.vllm_max_model_length == cfg.model.max_position_embeddings
    assert multi.generation_kwargs == {"stop_token_ids": [5, 6], "max_tokens": cfg.grpo.max_new_tokens}
    assert multi.max_completion_length == cfg.grpo.max_episode_tokens  # the rollout budget stays TRL's
    single = grpo_args(cfg, tmp_path / "s", multi_turn=False, stop_ids=[5, 6])
    assert single.generation_kwargs == {"stop_token_ids": [5, 6]}
    plain = grpo_args(tiny_cfg(tmp_path), tmp_path / "p", stop_ids=[5, 6])  # HF generation: nothing vLLM-only
    assert plain.generation_kwargs is None and plain.vllm_max_model_length is None


def test_vllm_pin_is_within_what_trl_supports():
    """environment.yml and the gpu extra pin a vLLM that the installed TRL accepts (its `vllm` extra)."""
    import tomllib
    from importlib.metadata import requires
    from pathlib import Path

    import yaml
    from packaging.requirements import Requirement
    from packaging.version import Version

    root = Path(__file__).resolve().parents[1]
    trl_spec = next(Requirement(r.split(";")[0]).specifier for r in requires("trl")
                    if r.startswith("vllm") and 'extra == "vllm"' in r)
    gpu = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    env = yaml.safe_load((root / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    ours = [Requirement(r) for r in gpu + pip if isinstance(r, str) and r.startswith("vllm")]
    assert len(ours) == 2, ours
    for req in ours:
        lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
        highs = [Version(s.version) for s in req.specifier if s.operator in ("<=", "<", "==")]
        assert lows and highs, f"{req}: pin both ends (TRL supports {trl_spec})"
        assert max(lows) in trl_spec, f"{req} allows vLLM {max(lows)}, which TRL refuses ({trl_spec})"
        top = max(highs)
        assert all(s.operator == "<" or top in trl_spec for s in req.specifier if Version(s.version) == top), \
            f"{req} allows vLLM up to {top}, beyond TRL's {trl_spec}"


# What each vLLM release requires of transformers and torch (Requires-Dist in its wheel's METADATA, read from PyPI's
# wheels): the pin must allow only releases listed here, each accepting the installed transformers.
VLLM_REQUIRES = {"0.22.0": ("!=5.0.*,!=5.1.*,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0,>=4.56.0", "==2.11.0"),
                 "0.28.0": (">=5.5.3", "==2.13.0"), "0.29.0": (">=5.10.4", "==2.13.0"),
                 "0.30.0": (">=5.10.4", "==2.13.0"), "0.31.0": ("<5.18.0,>=5.10.4", "==2.13.0")}


def test_vllm_pin_accepts_the_transformers_the_suite_runs():
    """Issue 32 item 14: vLLM 0.31 would pull transformers below 5.18, not the 5.24 the suite is tested with."""
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    root = Path(__file__).resolve().parents[1]
    gpu = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    (pin,) = [Requirement(r).specifier for r in gpu if r.startswith("vllm")]
    env_line = next(line for line in (root / "environment.yml").read_text().splitlines() if "- vllm" in line)
    assert SpecifierSet(env_line.split("vllm", 1)[1].split("#")[0].strip()) == pin  # the two pins agree
    allowed = [v for v in VLLM_REQUIRES if v in pin]
    assert allowed, pin
    assert not pin.contains("0.31.0") and not pin.contains("0.22.0")
    tf = version("transformers")
    for v in allowed:
        need = VLLM_REQUIRES[v][0]
        assert tf in SpecifierSet(need), f"vLLM {v} requires transformers {need}, not {tf}"
        assert version("torch").split("+")[0] in SpecifierSet(VLLM_REQUIRES[v][1])


def test_a_relative_hostfile_is_found_from_a_notebook(tmp_path, monkeypatch):
    """paper.yaml says `hostfile: hostfile`; a notebook runs in notebooks/: the checkout's hostfile is the one."""
    from acl_lib.config import project_root
    from acl_lib.runs import Run

    monkeypatch.chdir(project_root() / "notebooks")
    cfg = load_config("paper", overrides={"output_dir": str(tmp_path / "outputs")})
    assert launcher.hostfile_path(cfg) == project_root() / "hostfile"
    job = launcher.write_job(cfg, "sft", Run(cfg, "seq_search").path, {})
    ds = launcher.multi_node_scripts(cfg, job, Run(cfg, "seq_search").path)["deepspeed"].read_text()
    assert f"--hostfile {project_root() / 'hostfile'} " in ds
    absolute = load_config("paper", overrides={"launcher.hostfile": str(tmp_path / "hosts")})
    assert launcher.hostfile_path(absolute) == tmp_path / "hosts"


def test_env_file_carries_the_named_variables_and_model_ids_become_local_snapshots(tmp_path, monkeypatch):
    """Issue 32 item 3: what DeepSpeed's runner does not forward to the other nodes goes into the env file (mode
    0600); a hub id cached here is passed to the workers as its snapshot's path."""
    cfg = _paper_cfg(tmp_path, **{"sft.teacher": "served", "sft.teacher_url": "http://h:8002/v1",
                                  "sft.teacher_api_key_env": "TEACHER_KEY"})
    environ = {"OPENAI_API_KEY": "k1", "TEACHER_KEY": "k2", "HF_TOKEN": "t", "VLLM_LOGGING_LEVEL": "INFO",
               "HOME": "/home/u", "SECRET_OF_NOBODY": "x"}
    assert launcher.forwarded_env(cfg, environ) == {"HF_TOKEN": "t", "OPENAI_API_KEY": "k1", "TEACHER_KEY": "k2",
                                                    "VLLM_LOGGING_LEVEL": "INFO"}
    path = tmp_path / "deepspeed_env"
    path.write_text("old\n")
    path.chmod(0o644)  # a file left by an older run keeps no looser mode
    launcher.env_file(cfg, launcher.deepspeed_config(cfg), path, environ)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_text().splitlines()
    assert "OPENAI_API_KEY=k1" in lines and "TEACHER_KEY=k2" in lines and f"{DS_CONFIG_ENV}=" in path.read_text()
    with pytest.raises(ValueError, match="OPENAI_API_KEY: .*line break") as err:
        launcher.env_file(cfg, launcher.deepspeed_config(cfg), path, {"OPENAI_API_KEY": "a\nb"})
    assert "a\nb" not in str(err.value)  # an error never prints a key

    # The hub cache layout huggingface_hub reads offline: refs/main names the snapshot.
    cache = tmp_path / "hub"
    repo = cache / "models--Qwen--Qwen3-8B-Base"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    job = launcher.write_job(cfg, "mmopd", tmp_path / "run", {"student_dir": "Qwen/Qwen3-8B-Base", "domain": "math",
                                                             "teacher_dirs": ["Qwen/Qwen3-8B-Base", str(tmp_path)],
                                                             "model_dir": "Other/not-cached"})
    args = json.loads(job.read_text())["args"]
    assert args["student_dir"] == str(snap) and args["teacher_dirs"] == [str(snap), str(tmp_path)]
    assert args["model_dir"] == "Other/not-cached" and args["domain"] == "math"
