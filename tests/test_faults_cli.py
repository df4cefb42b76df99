"""Fault suite, the `acl` command (issue 11): every subcommand with every class of bad argument exits with
code 2 and a short message on stderr, never a traceback; `acl eval` (defects 1, 2, 3, 9) and bad output
locations (defect 10).

The table runs `acl` in-process (`acl_lib.cli.main`): an exception escaping `main` is what prints a traceback
in a terminal, and fails the test here. One case also runs as a real subprocess.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from acl_lib.cli import main
from conftest import ACL, ROOT, child_env, write_notebook

UNWRITABLE = "/proc/acl-suite-faults/out"  # mkdir fails there, even as root


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Throwaway files and directories the bad arguments point at."""
    d = tmp_path_factory.mktemp("faults")
    f = {"dir": d}
    f["file"] = d / "a_file.txt"
    f["file"].write_text("not a directory")
    f["bad_json"] = d / "bad.json"
    f["bad_json"].write_text("{not json")
    f["dict_json"] = d / "dict.json"
    f["dict_json"].write_text("{}")
    f["list_json"] = d / "list.json"
    f["list_json"].write_text("[]")
    f["nb"] = d / "nb"
    # would leave a marker if any notebook ran: every case below must stop before that
    write_notebook(f["nb"] / "00_never.ipynb", [f"open({str(d / 'RAN')!r}, 'w').write('ran')"])
    f["empty_dir"] = d / "empty_dir"
    f["empty_dir"].mkdir()
    f["foreign"] = d / "foreign"
    f["foreign"].mkdir()
    (f["foreign"] / "notes.txt").write_text("keep me")
    # a run directory of a run store
    f["run"] = d / "outputs" / "smoke" / "seed0" / "seq_math"
    f["run"].mkdir(parents=True)
    (f["run"] / "COMPLETE.json").write_text("{}")
    return f


def _cases(f) -> list[tuple[str, list[str], str]]:
    nb, pm, out = str(f["nb"]), str(f["dir"] / "pm"), str(f["dir"] / "out")
    dirs = ["--notebooks-dir", nb, "--papermill-dir", pm, "--output-dir", out]
    inside_file = str(f["file"] / "sub")
    smoke = ["--profile", "smoke"]
    ev = ["eval", "--model", "null", *smoke]
    rp = ["env", "retail", "replay"]
    db, tasks, outj = str(f["dict_json"]), str(f["list_json"]), str(f["dir"] / "replay.jsonl")
    return [
        # --- acl run
        ("run: unknown key", ["run", *smoke, "--set", "no_such_key=1", *dirs], "no_such_key"),
        ("run: bad type", ["run", *smoke, "--set", "eval.k=abc", *dirs], "eval.k"),
        ("run: bad type (argparse)", ["run", *smoke, "--seeds", "x", *dirs], "invalid int"),
        ("run: --set profile", ["run", *smoke, "--set", "profile=paper", *dirs], "--profile"),
        ("run: unknown profile", ["run", "--profile", "huge", *dirs], "invalid choice"),
        ("run: missing notebooks dir", ["run", *smoke, "--notebooks-dir", str(f["dir"] / "none"), "--papermill-dir", pm,
                                        "--output-dir", out], "no such directory"),
        ("run: unknown notebook", ["run", *smoke, "--only", "77", *dirs], "77"),
        ("run: output dir inside a file", ["run", *smoke, "--notebooks-dir", nb, "--papermill-dir", pm,
                                           "--output-dir", inside_file], "is a file"),
        ("run: unwritable output dir", ["run", *smoke, "--notebooks-dir", nb, "--papermill-dir", pm,
                                        "--output-dir", UNWRITABLE], "cannot write"),
        ("run: papermill dir inside a file", ["run", *smoke, "--notebooks-dir", nb, "--papermill-dir", inside_file,
                                              "--output-dir", out], "is a file"),
        ("run: unwritable papermill dir", ["run", *smoke, "--notebooks-dir", nb, "--papermill-dir", UNWRITABLE,
                                           "--output-dir", out], "cannot write"),
        # --- acl status
        ("status: unknown profile", ["status", "--profile", "huge"], "invalid choice"),
        ("status: bad type", ["status", *smoke, "--seeds", "x"], "invalid int"),
        ("status: output dir is a file", ["status", *smoke, "--output-dir", str(f["file"]), "--notebooks-dir", nb],
         "not a directory"),
        ("status: missing notebooks dir", ["status", *smoke, "--notebooks-dir", str(f["dir"] / "none"),
                                           "--output-dir", out], "no such directory"),
        # --- acl config
        ("config: unknown key", ["config", *smoke, "--set", "no_such_key=1"], "no_such_key"),
        ("config: bad type", ["config", *smoke, "--set", "eval.k=true"], "eval.k"),
        ("config: bad value", ["config", *smoke, "--seed", "-1"], "seed"),
        ("config: bad YAML", ["config", *smoke, "--set", "model.base_model={"], "not valid YAML"),
        ("config: short curriculum", ["config", *smoke, "--set", "pipeline.curriculum=[]"], "curriculum"),
        ("config: not key=value", ["config", *smoke, "--set", "eval.k"], "key=value"),
        # --- acl eval (defects 1, 2, 9, and --out)
        ("eval: unknown key", [*ev, "--set", "no_such_key=1", "eval.k=abc"], "no_such_key"),
        ("eval: bad type", [*ev, "--set", "eval.k=abc"], "eval.k"),
        ("eval: k < 0", [*ev, "--k", "-1"], "--k must be at least 1"),
        ("eval: k = 0", [*ev, "--k", "0"], "--k must be at least 1"),
        ("eval: bad type (argparse)", [*ev, "--k", "abc"], "invalid int"),
        ("eval: bad suites", [*ev, "--suites", "everything"], "invalid choice"),
        ("eval: missing model dir", ["eval", "--model", str(f["dir"] / "seq_math" / "model"), *smoke],
         "no such directory"),
        ("eval: missing relative model dir with /", ["eval", "--model", "acl_lib/no_such_run/model", *smoke],
         "no such directory"),
        ("eval: model dir is not a model", ["eval", "--model", str(f["empty_dir"]), *smoke], "not a checkpoint"),
        ("eval: model is a file", ["eval", "--model", str(f["file"]), *smoke], "not a checkpoint directory"),
        ("eval: out inside a file", [*ev, "--out", inside_file], "is a file"),
        ("eval: out unwritable", [*ev, "--out", UNWRITABLE], "cannot write"),
        ("eval: out in a run", [*ev, "--out", str(f["run"] / "eval2")], "run directory"),
        ("eval: out is a run", [*ev, "--out", str(f["run"])], "run directory"),
        ("eval: out holds other files", [*ev, "--out", str(f["foreign"])], "already holds other files"),
        # --- acl env retail replay (defect 6)
        ("replay: missing db", [*rp, "--db", str(f["dir"] / "none.json"), "--tasks", tasks, "--out", outj],
         "no such file"),
        ("replay: missing tasks", [*rp, "--db", db, "--tasks", str(f["dir"] / "none.json"), "--out", outj],
         "no such file"),
        ("replay: invalid JSON", [*rp, "--db", db, "--tasks", str(f["bad_json"]), "--out", outj], "not valid JSON"),
        ("replay: tasks not a list", [*rp, "--db", db, "--tasks", str(f["dict_json"]), "--out", outj],
         "expected a JSON list"),
        ("replay: db not a retail db", [*rp, "--db", str(f["list_json"]), "--tasks", tasks, "--out", outj],
         "not a tau2 retail database"),
        ("replay: db is a directory", [*rp, "--db", str(f["dir"]), "--tasks", tasks, "--out", outj], "cannot read"),
        ("replay: missing argument", [*rp, "--db", db, "--tasks", tasks], "required"),
        # --- acl nbstrip
        ("nbstrip: missing notebook", ["nbstrip", str(f["dir"] / "none.ipynb")], "no such file"),
        ("nbstrip: not a notebook", ["nbstrip", str(f["bad_json"])], "not a notebook"),
        ("nbstrip: a directory", ["nbstrip", str(f["dir"])], "not a file"),
        # --- no or unknown subcommand
        ("no command", [], "required"),
        ("unknown command", ["train"], "invalid choice"),
    ]


def _run(argv, capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.err


def test_every_bad_argument_exits_2_with_a_short_message(files, capsys):
    cases = _cases(files)
    failures = []
    for name, argv, needle in cases:
        code, err = _run(argv, capsys)
        problems = []
        if code != 2:
            problems.append(f"exit {code}")
        if needle not in err:
            problems.append(f"no {needle!r} in stderr")
        if "Traceback" in err:
            problems.append("a traceback")
        message = err.strip()
        if not message or "\n\n" in message or len(message.splitlines()) > 8:
            problems.append("not one short paragraph")
        if problems:
            failures.append(f"{name}: {', '.join(problems)}\n    acl {' '.join(argv)}\n    stderr: {err[-600:]!r}")
    assert not failures, "\n".join(failures)
    assert not (files["dir"] / "RAN").exists(), "a notebook ran although the arguments were bad"
    assert not (files["dir"] / "pm").exists() or not any((files["dir"] / "pm").rglob("*.ipynb"))
    assert (files["foreign"] / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in files["run"].iterdir()) == ["COMPLETE.json"]
    assert not (files["dir"] / "replay.jsonl").exists()


@pytest.mark.slow
def test_a_bad_argument_in_a_real_process_prints_no_traceback(files):
    res = subprocess.run([*ACL, "eval", "--model", str(files["empty_dir"]), "--profile", "smoke"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env=child_env())
    assert res.returncode == 2 and "not a checkpoint" in res.stderr and "Traceback" not in res.stderr, res.stderr


# --- acl eval: --set, --k, where results go, bad checkpoints ------------------------------------------------


def _eval(argv, capsys) -> tuple[int, str, str]:
    try:
        code = main(["eval", *argv])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_eval_applies_set_and_k(tmp_path, capsys):
    # defect 1: --set was read from the wrong attribute and ignored
    code, _, err = _eval(["--model", "null", "--profile", "smoke", "--set", "worlds.n_test=2", "worlds.n_ood=1",
                          "--out", str(tmp_path / "e")], capsys)
    assert code == 0, err
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert metrics["n_tasks"]["aime26"] == 2 and metrics["n_tasks"]["gpqa"] == 1, metrics["n_tasks"]
    assert all(v == 0.0 for v in metrics["scores"].values())
    # defect 2: --k -1 wrote a finished-looking result; --k 0 fell back to the config's k
    for k in ("-1", "0"):
        code, _, err = _eval(["--model", "expert", "--profile", "smoke", "--k", k, "--out", str(tmp_path / f"k{k}")],
                             capsys)
        assert code == 2 and "--k must be at least 1" in err
        assert not (tmp_path / f"k{k}").exists()


def _listing(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): p.stat().st_mtime_ns for p in sorted(d.rglob("*"))}


@pytest.mark.slow
def test_eval_of_a_runs_model_never_writes_into_the_run(smoke_base_copy, capsys):
    # defect 3: the README's `acl eval --model <run>/model` wrote into the run, replacing its results
    out, model = smoke_base_copy  # a complete `base` run of the smoke profile, in a run store of this test's
    run = model.parent
    before = _listing(run)
    tiny = ["--set", f"output_dir={out}", "worlds.n_test=1", "worlds.n_ood=1", "eval.max_new_tokens=4",
            "eval.max_turns=1"]
    code, stdout, err = _eval(["--model", str(model), "--profile", "smoke", "--suites", "ood", *tiny], capsys)
    assert code == 0, err
    assert _listing(run) == before, "the run directory changed"
    results = sorted((out / "eval").glob("base-*"))
    assert len(results) == 1, list((out / "eval").iterdir())
    assert {p.name for p in results[0].iterdir()} == {"metrics.json", "records", "eval_config.yaml"}
    assert str(results[0] / "metrics.json") in stdout
    metrics = json.loads((results[0] / "metrics.json").read_text())
    assert set(metrics["scores"]) == {"gpqa", "mmlu_redux", "single_hop", "multi_hop", "telecom", "mock", "ifbench"}
    # and an explicit --out inside the run is refused before any scoring
    code, _, err = _eval(["--model", str(model), "--profile", "smoke", "--out", str(run / "eval"), *tiny], capsys)
    assert code == 2 and "run directory" in err and str(run) in err
    assert _listing(run) == before


@pytest.mark.slow
def test_eval_of_a_broken_checkpoint_exits_2(smoke_base, tmp_path, capsys):
    # defect 9: a truncated model.safetensors raised a safetensors traceback and exit 1
    model = smoke_base.model
    broken = tmp_path / "broken"
    shutil.copytree(model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    code, _, err = _eval(["--model", str(broken), "--profile", "smoke", "--out", str(tmp_path / "e")], capsys)
    assert code == 2, err
    assert "cannot load" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 3, err
    assert not (tmp_path / "e").exists()


class _DiesMidway:
    """The experts, until the evaluation is a few benchmarks in; then the process 'dies' (Ctrl-C)."""

    name = "dies"

    def __init__(self, calls: int):
        from acl_lib.eval.policies import ExpertPolicy

        self.expert, self.left = ExpertPolicy(), calls

    def __call__(self, batch):
        self.left -= 1
        if self.left < 0:
            raise KeyboardInterrupt
        return self.expert(batch)


def test_an_eval_killed_midway_leaves_the_previous_results_whole(tmp_path, monkeypatch, capsys):
    # defect 3: a killed evaluation left metrics.json of the previous model beside records/ of the new one
    from acl_lib.eval import harness

    out = tmp_path / "e"
    args = ["--profile", "smoke", "--set", "worlds.n_test=2", "worlds.n_ood=2", "--out", str(out)]
    code, _, err = _eval(["--model", "null", *args], capsys)
    assert code == 0, err
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr(harness, "make_policy", lambda model, cfg: _DiesMidway(calls=6))
    with pytest.raises(KeyboardInterrupt):
        main(["eval", "--model", "expert", *args])
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before, "a part of the killed evaluation replaced the previous one"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")], "temporary directory left behind"
    # a complete evaluation replaces the previous one as a whole
    monkeypatch.setattr(harness, "make_policy", lambda model, cfg: _DiesMidway(calls=10**6))
    main(["eval", "--model", "expert", *args])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"] == "expert" and all(v == 100.0 for v in metrics["scores"].values())
