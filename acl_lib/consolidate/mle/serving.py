"""MLE's serving: the evaluator's policies with a router in front.

``MLEPolicy`` (an ``HFPolicy``): one backbone, every adapter attached by name (``load_routed_model``); the router
decides once per episode, from its first context; a batch whose episodes need different experts is one
``generate`` per step with PEFT's per-row ``adapter_names`` (``RoutedTurnGenerator``: the evaluator's
``TurnGenerator`` with per-episode KV caches, the shared first prefix encoded per expert). ``reroute=True``
decides again at every turn (the mid-episode change) and drops the episode's cache when the expert changes.
``VLLMMLEPolicy`` (a ``VLLMPolicy``): the paper profile's path, vLLM multi-LoRA (``enable_lora``, one
``LoRARequest`` per request); its arguments are built by ``vllm_lora_engine_args`` / ``lora_requests`` (tested
without vLLM). Both keep the harness's turn semantics (rendering, the context guard, stop tokens, decoding).

``run_mle`` scores a system on the whole suite through the evaluator, or copies the evaluation of a system that
routes every episode the same way (``eval_twin``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.atomic import write_json
from acl_lib.consolidate.mle.experts import backbone_check, load_routed_model, run_experts
from acl_lib.consolidate.mle.routers import (
    Context,
    RecordingRouter,
    Router,
    decisions_from_json,
    decisions_json,
    make_router,
    routes_agree,
    run_router,
)
from acl_lib.consolidate.mle.specs import (
    BASE_ADAPTER,
    MLE_JSON,
    ROUTES_JSON,
    MLESpec,
    adapter_dirs,
    mle_run,
    router_run,
    start_run,
)
from acl_lib.eval.harness import evaluate as evaluate_suite
from acl_lib.eval.policies import HFPolicy, VLLMPolicy, cut_at_stop, eval_device, vllm_engine_args
from acl_lib.eval.sharding import evaluate_sharded
from acl_lib.eval.turns import TurnGenerator
from acl_lib.processes import call_in_child
from acl_lib.runs import run_once
from acl_lib.seeding import seed_and_threads
from acl_lib.steps import require_complete

if TYPE_CHECKING:
    from acl_lib.config import Config


class RoutedTurnGenerator(TurnGenerator):
    """``TurnGenerator`` whose rows each run their episode's expert (``adapter_of(key)``) in one call: the engine
    applies each row's LoRA adapter (``acl_lib.eval.engine.Row.adapter``); the shared first prefix is encoded
    once per expert."""

    def __init__(self, *args, adapter_of=None, **kw):
        super().__init__(*args, **kw)
        self.adapter_of = adapter_of

    def adapter(self, key):
        return self.adapter_of(key) if self.adapter_of else None


class MLEPolicy(HFPolicy):
    """``HFPolicy`` over one backbone with every expert attached; the router picks each episode's expert from its
    first context (``reroute``: from every turn's). Rendering, the context guard, generation and decoding are
    ``HFPolicy``'s; what differs is the model (``load_routed_model``), the generator (``RoutedTurnGenerator``),
    the episode key (the message list alone: the task shown may change mid-episode, ``SwitchEpisode``) and the
    routing before each batch."""

    def __init__(self, backbone_dir, adapters: Mapping[str, str | Path], router: Router, max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, batch_size: int = 16, dtype: str = "float32",
                 reuse_kv: bool = True, device: str | None = None, reroute: bool = False, model=None, tok=None):
        # HFPolicy.__init__ loads one plain checkpoint: the routed model is loaded here, then HFPolicy's own setup
        # runs with the routed generator
        device = eval_device(device)
        if model is None:
            model, tok = load_routed_model(backbone_dir, adapters, dtype, device)
        self.router = router
        self.reroute = reroute
        self.experts = set(adapters)
        self.routes: dict = {}  # episode key -> expert
        self.route_log: list[tuple[str, str]] = []  # (expert, how) per decision
        self._setup("mle", model, tok, device, max_new_tokens, temperature, top_p, batch_size, RoutedTurnGenerator,
                    reuse=reuse_kv, adapter_of=self.adapter_of)

    @staticmethod
    def _key(task, messages):
        # the episode's own message list: stable across its turns, also when the desk (and the task shown)
        # changes mid-episode (``SwitchEpisode``); never read by the router
        return id(messages)

    def adapter_of(self, key) -> str:
        d = self.routes[key]
        return d if d in self.experts else BASE_ADAPTER

    def decide(self, task, messages) -> str:
        key = self._key(task, messages)
        if key not in self.routes or self.reroute:
            d = self.router.route(Context.of(task, messages))
            if key in self.routes and self.routes[key] != d:
                self.gen.forget(key)  # its cache holds another expert's keys and values
                self.route_log.append((d, "rerouted"))
            elif key not in self.routes:
                self.route_log.append((d, "first"))
            self.routes[key] = d
        return self.routes[key]

    def forget(self, task, messages) -> None:
        super().forget(task, messages)
        self.routes.pop(self._key(task, messages), None)

    def __call__(self, batch):
        for t, m in batch:
            self.decide(t, m)
        return super().__call__(batch)


# --- vLLM multi-LoRA (paper profile) -----------------------------------------------------------------------


def vllm_lora_engine_args(backbone_dir, dtype: str, max_model_len: int, n_adapters: int, max_rank: int,
                          seed: int = 0, gpu_memory_utilization: float = 0.9) -> dict:
    """``vllm.LLM`` keyword arguments of the multi-LoRA engine: the evaluator's (``vllm_engine_args``) with LoRA
    enabled for ``n_adapters`` adapters of rank up to ``max_rank`` resident at once."""
    args = vllm_engine_args(str(backbone_dir), dtype, max_model_len, seed, gpu_memory_utilization)
    args.update(enable_lora=True, max_loras=int(n_adapters), max_lora_rank=int(max_rank))
    return args


@dataclass(frozen=True)
class _LoRARequestArgs:
    lora_name: str
    lora_int_id: int
    lora_path: str


def lora_request_class():
    """``vllm.lora.request.LoRARequest`` where vLLM is installed, else a stand-in with the same fields."""
    try:
        from vllm.lora.request import LoRARequest

        return LoRARequest
    except ImportError:
        return _LoRARequestArgs


def lora_requests(experts: Sequence[str], adapters: Mapping[str, str | Path], order: Sequence[str],
                  cls=None) -> list:
    """One ``LoRARequest`` per request: ``experts[i]`` -> (its name, a stable id from 1 in ``order``, its
    adapter's path); an expert without an adapter (the backbone) -> None."""
    cls = cls or lora_request_class()
    ids = {d: i + 1 for i, d in enumerate(order)}
    return [cls(lora_name=d, lora_int_id=ids[d], lora_path=str(adapters[d])) if d in adapters else None
            for d in experts]


class VLLMMLEPolicy(VLLMPolicy):
    """The paper profile's MLE serving: ``VLLMPolicy`` over one engine of the backbone with multi-LoRA; each
    request carries its episode's ``LoRARequest`` (the router decides once per episode). ``llm`` /
    ``sampling_params``: an engine and a ``SamplingParams`` factory instead of vLLM's (tests)."""

    def __init__(self, backbone_dir, adapters: Mapping[str, str | Path], router: Router, max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, dtype: str = "bfloat16", max_model_len: int = 32768,
                 max_rank: int = 8, seed: int = 0, llm=None, sampling_params=None, reroute: bool = False):
        # the engine is built here, with LoRA enabled: VLLMPolicy would build a plain one
        engine_args = vllm_lora_engine_args(backbone_dir, dtype, max_model_len, len(adapters), max_rank, seed)
        if llm is None or sampling_params is None:
            try:
                import vllm
            except ImportError as exc:
                raise RuntimeError("MLE on eval.backend=vllm needs vLLM (the 'gpu' extra)") from exc
            llm = llm if llm is not None else vllm.LLM(**engine_args)
            sampling_params = sampling_params or vllm.SamplingParams
        super().__init__(str(backbone_dir), max_new_tokens, temperature, top_p, dtype=dtype,
                         max_model_len=max_model_len, seed=seed, llm=llm, sampling_params=sampling_params)
        self.engine_args = engine_args
        self.name = "mle"
        self.adapters = {d: str(p) for d, p in adapters.items()}
        self.order = list(adapters)
        self.router, self.reroute = router, reroute
        self.routes: dict = {}

    _key = staticmethod(MLEPolicy._key)

    def decide(self, task, messages) -> str:
        key = self._key(task, messages)
        if key not in self.routes or self.reroute:
            self.routes[key] = self.router.route(Context.of(task, messages))
        return self.routes[key]

    def forget(self, task, messages) -> None:
        self.routes.pop(self._key(task, messages), None)

    def requests(self, batch) -> tuple[list, list, list[int]]:
        """``(prompts, lora_requests, fits)`` of a batch: token-id prompts that fit the context and their
        adapters (what ``llm.generate`` receives)."""
        experts = [self.decide(t, m) for t, m in batch]
        ids = [self.tok(self.render(t, m), add_special_tokens=False)["input_ids"] for t, m in batch]
        limit = self.max_context - self.max_new_tokens
        fits = [i for i in range(len(batch)) if len(ids[i]) <= limit]
        prompts = [{"prompt_token_ids": ids[i]} for i in fits]
        return prompts, lora_requests([experts[i] for i in fits], self.adapters, self.order), fits

    def __call__(self, batch):
        # VLLMPolicy.__call__ with each request's adapter passed to the engine
        prompts, loras, fits = self.requests(batch)
        out: list[str | None] = [None] * len(batch)
        if not fits:
            return out
        t0 = time.perf_counter()
        params = self.sampling_params(**self.sampling_args())
        outs = self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        self.generate_seconds += time.perf_counter() - t0
        for i, o in zip(fits, outs):
            toks = cut_at_stop(list(o.outputs[0].token_ids), self.stop_ids)
            self.generated_tokens += len(toks)
            out[i] = self.tok.decode(toks, skip_special_tokens=True)
        return out


# --- the system, scored --------------------------------------------------------------------------------------


def make_mle_policy(cfg: Config, spec: MLESpec, router: Router | None = None, reroute: bool = False):
    """The MLE policy of ``spec`` with the evaluator's settings (``eval.backend`` picks HF or vLLM)."""
    backbone = pipeline.model_dir(start_run(cfg, spec.start))
    adapters = adapter_dirs(cfg, spec)
    router = router or make_router(cfg, spec.router)
    e = cfg.eval
    if e.backend == "vllm":
        return VLLMMLEPolicy(backbone, adapters, router, e.max_new_tokens, e.temperature, e.top_p,
                             dtype=cfg.model.dtype, max_model_len=cfg.model.max_position_embeddings,
                             max_rank=spec.rank or cfg.mle.rank, seed=cfg.seed, reroute=reroute)
    return MLEPolicy(backbone, adapters, router, e.max_new_tokens, e.temperature, e.top_p, e.batch_size,
                     dtype=cfg.model.dtype, reroute=reroute)


def run_mle(cfg: Config, spec: MLESpec, evaluate: bool = True):
    """The MLE system of ``spec``: its experts (trained where missing; ``run_router`` for the learned router),
    the backbone check (``mle.json``), then the whole suite scored through the evaluator with ``MLEPolicy``
    (``<run>/eval/metrics.json``, as every checkpoint). Returns the run."""
    run_experts(cfg, spec)
    if spec.router == "learned":
        run_router(cfg)
    run = mle_run(cfg, spec)
    require_complete(run.inputs, f"MLE {spec.name}")

    def fn(r) -> None:
        check = backbone_check(cfg, spec)
        r.write_json(MLE_JSON, {"name": spec.name, "start": spec.start, "router": spec.router,
                                "rank": spec.rank or cfg.mle.rank, "backbone": str(pipeline.model_dir(run.inputs[0])),
                                "adapters": {d: str(p) for d, p in adapter_dirs(cfg, spec).items()},
                                "backbone_check": check})
        if not (check["files_unchanged"] and check["in_memory_equal"]):
            raise RuntimeError(f"MLE {spec.name}: the backbone changed: {check}")

    run_once(run, fn)
    if evaluate:
        ev = pipeline.eval_run(cfg, run)
        twin = eval_twin(cfg, spec)

        def score(r) -> None:
            if cfg.launcher.eval_subprocess:  # the multi-LoRA engine in a process of its own, as every evaluation
                call_in_child(score_mle, cfg, spec, str(r.path))
            else:
                score_mle(cfg, spec, str(r.path))

        if twin is not None and not ev.is_complete():
            run.logger.info("MLE %s routes every episode of the complete evaluation %s as it did: copied", spec.name,
                            twin.name)
            run_once(ev, pipeline.copy_eval_fn(twin, model=spec.name, files=(ROUTES_JSON,)))
        else:
            run_once(ev, score)
    return run


def score_mle(cfg: Config, spec: MLESpec, out_dir: str) -> None:
    """Score the MLE system of ``spec`` on the whole suite into ``out_dir`` (``metrics.json``, ``records/``) and
    write which expert each episode was routed to (``routes.json``); over ``eval.shards`` processes at once where
    that is above 1 (``sharding.evaluate_sharded`` with ``shard_policy``: each child builds the system, scores
    every n-th task and writes its shard's routes, merged here)."""
    if cfg.eval.shards > 1:
        evaluate_sharded(cfg, spec.name, out_dir, suites="all", policy_factory=f"{__name__}:shard_policy",
                         factory_args=[asdict(spec)])
        shards = sorted((Path(out_dir) / "shards").glob(f"*/{ROUTES_JSON}"), key=lambda p: int(p.parent.name))
        decisions = [x for p in shards for x in decisions_from_json(json.loads(p.read_text())["decisions"])]
        _write_routes(out_dir, decisions)
        return
    seed_and_threads(cfg.seed, cfg.torch_threads)
    policy = shard_policy(cfg, asdict(spec))
    try:
        evaluate_suite(cfg, spec.name, out_dir, suites="all", policy=policy)
        policy.finish(out_dir)
    finally:
        policy.close()


def _write_routes(out_dir, decisions) -> None:
    routes = Counter(d for _, d in decisions)
    write_json(Path(out_dir) / ROUTES_JSON, {"episodes_per_expert": dict(routes),
                                              "decisions": decisions_json(decisions)})


def shard_policy(cfg: Config, spec: dict):
    """The MLE policy of ``spec`` (an ``MLESpec`` as a dict) with a recording router and a ``finish(out_dir)`` that
    writes the routes it took (``routes.json``): what each process of a sharded MLE scoring builds."""
    router = RecordingRouter(make_router(cfg, spec["router"]))
    policy = make_mle_policy(cfg, MLESpec(**spec), router=router)
    policy.finish = lambda out_dir: _write_routes(out_dir, router.decisions)
    return policy


def eval_twin(cfg: Config, spec: MLESpec):
    """A complete MLE evaluation of this seed directory that ``spec``'s would repeat, or None: the same experts
    (start and rank) on the same backbone, whose recorded routing decisions (``routes.json``) ``spec``'s router
    makes on every episode. The policies then generate the same tokens for every episode, so the scores are the
    same; ``mle`` and ``mle_learned`` are twins whenever the learned router agrees with the context router."""
    router = None
    for path in sorted(cfg.seed_dir().glob(f"*/{MLE_JSON}")):
        if path.parent.name == spec.name:
            continue
        try:
            done = json.loads(path.read_text())
            other = MLESpec(path.parent.name, start=done["start"], router=done["router"],
                            rank=None if done.get("rank") == cfg.mle.rank else done.get("rank"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if other.expert_prefix(cfg) != spec.expert_prefix(cfg):
            continue
        trained = mle_run(cfg, other)
        ev = pipeline.eval_run(cfg, trained)
        if not trained.is_complete() or not ev.is_complete() or not (ev.path / ROUTES_JSON).is_file():
            continue
        recorded = json.loads((ev.path / ROUTES_JSON).read_text()).get("decisions")
        if not recorded:
            continue  # an evaluation from before decisions were recorded
        if router is None:
            if spec.router == "learned" and not router_run(cfg).is_complete():
                return None
            router = make_router(cfg, spec.router)
        if routes_agree(router, decisions_from_json(recorded)):
            return ev
    return None
