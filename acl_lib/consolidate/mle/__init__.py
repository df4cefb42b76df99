"""MLE, modular LoRA experts (notebook 11): a frozen backbone, one RL-trained LoRA expert per domain, routed by
the agent's execution context.

    start = default_start(cfg)                        # "sdft_base" (notebook 09), else "base" where 09 kept no data
    experts = run_experts(cfg, MLESpec("mle", start=start))   # mle_expert_<d>/adapter (PEFT), expert.json
    router = run_router(cfg)                          # mle_router/router.pt + router.json (accuracies, confusion)
    run_mle(cfg, MLESpec("mle", start=start))         # context router -> mle/eval/metrics.json (whole suite)
    run_mle(cfg, MLESpec("mle_learned", start=start, router="learned"))
    run_measurements(cfg, spec)                       # mle_measure/measurements.json (parameters, latency, memory)
    run_stress(cfg, spec)                             # mle_stress/stress.json (ambiguous, switch, two skills)

Modules, each one job (every name is importable from here):

    specs.py         MLESpec, the experts' recipes (expert_cfg, lora_kwargs) and the runs' keys (start, expert,
                     router, system) with the file names they hold
    experts.py       the LoRA experts: the launcher's jobs lora_sft / lora_grpo, train_expert, run_expert(s), the
                     backbone's bit-for-bit checks, load_routed_model (the backbone with every adapter attached)
    routers.py       Context, the context rule and the learned router, their decisions and confusion, run_router
    serving.py       MLEPolicy / VLLMMLEPolicy (the evaluator's HFPolicy / VLLMPolicy with a router), run_mle,
                     eval_twin
    measurements.py  parameters, memory and latency against the backbone and a merged expert
    stress.py        the stress cases (ambiguous contexts, a desk switch, two skills) and run_stress
    tables.py        what notebook 11 shows: DataFrames and a reading computed from the numbers
"""

from __future__ import annotations

from acl_lib.consolidate.mle.experts import (
                                             GRPO_SUBDIR,
                                             SFT_SUBDIR,
                                             TRAIN_SUMMARY,
                                             backbone_check,
                                             backbone_tensors_equal,
                                             file_digests,
                                             load_routed_model,
                                             lora_parameters,
                                             run_expert,
                                             run_experts,
                                             train_expert,
                                             train_lora_grpo,
                                             train_lora_sft,
)
from acl_lib.consolidate.mle.measurements import measure, measure_run, run_measurements
from acl_lib.consolidate.mle.routers import (
                                             Context,
                                             ContextRouter,
                                             LearnedRouter,
                                             RecordingRouter,
                                             Router,
                                             accuracy,
                                             benchmark_tasks,
                                             confusion,
                                             decisions_from_json,
                                             decisions_json,
                                             features,
                                             make_router,
                                             router_contexts,
                                             routes_agree,
                                             run_router,
)
from acl_lib.consolidate.mle.serving import (
                                             MLEPolicy,
                                             RoutedTurnGenerator,
                                             VLLMMLEPolicy,
                                             eval_twin,
                                             lora_request_class,
                                             lora_requests,
                                             make_mle_policy,
                                             run_mle,
                                             vllm_lora_engine_args,
)
from acl_lib.consolidate.mle.specs import (
                                             ADAPTER_DIR,
                                             BASE_ADAPTER,
                                             EXPERT_JSON,
                                             EXPERT_SECTIONS,
                                             LABEL_FIELDS,
                                             MEASURE_JSON,
                                             MLE_JSON,
                                             ROUTER_FILE,
                                             ROUTER_JSON,
                                             ROUTER_RUN,
                                             ROUTER_SEED,
                                             ROUTERS,
                                             ROUTES_JSON,
                                             STARTS,
                                             STRESS_JSON,
                                             MLESpec,
                                             ablation_specs,
                                             adapter_dirs,
                                             default_start,
                                             expert_cfg,
                                             expert_cold_start,
                                             expert_name,
                                             expert_run,
                                             lora_config,
                                             lora_kwargs,
                                             mle_run,
                                             router_run,
                                             start_run,
)
from acl_lib.consolidate.mle.stress import (
                                             SwitchEpisode,
                                             TwoSkillEpisode,
                                             ViewEpisode,
                                             run_stress,
                                             stress_episodes,
                                             stress_run,
                                             stress_scores,
)
from acl_lib.consolidate.mle.tables import (
                                             confusion_frame,
                                             experts_frame,
                                             measurements_frame,
                                             reading,
                                             router_accuracy_frame,
                                             stress_frame,
                                             stress_routes_frame,
)

__all__ = [
    # specs
    "ADAPTER_DIR", "BASE_ADAPTER", "EXPERT_JSON", "EXPERT_SECTIONS", "LABEL_FIELDS", "MEASURE_JSON", "MLE_JSON",
    "ROUTER_FILE", "ROUTER_JSON", "ROUTER_RUN", "ROUTER_SEED", "ROUTERS", "ROUTES_JSON", "STARTS", "STRESS_JSON",
    "MLESpec", "ablation_specs", "adapter_dirs", "default_start", "expert_cfg", "expert_cold_start", "expert_name",
    "expert_run", "lora_config", "lora_kwargs", "mle_run", "router_run", "start_run",
    # experts
    "GRPO_SUBDIR", "SFT_SUBDIR", "TRAIN_SUMMARY", "backbone_check", "backbone_tensors_equal", "file_digests",
    "load_routed_model", "lora_parameters", "run_expert", "run_experts", "train_expert", "train_lora_grpo",
    "train_lora_sft",
    # routers
    "Context", "ContextRouter", "LearnedRouter", "RecordingRouter", "Router", "accuracy", "benchmark_tasks",
    "confusion", "decisions_from_json", "decisions_json", "features", "make_router", "router_contexts",
    "routes_agree", "run_router",
    # serving
    "MLEPolicy", "RoutedTurnGenerator", "VLLMMLEPolicy", "eval_twin", "lora_request_class", "lora_requests",
    "make_mle_policy", "run_mle", "vllm_lora_engine_args",
    # measurements
    "measure", "measure_run", "run_measurements",
    # stress
    "SwitchEpisode", "TwoSkillEpisode", "ViewEpisode", "run_stress", "stress_episodes", "stress_run",
    "stress_scores",
    # tables
    "confusion_frame", "experts_frame", "measurements_frame", "reading", "router_accuracy_frame",
    "stress_frame", "stress_routes_frame",
]
