"""Every committed notebook follows the suite's conventions, and all of them execute under the smoke profile."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from acl_lib.notebooks import (
    check_conventions,
    default_notebooks,
    list_notebooks,
    notebook_state,
    plan_jobs,
    strip_outputs,
)
from conftest import ACL, ROOT, child_env, write_notebook

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_follows_conventions(path):
    assert check_conventions(path) == []


STAGE_NOTEBOOKS = [p for p in NOTEBOOKS if re.match(r"0[1-4]_seq_stage_", p.name)]


@pytest.mark.parametrize("path", STAGE_NOTEBOOKS, ids=[p.name for p in STAGE_NOTEBOOKS])
def test_a_stage_notebook_names_no_benchmark_in_its_code(path):
    """A stage notebook runs whichever domain ``pipeline.curriculum`` puts at its index: the benchmarks it shows
    come from the domain table (``acl_lib.domains``), never from a name written into a code cell."""
    from acl_lib.domains import BENCHMARK_DOMAIN

    assert len(STAGE_NOTEBOOKS) == 4
    code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    named = sorted(b for b in BENCHMARK_DOMAIN if re.search(rf"[\"']{b}[\"']", code))
    assert named == [] or path.name.startswith("04_"), named  # 04 also draws the whole sequence's trajectories
    if path.name.startswith("04_"):
        assert "show_transcripts(run.path / \"eval\", [own, domains.SHOWN_OOD[domain]])" in code


def test_every_notebook_is_listed_in_order():
    listed = list_notebooks(ROOT / "notebooks")
    assert listed == NOTEBOOKS, "every .ipynb in notebooks/ must be named NN_name.ipynb"
    prefixes = [p.name[:2] for p in listed]
    assert len(set(prefixes)) == len(prefixes), f"duplicate prefixes: {prefixes}"


def test_convention_checker_catches_each_violation(tmp_path):
    good = write_notebook(tmp_path / "03_good_one.ipynb", ["x = cfg.seed"])
    assert check_conventions(good) == []

    def mutated(name, change):
        nb = json.loads(good.read_text())
        change(nb)
        p = tmp_path / name
        p.write_text(json.dumps(nb))
        return " | ".join(check_conventions(p))

    assert "does not match" in mutated("3_Bad.ipynb", lambda nb: None)
    assert "first markdown cell" in mutated("03_a.ipynb", lambda nb: nb["cells"][0].update(source="# no command"))
    def cell(i: int, source: str):  # a mutation: cell i's source replaced
        return lambda nb: nb["cells"][i].update(source=source)

    assert "exactly one cell tagged" in mutated("03_b.ipynb",
                                                lambda nb: nb["cells"][3]["metadata"].update(tags=["parameters"]))
    assert "outputs" in mutated("03_c.ipynb", lambda nb: nb["cells"][3].update(execution_count=4))
    assert "does not define overrides" in mutated("03_d.ipynb", cell(1, 'profile = "mini"\nseed = 0'))
    assert "not a literal" in mutated("03_e.ipynb", cell(1, 'profile = "mini"\nseed = 0\noverrides = list()'))
    assert "cannot parse" in mutated("03_h.ipynb",
                                     cell(1, 'profile = "mini"\nseed = 0\noverrides = []  # e.g. ["eval.k=4"]'))
    assert "defaults to 'smoke'" in mutated("03_i.ipynb", cell(1, 'profile = "smoke"\nseed = 0\noverrides = []'))
    assert "load_config(profile, overrides, seed=seed)" in mutated("03_f.ipynb", cell(2, "cfg = None"))
    (tmp_path / "03_g.ipynb").write_text("{not json")
    assert "not valid JSON" in " ".join(check_conventions(tmp_path / "03_g.ipynb"))


def test_the_schedule_is_the_notebooks_own_metadata(tmp_path):
    """How ``acl run`` schedules a notebook (once over all seeds, opt-in) is read from ``metadata.acl``, checked by
    the conventions, and kept by ``acl nbstrip``, which drops only ``acl run``'s interruption mark."""
    from acl_lib.notebooks import across_seeds, schedule

    p = write_notebook(tmp_path / "07_tables.ipynb", ["x = seeds"])
    assert schedule(p) == {"runs": "per_seed", "opt_in": False, "after": None} and not across_seeds(p)
    nb = json.loads(p.read_text())
    nb["metadata"]["acl"] = {"runs": "once_over_seeds", "interrupted": True, "at": "2026-01-01T00:00:00+00:00"}
    p.write_text(json.dumps(nb))
    assert across_seeds(p) and default_notebooks([p]) == [p]
    assert strip_outputs(p) is True
    assert json.loads(p.read_text())["metadata"]["acl"] == {"runs": "once_over_seeds"}
    assert check_conventions(p) == ["runs once over the seeds (metadata.acl.runs) but its parameters cell does not "
                                    "define seeds"]
    nb = json.loads(p.read_text())
    nb["metadata"]["acl"] = {"opt_in": "yes"}
    p.write_text(json.dumps(nb))
    assert "opt_in must be true or false" in " ".join(check_conventions(p))
    nb["metadata"]["acl"] = {"opt_in": True}
    p.write_text(json.dumps(nb))
    assert default_notebooks([p]) == [] and default_notebooks([p], ["07"]) == [p]


@pytest.mark.slow
def test_strip_outputs_and_nbstrip_check(tmp_path):
    p = write_notebook(tmp_path / "05_dirty.ipynb", ["print('hi')"])
    nb = json.loads(p.read_text())
    nb["cells"][3].update(execution_count=7, outputs=[{"output_type": "stream", "name": "stdout", "text": "hi\n"}])
    nb["cells"][3]["metadata"]["papermill"] = {"duration": 0.1}
    nb["metadata"]["papermill"] = {"parameters": {}}
    p.write_text(json.dumps(nb, indent=1))

    check = subprocess.run([*ACL, "nbstrip", "--check", str(p)], capture_output=True, text=True, env=child_env(),
                           timeout=60)
    assert check.returncode == 1 and "would strip" in check.stdout
    assert strip_outputs(p) is True
    clean = json.loads(p.read_text())
    assert clean["cells"][3]["outputs"] == [] and clean["cells"][3]["execution_count"] is None
    assert "papermill" not in clean["metadata"] and "papermill" not in clean["cells"][3]["metadata"]
    assert clean["cells"][1]["metadata"]["tags"] == ["parameters"]
    assert check_conventions(p) == []
    assert strip_outputs(p) is False, "a clean notebook is left untouched"
    check = subprocess.run([*ACL, "nbstrip", "--check", str(p)], capture_output=True, text=True, env=child_env(),
                           timeout=60)
    assert check.returncode == 0


def _lab_save(src, dst):
    """What opening a notebook in JupyterLab and saving it without running writes: the server's contents
    manager round trip, with the kernel's display name and the ``language_info`` the kernel reports."""
    from jupyter_server.services.contents.filemanager import FileContentsManager

    shutil.copy(src, dst / src.name)
    cm = FileContentsManager(root_dir=str(dst))
    model = cm.get(src.name, content=True, type="notebook")
    meta = model["content"]["metadata"]
    meta["kernelspec"]["display_name"] = "Python 3 (ipykernel)"
    meta["language_info"] = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                             "mimetype": "text/x-python", "name": "python", "version": "3.11.2"}
    cm.save({"type": "notebook", "format": "json", "content": model["content"]}, src.name)
    return dst / src.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_saving_in_lab_then_nbstrip_leaves_the_committed_bytes(tmp_path, path):
    saved = _lab_save(path, tmp_path)
    assert saved.read_bytes() != path.read_bytes(), "the Lab round trip should have changed something"
    strip_outputs(saved)
    assert saved.read_bytes() == path.read_bytes()


def _stream_lines(cell: dict) -> int:
    streams = [o for o in cell.get("outputs", []) if o.get("output_type") == "stream"]
    return sum("".join(o.get("text", "")).count("\n") for o in streams)


SCREENFUL = 40  # log lines a cell may print; progress has its own one-line display


@pytest.mark.slow
@pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks committed yet")
def test_all_notebooks_execute_under_smoke(tmp_path):
    """Every notebook executes; `acl run` reports notebook, run, step, loss or reward and time left line by
    line; no cell buries its results under logs; nbconvert HTML carries every figure, with plotly.js inside."""
    from nbconvert import HTMLExporter

    from acl_lib.views import static_images_available

    pm, out = tmp_path / "papermill_runs", tmp_path / "outputs"
    res = subprocess.run(
        [*ACL, "run", "--profile", "smoke", "--seeds", "0", "--papermill-dir", str(pm), "--output-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, env=child_env(), timeout=3600,
    )
    assert res.returncode == 0, res.stderr[-5000:]
    lines = res.stdout.splitlines()
    jobs = plan_jobs(default_notebooks(NOTEBOOKS), [0])  # what `acl run` executes: the opt-in ones (13) left out
    assert f"[2/{len(jobs)}] 01_seq_stage_1.ipynb  (profile smoke, seed 0)" in lines
    sft_progress = r"seq_search · sft: \d+/\d+ steps \(\d+%\) · loss [\d.]+"
    assert any(re.search(sft_progress, x) for x in lines), res.stdout[-3000:]
    assert any(re.search(r"seq_search · grpo: \d+/\d+ steps .* reward [\d.]+", x) for x in lines), res.stdout[-3000:]
    assert any(re.search(r"seq_if/eval · eval: \d+/\d+ episodes .*, ~\d+s left", x) for x in lines), res.stdout[-3000:]
    # the same lines are in the run's log, with the trainer's own output
    log = (out / "smoke" / "seed0" / "seq_search" / "run.log").read_text()
    assert re.search(r"acl.progress: seq_search · sft: \d+/\d+ steps", log)

    png = static_images_available()
    assert not any(j.notebook.name.startswith("13_") for j in jobs)
    for job in jobs:
        nb, executed = job.notebook, job.output(pm, "smoke")
        state, _ = notebook_state(executed)
        assert state == "done", f"{nb.name}: {state}"
        cells = json.loads(executed.read_text())["cells"]
        for i, cell in enumerate(cells):
            assert _stream_lines(cell) <= SCREENFUL, f"{nb.name} cell {i}: {_stream_lines(cell)} log lines"
            # the suite's log lines are information: stdout, not the red box a notebook draws around stderr
            errs = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("name") == "stderr")
            assert not re.search(r"\d\d:\d\d:\d\d acl\.", errs), f"{nb.name} cell {i}: log lines on stderr"
        outputs = [o for c in cells for o in c.get("outputs", [])]
        figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
        assert figures, f"{nb.name} draws no figure"
        html, _ = HTMLExporter().from_filename(str(executed))
        assert html.count("Plotly.newPlot(") >= len(figures), f"{nb.name}: figures missing from the HTML"
        assert 'src="https://cdn.plot.ly' not in html and "plotly.js v" in html, f"{nb.name}: plotly.js not embedded"
        if png:  # what GitHub and nbviewer show of a plotly output: its PNG copy
            assert all("image/png" in o["data"] for o in figures), f"{nb.name}: a figure has no PNG copy"
