"""Typed, validated configuration: profile YAML -> notebook parameters / ``--set`` -> ``Config``.

One source of truth per setting. Profiles (``acl_lib/profiles/*.yaml``) only change values; no code
branches on a profile's name. Unknown keys and wrong types fail before any compute, with a message that
names the key, where it came from and the valid keys.

Overrides are ``dotted.key=value`` strings; values are parsed as YAML (``eval.k=4``,
``pipeline.curriculum=[if,math,search,ecom]``, ``model.base_model=Qwen/Qwen3-8B-Base``).
"""

from __future__ import annotations

import copy
import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_serializer, model_validator

from acl_lib import domains
from acl_lib.config.base import DOMAINS, ConfigError, _Section, _strict, check_domains
from acl_lib.config.consolidation import (
    AblationsConfig,
    DiagnosticsConfig,
    LauncherConfig,
    MergeConfig,
    MLEConfig,
    MMOPDConfig,
    SDFTConfig,
    _check_mixture,  # noqa: F401 (re-exported: tests check the mixture rule)
)


class ModelConfig(_Section):
    # A hub id or a local directory to start from. Empty: build the small model from the fields below.
    base_model: str = ""
    vocab_size: int = Field(512, ge=64)  # tokenizer target size (BPE) for the locally built model
    hidden_size: int = Field(64, ge=8)
    intermediate_size: int = Field(128, ge=8)
    num_hidden_layers: int = Field(2, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    head_dim: int = Field(16, ge=4)
    max_position_embeddings: int = Field(1024, ge=64)
    tie_word_embeddings: bool = True
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class PretrainConfig(_Section):
    enabled: bool = True  # False: the base checkpoint is model.base_model, nothing is trained
    # "shipped": load the pretrained base committed with the suite (shipped_dir, checked against its model
    # card's sha256), as the paper profile starts from a released model; "pretrain": build it from scratch
    # with the recipe below (the recipe that built the shipped one; see its MODEL_CARD.md).
    source: Literal["pretrain", "shipped"] = "pretrain"
    shipped_dir: str = "acl_lib/data/mini_base"  # relative to the suite's checkout (or an absolute path)
    corpus_chars: int = Field(400_000, ge=1000)  # size of the corpus drawn from the mini worlds (BPE + pretraining)
    # Share of the corpus (in characters) per training world. Shares are by size, not by document count:
    # a retail transcript is ~20x longer than a math solution.
    mix: dict[str, float] = Field(default_factory=lambda: {"math": 0.35, "search": 0.2, "ecom": 0.25, "if": 0.2})
    noise: float = Field(0.35, ge=0, le=1)  # probability that a corpus transcript's assistant turn is corrupted
    max_steps: int = Field(20, ge=0)
    batch_size: int = Field(8, ge=1)
    seq_len: int = Field(256, ge=16)
    learning_rate: float = Field(3e-3, gt=0)
    warmup_steps: int = Field(0, ge=0)
    max_turns: int = Field(8, ge=1)  # turn limit of the corpus's expert transcripts
    # The corpus is drawn from worlds of cfg.worlds' shape built with these world seeds, never the evaluation
    # world's (checked): the base learns the formats and how to read, not the facts of the worlds it is tested on.
    world_seeds: list[int] = Field(default_factory=lambda: [1000, 1001, 1002, 1003])
    # Copy warm-up (phase 1, see acl_lib.train.pretrain): synthetic induction blocks before the corpus.
    copy_warmup_steps: int = Field(0, ge=0)
    copy_warmup_batch: int = Field(32, ge=1)
    copy_warmup_seq_len: int = Field(128, ge=16)
    copy_warmup_lr: float = Field(1e-3, gt=0)
    copy_mix: float = Field(0.0, ge=0, lt=1)  # share of synthetic copy blocks among the corpus blocks
    copy_eval_every: int = Field(0, ge=0)  # log the context-copy gain every N steps (0: never)
    # Mid-training (phase 3, acl_lib.train.midtrain): rejection-sampled scripted-expert episodes per domain, from
    # worlds of world_seeds, trained with assistant-only loss after the corpus. Off while midtrain_steps is 0.
    midtrain_demos: dict[str, int] = Field(default_factory=dict)
    midtrain_steps: int = Field(0, ge=0)
    midtrain_batch_size: int = Field(8, ge=1)
    midtrain_lr: float = Field(5e-4, gt=0)
    midtrain_max_length: int = Field(4096, ge=16)
    # The instruction-following rows' vocabulary: "world" (the IF world's train pools: 24 topics, 10 keywords) or
    # "wide" (acl_lib.envs.instruct.WIDE_NOUNS ...: ~200 topics and keywords, none of them a test word), so that
    # the base learns to copy a prompt's words.
    midtrain_if_vocab: Literal["world", "wide"] = "world"
    # Cool-down (phase 4, acl_lib.train.pretrain): the corpus of phase 2 drawn again (transcripts, documents, echo
    # documents), its transcripts corrupted with probability cooldown_noise (None: noise, as phase 2's), for
    # cooldown_steps steps after the mid-training, cosine from cooldown_lr. A modern base sees general text after
    # its mid-training data: it keeps the skills but no longer shows them on every prompt, so RL has something to
    # elicit. Off while cooldown_steps is 0.
    cooldown_steps: int = Field(0, ge=0)
    cooldown_lr: float = Field(2e-4, gt=0)
    cooldown_noise: float | None = Field(None, ge=0, le=1)
    COOLDOWN_KEYS: ClassVar[tuple[str, ...]] = ("cooldown_steps", "cooldown_lr", "cooldown_noise")
    # The retail desk's task kinds in the pretraining worlds (phase 2's transcripts, phase 3's episodes, phase 4's
    # corpus); None: worlds.retail_kinds. A base may have seen a wider desk than the one the suite scores it on
    # (Config.pretraining_worlds).
    world_retail_kinds: list[str] | None = None
    # Keys added after bases were built: left out of the dump at their defaults, so the recipe hash of every base
    # built before they existed is unchanged.
    LATER_KEYS: ClassVar[tuple[str, ...]] = ("midtrain_if_vocab", *COOLDOWN_KEYS, "world_retail_kinds")

    @model_serializer(mode="wrap")
    def _dump_without_later_defaults(self, handler):
        out = handler(self)
        if isinstance(out, dict):
            for key in self.LATER_KEYS:
                if key in out and out[key] == type(self).model_fields[key].default:
                    del out[key]
        return out

    @model_validator(mode="after")
    def _check_cooldown(self) -> PretrainConfig:
        if self.cooldown_steps > 0 and not (self.midtrain_steps > 0 and sum(self.midtrain_demos.values()) > 0):
            raise ValueError(f"pretrain.cooldown_steps={self.cooldown_steps} needs a mid-training phase to follow "
                             "(pretrain.midtrain_steps and pretrain.midtrain_demos)")
        return self

    @field_validator("world_retail_kinds")
    @classmethod
    def _check_world_retail_kinds(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or [k for k in v if k not in RETAIL_KINDS]):
            raise ValueError(f"world_retail_kinds must be null or a non-empty subset of {list(RETAIL_KINDS)}, got {v}")
        return v

    @field_validator("midtrain_demos")
    @classmethod
    def _check_midtrain_demos(cls, v: dict[str, int]) -> dict[str, int]:
        check_domains(v)
        if any(n < 0 for n in v.values()):
            raise ValueError(f"midtrain_demos must be >= 0 per domain, got {v}")
        return v

    @field_validator("mix")
    @classmethod
    def _check_mix(cls, v: dict[str, float]) -> dict[str, float]:
        check_domains(v)
        if any(x < 0 for x in v.values()) or sum(v.values()) <= 0:
            raise ValueError(f"mix shares must be >= 0 with a positive sum, got {v}")
        return v


# Default weights of the mini math world's difficulty levels 1-4 per split (``WorldsConfig.math_levels``).
RETAIL_KINDS = ("order_status", "order_total", "cancel", "modify_order_address", "modify_user_address",
                "modify_payment", "modify_items", "return", "exchange")
DEFAULT_MATH_LEVELS = {"train": [4, 3, 2, 1], "test": [1, 2, 3, 4]}


class UserSimConfig(_Section):
    """The LLM user simulator of the real tau2 tasks (``acl_lib/envs/llm_user.py``; tau2-bench's protocol).

    ``backend``: ``none`` (real tasks without a structured scenario cannot be played; the mini worlds' rule-based
    user needs no model), ``hf`` (a local HF model, batched ``generate`` as the evaluator's policy), ``vllm`` (an
    in-process vLLM engine) or ``openai`` (any OpenAI-compatible ``/v1/chat/completions`` endpoint: the OpenAI API,
    ``vllm serve``, ``transformers serve``).
    """

    backend: Literal["none", "hf", "vllm", "openai"] = "none"
    # hf / vllm: a model directory (relative: to the checkout, e.g. acl_lib/data/mini_base) or hub id; openai: the
    # model name the endpoint serves
    model: str = ""
    url: str = ""  # openai: the API's base URL, up to /v1 (e.g. http://127.0.0.1:8000/v1)
    api_key_env: str = ""  # openai: NAME of the environment variable holding the key ("" = send no key)
    temperature: float = Field(0.0, ge=0)  # tau2's default for the user: 0
    max_new_tokens: int = Field(256, ge=1)  # per user message
    max_turns: int = Field(30, ge=1)  # user messages per conversation, the first included; then the episode ends
    timeout_s: float = Field(120.0, gt=0)  # openai: per request
    retries: int = Field(2, ge=0)  # openai: further tries after a connection error, 429 or 502-504 (never a 500)
    backoff_s: float = Field(1.0, ge=0)  # openai: the first retry's wait, doubled at each next one (or Retry-After)
    max_backoff_s: float = Field(60.0, ge=0)  # openai: the longest wait between tries
    # openai: above this share of failed requests (the last 50, after 20) the run stops with an error instead of
    # training on, or scoring, episodes the endpoint failed (1 = never stop)
    max_failure_rate: float = Field(0.2, gt=0, le=1)
    concurrency: int = Field(8, ge=1)  # openai: requests in flight at once (the evaluator steps episodes in threads)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # hf / vllm

    @model_validator(mode="after")
    def _check_backend(self) -> UserSimConfig:
        if self.backend != "none" and not self.model:
            raise ValueError(f"user_sim.backend={self.backend} needs user_sim.model (a model directory, hub id or, "
                             "for openai, the served model's name)")
        if self.backend == "openai" and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"user_sim.backend=openai needs user_sim.url, an http(s):// base URL ending in /v1, "
                             f"got {self.url!r}")
        return self


class WorldsConfig(_Section):
    """How many tasks of each split the mini worlds generate, and where real data lives."""

    # The world seed fixes the generated worlds and the evaluation tasks. It is the same for every
    # training seed, so that mean +- std over seeds is taken on one benchmark.
    seed: int = Field(0, ge=0)
    n_train: int = Field(64, ge=1)  # training tasks per domain
    n_test: int = Field(16, ge=1)  # held-out in-domain tasks per benchmark
    n_ood: int = Field(16, ge=1)  # tasks per OOD benchmark
    data_dir: str = ""  # real datasets (paper profile); empty = generate mini worlds
    # optional POST /retrieve service for search (a Search-R1-style server: e5 dense retrieval there, whose scores
    # are not comparable with BM25's; docs/paper-checklist.md); empty = the local bm25s index
    retriever_url: str = ""
    search_topk: int = Field(3, ge=1)
    # Mini math world: weights of difficulty levels 1-4 per split. The default makes the held-out set
    # harder than training (AIME-like); a small model may need an easier mix (see the mini profile).
    math_levels: dict[str, list[float]] = Field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_MATH_LEVELS.items()})
    # Mini math world: the largest number a generator draws (0 = each generator's own range, up to 99).
    # A small cap keeps the arithmetic a table small enough for the mini model (see the mini profile).
    math_max_operand: int = Field(0, ge=0)
    # Mini retail world: the task kinds generated (all nine by default: order status and total, cancel,
    # modify order address, modify user address, modify payment, modify items, return, exchange) and how the
    # simulated users identify themselves ("any": e-mail or name + zip, half each; "email": e-mail only).
    # Fewer kinds make shorter, easier episodes; the 16 tools, the tau2 schema and the reward stay the same.
    retail_kinds: list[str] = Field(default_factory=lambda: list(RETAIL_KINDS))
    retail_auth: Literal["any", "email"] = "any"
    # Mini retail world: how many customers the store has (a range; the world seed draws the number). Train and
    # test tasks concern disjoint customers (75% / 25%); a larger store gives the training tasks more distinct
    # customers, so that a cold start cannot pass them by memorising e-mails and ids and has to copy them.
    retail_users: tuple[int, int] = (40, 80)
    # Who plays the customer of the real tau2 tasks (paper profile); see UserSimConfig.
    user_sim: UserSimConfig = Field(default_factory=UserSimConfig)

    @model_serializer(mode="wrap")
    def _dump_without_default_user_sim(self, handler):
        # At its default (backend none) user_sim is left out of the dump, so the worlds hash of every run made
        # before the key existed (all mini and smoke runs) is unchanged; any other value is dumped and hashed.
        out = handler(self)
        if isinstance(out, dict) and self.user_sim == UserSimConfig():
            out.pop("user_sim", None)
        if isinstance(out, dict) and tuple(self.retail_users) == (40, 80):  # same rule, same reason
            out.pop("retail_users", None)
        return out

    @field_validator("retail_kinds")
    @classmethod
    def _check_retail_kinds(cls, v: list[str]) -> list[str]:
        unknown = [k for k in v if k not in RETAIL_KINDS]
        if unknown or not v:
            raise ValueError(f"retail_kinds must be a non-empty subset of {list(RETAIL_KINDS)}, got {v}")
        return v

    @field_validator("retail_users")
    @classmethod
    def _check_retail_users(cls, v: tuple[int, int]) -> tuple[int, int]:
        if not 4 <= v[0] <= v[1]:
            raise ValueError(f"retail_users must be [low, high] with 4 <= low <= high, got {list(v)}")
        return v

    @field_validator("math_max_operand")
    @classmethod
    def _check_math_max_operand(cls, v: int) -> int:
        if 0 < v < 9:
            raise ValueError(f"math_max_operand must be 0 (generator ranges) or >= 9, got {v}")
        return v

    @field_validator("math_levels")
    @classmethod
    def _check_math_levels(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        if set(v) != {"train", "test"}:
            raise ValueError(f"math_levels needs exactly the keys train and test, got {sorted(v)}")
        for split, w in v.items():
            if len(w) != 4 or any(x < 0 for x in w) or sum(w) <= 0:
                raise ValueError(f"math_levels.{split} must be 4 weights >= 0 with a positive sum, got {w}")
        return v


# What ``eval.limits.<benchmark>`` may set, and each value's type: integers are at least 1, the temperature >= 0.
LIMIT_KEYS: dict[str, type] = {"max_turns": int, "max_new_tokens": int, "max_tasks": int, "k": int,
                               "temperature": float}


class EvalConfig(_Section):
    backend: Literal["hf", "vllm"] = "hf"
    k: int = Field(1, ge=1)  # samples per task (avg@k)
    temperature: float = Field(0.0, ge=0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(128, ge=1)  # per assistant turn
    max_turns: int = Field(8, ge=1)  # per episode
    batch_size: int = Field(16, ge=1)
    suites: Literal["in_domain", "ood", "all"] = "all"
    # Processes one evaluation is split over (sharding.evaluate_sharded): each scores every n-th task of each
    # benchmark on its own GPU, and the records are merged into one metrics.json. 1: one process.
    shards: int = Field(1, ge=1)
    # Generated tokens per second one shard sustains, for the estimate printed before each evaluation
    # (sizing.evaluation_estimate); 0: no time in the estimate. An assumption, not a measurement: set it from a
    # run's metrics.json (generated_tokens / generate_seconds).
    tokens_per_s: float = Field(0.0, ge=0)
    # Per benchmark (its key: retail, telecom, ...), limits that replace max_turns / max_new_tokens above, e.g.
    # {retail: {max_turns: 10, max_new_tokens: 121}}. The mini profile's come from what the scripted expert needs
    # (benchmarks/expert_needs.py: its longest episode and longest turn, plus a margin). ``max_tasks``: how many tasks
    # of that benchmark to score, instead of worlds.n_test / worlds.n_ood (a real set smaller than that is scored
    # whole; the paper profile sizes each OOD benchmark this way). ``k`` and ``temperature``: that benchmark's
    # samples per task (avg@k) and sampling temperature, instead of k / temperature above. A single-turn benchmark
    # can so be scored on more samples while the multi-turn desks stay greedy at k=1, e.g. the study's avg@16 at
    # 0.6 for AIME26: {aime26: {max_tasks: 64, k: 16, temperature: 0.6}}. The samples of one task are correlated,
    # so more tasks lower the error more than more samples do: acl_lib.noise.clustered_se lies between the binomial
    # SE of n x k trials (at 50%: 1.6 points for 64 x 16) and that of n (6.1; 8.3 for 32 greedy tasks). k > 1 at
    # temperature 0 would repeat one greedy sample: the harness scores it with k=1 and warns.
    limits: dict[str, dict[str, int | float]] = Field(default_factory=dict)

    @field_validator("limits", mode="before")
    @classmethod
    def _check_limits(cls, v: Any) -> dict:
        # A before-validator: the values are checked as written (pydantic's lax mode would read true as 1).
        if not isinstance(v, dict):
            raise ValueError(f"eval.limits must map benchmarks to their limits, got {v!r}")
        benchmarks = domains.BENCHMARK_DOMAIN
        unknown = sorted(set(v) - set(benchmarks))
        if unknown:
            raise ValueError(f"eval.limits: unknown benchmark(s) {unknown}; benchmarks are {sorted(benchmarks)}")
        out: dict[str, dict[str, int | float]] = {}
        for b, lim in v.items():
            if not isinstance(lim, dict):
                raise ValueError(f"eval.limits.{b} must map keys of {list(LIMIT_KEYS)} to values, got {lim!r}")
            bad_keys = sorted(str(key) for key in set(lim) - set(LIMIT_KEYS))
            if bad_keys:
                raise ValueError(f"eval.limits.{b}: unknown key(s) {bad_keys}; keys are {list(LIMIT_KEYS)}")
            out[b] = {}
            for key, x in lim.items():
                if LIMIT_KEYS[key] is int:
                    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                        raise ValueError(f"eval.limits.{b}.{key} must be an integer of at least 1, got {x!r}")
                else:
                    try:
                        number = _strict(float, x)
                    except ValueError:
                        raise ValueError(f"eval.limits.{b}.{key} must be a finite number, got {x!r}") from None
                    if number < 0:
                        raise ValueError(f"eval.limits.{b}.{key} must be at least 0 (0 = greedy), got {x!r}")
                    x = number
                out[b][key] = x
        return out

    def limits_for(self, benchmark: str) -> tuple[int, int]:
        """(max_turns, max_new_tokens) for ``benchmark``: its own limits where set, else the defaults."""
        lim = self.limits.get(benchmark, {})
        return lim.get("max_turns", self.max_turns), lim.get("max_new_tokens", self.max_new_tokens)

    def sampling_for(self, benchmark: str) -> tuple[int, float]:
        """(k, temperature) for ``benchmark`` as configured: samples per task and sampling temperature (0 =
        greedy), its own (``limits.<benchmark>.k`` / ``.temperature``) where set, else ``k`` / ``temperature``.
        The harness (``acl_lib.eval.harness.sampling_plan``) applies ``acl eval --k`` and scores k > 1 at
        temperature 0 with k=1."""
        lim = self.limits.get(benchmark, {})
        return int(lim.get("k", self.k)), float(lim.get("temperature", self.temperature))


class SFTConfig(_Section):
    num_demos: int = Field(32, ge=1)  # rejection-sampled trajectories kept for the cold start
    max_steps: int = Field(10, ge=0)
    # At most this many passes over the kept demos (0 = no cap): steps = min(max_steps, ceil(max_epochs x demos /
    # batch_size)). A cold start on a small real train split (tau2 retail: 74 tasks) would otherwise repeat it
    # hundreds of times; train_summary.json records the steps and epochs it took.
    max_epochs: float = Field(0.0, ge=0)
    batch_size: int = Field(8, ge=1)
    learning_rate: float = Field(1e-3, gt=0)
    max_length: int = Field(1024, ge=32)
    # Encode a batch's common prefix (system prompt, tool schemas) once and let every row attend to its cache:
    # the same loss and gradients, less compute where conversations share a long opening (the retail desk).
    share_prefix: bool = False
    # The cold start's stopping criterion, fixed in advance (acl_lib.train.sft.WellFormedStop): stop at the first
    # check where this share of greedy episodes on stop_check_tasks held-out training tasks (none of them a demo's)
    # make at least one tool call and no malformed one; checked every stop_check_every optimizer steps, max_steps
    # the cap. 0 = off (train max_steps). Worlds without tools always train max_steps.
    stop_at_well_formed: float = Field(0.0, ge=0, le=1)
    stop_check_every: int = Field(8, ge=1)
    stop_check_tasks: int = Field(16, ge=1)
    # Who the cold start's demos are sampled from (acl_lib.train.stage): "expert" (the world's scripted expert: the
    # smoke and mini profiles), "base" (the base checkpoint), "incoming" (the checkpoint the stage starts from), a
    # model directory or hub id, or with teacher_url the name of the model an OpenAI-compatible endpoint serves.
    teacher: str = "expert"
    teacher_url: str = ""  # OpenAI-compatible base URL up to /v1 (acl_lib.envs.llm_user.OpenAIChat)
    teacher_api_key_env: str = ""  # NAME of the environment variable holding the endpoint's key ("" = no key)
    samples_per_task: int = Field(1, ge=1)  # teacher episodes per task; a model teacher's repeats are de-duplicated
    teacher_temperature: float = Field(1.0, ge=0)  # a model teacher's sampling (0 = greedy)
    teacher_top_p: float = Field(1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _check_teacher(self) -> SFTConfig:
        t, url = self.teacher.strip(), self.teacher_url
        if not t or t != self.teacher:
            raise ValueError(f"sft.teacher must be expert, base, incoming, a model directory / hub id or a served "
                             f"model's name, without surrounding spaces; got {self.teacher!r}")
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(f"sft.teacher_url must be an http(s):// base URL ending in /v1, got {url!r}")
        if url and t in ("expert", "base", "incoming"):
            raise ValueError(f"with sft.teacher_url, sft.teacher is the name of the model it serves, not {t!r}")
        if self.teacher_api_key_env and not url:
            raise ValueError("sft.teacher_api_key_env is the key of an endpoint: set sft.teacher_url too")
        if self.samples_per_task > 1 and (t == "expert" or self.teacher_temperature == 0):
            why = "the scripted expert" if t == "expert" else "a greedy teacher (teacher_temperature 0)"
            raise ValueError(f"sft.samples_per_task={self.samples_per_task}: {why} gives the same episode every "
                             "time, every sample after the first would be a duplicate; use 1")
        return self

    @model_serializer(mode="wrap")
    def _dump_without_defaults_of_later_keys(self, handler):
        # Keys added after runs existed are left out of the dump at their defaults, so the sft hash of those runs
        # (every run that cold-starts from the scripted expert) is unchanged.
        out = handler(self)
        if isinstance(out, dict):
            for key in ("share_prefix", "teacher", "teacher_url", "teacher_api_key_env", "samples_per_task",
                        "teacher_temperature", "teacher_top_p"):
                if getattr(self, key) == SFTConfig.model_fields[key].default:
                    out.pop(key, None)
        return out


class GRPOConfig(_Section):
    max_steps: int = Field(5, ge=0)
    num_generations: int = Field(4, ge=2)
    batch_size: int = Field(8, ge=1)  # prompts x generations per step
    learning_rate: float = Field(1e-4, gt=0)
    beta: float = Field(0.0, ge=0)  # KL coefficient
    loss_type: str = "dapo"
    temperature: float = Field(1.0, gt=0)
    max_completion_length: int = Field(128, ge=8)  # single-turn worlds (math, IF): tokens per completion
    # Multi-turn worlds (search, retail): tokens of a whole rollout, policy + tool/user tokens of every turn
    # (TRL counts a multi-turn completion whole); each turn is also capped by eval.max_new_tokens.
    max_episode_tokens: int = Field(1024, ge=8)
    # Multi-turn worlds: assistant turns per training episode and tokens per turn (also the cold start's
    # demo episodes). Training keys, apart from eval.max_turns / eval.max_new_tokens: re-scoring never retrains.
    max_turns: int = Field(8, ge=1)
    max_new_tokens: int = Field(128, ge=1)
    use_vllm: bool = False
    # Sequences each process takes through one forward/backward (0: its whole share, batch_size / processes, at
    # once). Smaller: the step's batch is generated once and trained in batch_size / (processes x micro_batch_size)
    # accumulated micro-batches (TRL's steps_per_generation), so long episodes fit (docs/paper-checklist.md).
    micro_batch_size: int = Field(0, ge=0)
    # vLLM rollouts: put the colocated engine to sleep (weights and KV cache off the GPU) during the training
    # passes of a step (TRL's vllm_enable_sleep_mode), so they get the memory the engine holds while generating.
    # Single-turn rollouts only (grpo.vllm_kwargs): TRL 1.16's colocated engine sleeps after *every* generate call
    # and re-pushes the weights on the next (under ZeRO-3 a gather of every parameter, a collective). A multi-turn
    # rollout calls generate once per turn and ranks take different numbers of turns, so they would wait on
    # collectives the others never enter; multi-turn rollouts (search, e-commerce, MMOPD, the MLE experts on
    # those worlds) keep the engine awake, and their memory plan counts it.
    vllm_sleep_mode: bool = False


class PipelineConfig(_Section):
    curriculum: list[str] = Field(default_factory=lambda: list(DOMAINS))
    # Per-domain recipe: a cold start (rejection-sampled SFT) before GRPO?
    cold_start: dict[str, bool] = Field(
        default_factory=lambda: {"math": False, "search": True, "ecom": True, "if": False}
    )
    # Per-stage settings on top of the profile, as dotted overrides (e.g. {"ecom": ["grpo.max_steps=5"]}):
    # worlds differ in episode length and difficulty; one stage's budget should not be every stage's.
    stage_overrides: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("curriculum")
    @classmethod
    def _check_curriculum(cls, v: list[str]) -> list[str]:
        bad = [d for d in v if d not in DOMAINS]
        if bad:
            raise ValueError(f"unknown stage(s) {bad}; stages are {list(DOMAINS)}")
        if len(set(v)) != len(v):
            raise ValueError(f"curriculum repeats a stage: {v}")
        if len(v) != len(DOMAINS):
            # the sequential steps run one stage each and the oracles train one per stage: a shorter list would
            # fail minutes later, after the base is built
            raise ValueError(f"the curriculum must order all {len(DOMAINS)} stages {list(DOMAINS)} (the sequential "
                             f"steps run stages 1-{len(DOMAINS)}), got {v}")
        return v

    @field_validator("stage_overrides")
    @classmethod
    def _check_stage_overrides(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        check_domains(v)
        for d, items in v.items():
            for item in items:
                key = parse_override(item)[0]
                if key.startswith("pipeline."):
                    raise ValueError(f"stage override '{item}' for {d}: a stage cannot change the pipeline")
                if key in ("profile", "seed", "output_dir", "papermill_dir"):
                    raise ValueError(f"stage override '{item}' for {d}: a stage cannot change where runs are stored")
        return v

    @field_validator("cold_start")
    @classmethod
    def _check_cold_start(cls, v: dict[str, bool]) -> dict[str, bool]:
        return check_domains(v)


class Config(_Section):
    profile: str = "smoke"
    seed: int = Field(0, ge=0)
    output_dir: str = "outputs"
    papermill_dir: str = "papermill_runs"
    # CPU threads of one machine, split over the job's processes on it (seeding.threads_per_rank); 0 = every core
    # this process may use (GPU nodes: data collation, tokenising, rewards and tools run on the CPU).
    torch_threads: int = Field(2, ge=0)
    model: ModelConfig = Field(default_factory=ModelConfig)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)
    worlds: WorldsConfig = Field(default_factory=WorldsConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    mmopd: MMOPDConfig = Field(default_factory=MMOPDConfig)
    sdft: SDFTConfig = Field(default_factory=SDFTConfig)
    mle: MLEConfig = Field(default_factory=MLEConfig)
    launcher: LauncherConfig = Field(default_factory=LauncherConfig)
    diagnostics: DiagnosticsConfig = Field(default_factory=DiagnosticsConfig)
    merge: MergeConfig = Field(default_factory=MergeConfig)
    ablations: AblationsConfig = Field(default_factory=AblationsConfig)

    @model_validator(mode="after")
    def _check_corpus_worlds(self) -> Config:
        if self.worlds.seed in self.pretrain.world_seeds:
            raise ValueError(f"pretrain.world_seeds {self.pretrain.world_seeds} contains the evaluation world seed "
                             f"worlds.seed={self.worlds.seed}: the base would be pretrained on the test world")
        return self

    @model_validator(mode="after")
    def _check_micro_batches(self) -> Config:
        # what train.common.micro_batches will do with it, checked at load time (the job's processes: the launcher's)
        L = self.launcher
        procs = 1 if L.mode == "in_process" else L.num_processes * L.num_nodes
        g = self.grpo
        if g.micro_batch_size and g.batch_size % procs == 0:  # an uneven batch split is the trainer's error
            try:
                micro_batches(g.batch_size, procs, g.micro_batch_size)
            except ValueError as exc:
                raise ValueError(f"grpo.{exc} (grpo.batch_size {g.batch_size})") from None
        return self

    @model_validator(mode="after")
    def _check_stage_configs(self) -> Config:
        # a bad per-stage override fails at load time, before any compute, not when its stage starts
        for domain in self.pipeline.stage_overrides:
            self.for_stage(domain)
        return self

    # --- derived -----------------------------------------------------------------------------------
    def seed_dir(self) -> Path:
        """``outputs/<profile>/seed<k>``: where every run of this profile and seed lives.

        A relative ``output_dir`` is taken from the project root (so a notebook opened in JupyterLab,
        whose working directory is ``notebooks/``, writes to the same place as ``acl run``)."""
        return project_root() / self.output_dir / self.profile / f"seed{self.seed}"

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")

    def pretraining_worlds(self) -> WorldsConfig:
        """``worlds`` as the base's pretraining phases draw theirs (each at one of ``pretrain.world_seeds``): with
        ``pretrain.world_retail_kinds`` as the retail desk's kinds where set."""
        kinds = self.pretrain.world_retail_kinds
        return self.worlds if kinds is None else self.worlds.model_copy(update={"retail_kinds": list(kinds)})

    def for_stage(self, domain: str) -> Config:
        """This config with ``pipeline.stage_overrides[domain]`` applied (validated like any override)."""
        items = self.pipeline.stage_overrides.get(domain, [])
        if not items:
            return self
        tree = self.to_dict()
        tree["pipeline"]["stage_overrides"] = {}  # the stage's own config carries no further overrides
        for item in items:
            key, value = parse_override(item)
            _set_dotted(tree, key, value, f"pipeline.stage_overrides.{domain}")
        try:
            return Config.model_validate(tree)
        except ValidationError as exc:
            raise ConfigError(f"invalid stage override for {domain} (pipeline.stage_overrides.{domain}):\n"
                              + _format_errors(exc)) from None

    def hash(self, *sections: str) -> str:
        """Short stable hash of the whole config, or only of the named sections (what a run depends on)."""
        d = self.to_dict()
        if sections:
            d = {k: d[k] for k in sections}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def micro_batches(batch_size: int, processes: int, micro_batch_size: int = 0) -> tuple[int, int]:
    """``(per_device_batch, accumulation_steps)`` of a global ``batch_size`` over ``processes``: each process's
    share at once (``micro_batch_size`` 0), or in micro-batches of ``micro_batch_size``; a split that does not
    divide evenly is a ``ValueError`` naming the numbers."""
    if batch_size % processes:
        raise ValueError(f"batch size {batch_size} is not divisible by the {processes} processes of the job")
    share = batch_size // processes
    if not micro_batch_size or micro_batch_size >= share:
        return share, 1
    if share % micro_batch_size:
        raise ValueError(f"micro_batch_size {micro_batch_size} does not divide the {share} sequences each of the "
                         f"{processes} processes takes per step (batch size {batch_size})")
    return micro_batch_size, share // micro_batch_size


def project_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) holding both ``acl_lib/`` and
    ``notebooks/``: the suite's checkout. Falls back to ``start`` itself."""
    start = (start or Path.cwd()).resolve()
    for d in (start, *start.parents):
        if (d / "acl_lib").is_dir() and (d / "notebooks").is_dir():
            return d
    return start


# --- loading -----------------------------------------------------------------------------------------


def available_profiles() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("acl_lib.profiles").iterdir() if p.name.endswith(".yaml"))


def _valid_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_valid_keys(ann, f"{prefix}{name}."))
        else:
            keys.append(prefix + name)
    return keys


def _set_dotted(tree: dict, key: str, value: Any, source: str) -> None:
    parts = key.split(".")
    model: type[BaseModel] = Config
    node = tree
    for i, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            where = ".".join(parts[:i]) or "top level"
            valid = _valid_keys(model, ".".join(parts[:i]) + "." if i else "")
            raise ConfigError(
                f"unknown config key '{key}' (from {source}): no '{part}' at {where}. Valid keys: {', '.join(valid)}"
            )
        ann = fields[part].annotation
        last = i == len(parts) - 1
        if last:
            node[part] = value
        elif getattr(ann, "__origin__", None) is dict:
            # one entry of a dict-valued setting (pipeline.cold_start.math=true, eval.limits.retail.max_turns=10):
            # merge into the default
            current = node.get(part)
            if not isinstance(current, dict):
                current = copy.deepcopy(dict(fields[part].get_default(call_default_factory=True) or {}))
            node[part] = current
            for sub in parts[i + 1 : -1]:
                if not isinstance(current.get(sub), dict):
                    current[sub] = {}
                current = current[sub]
            current[parts[-1]] = value
            return
        else:
            if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
                raise ConfigError(f"config key '{key}' (from {source}): '{part}' is a value, not a section")
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config key '{key}' (from {source}): '{part}' is a section, got {node!r}")
            model = ann


def _flatten(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in tree.items():
        if isinstance(v, dict) and k not in ("cold_start", "stage_overrides", "mix", "midtrain_demos"):
            out.extend(_flatten(v, f"{prefix}{k}."))
        else:
            out.append((prefix + k, v))
    return out


def parse_override(item: str) -> tuple[str, Any]:
    """``"a.b=3"`` -> ``("a.b", 3)``; the value is parsed as YAML (a value that is not valid YAML is an error,
    not kept as text: ``model.base_model={`` is a typo, ``model.base_model='{'`` is the text)."""
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{item}' has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"override '{item}': the value of {key} is not valid YAML ({problem}); "
                          f"quote it to pass it as text: {key}='...'") from None
    return key, value


def _format_errors(exc: ValidationError) -> str:
    """One line per error, naming the key; the offending value only when it is short (never a whole section)."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        if isinstance(err.get("ctx", {}).get("error"), ConfigError):
            msg = str(err["ctx"]["error"])  # a ConfigError raised inside a validator says everything itself
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        got = err.get("input")
        shown = "" if (isinstance(got, (dict, list)) and len(repr(got)) > 80) or repr(got) in msg else f" (got {got!r})"
        lines.append(f"  {key}: {msg}{shown}" if key else "  " + msg.replace("\n", "\n  "))
    return "\n".join(lines)


# Chosen by their own arguments, never by --set: a --set value would be overwritten (seed) or would write
# one profile's runs under another profile's name (profile).
_NOT_OVERRIDABLE = {
    "profile": "the profile is chosen with --profile (or the notebook's `profile` parameter), not --set profile=...",
}


def load_config(
    profile: str = "smoke",
    overrides: list[str] | dict[str, Any] | None = None,
    seed: int | None = None,
    source: str = "--set",
) -> Config:
    """Resolve a profile plus overrides into a validated ``Config``. Raises ``ConfigError`` early."""
    if profile not in available_profiles():
        raise ConfigError(f"unknown profile '{profile}'; profiles are {available_profiles()}")
    text = resources.files("acl_lib.profiles").joinpath(f"{profile}.yaml").read_text()
    raw = yaml.safe_load(text) or {}
    tree: dict = {}
    for key, value in _flatten(raw):
        _set_dotted(tree, key, value, f"profile {profile}.yaml")
    tree["profile"] = profile
    items = overrides.items() if isinstance(overrides, dict) else [parse_override(o) for o in (overrides or [])]
    for key, value in items:
        if key in _NOT_OVERRIDABLE:
            raise ConfigError(f"{key} cannot be set with {source}: {_NOT_OVERRIDABLE[key]}")
        if key == "seed" and seed is not None and value != seed:
            raise ConfigError(f"seed={value!r} (from {source}) contradicts the seed argument {seed}: the seed is "
                              f"chosen with --seed / --seeds (or the notebook's `seed` parameter)")
        _set_dotted(tree, key, value, source)
    if seed is not None:
        tree["seed"] = seed
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(f"invalid config for profile '{profile}':\n" + _format_errors(exc)) from None


def setting_text(value: Any) -> str:
    """A config value as it is configured (``0.001``, ``5e-05``, ``True``, ``None``), for tables: pandas would
    round a float to the notebooks' display precision (one decimal, for scores), printing ``0.001`` as ``0.0``."""
    return "None" if value is None else str(value)
