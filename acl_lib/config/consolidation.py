"""The consolidations' and the machinery's config sections: MMOPD, SDFT, MLE, the launcher, merging, ablations,
diagnostics (re-exported by ``acl_lib.config``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from acl_lib.config.base import DOMAINS, _Section, check_domains


def _check_mixture(v: dict[str, float]) -> dict[str, float]:
    check_domains(v)
    if any(w < 0 for w in v.values()) or not sum(v.values()) > 0:
        raise ValueError(f"mixture weights must be >= 0 with a positive sum, got {v}")
    return v


class MMOPDConfig(_Section):
    """Multi-teacher mixed on-policy distillation (the MMOPD consolidation, ``acl_lib.consolidate.mmopd``)."""

    # Share of each domain's training prompts in the student's prompt mixture (normalised; 0 leaves a domain out).
    mixture: dict[str, float] = Field(default_factory=lambda: {d: 1.0 for d in DOMAINS})
    n_prompts: int = Field(64, ge=1)  # prompts drawn for the whole run, split over domains by ``mixture``
    max_steps: int = Field(5, ge=0)
    batch_size: int = Field(8, ge=1)  # on-policy rollouts per optimizer step
    learning_rate: float = Field(5e-5, gt=0)
    temperature: float = Field(1.0, gt=0)  # the student's sampling temperature for its rollouts
    # The "mixed" KL: reverse KL (student -> teacher) at every policy token, plus ``forward_weight`` x forward KL
    # over the teacher's ``top_q`` tokens where the teacher's entropy exceeds ``alpha`` nats. alpha = null (YAML;
    # infinity: no position qualifies) is plain reverse-KL on-policy distillation.
    alpha: float | None = Field(1.0, ge=0)
    top_q: int = Field(16, ge=1)
    forward_weight: float = Field(1.0, ge=0)
    # Where the frozen teachers live: "resident" (all on the training device) or "offload" (on the CPU, each moved
    # to the device for the micro-batch routed to it and back; what four 8B teachers beside an 8B student need).
    teacher_placement: Literal["resident", "offload"] = "resident"
    # Policy positions projected through the student's and the teacher's heads at once (the chunked divergence:
    # memory ~ chunk_tokens x vocabulary x a few float32 copies, not the batch's whole logits).
    chunk_tokens: int = Field(1024, ge=1)

    _mixture = field_validator("mixture")(classmethod(lambda cls, v: _check_mixture(v)))


class SDFTConfig(_Section):
    """Self-distilled fine-tuning (the SDFT consolidation, ``acl_lib.consolidate.sdft``)."""

    n_prompts: int = Field(32, ge=1)  # training prompts per domain each oracle samples on
    group_size: int = Field(8, ge=1)  # rollouts per prompt (the study: 8)
    temperature: float = Field(1.0, gt=0)
    # Near-duplicate filter: two kept trajectories of a domain whose assistant texts share more than this
    # Jaccard similarity of word n-grams (``dedup_ngram``) count as one.
    dedup_threshold: float = Field(0.9, gt=0, le=1)
    dedup_ngram: int = Field(3, ge=1)
    mixture: dict[str, float] = Field(default_factory=lambda: {d: 1.0 for d in DOMAINS})
    # Presentation order of the union: "shuffle" (interleaved), "staged" (domain by domain, curriculum order),
    # "difficulty" (easiest first, by the task's difficulty then episode length).
    order: Literal["shuffle", "staged", "difficulty"] = "shuffle"
    max_steps: int = Field(40, ge=0)  # the cap, with heldout_fraction set
    batch_size: int = Field(8, ge=1)
    learning_rate: float = Field(5e-4, gt=0)
    # Train until the SFT loss stops falling on held-out samples: this share of the union held out (0 = off, train
    # max_steps), its loss every eval_every steps, stop after patience measurements without a new low.
    heldout_fraction: float = Field(0.0, ge=0, lt=1)
    eval_every: int = Field(10, ge=1)
    patience: int = Field(2, ge=1)

    _mixture = field_validator("mixture")(classmethod(lambda cls, v: _check_mixture(v)))


class MLEConfig(_Section):
    """Modular LoRA experts on a frozen SDFT backbone, routed by the context (the MLE consolidation,
    ``acl_lib.consolidate.mle``)."""

    # PEFT LoraConfig of every expert
    rank: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                               "gate_proj", "up_proj", "down_proj"])
    # Each expert trains by GRPO in its domain's world, as the study's LoRA-RL experts, with the stage's settings
    # (cfg.for_stage(d)) and these budgets in place of the stage's. cold_start: true puts a LoRA-SFT cold start on
    # the scripted expert's demos before the GRPO of the domains whose stage has one (pipeline.cold_start).
    cold_start: bool = False
    num_demos: int = Field(64, ge=1)  # cold-start demos (at most the stage's own sft.num_demos)
    sft_max_steps: int = Field(40, ge=0)
    sft_learning_rate: float = Field(1e-3, gt=0)
    # None: the stage's own GRPO steps (cfg.for_stage(d)), so each expert gets its oracle's RL budget (rollouts a
    # step are the stage's grpo.batch_size either way)
    grpo_max_steps: int | None = Field(10, ge=0)
    grpo_learning_rate: float = Field(2e-4, gt=0)
    # Further per-expert settings, as dotted overrides on top of the above (e.g. {"ecom": ["grpo.max_steps=2"]}).
    stage_overrides: dict[str, list[str]] = Field(default_factory=dict)
    ablation_ranks: list[int] = Field(default_factory=lambda: [4, 16])  # the rank ablation's two values
    # The learned router: logistic regression on hashed bag-of-words of the first context, trained on training-split
    # contexts of each stage world and scored on disjoint held-out ones.
    router_train: int = Field(64, ge=1)  # training contexts per domain
    router_heldout: int = Field(32, ge=1)  # held-out contexts per domain (other tasks of the training split)
    router_features: int = Field(4096, ge=16)  # hash buckets of the bag of words (+ bigrams)
    router_steps: int = Field(300, ge=1)
    router_l2: float = Field(1e-3, ge=0)
    fallback: Literal[DOMAINS] = "if"  # the context router's choice when no rule fires
    # Measurements and stress cases
    latency_batch: int = Field(4, ge=1)  # episodes in the timed batch (one per domain, repeated)
    latency_new_tokens: int = Field(32, ge=1)
    latency_repeats: int = Field(2, ge=1)
    stress_tasks: int = Field(4, ge=1)  # episodes per stress case
    switch_turn: int = Field(1, ge=1)  # the mid-episode change: the desk changes after this many assistant turns
    # The MLE step's choices (not part of any run's key)
    backbone_fallback: bool = True  # start the experts from the base where sdft_base is missing (smoke keeps no data)
    stress_oracles: bool = True  # also run each oracle_<d> on the stress cases
    reroute: bool = False  # the learned router on the mid-episode change: decide again at every turn

    @field_validator("stage_overrides")
    @classmethod
    def _check_overrides(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        return check_domains(v)


class LauncherConfig(_Section):
    mode: Literal["in_process", "multi_process", "multi_node"] = "in_process"
    num_processes: int = Field(1, ge=1)  # per node
    num_nodes: int = Field(1, ge=1)
    zero_stage: Literal[0, 1, 2, 3] = 2
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    # Recompute activations in the backward pass instead of keeping them (every trainer: pretrain, SFT, GRPO):
    # ~30% more compute for memory that grows with layers only, not layers x tokens. Off for the small CPU models
    # (nothing to save, and slower); on for 8B at 16k-32k tokens per sequence (paper), which would not fit without.
    activation_checkpointing: bool = False
    # Evaluate each checkpoint in a Python process of its own (acl_lib.eval.sharding.evaluate_in_subprocess): the
    # GPU memory of its model / vLLM engine is freed when the process ends, before the next checkpoint's.
    eval_subprocess: bool = False
    # How long a rank waits in a collective for the others (TrainingArguments.ddp_timeout, torch's default 1800 s).
    # Ranks reach the next collective apart by the spread of their rollouts: a rank whose retail episodes wait on a
    # rate-limited simulated customer can trail the others by many minutes (docs/paper-checklist.md, issue 32 item 8).
    collective_timeout_s: int = Field(1800, ge=60)
    hostfile: str = ""
    # Where the ranks meet (multi_node). "" = the hostfile's first host by the name the hostfile gives it (Slurm:
    # the allocation's first node name), not DeepSpeed's `ssh <host> hostname -I` probe, whose first address can
    # be a container bridge or a management network. Port 0 = a free port picked on the node that starts the job
    # when it starts (a fixed 29500 made two jobs on one cluster collide); give one where a firewall needs it.
    master_addr: str = ""
    master_port: int = Field(0, ge=0, le=65535)
    slurm_partition: str = ""
    slurm_time: str = "48:00:00"
    # One GPU's memory, for the memory plans (MMOPD's: the colocated vLLM engine takes TRL's 0.3 of it).
    gpu_memory_gib: float = Field(80.0, gt=0)


class MergeConfig(_Section):
    """Weight merging (the merging step, ``acl_lib.consolidate.merging``): the validation grid search and the
    TIES / DARE variants. The merges' run keys hold the resolved coefficients and densities, not this section."""

    grid: list[float] = Field(default_factory=lambda: [0.25, 0.5])  # values each lambda_k may take: len ** 4 candidates
    n_validation_tasks: int = Field(4, ge=1)  # validation tasks per domain for each candidate (a seed no training uses)
    ties_density: float = Field(0.5, gt=0, le=1)  # TIES: fraction of each task vector kept (largest magnitudes)
    dare_density: float = Field(0.5, gt=0, le=1)  # DARE: probability of keeping an entry (kept ones / density)
    oracle_merge: bool = True  # also merge the four oracles uniformly (four single-domain task vectors)

    @field_validator("grid")
    @classmethod
    def _check_grid(cls, v: list[float]) -> list[float]:
        if not v or any(x < 0 for x in v):
            raise ValueError(f"grid must be a non-empty list of non-negative coefficients, got {v}")
        return v


class AblationsConfig(_Section):
    """Which variants the consolidation steps train beside their main run (each an extra run, so extra time)."""

    mmopd_reverse_kl: bool = True  # mmopd_rkl: alpha infinite (reverse KL only, no forward term)
    mmopd_single_teacher: bool = True  # mmopd_single: teacher seq_search, student seq_ecom, search prompts
    # sdft_mix_*: SDFT on a non-uniform domain mixture (null: none)
    sdft_mixture: dict[str, float] | None = Field(default_factory=lambda: {"math": 1.0, "search": 1.0, "ecom": 2.0,
                                                                          "if": 2.0})
    # sdft_<order>: presentation orders run beside sdft.order
    sdft_orders: list[Literal["shuffle", "staged", "difficulty"]] = Field(
        default_factory=lambda: ["staged", "difficulty"])
    mle_ranks: bool = False  # mle_r<k>: experts of each rank in mle.ablation_ranks
    mle_from_base: bool = False  # mle_frombase: experts on the base instead of sdft_base

    @field_validator("sdft_mixture")
    @classmethod
    def _check_sdft_mixture(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        return None if v is None else _check_mixture(v)


class DiagnosticsConfig(_Section):
    """The weight and token diagnostics (``acl_lib.diagnostics``)."""

    # Reference entropy (nats) above which a token position counts as high-entropy (finding F3). One value for every
    # profile, so the share of positions above it is a measurement beside the study's ~6%, not a setting tuned to
    # match it; 1 nat is also where MMOPD's forward KL starts (mmopd.alpha's default).
    entropy_threshold: float = Field(1.0, ge=0)
