"""Adapters between our ``Environment`` / ``Episode`` and TRL's ``GRPOTrainer``.

Which TRL mechanism each kind of world uses, and why:

* Single-turn worlds (math, IF): a plain GRPO dataset (``prompt`` = the task's chat messages, ``task`` = the
  task as a JSON string) and ``EpisodeReward``, a reward function that decodes each completion's raw token
  ids, rebuilds the ``Task`` from the ``task`` column and scores ``env.start(task).step(text).reward()``.
  Scoring raw ids (not TRL's parsed message) means the reward sees exactly the text the evaluator sees.

* Multi-turn tool worlds (search, retail, and the OOD desks): ``rollout_func`` (``EpisodeRollout``) plus an
  ``environment_factory`` whose environments (``EpisodeEnv``) expose no tools. We do not use TRL's own tool
  loop (``tools=`` / tool methods on the environment) because:
    1. retail's simulated customer answers an assistant turn *without* tool calls with a ``user`` message and
       the conversation goes on; TRL's loop ends a rollout at the first turn without tool calls and can only
       insert ``tool`` messages;
    2. TRL parses each turn with the tokenizer's response template and silently turns a malformed call into
       plain content (docs/stack-notes.md); our ``Episode`` must see the raw turn to record the protocol error
       that the reward and the failure statistics count;
    3. TRL builds tool schemas from Python signatures and docstrings, while our tasks carry their OpenAI
       schemas (``Task.tools``), rendered exactly as the evaluator renders them; retail has 15 per task.
  ``environment_factory`` is still TRL's: it hands each rollout its own ``EpisodeEnv`` and calls
  ``reset(**row)`` with the dataset row (that is how the rollout learns each prompt's ``Task``; ``rollout_func``
  itself only receives the prompts), and ``get_reward()`` is TRL's per-rollout reward source.
  ``EpisodeRollout`` then drives every episode: the policy writes a turn, the episode answers, the answer is
  appended as template-rendered tokens with ``env_mask`` 0 (TRL turns ``env_mask`` into ``tool_mask`` and
  trains on ``completion_mask * tool_mask``), and the policy's own tokens carry ``env_mask`` 1. Appending
  rendered observations to generated tokens needs a prefix-preserving template: for one that is not (Qwen3's
  own), rollouts render with TRL's training variant of it (``rollout_chat_template``), the swap TRL itself
  makes only when ``tools=`` is passed.

The token bookkeeping lives in ``rollout_episodes`` (pure: a policy in, ids and masks out), so a test can drive
real episodes with the scripted expert through the very code the trainer runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from acl_lib.envs import STAGE_ENV
from acl_lib.envs import make_env as make_world
from acl_lib.envs.base import Environment, Episode, Task, map_concurrently, prefetch, step_workers
from acl_lib.eval.policies import split_turn, stop_token_ids
from acl_lib.eval.turns import TurnGenerator

if TYPE_CHECKING:
    from acl_lib.config import Config


def make_env(domain: str, cfg: Config) -> Environment:
    """The world of a training stage (``math``/``search``/``ecom``/``if``) or environment name, built from
    ``cfg.worlds`` with the world seed ``cfg.worlds.seed``, exactly as evaluation builds it (the training
    seed ``cfg.seed`` only changes which training tasks are drawn and how the model samples)."""
    return make_world(STAGE_ENV.get(domain, domain), cfg.worlds, seed=cfg.worlds.seed)


# --- datasets ----------------------------------------------------------------------------------------


def task_row(task: Task) -> dict:
    """One GRPO dataset row: the prompt messages and the task as a JSON string.

    The task is a string column on purpose: Arrow would merge the ``answer`` / ``tools`` dicts of all rows
    into one struct and hand every row the other rows' keys as nulls (docs/stack-notes.md).
    """
    return {"prompt": task.initial_messages(), "task": json.dumps(task.to_dict())}


def grpo_dataset(tasks: list[Task]):
    """A ``datasets.Dataset`` of ``task_row`` s."""
    from datasets import Dataset

    return Dataset.from_list([task_row(t) for t in tasks])


def task_from_column(value: str | dict) -> Task:
    return Task.from_dict(json.loads(value) if isinstance(value, str) else value)


def is_multi_turn(tasks: list[Task]) -> bool:
    """Tool worlds are multi-turn; a task without tools is answered in one turn."""
    return any(t.tools for t in tasks)


# --- single-turn reward ------------------------------------------------------------------------------


class EpisodeReward:
    """GRPO reward function for single-turn worlds: the environment's verifier on the raw completion.

    Called by TRL as ``reward(prompts=..., completions=..., completion_ids=..., task=[...], ...)``; returns one
    float in [0, 1] per completion. Failure reasons go to TRL's completion table via ``log_extra``.
    """

    def __init__(self, env: Environment, tokenizer, max_turns: int = 1):
        self.env = env
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.__name__ = f"{env.name}_reward"  # TRL names the logged reward column after it

    def __call__(self, prompts, completions, completion_ids, task, log_extra=None, **kwargs) -> list[float]:
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        rewards, failures = [], []
        for text, t in zip(texts, task, strict=True):
            ep = self.env.start(task_from_column(t), max_turns=self.max_turns)
            ep.step(text)
            rewards.append(ep.reward())
            failures.append(ep.failure or "")
        if log_extra is not None:
            log_extra("failure", failures)
        return rewards


# --- multi-turn rollouts -----------------------------------------------------------------------------


class EpisodeEnv:
    """TRL ``environment_factory`` environment holding one of our episodes.

    Only ``reset`` and ``get_reward`` are public: TRL would expose any other public method as a tool, and this
    environment's tools are run by the episode itself (see the module docstring).
    """

    def __init__(self, env: Environment, max_turns: int):
        self._env = env
        self._max_turns = max_turns
        self.episode: Episode | None = None

    def reset(self, task: str | dict, **row) -> None:
        """Take the dataset row's task for a fresh episode. Returns None: the prompt stays as in the row. The
        episode itself is started by the rollout (``start_episodes``), a batch's at once: a customer played by a
        remote simulator opens with a request to it, and TRL resets its environments one after the other."""
        self._task = task_from_column(task)
        self.episode = None
        return None

    def _start(self) -> None:
        self.episode = self._env.start(self._task, max_turns=self._max_turns)

    def get_reward(self) -> float:
        """The finished episode's verifiable reward in [0, 1] (0 when no episode ran)."""
        return self.episode.reward() if self.episode is not None else 0.0


def start_episodes(envs: list[EpisodeEnv]) -> list[Episode]:
    """Start the episode of every reset environment that has none; returns all their episodes, in order. The first
    starts alone; the rest, in threads when its kind waits on a remote simulator (``envs.base.step_workers``)."""
    pending = [e for e in envs if e.episode is None]
    if pending:
        pending[0]._start()
        map_concurrently(EpisodeEnv._start, pending[1:], step_workers([pending[0].episode]))
    return [e.episode for e in envs]


def environment_factory(env: Environment, max_turns: int) -> Callable[[], EpisodeEnv]:
    """The zero-argument factory TRL calls once per concurrent rollout."""

    def make() -> EpisodeEnv:
        return EpisodeEnv(env, max_turns)

    return make


@dataclass
class Request:
    """One generation request: the full context ids of an episode and how many new tokens it may take."""

    ids: list[int]
    episode: Episode
    max_new_tokens: int


# A policy turns requests into generated ids: one list per request, ending with eos unless cut off, plus the
# per-token log-probabilities of the sampled tokens when the backend reports them (vLLM), else None.
Policy = Callable[[list[Request]], tuple[list[list[int]], list[list[float]] | None]]


@dataclass
class Rollout:
    """The token-level record of one multi-turn episode (what GRPO trains on).

    ``completion_ids`` interleaves the policy's turns with the rendered observations; ``env_mask`` (same length)
    is 1 on policy tokens and 0 on observation tokens (tool responses, simulated-user turns, the template's
    turn markup between them). ``logprobs`` follows ``completion_ids`` (0.0 on observations) or is None.
    """

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    turns: list[str] = field(default_factory=list)  # raw text of each policy turn
    truncated: bool = False


def prompt_ids_for(tokenizer, episode: Episode, chat_template: str | None = None) -> list[int]:
    """The generation prompt of an episode, rendered with its task's tool schemas (as the evaluator does).
    ``chat_template``: the template to render with (``rollout_chat_template``); None: the tokenizer's own."""
    return list(
        tokenizer.apply_chat_template(
            episode.messages, tools=episode.task.tools or None, add_generation_prompt=True, tokenize=True,
            return_dict=False, chat_template=chat_template,
        )
    )


def observation_ids(tokenizer, observations: list[dict], chat_template: str | None = None) -> list[int]:
    """Token ids the chat template renders for ``observations`` after an assistant turn that ended with eos.

    Rendered as the difference between a short conversation ending in an assistant turn and the same
    conversation plus the observations and the next generation prompt, cut at the assistant turn's eos, so
    the ids continue exactly the tokens the policy generated (the policy's own eos included). Raises
    ``ValueError`` when the template re-renders the assistant turn once observations follow it (Qwen3's own
    template does: see ``rollout_chat_template``).
    """
    head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    # The dummy head must end with the same kind of turn the observations answer: tool results follow a call.
    if any(m["role"] == "tool" for m in observations):
        head[1] = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": observations[0].get("name", "tool"), "arguments": "{}"}}]}
    render = lambda msgs, gen: list(  # noqa: E731
        tokenizer.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=True, return_dict=False,
                                      chat_template=chat_template)
    )
    prefix, full = render(head, False), render(head + observations, True)
    eos = tokenizer.eos_token_id
    cut = max(i for i, t in enumerate(prefix) if t == eos) + 1
    if full[:cut] != prefix[:cut]:
        raise ValueError("chat template is not prefix-preserving: observations re-render the assistant turn")
    return full[cut:]


# The two observation kinds a rollout appends after a policy turn: tool results, and a simulated user's reply.
_PROBE_OBSERVATIONS = ([{"role": "tool", "name": "probe", "content": "probe"}], [{"role": "user", "content": "probe"}])


def _renders_observations(tokenizer, chat_template: str | None) -> bool:
    try:
        for obs in _PROBE_OBSERVATIONS:
            observation_ids(tokenizer, obs, chat_template)
    except ValueError:
        return False
    return True


def rollout_chat_template(tokenizer) -> str | None:
    """The chat template multi-turn rollouts render with: None (the tokenizer's own) when appending observations
    never re-renders the assistant turn before them, else TRL's prefix-preserving training variant of it.

    Qwen3's own template (Qwen3-8B-Base ships it) renders an empty ``<think>`` block in the last assistant turn
    and drops it once a tool result or user message follows, so the observation tokens could not be appended to
    what the policy generated. TRL swaps in its training template (``trl/chat_templates/qwen3_training.jinja``:
    every assistant turn rendered the same way, ``{% generation %}`` markers) only when ``tools=`` is passed,
    which our rollout path does not do (module docstring); this is the same swap, for ``rollout_func``. The
    tokenizer itself is left as it is: checkpoints keep their own template for evaluation. The prompt (system,
    tools, user, generation header) renders the same under both. Raises ``ValueError`` for a template that is
    not prefix-preserving and that TRL has no training variant of.
    """
    if _renders_observations(tokenizer, None):
        return None
    from trl.chat_template_utils import get_training_chat_template

    try:
        template = get_training_chat_template(tokenizer)
    except ValueError as exc:
        raise ValueError(
            "the tokenizer's chat template is not prefix-preserving (appending a tool result or a user message "
            f"re-renders the assistant turn before it) and TRL has no training variant of it ({exc}); give the "
            "tokenizer a prefix-preserving template for multi-turn GRPO") from None
    if template is None or not _renders_observations(tokenizer, template):
        raise ValueError("the tokenizer's chat template is not prefix-preserving for tool results and user "
                         "messages, and TRL's training variant of it is not either")
    return template


def context_problem(n_tokens: int, max_new_tokens: int, max_context: int | None) -> str | None:
    """Why a request of ``n_tokens`` context ids for up to ``max_new_tokens`` more cannot be sent to a model holding
    ``max_context`` tokens (prompt + completion; None: no limit), or None when it fits. The evaluator's rule
    (``policies.HFPolicy``: prompts up to ``max_context - max_new_tokens`` tokens): vLLM rejects a request past its
    ``max_model_len``, and under ZeRO-3 one rank's error leaves the others waiting in NCCL."""
    if max_context is None or n_tokens + max_new_tokens <= max_context:
        return None
    return (f"context limit: {n_tokens} context tokens + {max_new_tokens} new tokens exceed the model's context "
            f"({max_context} tokens)")


def rollout_episodes(episodes: list[Episode], policy: Policy, tokenizer, max_completion_length: int,
                     max_new_tokens: int | None = None, chat_template: str | None = None,
                     max_context: int | None = None, stop_ids: list[int] | None = None) -> list[Rollout]:
    """Drive ``episodes`` to the end with ``policy``; returns one ``Rollout`` per episode, in order.

    All unfinished episodes generate together, one turn per round. A turn ends where the evaluator ends it
    (``policies.split_turn`` at the first of ``stop_ids``, default ``stop_token_ids(tokenizer)``: eos,
    ``<|im_end|>``, ``<|endoftext|>``); the stop token the policy sampled is kept in the completion (it learns to
    end its turn) and the turn's text, the ids before it decoded without special tokens, is fed raw to
    ``episode.step``. Observations are then appended as the template renders them after ``<|im_end|>`` (after
    another stop token they follow that token: the sampled ids are never rewritten). Budgets, in tokens:
    ``max_completion_length`` for the whole rollout (policy and observation tokens, as TRL counts a
    completion), ``max_new_tokens`` per turn (the evaluator's cap; None: only the rollout budget), and
    ``max_context`` for a request (context ids + the turn's cap, ``context_problem``; None: no limit). An
    episode stops when it is done, when a turn is cut off by a budget, when the next observation would not fit
    the rollout budget, or when the next request would not fit the context ("context limit" failure; its
    observations are then not appended, so a rollout never ends in tokens no turn follows).
    ``chat_template``: what prompts and observations are rendered with (``rollout_chat_template``).
    """
    stops = stop_ids if stop_ids is not None else stop_token_ids(tokenizer)
    rolls = [Rollout(prompt_ids=prompt_ids_for(tokenizer, ep, chat_template)) for ep in episodes]

    def asked(r: Rollout, extra: int = 0) -> int:
        # What the next request may generate, as the engine is asked: the per-turn cap (vLLM gets it for every
        # call, grpo.vllm_kwargs), else the rest of the rollout budget.
        rest = max_completion_length - len(r.completion_ids) - extra
        return max_new_tokens if max_new_tokens is not None else rest

    active = []
    for i, ep in enumerate(episodes):
        if ep.done:
            continue
        problem = context_problem(len(rolls[i].prompt_ids), asked(rolls[i]), max_context)
        if problem:
            ep.end(problem)
        else:
            active.append(i)
    while active:
        reqs = []
        for i in active:
            budget = max_completion_length - len(rolls[i].completion_ids)
            if max_new_tokens is not None:
                budget = min(budget, max_new_tokens)
            reqs.append(Request(rolls[i].prompt_ids + rolls[i].completion_ids, episodes[i], budget))
        outs, lps = policy(reqs)
        stepped = []  # (i, the turn's text): the episodes whose turn ended at a stop token
        for k, i in enumerate(active):
            r, ep = rolls[i], episodes[i]
            text_ids, stop = split_turn(list(outs[k])[: reqs[k].max_new_tokens], stops)
            ids = text_ids + ([stop] if stop is not None else [])
            r.completion_ids += ids
            r.env_mask += [1] * len(ids)
            if lps is not None:
                r.logprobs = (r.logprobs or []) + list(lps[k][: len(ids)])
            text = tokenizer.decode(text_ids, skip_special_tokens=True)
            r.turns.append(text)
            if stop is None:  # cut off by a budget: the turn is incomplete
                r.truncated = True
                ep.end(f"turn cut off after {len(ids)} tokens (budgets: {max_new_tokens} per turn, "
                       f"{max_completion_length} per rollout)")
                continue
            stepped.append((i, text))
        # The round's steps together: a remote simulated customer answers them in threads (envs.base.step_workers)
        # instead of one request after the other.
        prefetch([episodes[i] for i, _ in stepped], [text for _, text in stepped])  # the round's searches, batched
        observations = map_concurrently(lambda item: episodes[item[0]].step(item[1]), stepped,
                                        step_workers([episodes[i] for i, _ in stepped]))
        still = []
        for (i, _), obs in zip(stepped, observations, strict=True):
            r, ep = rolls[i], episodes[i]
            if ep.done:
                continue
            obs_ids = observation_ids(tokenizer, obs, chat_template) if obs else []
            if not obs_ids or len(r.completion_ids) + len(obs_ids) >= max_completion_length:
                ep.end(f"completion budget ({max_completion_length} tokens) exhausted")
                continue
            n_next = len(r.prompt_ids) + len(r.completion_ids) + len(obs_ids)
            problem = context_problem(n_next, asked(r, len(obs_ids)), max_context)
            if problem:
                ep.end(problem)
                continue
            r.completion_ids += obs_ids
            r.env_mask += [0] * len(obs_ids)
            if r.logprobs is not None:
                r.logprobs += [0.0] * len(obs_ids)
            still.append(i)
        active = still
    return rolls


def context_limit(trainer) -> int | None:
    """Tokens (prompt + completion) a rollout request may span: vLLM's ``max_model_len`` under vLLM
    (``grpo.vllm_kwargs`` sets ``model.max_position_embeddings``), else the trained model's
    ``config.max_position_embeddings`` (None when neither is known)."""
    if trainer.use_vllm and getattr(trainer.args, "vllm_max_model_length", None):
        return int(trainer.args.vllm_max_model_length)
    n = getattr(getattr(trainer.model, "config", None), "max_position_embeddings", None)
    return int(n) if n else None


@contextmanager
def zero3_forwards_stay_local(engine):
    """Inside TRL's ``unwrap_model_for_generation`` (weights gathered, ZeRO-3 module hooks removed): also take off
    the hook DeepSpeed keeps on the top module, so a forward pass is local to its rank.

    TRL's ``remove_hooks`` removes the ZeRO-3 ``forward_hooks``/``backward_hooks`` lists but not the
    ``fwd_pre_hook`` that ``DeepSpeedZeRoOffload.setup_zero_stage3_hooks`` registers apart from them (TRL PR 4693
    documents the same). That hook's ``reset_step`` checks, while the parameter trace is incomplete (it always is
    during generation: ``add_hooks`` invalidates it), that the ranks recorded the same module order: a broadcast
    across the ranks at every forward. TRL's single-turn generation runs in lockstep (``synced_gpus``); a
    multi-turn rollout does not: a rank whose episodes all end first (a customer that fails at its opening) stops
    making forwards and the other ranks wait in that broadcast forever (found by the hostfile rehearsal). The hook
    goes back on, first in order as before, when the block ends. A no-op without ZeRO-3."""
    opt = getattr(engine, "optimizer", None)
    offload = getattr(opt, "parameter_offload", opt)
    handle, module = getattr(offload, "fwd_pre_hook", None), getattr(offload, "module", None)
    hook = module._forward_pre_hooks.get(handle.id) if handle is not None and module is not None else None
    if hook is None:
        yield
        return
    handle.remove()
    try:
        yield
    finally:
        offload.fwd_pre_hook = module.register_forward_pre_hook(hook, prepend=True)


def engine_sampling(generation_config) -> dict:
    """The engine's sampling arguments (temperature, top-p) from a trainer's ``GenerationConfig``; a setting the
    engine does not implement (top-k, min-p, a repetition penalty) is an error, not silently dropped."""
    g = generation_config
    if getattr(g, "top_k", None) not in (None, 0):
        raise ValueError(f"the CPU rollout engine samples with temperature and top-p only, not top_k={g.top_k}")
    if getattr(g, "min_p", None) not in (None, 0, 0.0):
        raise ValueError(f"the CPU rollout engine samples with temperature and top-p only, not min_p={g.min_p}")
    if getattr(g, "repetition_penalty", None) not in (None, 1.0):
        raise ValueError("the CPU rollout engine has no repetition penalty "
                         f"(repetition_penalty={g.repetition_penalty})")
    sample = bool(getattr(g, "do_sample", False))
    return {"temperature": float(g.temperature or 1.0) if sample else 0.0,
            "top_p": float(g.top_p if g.top_p is not None else 1.0)}


@contextmanager
def generation_model(trainer):
    """The trainer's model, whole and local to this rank, for the engine to read (TRL's
    ``unwrap_model_for_generation``: ZeRO-3's parameters gathered, its hooks off, ``zero3_forwards_stay_local``)."""
    from trl.models import unwrap_model_for_generation

    if trainer.is_deepspeed_enabled and not trainer.args.ds3_gather_for_generation:
        raise ValueError("CPU rollouts need ds3_gather_for_generation=True under ZeRO-3: with sharded weights every "
                         "rank must run the same forward passes, and episodes end unevenly")
    with unwrap_model_for_generation(
        trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
        generation_kwargs=getattr(trainer, "generation_kwargs", None),
    ) as model, zero3_forwards_stay_local(trainer.model_wrapped):
        yield model


class SingleTurnRollout:
    """TRL ``rollout_func`` for single-turn worlds (math, IF) on CPU: the engine samples every completion.

    TRL hands the prompts repeated ``num_generations`` times; the engine encodes each distinct prompt once and
    copies its cache to the group's generations (``acl_lib.eval.engine``), and each generation draws from a stream
    of its own, seeded from torch's generator (restored with a checkpoint: a resumed run draws the same). A
    completion is at most ``max_completion_length`` tokens and ends at the first stop id (kept, as TRL keeps the
    eos it generated). Prompts are rendered as TRL renders them (the chat template with the generation prompt).
    Under vLLM (the paper profile) TRL's own generation runs instead (``grpo.build_trainer``)."""

    def __init__(self):
        self.__name__ = "single_turn_rollout"

    def __call__(self, prompts: list, trainer) -> dict[str, Any]:
        tok = trainer.processing_class
        prompt_ids = [list(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False))
                      for p in prompts]
        with generation_model(trainer) as model:
            gen = TurnGenerator(model, tok.pad_token_id, stop_token_ids(tok), batch_size=len(prompt_ids),
                                reuse=False)
            outs = gen.generate(list(enumerate(prompt_ids)), trainer.max_completion_length,
                                **engine_sampling(trainer.generation_config))
        return {"prompt_ids": prompt_ids, "completion_ids": outs, "logprobs": None}


def hf_policy(trainer) -> Policy:
    """A ``Policy`` sampling from the trainer's model with the suite's engine (CPU / no vLLM).

    Uses the trainer's generation config (temperature, top-p; ``engine_sampling``) through the evaluator's
    ``TurnGenerator``: each episode's KV cache is kept across its turns, so a turn encodes only the observation
    that came after the policy's last tokens. Call inside ``unwrap_model_for_generation`` (``EpisodeRollout``
    does); make one per rollout call: the weights change between calls, the caches must not outlive them.
    """
    tok = trainer.processing_class
    state: dict = {}

    def policy(reqs: list[Request]):
        model = trainer._acl_gen_model  # set by EpisodeRollout for the duration of one rollout call
        if state.get("model") is not model:
            state["model"] = model
            # Stops at every stop token, as the evaluator's HFPolicy does (a base model may end a turn with
            # <|endoftext|>): a turn must not run on past one.
            state["gen"] = TurnGenerator(model, tok.pad_token_id, stop_token_ids(tok), batch_size=len(reqs))
        # The engine runs the gathered weights as plain tensors: no collective, so ranks whose episodes take
        # different numbers of turns never wait on each other (found by the hostfile rehearsal with generate()).
        # The weights are gathered whole for the rollout (ds3_gather_for_generation) and every ZeRO-3 hook is off
        # (EpisodeRollout, zero3_forwards_stay_local). Each episode samples from a stream of its own, seeded from
        # torch's generator (restored with a checkpoint, so a resumed run draws the same).
        outs = state["gen"].generate([(id(r.episode), r.ids) for r in reqs], max(r.max_new_tokens for r in reqs),
                                     **engine_sampling(trainer.generation_config))
        return outs, None

    return policy


def vllm_policy(trainer) -> Policy:
    """A ``Policy`` on TRL's vLLM backend (``use_vllm=True``, paper profile); returns sampled-token logprobs.

    Needs ``vllm_mode="colocate"`` with tensor parallel size 1 (``grpo.grpo_args`` sets colocate): each rank
    then generates locally, so ranks whose episodes take different numbers of turns never wait on each other.
    Server mode gathers prompts across ranks on every call and would deadlock on unequal turn counts. Each call
    generates one turn: ``grpo.vllm_kwargs`` caps it at ``grpo.max_new_tokens`` and stops it at every stop token
    (``stop_token_ids``); ``rollout_episodes`` ends the turn as the evaluator does and applies the rollout budget
    and the engine's context (``context_limit``: a request past it would kill this rank).
    Not exercised here (no vLLM on CPU).
    """

    def policy(reqs: list[Request]):
        _, completion_ids, logprobs, _ = trainer.vllm_generation.generate(
            prompts=[r.ids for r in reqs], images=None, num_generations=1
        )
        return completion_ids, [[lp[0] for lp in seq] for seq in logprobs]

    return policy


class EpisodeRollout:
    """TRL ``rollout_func`` for multi-turn worlds: ``rollout(prompts, trainer) -> dict``.

    The prompts TRL passes are ignored beyond their count: the episodes that ``EpisodeEnv.reset`` started from
    the same dataset rows (``trainer.environments``, one per prompt, in order) carry the task and render the
    prompt themselves. Returns ``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask`` and per-rollout
    ``turns`` / ``episode_failure`` (forwarded by TRL to the reward functions and logs).

    ``policy``: override the generator (a test drives real episodes with the scripted expert through the
    trainer this way); default: vLLM when the trainer uses it, else ``model.generate``. ``max_new_tokens``:
    the per-turn cap (``rollout_episodes``); the rollout budget is the trainer's ``max_completion_length``, the
    context of a request ``context_limit(trainer)``.
    """

    def __init__(self, policy: Policy | None = None, max_new_tokens: int | None = None):
        self.policy = policy
        self.max_new_tokens = max_new_tokens
        self.__name__ = "episode_rollout"
        self._template: tuple[int, str | None] | None = None  # (id of the tokenizer, rollout_chat_template of it)

    def chat_template(self, tokenizer) -> str | None:
        """``rollout_chat_template(tokenizer)``, worked out once per tokenizer."""
        if self._template is None or self._template[0] != id(tokenizer):
            self._template = (id(tokenizer), rollout_chat_template(tokenizer))
        return self._template[1]

    def __call__(self, prompts: list, trainer) -> dict[str, Any]:
        envs = trainer.environments
        if envs is None or len(envs) != len(prompts):
            raise RuntimeError("EpisodeRollout needs environment_factory=trl_env.environment_factory(...)")
        episodes = start_episodes(envs)
        tok = trainer.processing_class
        run = lambda policy: rollout_episodes(  # noqa: E731
            episodes, policy, tok, trainer.max_completion_length, self.max_new_tokens, self.chat_template(tok),
            max_context=context_limit(trainer))
        if self.policy is not None:
            rolls = run(self.policy)
        elif trainer.use_vllm:
            rolls = run(vllm_policy(trainer))
        else:
            # One unwrap for the whole multi-turn rollout: under ZeRO-3 the gather is a collective, so every
            # process enters and leaves it once whatever number of turns its own episodes take.
            with generation_model(trainer) as model:
                trainer._acl_gen_model = model
                try:
                    rolls = run(hf_policy(trainer))
                finally:
                    trainer._acl_gen_model = None
        for r in rolls:  # every completion needs >= 1 token for TRL's bookkeeping
            if not r.completion_ids:
                r.completion_ids, r.env_mask = [tok.eos_token_id], [1]
                if r.logprobs is not None:
                    r.logprobs = [0.0]
        logprobs = [r.logprobs for r in rolls]
        return {
            "prompt_ids": [r.prompt_ids for r in rolls],
            "completion_ids": [r.completion_ids for r in rolls],
            "logprobs": logprobs if all(lp is not None for lp in logprobs) else None,
            "env_mask": [r.env_mask for r in rolls],
            "turns": [len(r.turns) for r in rolls],
            # reward() first: it is what sets ``failure`` (get_reward calls it again; it is idempotent).
            "episode_failure": [(ep.reward(), ep.failure or "")[1] for ep in episodes],
        }
