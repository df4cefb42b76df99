"""The evaluator's policies: what turns a batch of (task, conversation so far) into assistant texts.

The ``Policy`` protocol; the scripted experts (``ExpertPolicy``, ``--model expert``) and the do-nothing policy
(``NullPolicy``, ``--model null``); a local model behind the suite's engine (``HFPolicy``) or vLLM (``VLLMPolicy``,
the ``paper`` profile) with the one rule of where a turn ends (``stop_token_ids``, ``split_turn``); the user
simulator's local model (``user_simulator_policy``) and ``make_policy``, which builds the policy of a checkpoint
from the profile's settings. ``acl_lib.eval.harness`` runs them through the episodes.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from acl_lib.config import UserSimConfig
from acl_lib.envs import llm_user, scripted_expert
from acl_lib.envs.base import Task
from acl_lib.eval.turns import ReferenceTurnGenerator, TurnGenerator


class Policy(Protocol):
    """Maps a batch of (task, messages so far) to the next assistant texts (raw, as generated).

    That is all a policy must do. What else the harness uses where a policy has it is one protocol each below,
    checked with ``isinstance``: a per-turn token budget and a sampling temperature (a model's; the harness sets
    each benchmark's own), ``forget`` (called when an episode ends), ``close`` (called when an evaluation that built
    the policy ends) and the generation counters that go into ``metrics.json``. The scripted policies have none of
    them; ``HFPolicy`` and ``VLLMPolicy`` have all."""

    def __call__(self, batch: Sequence[tuple[Task, list[dict]]]) -> list[str]: ...


@runtime_checkable
class HasTokenBudget(Protocol):
    """A policy with a per-turn token budget, which the harness sets to each benchmark's ``max_new_tokens``."""

    max_new_tokens: int


@runtime_checkable
class HasTemperature(Protocol):
    """A policy that samples at a temperature, which the harness sets to each benchmark's own."""

    temperature: float


@runtime_checkable
class SupportsForget(Protocol):
    """A policy that keeps state per episode (a KV cache, a random stream): told when an episode has ended."""

    def forget(self, task: Task, messages: list[dict]) -> None: ...


@runtime_checkable
class SupportsClose(Protocol):
    """A policy holding a model or an engine, released by ``close()`` when the evaluation that built it ends."""

    def close(self) -> None: ...


@runtime_checkable
class CountsTokens(Protocol):
    """A policy that counts the tokens it has generated (``metrics.json``: ``generated_tokens``)."""

    generated_tokens: int


@runtime_checkable
class TimesGeneration(Protocol):
    """A policy that times its generation (``metrics.json``: ``generate_seconds``)."""

    generate_seconds: float


class ExpertPolicy:
    """The scripted experts of every world, behind the policy interface."""

    name = "expert"

    def __call__(self, batch):
        return [scripted_expert(task.domain)(task, messages) for task, messages in batch]


class FailedTurn(str):
    """What a policy returns for a turn it could not produce (an endpoint's failed request): an empty text that
    ends its episode with ``reason`` as the failure (``harness.run_episodes``)."""

    def __new__(cls, reason: str):
        turn = super().__new__(cls, "")
        turn.reason = reason
        return turn


class NullPolicy:
    """A policy that does nothing (empty turns): the floor every benchmark should score about 0 on."""

    name = "null"

    def __call__(self, batch):
        return ["" for _ in batch]


# Where an assistant turn ends in the Qwen3 chat convention, and the end of a document. A base model's eos is
# often the latter only (Qwen3-8B-Base: ``<|endoftext|>``): without ``<|im_end|>`` as a stop it writes past the
# end of its turn, inventing the user's next message, until the turn's token budget runs out.
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")


def stop_token_ids(tok) -> list[int]:
    """Token ids generation stops at: the tokenizer's eos plus each of ``STOP_TOKENS`` the vocabulary has."""
    vocab = tok.get_vocab()
    ids = [tok.eos_token_id] if tok.eos_token_id is not None else []
    ids += [vocab[t] for t in STOP_TOKENS if t in vocab]
    if not ids:
        raise ValueError("the tokenizer has no eos token and none of " + ", ".join(STOP_TOKENS))
    return sorted(set(ids))


def split_turn(ids: Sequence[int], stops) -> tuple[list[int], int | None]:
    """Where a generated assistant turn ends: the one rule of evaluation and GRPO rollouts (``trl_env``).

    Returns ``(text_ids, stop)``: the ids before the first of ``stops`` (``stop_token_ids``) and that stop token,
    a normal end of turn whichever stop it is; ``stop`` is None when no stop token came, i.e. the turn was cut
    off by its token budget, and every id is text. Ids after the first stop are dropped.
    """
    stops = set(stops)
    j = next((j for j, t in enumerate(ids) if t in stops), None)
    return (list(ids), None) if j is None else (list(ids[:j]), ids[j])


def cut_at_stop(ids: list[int], stops) -> list[int]:
    """``ids`` up to (not including) the first stop token (``split_turn``)."""
    return split_turn(ids, stops)[0]


def eval_device(device: str | None = None):
    """The device a policy runs its model on: ``device`` if given, else the first GPU when there is one."""
    import torch

    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def release_accelerator_memory() -> None:
    """Free what a dropped model or engine held: garbage-collect, then return cached CUDA blocks to the driver
    (only where CUDA is there: a CPU build of torch has nothing to empty)."""
    import gc

    gc.collect()
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class HFPolicy:
    """A local model behind the suite's engine (``acl_lib.eval.engine``) with the tokenizer's chat template, on the
    first GPU if there is one (else the CPU, or ``device``), each episode's KV cache kept across its turns
    (``acl_lib.eval.turns``): a turn encodes only what is new since the episode's last turn. ``reuse_kv=False``
    re-encodes every prompt whole; ``reference=True`` generates with transformers' ``model.generate`` one row at a
    time, greedy (what the engine is tested against). A turn ends at the tokenizer's eos or ``<|im_end|>``
    (``stop_token_ids``). Sampled episodes draw from streams of their own (``episode_seed``).

    Prompts longer than the model's context minus ``max_new_tokens`` are not generated: the episode ends
    with a "context limit" failure (``context_overflow`` marks them with ``None``). ``close()`` drops the model.
    """

    def __init__(self, model_dir: str, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 batch_size: int = 16, dtype: str = "float32", reuse_kv: bool = True, device: str | None = None,
                 reference: bool = False):
        import torch  # torch and transformers load when a model does: importing this module stays cheap
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = eval_device(device)
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
        self._setup(str(model_dir), model.eval(), tok, device, max_new_tokens, temperature, top_p, batch_size,
                    ReferenceTurnGenerator if reference else TurnGenerator, reuse=reuse_kv)

    @classmethod
    def of_model(cls, model, tok, max_new_tokens: int, batch_size: int = 16, name: str = "in-memory") -> HFPolicy:
        """A greedy policy around a model already loaded (a trainer's, mid-training: the cold start's stopping
        check, ``acl_lib.train.sft.WellFormedStop``). The caller keeps the model unchanged while it is used."""
        import copy

        policy = cls.__new__(cls)
        device = next(model.parameters()).device
        policy._setup(name, model, copy.copy(tok), device, max_new_tokens, 0.0, 1.0, batch_size)
        return policy

    def _setup(self, name: str, model, tok, device, max_new_tokens: int, temperature: float, top_p: float,
               batch_size: int, generator=TurnGenerator, **generator_kwargs) -> None:
        """The policy's state around a loaded ``model``: what every method reads. A subclass that loads its
        model otherwise (MLE's backbone with its adapters) calls this with its own ``generator`` class."""
        self.name, self.model, self.tok, self.device = name, model, tok, device
        self.tok.padding_side = "left"
        self.stop_ids = stop_token_ids(self.tok)
        self.max_new_tokens = max_new_tokens
        self.temperature, self.top_p, self.batch_size = temperature, top_p, batch_size
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        self.generated_tokens = 0
        self.generate_seconds = 0.0
        self.sampling_seed = 0
        self._seeds: dict = {}  # episode key -> the seed of its stream (episode_seed)
        self._samples: dict = {}  # task id -> the last sample number handed out
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.stop_ids[0]
        self.gen = generator(self.model, pad, self.stop_ids, batch_size, **generator_kwargs)

    @property
    def stats(self) -> dict:
        """What generation cost (``TurnGenerator.stats``; benchmarks/throughput.py)."""
        return self.gen.stats

    @staticmethod
    def _key(task: Task, messages: list[dict]):
        return (id(messages), task.id)  # the episode's own message list: stable across its turns

    def forget(self, task: Task, messages: list[dict]) -> None:
        """The episode has ended: drop its cache and its random stream."""
        key = self._key(task, messages)
        self.gen.forget(key)
        self._seeds.pop(key, None)

    def render(self, task: Task, messages: list[dict]) -> str:
        return self.tok.apply_chat_template(
            messages, tools=task.tools or None, add_generation_prompt=True, tokenize=False
        )

    def episode_seed(self, task: Task, messages: list[dict]) -> int:
        """The seed of an episode's random stream: from ``sampling_seed`` (the harness sets one per benchmark),
        the task's id and the episode's place among the episodes of that task (its sample, 0 .. k-1), so a task's
        samples are the same whichever episodes share their batch, and in every shard of an evaluation."""
        key = self._key(task, messages)
        if key not in self._seeds:
            j = self._samples[task.id] = self._samples.get(task.id, -1) + 1
            self._seeds[key] = zlib.crc32(f"{self.sampling_seed}:{task.id}:{j}".encode())
        return self._seeds[key]

    def set_sampling_seed(self, seed: int) -> None:
        """Start the episodes' streams from ``seed`` (``episode_seed``)."""
        self.sampling_seed = int(seed)
        self._samples.clear()

    def __call__(self, batch):
        prompts = [self.render(t, m) for t, m in batch]
        ids = [self.tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        out: list[str | None] = [None] * len(batch)
        limit = self.max_context - self.max_new_tokens
        fits = [i for i in range(len(batch)) if len(ids[i]) <= limit]
        seeds = [self.episode_seed(*batch[i]) for i in fits] if self.temperature > 0 else None
        t0 = time.perf_counter()
        news = self.gen.generate([(self._key(*batch[i]), ids[i]) for i in fits], self.max_new_tokens,
                                 temperature=self.temperature, top_p=self.top_p, seeds=seeds)
        self.generate_seconds += time.perf_counter() - t0
        for i, toks in zip(fits, news):
            toks, _ = split_turn(toks, self.stop_ids)
            self.generated_tokens += len(toks)
            out[i] = self.tok.decode(toks, skip_special_tokens=True)
        return out

    def close(self) -> None:
        """Drop the model and its caches and give the accelerator's memory back (the policy is unusable after)."""
        self.gen = self.model = None
        release_accelerator_memory()


# --- vLLM (paper profile) ----------------------------------------------------------------------------------
# The engine and sampling arguments are plain dicts built here, so they are tested without vLLM (a GPU-only
# install): VLLMPolicy passes them to ``vllm.LLM(**engine_args)`` and ``vllm.SamplingParams(**sampling_args)``.


def vllm_engine_args(model_dir: str, dtype: str, max_model_len: int, seed: int = 0,
                     gpu_memory_utilization: float = 0.9) -> dict:
    """``vllm.LLM`` keyword arguments. ``max_model_len`` (tokens, prompt + completion) is the config's
    ``model.max_position_embeddings``: vLLM's default (the checkpoint's own maximum) may not fit the KV cache, and
    the context-overflow guard must know the limit the engine enforces. Prefix caching lets the turns of an
    episode reuse the blocks of its earlier turns (the role ``TurnGenerator`` plays for HF)."""
    if max_model_len < 1:
        raise ValueError(f"max_model_len must be a positive number of tokens, got {max_model_len}")
    return {"model": str(model_dir), "tokenizer": str(model_dir), "dtype": dtype, "max_model_len": int(max_model_len),
            "seed": int(seed), "enable_prefix_caching": True, "gpu_memory_utilization": gpu_memory_utilization}


def vllm_sampling_args(stop_ids: list[int], max_tokens: int, temperature: float, top_p: float) -> dict:
    """``vllm.SamplingParams`` keyword arguments for one assistant turn: at most ``max_tokens`` new tokens, ending
    at the first of ``stop_ids`` (eos, ``<|im_end|>``: see ``stop_token_ids``); special tokens dropped from the
    text as ``HFPolicy`` decodes it. Temperature 0 is greedy, as for HF."""
    return {"max_tokens": int(max_tokens), "temperature": float(temperature), "top_p": float(top_p),
            "stop_token_ids": list(stop_ids), "skip_special_tokens": True, "n": 1}


class VLLMPolicy(HFPolicy):
    """vLLM generation (the ``paper`` profile). vLLM is in the ``gpu`` extra; it does not install on CPU.

    One engine per policy, built once per evaluation (``evaluate`` / ``acl eval`` make one policy per checkpoint)
    and released by ``close()`` when the evaluation ends, so the next checkpoint's engine finds the GPU memory
    free. A process that evaluates many checkpoints in a row (a notebook) may still keep some of it (vLLM's own
    workers, CUDA context): run each evaluation in its own process (``acl eval``) where that matters.

    Same turn semantics as ``HFPolicy``: a prompt longer than ``max_model_len - max_new_tokens`` tokens is not
    sent (the episode ends with a "context limit" failure instead of aborting the whole batch), a turn stops at
    eos or ``<|im_end|>``. ``llm`` / ``sampling_params``: an engine and a ``SamplingParams`` factory to use instead
    of vLLM's (tests).
    """

    def __init__(self, model_dir: str, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 batch_size: int = 256, dtype: str = "bfloat16", max_model_len: int = 32768, seed: int = 0,
                 llm=None, sampling_params=None):
        from transformers import AutoTokenizer

        self.engine_args = vllm_engine_args(model_dir, dtype, max_model_len, seed)
        if llm is None or sampling_params is None:
            try:
                import vllm
            except ImportError as exc:
                raise RuntimeError("eval.backend=vllm needs vLLM: install the suite with the 'gpu' extra "
                                   "(GPU machines only)") from exc
            llm = llm if llm is not None else vllm.LLM(**self.engine_args)
            sampling_params = sampling_params or vllm.SamplingParams
        self.name = str(model_dir)
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.stop_ids = stop_token_ids(self.tok)
        self.llm = llm
        self.sampling_params = sampling_params
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens = max_new_tokens  # evaluate() sets each benchmark's own budget
        self.max_context = int(max_model_len)
        self.generated_tokens = 0
        self.generate_seconds = 0.0

    def set_sampling_seed(self, seed: int) -> None:
        """Nothing per benchmark: the engine samples from its own seed (``vllm_engine_args``)."""
        self.sampling_seed = int(seed)

    def sampling_args(self) -> dict:
        return vllm_sampling_args(self.stop_ids, self.max_new_tokens, self.temperature, self.top_p)

    def forget(self, task, messages) -> None:
        """Nothing to drop: vLLM's prefix cache manages itself."""

    def __call__(self, batch):
        prompts = [self.render(t, m) for t, m in batch]
        ids = [self.tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        limit = self.max_context - self.max_new_tokens
        fits = [i for i in range(len(batch)) if len(ids[i]) <= limit]
        out: list[str | None] = [None] * len(batch)
        if not fits:
            return out
        t0 = time.perf_counter()
        # Token ids, not text: the engine sees exactly what the guard counted.
        outs = self.llm.generate([{"prompt_token_ids": ids[i]} for i in fits],
                                 self.sampling_params(**self.sampling_args()), use_tqdm=False)
        self.generate_seconds += time.perf_counter() - t0
        for i, o in zip(fits, outs):
            toks, _ = split_turn(list(o.outputs[0].token_ids), self.stop_ids)
            self.generated_tokens += len(toks)
            out[i] = self.tok.decode(toks, skip_special_tokens=True)
        return out

    def close(self) -> None:
        """Shut the engine down and give its GPU memory back (del + gc + ``torch.cuda.empty_cache``)."""
        self.llm = None
        try:  # vLLM's tensor-parallel state outlives the engine object unless destroyed
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()
        except Exception:  # not installed (tests), or already torn down
            pass
        release_accelerator_memory()


def user_simulator_policy(cfg: UserSimConfig, model: str) -> Policy:
    """The LLM user simulator's local model (``worlds.user_sim`` backends ``hf`` and ``vllm``, see
    ``acl_lib.envs.llm_user``): one of these policies, one conversation's turn at a time."""
    if cfg.backend == "hf":
        # reuse_kv=False: every simulator prompt is a new message list, a per-episode cache would only grow
        return HFPolicy(model, cfg.max_new_tokens, cfg.temperature, batch_size=1, dtype=cfg.dtype, reuse_kv=False)
    return VLLMPolicy(model, cfg.max_new_tokens, cfg.temperature, batch_size=1, dtype=cfg.dtype)


# The environments play the real tau2 tasks' customer with these policies; they sit below this layer, so it hands
# them the factory (every process that plays an episode with a model has imported this module).
llm_user.use_local_policy(user_simulator_policy)


def make_policy(model: str, cfg, max_new_tokens: int | None = None, temperature: float | None = None,
                top_p: float | None = None) -> Policy:
    """``expert`` / ``null`` or a checkpoint directory / hub id, with the profile's sampling settings (``eval``:
    backend, tokens per turn, temperature, top-p), or the given ones in their place."""
    if model == "expert":
        return ExpertPolicy()
    if model == "null":
        return NullPolicy()
    e = cfg.eval
    args = (model, e.max_new_tokens if max_new_tokens is None else max_new_tokens,
            e.temperature if temperature is None else temperature, e.top_p if top_p is None else top_p, e.batch_size)
    if cfg.eval.backend == "vllm":
        return VLLMPolicy(*args, dtype=cfg.model.dtype, max_model_len=cfg.model.max_position_embeddings,
                          seed=cfg.seed)
    return HFPolicy(*args, dtype=cfg.model.dtype)
