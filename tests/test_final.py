"""The readings over seeds: aggregation and missing runs (acl_lib.final), the HTML report and the README's results
(acl_lib.report) with the findings' verdicts in them; acl run's plan (12 once after every seed, 13 opt-in); the
curriculum-orders position tables (acl_lib.curriculum). The findings' rules themselves: tests/test_findings.py."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from acl_lib import curriculum, final, findings, noise, report, views
from acl_lib import notebooks as nbs
from acl_lib.views import paper_results

SEQ = ["base", "seq_math", "seq_search", "seq_ecom", "seq_if"]
CUR = ["math", "search", "ecom", "if"]


def _scores(aime=0.0, nq=0.0, retail=0.0, ifeval=0.0, ood=0.0) -> dict:
    s = {"aime26": aime, "nq": nq, "retail": retail, "ifeval": ifeval}
    s.update({b: ood for b in final.OOD_BENCHMARKS})
    return s


def write_metrics(seed_dir: Path, run: str, scores: dict) -> None:
    p = seed_dir / run / "eval" / "metrics.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"scores": scores, "n_tasks": {b: 32 for b in scores}, "k": 1}))


def make_data(rows: dict[str, dict[int, dict]], diagnostics: dict | None = None, seeds=(0, 1, 2)) -> final.FinalData:
    return final.FinalData(seeds=list(seeds), curriculum=CUR, seq_runs=SEQ, final_run="seq_if",
                           scores={r: dict(v) for r, v in rows.items()}, diagnostics=diagnostics or {},
                           study=paper_results())


# A trajectory like the study's: each stage lifts its own domain, ecom pulls math and search down.
STUDY_LIKE = {
    "base": _scores(5, 10, 0, 20),
    "seq_math": _scores(40, 10, 0, 20),
    "seq_search": _scores(38, 45, 0, 20),
    "seq_ecom": _scores(10, 15, 30, 20),
    "seq_if": _scores(12, 30, 28, 80),
    "oracle_math": _scores(40, 5, 0, 20),
    "oracle_search": _scores(5, 45, 0, 20),
    "oracle_ecom": _scores(5, 5, 30, 20),
    "oracle_if": _scores(5, 5, 0, 85),
}


def _jitter(scores: dict, d: float) -> dict:
    return {b: v + d for b, v in scores.items()}


def seeded(rows: dict[str, dict], seeds=(0, 1, 2)) -> dict[str, dict[int, dict]]:
    return {r: {s: _jitter(v, 0.5 * s) for s in seeds} for r, v in rows.items()}


# --- aggregation ------------------------------------------------------------------------------------------


def test_mean_std_over_seeds_and_missing_runs(tmp_path):
    dirs = {s: tmp_path / f"seed{s}" for s in (0, 1, 2)}
    for s, d in dirs.items():
        for run in SEQ[:-1]:
            write_metrics(d, run, _scores(aime=10.0 * (s + 1), nq=4.0))
        if s != 2:
            write_metrics(d, "seq_if", _scores(aime=1.0 + s))
    (dirs[0] / "diagnostics").mkdir()
    weights = {"cosine_summary": {"unrelated_oracles": 0.02, "n_unrelated": 6}}
    (dirs[0] / "diagnostics" / "weights.json").write_text(json.dumps(weights))
    (dirs[1] / "sdft_directions").mkdir()
    (dirs[1] / "sdft_directions" / "directions.json").write_text(json.dumps({"same_sft_from_base_vs_seq_final": 0.7}))
    data = final.collect(dirs, CUR, SEQ)

    assert final.summarize([10, 20, 30]) == (20.0, 10.0, 3)
    assert final.summarize([7.0, None]) == (7.0, 0.0, 1)
    assert final.summarize([]) == (None, None, 0)
    traj = final.trajectory_frame(data)
    assert traj.loc["seq_math", ("aime26", "ours")] == "20.0 ± 10.0"
    assert traj.loc["seq_math", ("nq", "ours")] == "4.0 ± 0.0"
    assert traj.loc["seq_math", ("aime26", "study")] == "25.8"  # paper_results.yaml sequential
    assert traj.loc["seq_if", ("seeds", "")] == 2 and traj.loc["seq_if", ("aime26", "ours")] == "1.5 ± 0.7"

    missing = final.missing_frame(data)
    assert missing.loc["seq_if", "seeds"] == "2" and missing.loc["seq_if", "present for"] == "0, 1"
    assert missing.loc["mmopd", "seeds"] == "0, 1, 2" and missing.loc["mmopd", "written by"] == "08"
    assert missing.loc["diagnostics/weights.json", "seeds"] == "1, 2"
    assert missing.loc["diagnostics/tokens.json", "written by"] == "07"
    assert missing.loc["sdft_directions/directions.json", "seeds"] == "0, 2"
    assert data.diagnostics["directions"][1]["same_sft_from_base_vs_seq_final"] == 0.7
    assert data.tasks["seq_math"][0]["aime26"] == 32 and data.samples["seq_math"][0] == 1
    est = data.estimate("seq_math", "aime26")  # 10, 20, 30 over 32 tasks each: the binomial SE and the spread
    assert est.value == 20.0 and est.spread == 10.0 and est.sampling > 0 and est.se > 10.0 / 3 ** 0.5

    main = final.main_frame(data, "in_domain")  # only seq_final has scores: the other rows are left out
    assert list(main.index) == ["seq_final"]
    assert main.loc["seq_final", ("retail", "study")] == "29.6"
    assert ("in-domain mean", "ours") in main.columns
    assert len(final.main_frame(data, "ood", include_missing=True)) == len(final.main_rows(data))

    cl = final.cl_frame(data)  # no cl_metrics.json: computed from the scores of the seeds with a whole sequence
    assert cl.attrs["sources"] == {0: "metrics.json", 1: "metrics.json"}
    assert cl.loc["forgetting: aime26", "seed 0"] == "9.0" and cl.loc["forgetting: aime26", "seed 2"] == "-"
    assert cl.loc["mean forgetting", final.STUDY_DERIVED_COLUMN] == "10.6"  # computed from the study's table
    assert "derived from the study's table" in cl.attrs["note"]


# --- the report --------------------------------------------------------------------------------------------


class _Doc(HTMLParser):
    def __init__(self):
        super().__init__()
        self.title, self.tables, self.divs, self.links, self._in_title = "", [], [], [], False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "title":
            self._in_title = True
        elif tag == "table":
            self.tables.append(a.get("id"))
        elif tag == "div" and a.get("id"):
            self.divs.append(a["id"])
        elif tag == "a" and a.get("href"):
            self.links.append(a["href"])

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False

    def handle_data(self, data):
        if self._in_title:
            self.title += data


def _write_report(tmp_path) -> Path:
    """A two-seed smoke store with the study-like trajectory, and its report."""
    out, pm = tmp_path / "out", tmp_path / "pm"
    overrides = [f"output_dir={out}", f"papermill_dir={pm}"]
    for s in (0, 1):
        d = out / "smoke" / f"seed{s}"
        for run, sc in STUDY_LIKE.items():
            write_metrics(d, run, _jitter(sc, s))
            (d / run / "config.yaml").write_text(f"# run {run}: config_hash abc{s}\nseed: {s}\n")
        (pm / "smoke" / f"seed{s}").mkdir(parents=True)
        (pm / "smoke" / f"seed{s}" / "00_base_model.ipynb").write_text("{}")
    (pm / "smoke" / "12_final_tables.ipynb").write_text("{}")

    path = report.write_report("smoke", [0, 1], overrides)
    assert path == out / "smoke" / "report.html"
    return path


def test_write_report_structure(tmp_path):
    path = _write_report(tmp_path)
    text = path.read_text()
    doc = _Doc()
    doc.feed(text)
    assert doc.title.startswith("ACLArena suite: final report (profile smoke, seeds 0, 1)")
    assert {"findings", "trajectory", "lifts", "main-in-domain", "main-ood", "cl-metrics", "missing"} <= set(doc.tables)
    assert "figure-0" in doc.divs and "figure-1" in doc.divs
    assert text.count("Plotly.newPlot") >= 2 and "<script src=" not in text  # plotly.js inlined: opens offline
    assert len(doc.links) == 3
    for href in doc.links:
        assert (path.parent / href).resolve().is_file(), href
    assert "config_hash abc1" in text and "seq_ecom" in text
    assert "mmopd" in text  # listed as missing
    # the noise floor's formula is small print under a short heading, not part of it
    heading = re.search(r"<h2 id='h-findings'>(.*?)</h2>\s*<p class='note'>(.*?)</p>", text, re.S)
    formula = "combined standard error"
    assert heading and formula not in heading.group(1) and formula in heading.group(2)


def _browser() -> str | None:
    import shutil

    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "chrome")) if p), None)


@pytest.mark.slow
@pytest.mark.skipif(_browser() is None,
                    reason="no Chromium/Chrome here: test_write_report_structure checks the document")
def test_report_renders_in_a_headless_browser(tmp_path):
    """The report as a browser draws it: Chromium runs the inlined plotly.js offline and dumps the DOM it built."""
    import subprocess

    path = _write_report(tmp_path)
    dom = subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", path.resolve().as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    doc = _Doc()
    doc.feed(dom)
    assert {"findings", "trajectory", "main-in-domain"} <= set(doc.tables)
    # plotly draws each figure as <svg class="main-svg"> inside its div; an unrendered div stays empty
    assert dom.count('class="main-svg"') >= 4, dom[:500]
    assert "Plotly is not defined" not in dom


# --- acl run's plan ------------------------------------------------------------------------------------------


def test_plan_runs_12_once_after_every_seed_and_13_only_when_asked(tmp_path):
    names = ["00_base_model", "01_seq_stage_1", "11_mle", "12_final_tables", "13_curriculum_orders"]
    paths = [tmp_path / f"{n}.ipynb" for n in names]
    # how acl run schedules a notebook is written in the notebook's own metadata, not read from its number
    schedules = {"12_final_tables": {"runs": "once_over_seeds"}, "13_curriculum_orders": {"opt_in": True}}
    for p in paths:
        meta = {"acl": schedules[p.stem]} if p.stem in schedules else {}
        p.write_text(json.dumps({"cells": [], "metadata": meta, "nbformat": 4, "nbformat_minor": 5}))
    default = nbs.default_notebooks(paths, None)
    assert [p.name[:2] for p in default] == ["00", "01", "11", "12"]
    assert nbs.default_notebooks(paths[-1:], ["13"]) == paths[-1:]

    jobs = nbs.plan_jobs(default, [0, 1, 2])
    assert [(j.notebook.name[:2], j.seed, j.seeds) for j in jobs] == [
        ("00", 0, None), ("01", 0, None), ("11", 0, None), ("00", 1, None), ("01", 1, None), ("11", 1, None),
        ("00", 2, None), ("01", 2, None), ("11", 2, None), ("12", 0, (0, 1, 2))]
    last = jobs[-1]
    assert last.parameters("mini", ["eval.k=2"]) == {"profile": "mini", "seed": 0, "overrides": ["eval.k=2"],
                                                     "seeds": [0, 1, 2]}
    assert last.output("pm", "mini") == Path("pm/mini/12_final_tables.ipynb")
    assert jobs[3].output("pm", "mini") == Path("pm/mini/seed1/00_base_model.ipynb")
    assert "seeds" not in jobs[0].parameters("mini", [])
    assert [j.seed for j in nbs.plan_jobs(paths[-1:], [0, 1])] == [0, 1]  # 13 runs per seed


# --- notebook 13's tables ------------------------------------------------------------------------------------


def test_curriculum_positions_and_ecom_damage():
    assert curriculum.rotations(CUR) == [CUR, ["search", "ecom", "if", "math"], ["ecom", "if", "math", "search"],
                                         ["if", "math", "search", "ecom"]]
    names = SEQ
    order_b = ["search", "ecom", "if", "math"]
    sc_b = {"base": _scores(5, 10, 0, 20), "seq_math": _scores(5, 40, 0, 20), "seq_search": _scores(5, 12, 30, 20),
            "seq_ecom": _scores(5, 20, 25, 80), "seq_if": _scores(40, 18, 20, 70)}
    frame = curriculum.positions_frame({tuple(CUR): (names, STUDY_LIKE), tuple(order_b): (names, sc_b)})
    a = frame[(frame["order"] == curriculum.order_label(CUR)) & (frame["domain"] == "math")].iloc[0]
    assert a["position"] == 1 and a["followed by"] == "search" and a["after own stage"] == 40
    assert a["forgetting"] == 28 and a["drop ecom"] == 28 and a["drop search"] == 2
    b = frame[(frame["order"] == curriculum.order_label(order_b)) & (frame["domain"] == "search")].iloc[0]
    assert b["position"] == 1 and b["drop ecom"] == 28 and b["forgetting"] == 40 - 18
    damage = {d["order"]: d for d in curriculum.ecom_damage(frame)}
    assert damage[curriculum.order_label(CUR)]["ecom largest"] is True
    assert damage[curriculum.order_label(order_b)]["ecom largest"] is True
    text = curriculum.reading(frame, list(damage.values()))
    assert "2 of 2 orders" in text and "wherever it is placed" in text
    # the study's order: math lost most to ecom (2 stages later), search and ecom to the stage right after;
    # order_b: search lost most to ecom (next), ecom to if (next), if to math (next)
    nxt = {(r["order"][:6], r["domain"]): r for r in curriculum.next_stage_largest(frame)}
    assert nxt[("math →", "math")]["largest"] == "ecom" and not nxt[("math →", "math")]["next largest"]
    assert nxt[("math →", "search")]["next largest"] and nxt[("search", "if")]["largest"] == "math"
    assert "right after a domain caused its largest drop in 5 of 6 cases" in text and "math in math →" in text
    first = ["ecom", "if", "math", "search"]
    frame = curriculum.positions_frame({tuple(first): (names, sc_b)})
    assert curriculum.ecom_damage(frame)[0]["ecom largest"] is None  # nothing trained before the retail stage
    flat = {n: _scores() for n in names}  # nothing rose, nothing lost: no largest stage
    frame = curriculum.positions_frame({tuple(CUR): (names, flat)})
    damage = curriculum.ecom_damage(frame)
    assert damage[0]["largest"] is None and damage[0]["ecom largest"] is None
    assert "cannot be read here" in curriculum.reading(frame, damage)


# --- what tools/readme_results.py writes ------------------------------------------------------------------------


def test_final_tables_markdown_shows_mean_std_the_study_verdicts_and_what_is_missing():
    rows = seeded(STUDY_LIKE)
    rows["seq_if"].pop(2)  # one seed short
    data = make_data(rows)
    data.missing = {"seq_if": [2]}  # what collect() finds for such a store (test_mean_std_over_seeds_and_missing_runs)
    text = report.final_tables_markdown(data)
    lines = text.splitlines()
    seq_math = next(x for x in lines if x.startswith("| seq_math |"))
    assert seq_math.split(" | ")[1:3] == ["3", "40.5 ± 0.5 (25.8)"]  # seeds, aime26 mean ± std (study)
    seq_final = next(x for x in lines if x.startswith("| seq_final |"))
    assert seq_final.split(" | ")[1] == "2"
    f1 = next(x for x in lines if x.startswith("| F1 |"))
    assert f1.split(" | ")[1] == findings.rule_f1(data)["verdict"]  # the README shows the rule's verdict
    f4 = next(x for x in lines if x.startswith("| F4 |"))
    assert "\\|" in f4 and len(f4.replace("\\|", "").split("|")) == 8  # a rule's |cosine| does not split the row
    assert "| finding | verdict | ours | study | power | rule |" in text  # each finding's power beside its verdict
    assert "Noise floor: ± is the combined standard error" in text
    assert "Missing for some seeds: " in text and "seq_if (seeds 2)" in text


def test_lifts_over_the_checkpoint_each_run_started_from():
    rows = {r: {s: _jitter(v, 3.0 * s if r == "seq_search" else 0.0) for s in (0, 1, 2)}
            for r, v in STUDY_LIKE.items()}
    rows["oracle_if"].pop(1)  # one seed's oracle missing
    lifts = final.lifts_frame(make_data(rows))
    assert list(lifts.index) == [*SEQ[1:], "oracle_math", "oracle_search", "oracle_ecom", "oracle_if"]
    search = lifts.loc["seq_search"]  # nq 10 -> 45 (+35), seeds 1, 2 three and six points higher
    assert (search["from"], search["benchmark"]) == ("seq_math", "nq")
    assert [search[f"seed {s}"] for s in (0, 1, 2)] == [35.0, 38.0, 41.0]
    assert (search["mean"], search["smallest"]) == (38.0, 35.0)
    assert lifts.loc["seq_ecom", "seed 0"] == 30.0 and lifts.loc["oracle_ecom", "from"] == "base"
    oracle_if = lifts.loc["oracle_if"]  # ifeval 20 -> 85 at seeds 0 and 2; seed 1 has no oracle
    assert oracle_if["seed 1"] != oracle_if["seed 1"] and (oracle_if["mean"], oracle_if["smallest"]) == (65.0, 65.0)
    text = report.final_tables_markdown(make_data(rows))
    assert "| oracle_if | ifeval | base | +65.0 | - | +65.0 | +65.0 | +65.0 |" in text
    reading = report.seeds_reading(make_data(rows))  # notebook 12's reading, computed from the same runs
    assert "nq +38.0 (smallest +35.0)" in reading and "ifeval +65.0 (smallest +65.0)" in reading
    assert "aime26 5.0 (base) -> 40.0 (seq_math) -> 41.0 (seq_search) -> 10.0 (seq_ecom) -> 12.0 (seq_if)" in reading
    verdicts = findings.judge(make_data(rows))
    assert all(r["finding"] in reading for r in verdicts) and "In-domain means**: seq_final 37.5" in reading
    assert "not been scored" in report.seeds_reading(make_data({"base": rows["base"]}))


def test_the_regime_table_reads_the_runs_and_their_recipe(tmp_path):
    """The README's regime table: the study's column, the fixed mini-before column, and ours from the runs (base
    scores, the recipe from each stage's config.yaml and stage.json, the lifts, the findings' own measurements)."""
    import yaml

    seed_dir = tmp_path / "seed0"
    recipes = {"seq_math": ({"max_steps": 300, "batch_size": 64, "learning_rate": 1e-4, "beta": 0.0}, None, False),
               "seq_search": ({"max_steps": 80, "batch_size": 16, "learning_rate": 1.5e-4, "beta": 0.01}, 80, True)}
    for run, (grpo, sft_steps, cold) in recipes.items():
        (seed_dir / run).mkdir(parents=True)
        (seed_dir / run / "config.yaml").write_text(yaml.safe_dump({"grpo": grpo, "sft": {"max_steps": sft_steps}}))
        (seed_dir / run / "stage.json").write_text(json.dumps({"cold_start": cold}))
    data = make_data(seeded(STUDY_LIKE))
    text = report.regime_markdown(data, seed_dir)
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:]
            for line in text.splitlines() if line.startswith("| ")}
    assert rows["the base"] == ["6.5 / 13.3 / - / -", "6.2 / 0 / 6.2 / 12.5", "5.5 / 10.5 / 0.5 / 20.5 |"]
    assert rows["how a stage trains"][2] == ("math: GRPO 300 x 64 at lr 1e-4; search: cold start 80 SFT steps, then "
                                             "GRPO 80 x 16 at lr 1.5e-4, KL 0.01 |")  # ecom, if: no config, left out
    stages = rows["each stage on its benchmark, from its start"][2]
    assert stages.startswith("+35.0 / +35.0 / +30.0 / +60.0 (seed minima")
    verdicts = {r["finding"]: r for r in findings.judge(data)}
    assert rows["SFT/RL displacement (L2)"][2] == verdicts["F5"]["ours"] + " |"
    assert rows["consolidations, in-domain mean"][0].startswith("seq_final 39.5, MMOPD 44.7")  # the study's means
    got = rows["findings reproduced"][2].rstrip(" |")
    for f, r in verdicts.items():  # each finding named once, under its own verdict
        named_under = [part.split(": ")[0] if ": " in part else findings.REPRODUCED
                       for part in got.split("; ") if f in part.split(": ")[-1].split(", ")]
        assert named_under == [r["verdict"]], (f, got)


def test_curriculum_markdown_puts_each_domain_at_its_position():
    order_b = ["search", "ecom", "if", "math"]
    sc_b = {"base": _scores(5, 10, 0, 20), "seq_math": _scores(5, 40, 0, 20), "seq_search": _scores(5, 12, 30, 20),
            "seq_ecom": _scores(5, 20, 25, 80), "seq_if": _scores(40, 18, 20, 70)}
    frame = curriculum.positions_frame({tuple(CUR): (SEQ, STUDY_LIKE), tuple(order_b): (SEQ, sc_b)})
    text = curriculum.positions_markdown(frame)
    search = next(x for x in text.splitlines() if x.startswith("| search (nq) |")).strip("| ").split(" | ")
    assert search[1] == "40.0 -> 18.0, then ecom"  # position 1 in order_b
    assert search[2] == "45.0 -> 30.0, then ecom"  # position 2 in the study's order
    assert search[3] == search[4] == "-"
    assert "2 of 2 orders" in text
    assert curriculum.positions_markdown(curriculum.positions_frame({})) == "No order has been scored yet."


def test_readme_results_section_with_seeds_and_orders(tmp_path):
    """tools/readme_results.py's writer: seed 0's tables, then notebook 12's over the seeds and notebook 13's
    orders, between the markers only; an order not trained yet is named."""
    from acl_lib.config import load_config

    out = tmp_path / "out"
    overrides = [f"output_dir={out}"]
    for s in (0, 1):
        d = out / "smoke" / f"seed{s}"
        for run, sc in {**STUDY_LIKE, "mmopd": STUDY_LIKE["seq_math"]}.items():
            write_metrics(d, run, _jitter(sc, s))
            for rel in (run, f"{run}/eval"):
                (d / rel / "COMPLETE.json").write_text(json.dumps({"finished_at": "2026-12-02T00:00:00+00:00",
                                                                   "duration_s": 1.0, "code": "abc"}))
    readme = tmp_path / "README.md"
    readme.write_text("# t\n\n<!-- results:begin (x) -->\nOLD TEXT\n<!-- results:end -->\n\ntail\n")
    cfg = load_config("smoke", overrides, seed=0)
    body = report.write_results_section(readme, cfg, seeds=[0, 1], orders=curriculum.rotations(CUR),
                                        overrides=overrides)
    text = readme.read_text()
    assert text.startswith("# t\n\n<!-- results:begin (x) -->\n") and text.endswith("<!-- results:end -->\n\ntail\n")
    assert "OLD TEXT" not in text and body in text
    assert "### Over seeds 0, 1 (notebook 12)" in body and "40.5 ± 0.7 (25.8)" in body  # seq_math aime26: 40, 41
    assert "### Curriculum orders (notebook 13, seed 0)" in body
    assert "finished 2026-12-02 to 2026-12-02; code abc." in body
    se_row = next(x for x in body.splitlines() if x.startswith("| ± (largest SE) |")).strip("| ").split(" | ")
    aime = max(noise.binomial_se(_jitter(sc, 0)["aime26"], 32, 1) for sc in STUDY_LIKE.values())
    assert se_row[1 + views.BENCH_ORDER.index("aime26")] == f"{aime:.1f}"  # seed 0's runs, 32 tasks x 1 sample
    consolidated = body.split("The consolidations of `seq_final`")[1].split("\n\n")[1]  # the table after it
    assert consolidated.splitlines()[-1].startswith("| ± (largest SE) |")  # that table shows its precision too
    assert "Not scored yet: seq1_search, seq2_search-ecom" in body  # the study's order is scored, the others not


def test_the_readme_results_of_the_mini_profile_carry_the_regime_table(tmp_path):
    from acl_lib.config import load_config

    out = tmp_path / "out"
    overrides = [f"output_dir={out}"]
    def store(seed_dir, scores):
        for run, sc in STUDY_LIKE.items():
            write_metrics(seed_dir, run, scores(sc))
            for rel in (run, f"{run}/eval"):
                (seed_dir / rel / "COMPLETE.json").write_text(json.dumps({"finished_at": "2026-12-02T00:00:00+00:00",
                                                                         "duration_s": 1.0, "code": "abc"}))

    for s in (0, 1):
        store(out / "mini" / f"seed{s}", lambda sc, s=s: _jitter(sc, s))
    body = report.results_markdown(load_config("mini", overrides, seed=0), seeds=[0, 1], overrides=overrides)
    assert "**The regime**" in body and "| mini now (seeds 0, 1) |" in body
    assert "**What these runs show** (seeds 0, 1)" in body  # the reading computed from the runs
    smoke = tmp_path / "smoke_out"
    store(smoke / "smoke" / "seed0", lambda sc: sc)
    body = report.results_markdown(load_config("smoke", [f"output_dir={smoke}"], seed=0), seeds=[0],
                                   overrides=[f"output_dir={smoke}"])
    assert "**The regime**" not in body  # the before column is the mini profile's history


def test_the_wall_time_of_the_run_that_made_the_seeds(tmp_path):
    """benchmarks/pipeline_time.py's timing.json, beside the seeds' folders, goes under the tables over the seeds
    only when it timed exactly those seeds."""
    from acl_lib.config import load_config

    cfg = load_config("smoke", [f"output_dir={tmp_path}"], seed=0)
    assert report.wall_time_markdown(cfg, [0, 1, 2]) == ""  # never timed
    timing = {"seeds": [0, 1, 2], "jobs": 2, "commit": "abc1234", "started": "2026-12-06 08:00:00",
              "total_s": 10530.0, "exit_status": 0, "budget_s": 10800}
    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / report.TIMING_JSON).write_text(json.dumps(timing))
    text = report.wall_time_markdown(cfg, [0, 1, 2])
    assert "**2 h 56 min** (the profile's target: 3 h)" in text and "`acl run --jobs 2`" in text and "abc1234" in text
    assert report.wall_time_markdown(cfg, [0]) == ""  # another set of seeds: not this run's time
    (tmp_path / "smoke" / report.TIMING_JSON).write_text(json.dumps({**timing, "exit_status": 1}))
    assert "exit status 1" in report.wall_time_markdown(cfg, [0, 1, 2])
    assert "machine_speed.py" not in text  # a timing.json from before the machine's speed was measured beside it
    (tmp_path / "smoke" / report.TIMING_JSON).write_text(json.dumps({**timing, "machine_speed_s": {"1": 10.2,
                                                                                                   "2": 6.3}}))
    assert "`benchmarks/machine_speed.py` takes 10.2 s at one thread and 6.3 s at two" in report.wall_time_markdown(
        cfg, [0, 1, 2])


# --- the new verdicts and their power from a store with records --------------------------------------------------

# A consolidated store like the study's: MMOPD and SDFT win math and search back and pay elsewhere, the uniform
# merge wins little, MLE sits next to the oracles.
CONSOLIDATED_LIKE = {**STUDY_LIKE, "mmopd": _scores(35, 40, 28, 60, ood=25), "sdft": _scores(33, 38, 10, 80, ood=20),
                     "merge_uniform": _scores(20, 20, 12, 75, ood=15), "mle": _scores(38, 43, 28, 84, ood=30)}
RECORD_TASKS = {"aime26": (32, 4)}  # tasks x samples; every other benchmark 32 tasks x 1


def write_evaluation(seed_dir: Path, run: str, scores: dict) -> None:
    """metrics.json and records/<benchmark>.jsonl as the harness writes them: a score of s% passes the first
    round(s% of the episodes), task by task, so two runs share the tasks both pass (their gaps pair); the metrics'
    scores are the records' own."""
    eval_dir = seed_dir / run / "eval"
    (eval_dir / "records").mkdir(parents=True, exist_ok=True)
    got, n_tasks, ks = {}, {}, {}
    for b, v in scores.items():
        n, k = RECORD_TASKS.get(b, (32, 1))
        hits = round(v / 100 * n * k)
        with open(eval_dir / "records" / f"{b}.jsonl", "w") as f:
            for i in range(n * k):
                f.write(json.dumps({"id": f"{b}-{i // k}", "benchmark": b, "reward": 1.0 if i < hits else 0.0,
                                    "failure": None if i < hits else "wrong", "sample": i % k}) + "\n")
        got[b], n_tasks[b], ks[b] = 100 * hits / (n * k), n, k
    (eval_dir / "metrics.json").write_text(json.dumps({"scores": got, "n_tasks": n_tasks, "k_by_benchmark": ks,
                                                      "k": ks}))
    for rel in (run, f"{run}/eval"):
        (seed_dir / rel / "COMPLETE.json").write_text(json.dumps({"finished_at": "2026-12-07T00:00:00+00:00",
                                                                 "duration_s": 1.0, "code": "abc"}))


def _records_store(tmp_path, seeds=(0, 1, 2)) -> tuple[Path, list[str]]:
    out = tmp_path / "out"
    for s in seeds:
        for run, sc in CONSOLIDATED_LIKE.items():
            write_evaluation(out / "mini" / f"seed{s}", run, _jitter(sc, s))
    return out, [f"output_dir={out}", f"papermill_dir={tmp_path / 'pm'}"]


def test_readme_results_from_a_store_with_records_give_the_verdicts_and_their_power(tmp_path):
    """tools/readme_results.py on a three-seed store with records: the README's findings table is judge()'s rows on
    that store, each verdict with its power; the standard errors are clustered and paired (not the fallback)."""
    import subprocess
    import sys

    from acl_lib.config import load_config
    from acl_lib.pipeline import checkpoint_names

    out, overrides = _records_store(tmp_path)
    cfg = load_config("mini", overrides, seed=0)
    data = final.collect(final.seed_dirs("mini", [0, 1, 2], overrides), cfg.pipeline.curriculum,
                         checkpoint_names(cfg, oracles=False))
    assert data.binomial_fallback() == [] and data.clustered("seq_math", "aime26")
    unpaired = data.estimate("mmopd", "nq") - data.estimate("seq_if", "nq")
    assert data.diff("mmopd", "seq_if", "nq").se < unpaired.se  # the two share the tasks both pass
    rows = findings.judge(data)
    by = {r["finding"]: r for r in rows}
    readme = tmp_path / "README.md"
    readme.write_text("# t\n\n<!-- results:begin (x) -->\nOLD\n<!-- results:end -->\n")
    done = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "tools" / "readme_results.py"),
                           "--profile", "mini", "--output-dir", str(out), "--seeds", "0", "1", "2",
                           "--readme", str(readme)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    text = readme.read_text()
    assert "| finding | verdict | ours | study | power | rule |" in text
    for f, r in by.items():
        line = next(x for x in text.splitlines() if x.startswith(f"| {f} |"))
        assert line.split(" | ")[1] == r["verdict"], line
        assert ("detects" in line) == (r["verdict"] != findings.NOT_TESTABLE), line  # a judged finding's power
    assert "findings reproduced" in text and findings.verdict_summary(rows) in text
    # the three-seed store's kind of F6: seq_final is below the oracles, no consolidation below seq_final
    assert by["F6"]["verdict"] == findings.REPRODUCED, by["F6"]  # here MMOPD and SDFT each pay on a domain
    assert by["F1"]["verdict"] in findings.VERDICTS and by["F7"]["power"].count("detects") >= 2


def test_notebook_12_writes_the_verdicts_and_their_power_to_findings_json(tmp_path, monkeypatch):
    """Notebook 12's code cells, run as they stand with its parameters set: findings.json holds every finding's
    verdict and power, the same as judge() on the store."""
    monkeypatch.setenv("ACL_PNG", "0")
    out, overrides = _records_store(tmp_path, seeds=(0, 1))
    nb = json.loads((Path(__file__).parents[1] / "notebooks" / "12_final_tables.ipynb").read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "parameters" in cells[0]["metadata"].get("tags", [])
    namespace = {"profile": "mini", "seed": 0, "overrides": overrides, "seeds": [0, 1]}
    for cell in cells[1:]:
        exec(compile("".join(cell["source"]), "12_final_tables", "exec"), namespace)  # noqa: S102
    doc = json.loads((out / "mini" / "findings.json").read_text())
    judged = findings.judge(namespace["data"])
    assert [f["verdict"] for f in doc["findings"]] == [r["verdict"] for r in judged]
    assert all(f["power"] and f["power_parts"] is not None for f in doc["findings"])
    assert doc["binomial_fallback"] == [] and "underpowered" in doc["verdicts"]
    assert (out / "mini" / "report.html").is_file()
