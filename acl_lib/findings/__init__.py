"""The study's eight findings (F1-F8), each judged by a rule that can fail: the one place a verdict is computed.

Each rule is a function of :class:`acl_lib.final.FinalData` (one seed or several), registered with the finding's
claim and the rule in words beside it (:func:`finding`). It returns one row: the finding, its claim, the rule, the
quantity measured, ours (``value ± SE``: the combined standard error of :mod:`acl_lib.noise`, clustered by task
for a score, paired by task for a difference of checkpoints), the study's (marked
:data:`acl_lib.final.STUDY_DERIVED` where the suite computed it from the study's table), the verdict, its power
(the smallest effect each part of the rule detects at the current precision, beside the study's own effect), a
detail saying what the rule saw, and the numbers as JSON (``values``).

The verdicts: :data:`REPRODUCED` when every part of the rule holds beyond noise; :data:`NOT_REPRODUCED` when a part
fails, the data showing the contrary beyond noise or nothing where the test could have seen an effect as large as
the study's; :data:`UNDERPOWERED` when a part shows nothing and could not have seen the study's effect (never
"not reproduced" then); :data:`NOT_TESTABLE` when the runs or diagnostics a rule needs are not there, or show
nothing to test. The rules, thresholds and error bars were fixed on 2026-12-07, before the next regime's runs
(``docs/findings-rules.md``).

:func:`judge` applies the rules; the stage and diagnostics notebooks show the verdicts of their findings on one seed
with :func:`verdicts_markdown`, the final-tables notebook over every seed, and writes them with
:func:`write_findings` (``outputs/<profile>/findings.json``); ``acl report`` and the README's results show
:func:`findings_frame` and :func:`judge`'s rows.

Modules: ``core`` (verdicts, thresholds, parts and their power), ``sequence`` (F1, F2), ``internals`` (F3-F5),
``consolidation`` (F6-F8), ``tables`` (all of them at once).
"""

from acl_lib.findings.consolidation import rule_f6, rule_f7, rule_f8
from acl_lib.findings.core import (
    F3_CHANGED_HIGH_MIN,
    F3_LOW_STABLE_MIN,
    F3_STUDY_ALMOST_ALL,
    F4_SAME_MIN,
    F4_UNRELATED_MAX,
    F5_BAND,
    F7_DOMAIN_GAP,
    F7_MEAN_GAP,
    F7_OOD,
    F8_AGENTIC,
    NOISE_FLOOR,
    NOT_REPRODUCED,
    NOT_TESTABLE,
    REPRODUCED,
    RULES,
    UNDERPOWERED,
    VERDICTS,
    Finding,
    Part,
    finding,
)
from acl_lib.findings.internals import rule_f3, rule_f4, rule_f5
from acl_lib.findings.sequence import drops_contrast, recoveries, rule_f1, rule_f2, stage_drops
from acl_lib.findings.tables import DISPLAY, findings_frame, judge, verdict_summary, verdicts_markdown, write_findings

__all__ = [
    "DISPLAY", "F3_CHANGED_HIGH_MIN", "F3_LOW_STABLE_MIN", "F3_STUDY_ALMOST_ALL", "F4_SAME_MIN", "F4_UNRELATED_MAX",
    "F5_BAND", "F7_DOMAIN_GAP", "F7_MEAN_GAP", "F7_OOD", "F8_AGENTIC", "NOISE_FLOOR", "NOT_REPRODUCED",
    "NOT_TESTABLE", "REPRODUCED", "RULES", "UNDERPOWERED", "VERDICTS", "Finding", "Part", "drops_contrast",
    "finding", "findings_frame", "judge", "recoveries", "rule_f1", "rule_f2", "rule_f3", "rule_f4", "rule_f5",
    "rule_f6", "rule_f7", "rule_f8", "stage_drops", "verdict_summary", "verdicts_markdown", "write_findings",
]
