"""The paper profile's vLLM sleep mode against TRL's own colocated generation code (``VLLMGeneration.generate``),
with a stand-in engine in place of vLLM (not installed on CPU machines): how many times a multi-turn rollout
pushes the weights.

TRL 1.16 puts a colocated engine to sleep (level 2: weights discarded) after every ``generate`` call and re-pushes
the weights (``sync_weights``: under ZeRO-3 a gather of every parameter, a collective) at the next. A multi-turn
rollout calls ``generate`` once per turn, and ranks whose episodes take different numbers of turns would enter
different numbers of those collectives: the hang the paper profile had. The suite keeps the engine awake for
multi-turn rollouts (``grpo.vllm_kwargs``), so a rollout pushes nothing whatever its number of turns (the trainer
syncs once a step, before the rollout, outside these calls)."""

from __future__ import annotations

import types

import pytest
import torch


class _StandInLLM:
    """What ``VLLMGeneration.generate`` calls on ``vllm.LLM`` in colocate mode, recording sleep and wake-up."""

    def __init__(self):
        self.events: list[str] = []

    def generate(self, prompts, sampling_params, use_tqdm=False):
        self.events.append("generate")
        out = types.SimpleNamespace(token_ids=[7, 8], logprobs=None)
        return [types.SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], outputs=[out]) for p in prompts]

    def sleep(self, level):
        self.events.append(f"sleep{level}")

    def wake_up(self, tags):
        self.events.append("wake_" + "_".join(tags))


def _trl_generation(monkeypatch, enable_sleep_mode: bool):
    from trl.generation import vllm_generation as vg

    monkeypatch.setattr(vg, "SamplingParams", lambda **kw: kw, raising=False)
    gen = vg.VLLMGeneration.__new__(vg.VLLMGeneration)  # no engine start: the stand-in replaces vllm.LLM
    gen.__dict__.update(
        accelerator=types.SimpleNamespace(is_main_process=True, process_index=0), model=torch.nn.Linear(1, 1),
        mode="colocate",
        temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0, max_completion_length=16,
        logprobs=0, generation_kwargs={}, structured_outputs_regex=None, tensor_parallel_size=1,
        enable_sleep_mode=enable_sleep_mode, _llm_weights_sleeping=enable_sleep_mode, llm=_StandInLLM())
    pushes = []
    gen.sync_weights = lambda: (pushes.append(1), setattr(gen, "_llm_weights_sleeping", False))
    return gen, pushes


def _rollout(gen, turns: int) -> None:
    for _ in range(turns):  # one generate call per turn, as trl_env.vllm_policy makes them
        gen.generate(prompts=[[1, 2, 3]], images=None, num_generations=1)


@pytest.mark.parametrize("turns", [1, 3, 7])
def test_multi_turn_rollouts_keep_the_engine_awake_and_push_no_weights(monkeypatch, turns):
    from acl_lib.config import load_config
    from acl_lib.train.grpo import vllm_kwargs

    paper = load_config("paper")
    for domain in ("search", "ecom"):
        sleep = vllm_kwargs(paper.for_stage(domain), True, [1])["vllm_enable_sleep_mode"]
        gen, pushes = _trl_generation(monkeypatch, sleep)
        _rollout(gen, turns)
        assert pushes == [] and "sleep2" not in gen.llm.events  # the same on every rank, whatever its turns
    # what the paper profile did before: one weight push per turn after the first, so ranks with 3 and 7 turns
    # would have entered 2 and 6 collectives
    gen, pushes = _trl_generation(monkeypatch, True)
    gen._llm_weights_sleeping = False  # the trainer's sync at the step's start has just woken it
    _rollout(gen, turns)
    assert len(pushes) == turns - 1
    assert gen.llm.events.count("sleep2") == turns


def test_single_turn_rollouts_still_sleep_while_training(monkeypatch):
    from acl_lib.config import load_config
    from acl_lib.train.grpo import vllm_kwargs

    paper = load_config("paper")
    for domain in ("math", "if"):
        assert vllm_kwargs(paper.for_stage(domain), False, [1])["vllm_enable_sleep_mode"] is True
    gen, pushes = _trl_generation(monkeypatch, True)
    gen._llm_weights_sleeping = False
    _rollout(gen, 1)  # one generate call a step: the engine sleeps through the training passes
    assert pushes == [] and gen.llm.events[-1] == "sleep2"
