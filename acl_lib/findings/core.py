"""What every rule shares: the verdicts, the thresholds, the registry, a row, and the parts a rule tests with their
power.

A rule breaks its finding into **parts** (:class:`Part`), each a test on an estimate with a standard error
(:mod:`acl_lib.noise`): it *holds* when the data show it beyond noise (on the confidence bound); it *fails* when the
data show the contrary beyond noise, or show nothing although the test could have seen an effect as large as the
study's own; it is *underpowered* when it shows nothing and could not have seen the study's effect (its minimum
detectable effect, :func:`acl_lib.noise.detectable`, is larger). :func:`decide` turns the parts into the verdict:
reproduced when every part holds, not reproduced when one fails, else underpowered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from acl_lib.final import STUDY_DERIVED, FinalData
from acl_lib.noise import FORMULA, Estimate, detectable

REPRODUCED, NOT_REPRODUCED, UNDERPOWERED, NOT_TESTABLE = ("reproduced", "not reproduced", "underpowered",
                                                          "not testable")
VERDICTS = (REPRODUCED, NOT_REPRODUCED, UNDERPOWERED, NOT_TESTABLE)
HOLDS, FAILS = "holds", "fails"  # a part's status; the third is UNDERPOWERED

# Thresholds of the rules (each written into its rule's text; docs/findings-rules.md, fixed 2026-12-07).
F3_LOW_STABLE_MIN = 0.9  # low-entropy positions that still rank the rollout's token first: "stay put" from here
F3_CHANGED_HIGH_MIN = 0.8  # changed positions that are high-entropy: "almost all" from here
F3_STUDY_ALMOST_ALL = 0.95  # the study's "almost all", as a number for the power of that part (it gives none)
F4_SAME_MIN = 0.5  # the same SFT mixture from two starts: "aligned" from this cosine (the study: 0.77)
F4_UNRELATED_MAX = 0.15  # |cosine| of unrelated SFT updates: "nearly orthogonal" up to here (the study: 0.05)
F5_BAND = (3.0, 7.0)  # the study's "3 to 7 times"
F7_DOMAIN_GAP = 10.0  # points: the equivalence margin of each domain's gap to its oracle
F7_MEAN_GAP = 5.0  # points: the mean gap over the domains at least minus this
# The out-of-domain benchmarks on which the study names MLE best: GPQA, single-hop, multi-hop, tau-Mock.
F7_OOD = ("gpqa", "single_hop", "multi_hop", "mock")
F8_AGENTIC = ("search", "ecom")  # the agentic domains: nq and retail

NOISE_FLOOR = f"± is the combined standard error: {FORMULA}"


@dataclass(frozen=True)
class Finding:
    """A finding: its id, the study's claim, the rule that judges it (in words) and the function applying it."""

    id: str
    claim: str
    rule: str
    judge: Callable[[FinalData], dict]


RULES: dict[str, Finding] = {}


def finding(fid: str, claim: str, rule: str):
    """Register a rule function as finding ``fid``, with the study's claim and the rule in words beside it."""

    def register(fn):
        RULES[fid] = Finding(fid, claim, rule, fn)
        ordered = sorted(RULES.items(), key=lambda kv: int(kv[0][1:]))  # F1 ... F8, whatever the import order
        RULES.clear()
        RULES.update(ordered)
        fn.finding = RULES[fid]
        return fn

    return register


# --- parts and their power --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One test of a rule: ``name`` (what it tests), ``status`` (:data:`HOLDS`, :data:`FAILS` or
    :data:`UNDERPOWERED`), ``mde`` the smallest effect it detects at our precision (None: no standard error
    known, the point value judged), ``study`` the study's own effect on the same test (None: the study gives none
    there), in ``unit``."""

    name: str
    status: str
    mde: float | None = None
    study: float | None = None
    unit: str = " points"
    digits: int = 1

    def power_text(self) -> str:
        if self.mde is None:
            return f"{self.name}: precision unknown (no standard error), judged on the point value"
        d = self.digits
        study = "no study figure" if self.study is None else f"the study's {self.study:.{d}f}{self.unit}"
        return f"{self.name}: detects {self.mde:.{d}f}{self.unit} ({study})"

    def as_dict(self) -> dict:
        return {"test": self.name, "status": self.status, "detectable": self.mde, "study_effect": self.study,
                "powered": None if self.mde is None or self.study is None else self.mde <= self.study,
                "unit": self.unit.strip()}


def mde_of(est: Estimate) -> float | None:
    """The minimum detectable effect of ``est``; None when nothing gives it an error (one seed without a per-seed
    standard error)."""
    if est.seeds < 2 and est.sampling is None:
        return None
    return detectable(est.se)


def undecided(name: str, est: Estimate, study: float | None, **fmt) -> Part:
    """A part whose test saw nothing either way: underpowered when it could not have seen the study's effect."""
    mde = mde_of(est)
    weak = mde is not None and study is not None and mde > study
    return Part(name, UNDERPOWERED if weak else FAILS, mde, study, **fmt)


def above(name: str, est: Estimate | None, threshold: float, study: float | None, strict: bool = True,
          **fmt) -> Part | None:
    """``est`` above ``threshold`` on its lower confidence bound (``value - BEYOND SE``; ``strict=False``: at or
    above); it fails when its upper bound is below (the contrary shown) or nothing gives it an error; ``study``:
    the study's own margin over the threshold. None when ``est`` is None."""
    if est is None:
        return None
    lo, hi = est.low, est.high
    if lo > threshold or (not strict and lo >= threshold):
        return Part(name, HOLDS, mde_of(est), study, **fmt)
    if hi < threshold or est.se == 0:
        return Part(name, FAILS, mde_of(est), study, **fmt)
    return undecided(name, est, study, **fmt)


def below(name: str, est: Estimate | None, threshold: float, study: float | None, strict: bool = True,
          **fmt) -> Part | None:
    """``est`` below ``threshold`` on its upper confidence bound: :func:`above` mirrored."""
    if est is None:
        return None
    return above(name, Estimate(-est.value, est.se, est.seeds, est.spread, est.sampling), -threshold, study, strict,
                 **fmt)


def within(name: str, est: Estimate | None, lo: float, hi: float, study: float | None, **fmt) -> Part | None:
    """``est`` inside ``[lo, hi]`` on both confidence bounds (an equivalence test); it fails when a bound lies
    beyond the far edge (the contrary shown) or nothing gives it an error; ``study``: the room the study's own
    value leaves to the nearer edge."""
    if est is None:
        return None
    low, high = est.low, est.high
    if low >= lo and high <= hi:
        return Part(name, HOLDS, mde_of(est), study, **fmt)
    if low > hi or high < lo or est.se == 0:
        return Part(name, FAILS, mde_of(est), study, **fmt)
    return undecided(name, est, study, **fmt)


def any_of(name: str, parts: Sequence[Part]) -> Part:
    """A part that holds when one of ``parts`` holds. Else it fails when the test could have seen the study's
    pattern: one candidate where the study has an effect fails (a powered test saw nothing, or the contrary), or no
    candidate has a study effect at all; it is underpowered when every candidate with a study effect is. Its power
    is the best-powered candidate's."""
    if not parts:
        return Part(name, FAILS)
    with_study = [p for p in parts if p.study is not None]
    status = (HOLDS if any(p.status == HOLDS for p in parts) else
              FAILS if not with_study or any(p.status == FAILS for p in with_study) else UNDERPOWERED)
    return _summary(name, status, parts, min)


def all_of(name: str, parts: Sequence[Part]) -> Part:
    """A part that holds when every one of ``parts`` holds, fails when one fails, else is underpowered; its power
    is the weakest part's."""
    if not parts:
        return Part(name, HOLDS)
    status = (FAILS if any(p.status == FAILS for p in parts) else
              HOLDS if all(p.status == HOLDS for p in parts) else UNDERPOWERED)
    return _summary(name, status, parts, max)


def _summary(name: str, status: str, parts: Sequence[Part], pick) -> Part:
    """``name`` with ``status`` and the power of one of ``parts``: ``pick`` (min: the best-powered, max: the
    weakest) by how far its detectable effect lies above the study's, among the parts with a study figure where
    there are some."""
    judged = [p for p in parts if p.mde is not None]
    with_study = [p for p in judged if p.study is not None]
    if not judged:
        return Part(name, status, None, None, parts[0].unit, parts[0].digits)
    chosen = pick(with_study or judged, key=lambda p: p.mde - (p.study or 0.0))
    return Part(name, status, chosen.mde, chosen.study, chosen.unit, chosen.digits)


def decide(parts: Sequence[Part]) -> str:
    """The verdict of a rule from its parts: reproduced when all hold, not reproduced when one fails, else
    underpowered."""
    if any(p.status == FAILS for p in parts):
        return NOT_REPRODUCED
    if all(p.status == HOLDS for p in parts):
        return REPRODUCED
    return UNDERPOWERED


def failing(parts: Sequence[Part]) -> str:
    """The names of the parts that do not hold, with how: ``(b) recovery fails; ...``."""
    return "; ".join(f"{p.name} {'fails' if p.status == FAILS else 'is underpowered'}" for p in parts
                     if p.status != HOLDS)


# --- rows -------------------------------------------------------------------------------------------------------


def _row(fid: str, quantity: str, ours: str, study: str, verdict: str, detail: str = "", values: dict | None = None,
         study_values: dict | None = None, study_source: str = "reported by the study",
         parts: Sequence[Part] = ()) -> dict:
    f = RULES[fid]
    if study and study_source == STUDY_DERIVED and STUDY_DERIVED not in study:
        study = f"{study} ({STUDY_DERIVED})"
    power = "; ".join(p.power_text() for p in parts) if parts else "-"
    return {"finding": fid, "claim": f.claim, "rule": f.rule, "quantity": quantity, "ours": ours, "study": study,
            "study_source": study_source, "verdict": verdict, "power": power,
            "power_parts": [p.as_dict() for p in parts], "detail": detail, "values": values or {},
            "study_values": study_values or {}}


def missing_runs(data: FinalData, runs: Sequence[str]) -> list[str]:
    return [r for r in runs if not data.has(r)]


def complete_seeds(data: FinalData, runs: Sequence[str]) -> list[int]:
    return [s for s in data.seeds if all(s in data.row(r) for r in runs)]


def e(est: Estimate | None, digits: int = 1) -> str:
    return "-" if est is None else est.fmt(digits)


def js(est: Estimate | None) -> dict | None:
    return None if est is None else est.as_dict()


def study_seq(data: FinalData) -> dict[str, dict]:
    """The study's sequential table, keyed by our sequence's run names (base, then its stages in order)."""
    table = data.study.get("sequential", {})
    names = ["base", *[f"seq_{d}" for d in data.curriculum]]
    return {ours: table.get(theirs, {}) for ours, theirs in zip(data.seq_runs, names)}
