"""The study's vocabulary: its four domains, in the study's order, and the names each one goes by.

A domain has three names in the suite, one per role: the *stage* that trains it (``ecom``: run names ``seq_ecom``,
``oracle_ecom``, the keys of ``pipeline.curriculum`` and every per-domain setting), the *environment* it trains
and is scored in (``retail``: ``acl_lib.envs.ENVIRONMENTS``), and its *in-domain benchmark* (``retail``: a key of
``paper_results.yaml`` and of every metrics table). Its *out-of-domain* benchmarks measure the same skill on
tasks it never trained on. This table is the one place those names are written; ``acl_lib.envs`` (``STAGE_ENV``,
``IN_DOMAIN``, ``BENCHMARKS``) and ``acl_lib.config`` (``DOMAINS``, the default curriculum) are views of it.

    stage   environment  in-domain  out-of-domain
    math    math         aime26     gpqa, mmlu_redux
    search  search       nq         single_hop, multi_hop
    ecom    retail       retail     telecom, mock
    if      instruct     ifeval     ifbench
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Domain:
    stage: str  # the training stage's name: seq_<stage>, oracle_<stage>, pipeline.curriculum entries
    env: str  # the environment it trains in (an acl_lib.envs.ENVIRONMENTS key)
    in_domain: str  # its in-domain benchmark (a paper_results.yaml key)
    ood: tuple[str, ...]  # its out-of-domain benchmarks, in the tables' order
    shown: str  # the out-of-domain benchmark a stage's notebook shows transcripts of (the study's headline one)


# In the study's order: the sequential curriculum math -> search -> ecom -> if.
TABLE: tuple[Domain, ...] = (
    Domain("math", env="math", in_domain="aime26", ood=("gpqa", "mmlu_redux"), shown="gpqa"),
    Domain("search", env="search", in_domain="nq", ood=("single_hop", "multi_hop"), shown="multi_hop"),
    Domain("ecom", env="retail", in_domain="retail", ood=("telecom", "mock"), shown="telecom"),
    Domain("if", env="instruct", in_domain="ifeval", ood=("ifbench",), shown="ifbench"),
)

ORDER: tuple[str, ...] = tuple(d.stage for d in TABLE)  # the study's curriculum
BY_STAGE: dict[str, Domain] = {d.stage: d for d in TABLE}
STAGE_ENV: dict[str, str] = {d.stage: d.env for d in TABLE}  # stage -> environment
IN_DOMAIN: dict[str, str] = {d.stage: d.in_domain for d in TABLE}  # stage -> in-domain benchmark
SHOWN_OOD: dict[str, str] = {d.stage: d.shown for d in TABLE}  # stage -> the OOD benchmark its notebook shows
# Every benchmark, in the tables' order (the in-domain ones in the study's order, then each domain's OOD ones),
# mapped to the stage whose skill it measures.
BENCHMARK_DOMAIN: dict[str, str] = {d.in_domain: d.stage for d in TABLE} | {b: d.stage for d in TABLE for b in d.ood}
