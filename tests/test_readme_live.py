"""The README cannot go stale (issue 21): its outputs, its Python example and the paths it names are checked here
against what the tool does today, so a change in the output fails until the README follows. Since issue 38 the
README is one page and its long sections live whole in docs/: they are read there (tests/docs_text.py), and the
README's own excerpts are checked against them (tests/test_readme_page.py).

Also checked elsewhere: the `compare` example (tests/test_cli.py), the set-up commands (tests/test_scripts.py).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
from pathlib import Path

from .conftest import run_cli
from .docs_text import fenced_blocks, user_docs
from .docs_text import section as _section

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _blocks(text: str, lang: str = "") -> list[str]:
    """The fenced blocks of `text` opened with exactly ```lang, each as text."""
    return ["\n".join(body) + "\n" for body in fenced_blocks(text, lang)]


def _excerpt_matches(excerpt: str, printed: str) -> None:
    """Every line of the excerpt is a line of the output, in order; `...` alone elides lines, `(...)` inside a
    line elides a parenthesis."""
    lines = printed.splitlines()
    at = 0
    for want in excerpt.strip("\n").splitlines():
        if want == "...":
            continue
        pattern = re.compile("^" + ".*?".join(re.escape(part) for part in want.split("(...)")) + "$")
        while at < len(lines) and not pattern.match(lines[at].rstrip()):
            at += 1
        assert at < len(lines), f"README line not in the output (in order):\n{want}\n--- output:\n{printed}"
        at += 1


def test_the_readme_report_excerpt_is_a_real_run(minilm_dir, tmp_path):
    section = _section("Health report: `report`")
    excerpt = section.split("On MiniLM (excerpt):", 1)[1]
    excerpt = _blocks(excerpt)[0]
    out = run_cli("report", str(minilm_dir), "--db", str(tmp_path / "db"), "-q", env={"COLUMNS": "100000"})
    assert out.returncode == 0, out.stderr
    _excerpt_matches(excerpt, out.stdout)
    findings = re.search(r"^Findings \((\d+)\)$", out.stdout, re.M)
    assert findings is not None and f"Findings ({findings.group(1)})" in excerpt
    # Every finding the tool prints is in the excerpt, whole (the excerpt elides bullets, never findings).
    for line in out.stdout.splitlines():
        if re.match(r"^  F\d+ \[", line):
            assert line.rstrip() in excerpt, line


def test_the_readme_python_example_runs_on_the_demo_model(minilm_dir, tmp_path, monkeypatch):
    section = _section("Python API")
    code, shown = _blocks(section, "python")[0], _blocks(section)[0]
    assert '"path/to/model"' in code
    monkeypatch.setenv("WEIGHTDIAG_DB", str(tmp_path / "db"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace('"path/to/model"', repr(str(minilm_dir))), "README.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    saved = Path(lines[-1])
    assert saved.is_file() and saved.parent == tmp_path / "db" / "rows"
    assert lines[:-1] == shown.strip("\n").splitlines()


_PATH = re.compile(r"(?<![\w/.-])((?:weightdiag|scripts|benchmarks|docs|tests)/[\w./-]*[\w/])")
_MODULE = re.compile(r"`(weightdiag(?:\.\w+)+)(?:\(\))?`")


def test_every_path_and_module_the_readme_names_exists():
    text = user_docs()  # the README and the docs pages its sections moved to
    missing = [p for p in sorted(set(_PATH.findall(text))) if not (ROOT / p).exists()]
    assert not missing, f"README names paths that do not exist: {missing}"
    for dotted in sorted(set(_MODULE.findall(text))):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                assert hasattr(obj, attr), f"README names {dotted}: {obj.__name__} has no {attr}"
                obj = getattr(obj, attr)
            break
        else:
            raise AssertionError(f"README names {dotted}, which does not import")
    # The code layout lists files under their package folder: each of them exists there.
    layout = _section("How the code is laid out")
    block = _blocks(layout)[0]
    folder = None
    for line in block.splitlines():
        named = re.search(r"(weightdiag/[\w/]*/)\s", line)
        if named:
            folder = named.group(1)
            continue
        files = re.match(r"^ {4}([\w, .]+\.(?:py|c))\s", line)
        if files and folder:
            for name in re.split(r",\s*", files.group(1)):
                assert (ROOT / folder / name).exists(), f"README's code layout names {folder}{name}"


def test_the_readme_fit_and_db_show_examples_are_real_runs(minilm_dir, tmp_path):
    """`fit` on MiniLM (its table, the class legend, the notes) and `db show pythia-160m`, as the README shows
    them; to a file, so at full width, and with no caption line folded."""
    usage = _section("Usage")
    fit_example = _blocks(usage.split("On MiniLM (`scripts/demo`):", 1)[1])[0]
    (tmp_path / "DATABASE").mkdir()
    out = run_cli("fit", str(minilm_dir), env={"COLUMNS": "100000"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr

    # Whole, line for line (issue 42: a line the command prints was missing): the fingerprint (local files are
    # fingerprinted with their place), the seconds and the database's place are the run's own.
    def same(text: str) -> list[str]:
        text = re.sub(r"local-[0-9a-f]{12}", "local-FP", text)
        text = re.sub(r"in [0-9.]+ s \(", "in T s (", text)
        return [line.rstrip() for line in re.sub(r"written to \S*DATABASE/", "written to DATABASE/", text).splitlines()]

    assert same(out.stdout + out.stderr) == same(fit_example.strip("\n"))
    shown_db = _blocks(_section("The database: `db`"))[0]
    out = run_cli("db", "show", "pythia-160m", "--db", str(tmp_path / "DATABASE"), env={"COLUMNS": "100000"})
    assert out.returncode == 0, out.stderr
    lines = [line.rstrip() for line in out.stdout.splitlines()]
    assert lines[: len(shown_db.splitlines())] == shown_db.strip("\n").splitlines()


def test_the_class_legend_is_under_every_kinds_table_and_in_the_readme():
    from weightdiag.render.tables import CLASS_LEGEND

    readme = user_docs()
    for line in CLASS_LEGEND.splitlines():
        assert readme.count(line) >= 2, line  # under the fit and the db show examples
    assert "**The two class columns.**" in readme
    assert "┃ k class        ┃ cohort k range ┃" in readme  # compare's column says which class it is


def test_the_readme_trajectory_walk_through_runs_offline(tmp_path):
    """The offline block of "Training runs" runs as written, in an empty folder with no network, and
    `trajectory` prints what the README shows."""
    import os
    import shlex
    import subprocess
    import sys

    section = _section("Training runs: `sweep` and `trajectory`")
    commands = [line.split("  #", 1)[0].strip() for line in _blocks(section, "bash")[0].strip().splitlines()]
    assert commands[0].startswith("python -c ") and "synthetic.write_training_run" in commands[0]
    shown = _blocks(section)[0]
    env = {"WEIGHTDIAG_DB": str(tmp_path / "db"), "COLUMNS": "100000", "HF_HUB_OFFLINE": "1"}
    printed = {}
    for command in commands:
        words = shlex.split(command)
        if words[0] == "python":
            done = subprocess.run(
                [sys.executable, *words[1:]], cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True
            )
        else:
            assert words[0] == "weightdiag", command
            done = run_cli(*words[1:], env=env, cwd=tmp_path)
        assert done.returncode == 0, (command, done.stderr)
        assert "Traceback" not in done.stderr
        printed[command] = done.stdout
    trajectory = next(c for c in commands if c.startswith("weightdiag trajectory") and "--plot" not in c)
    lines = [line.rstrip() for line in printed[trajectory].strip("\n").splitlines()]
    assert lines == shown.strip("\n").splitlines()
    assert list((tmp_path / "plots").glob("*.png"))


def test_a_newcomer_outside_the_repository(minilm_dir, tmp_path):
    """Issue 21's newcomer path: a fresh HOME, a folder outside the repository, no network, no --db. The row lands
    in the per-user database, is found from another folder, and compare and report print what the README shows."""
    home, first, second = tmp_path / "home", tmp_path / "projects" / "try", tmp_path / "elsewhere"
    for folder in (home, first, second):
        folder.mkdir(parents=True)
    env = {"HOME": str(home), "XDG_DATA_HOME": "", "WEIGHTDIAG_DB": "", "HF_HUB_OFFLINE": "1", "COLUMNS": "100000"}
    fitted = run_cli("fit", str(minilm_dir), env=env, cwd=first)
    assert fitted.returncode == 0, fitted.stderr
    rows = list((home / ".local" / "share" / "weightdiag" / "rows").glob("all-MiniLM-L6-v2@*.json"))
    assert len(rows) == 1 and f"row written to {rows[0]}" in fitted.stderr
    for args in (("db", "list"), ("db", "show", "all-MiniLM-L6-v2"), ("env",)):
        out = run_cli(*args, env=env, cwd=second)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (args, out.stderr)
    assert "all-MiniLM-L6-v2" in run_cli("db", "list", env=env, cwd=second).stdout
    section = _section("Comparing with the paper's cohort: `compare`")
    compared = run_cli("compare", "all-MiniLM-L6-v2", "-q", env=env, cwd=second)
    assert compared.returncode == 0, compared.stderr
    shown = "\n".join(line.rstrip() for line in compared.stdout.strip("\n").splitlines())
    assert shown == _blocks(section)[0].strip("\n")
    reported = run_cli("report", "all-MiniLM-L6-v2", "-q", env=env, cwd=second)
    assert reported.returncode == 0, reported.stderr
    excerpt = _blocks(_section("Health report: `report`").split("On MiniLM (excerpt):", 1)[1])[0]
    # read from the row, the first line says "database" where a fresh fit says "fitted"
    _excerpt_matches(excerpt.replace("(fitted;", "(database;", 1), reported.stdout)


def test_one_vocabulary_for_the_two_classes_in_json(minilm_dir, tmp_path):
    """A row's kinds have `class` (the role) and `k_class`; compare's --json names them k_class and role too."""
    import json

    fitted = run_cli("fit", str(minilm_dir), "--json", "-q", "--db", str(tmp_path))
    row = json.loads(fitted.stdout)
    (compared,) = json.loads(run_cli("compare", str(minilm_dir), "--json", "-q", "--db", str(tmp_path)).stdout)
    for kind in ("q", "k", "ffn_out"):
        assert compared["kinds"][kind]["k_class"] == row["kinds"][kind]["k_class"] == compared["kinds"][kind]["class"]
        assert compared["kinds"][kind]["role"] == row["kinds"][kind]["class"]
    assert row["kinds"]["q"]["class"] == "selection" and row["kinds"]["q"]["k_class"] == "transmission"


# Each command's section of the README and the commands whose options it names.
_COMMAND_SECTIONS = {
    "Training runs: `sweep` and `trajectory`": ("sweep", "trajectory"),
    "What fine-tuning changed: `diff`": ("diff",),
    "Regression checks in CI: `check`": ("check",),
    "Health report: `report`": ("report",),
    "Comparing with the paper's cohort: `compare`": ("compare",),
    # the README's short sections, which link to those (issue 38)
    "fit": ("fit",),
    "compare": ("compare",),
    "check": ("check",),
    "diff": ("diff",),
    "sweep and trajectory": ("sweep", "trajectory"),
    "report": ("report",),
    "spectrum": ("fit", "report", "compare", "sweep"),
}


def test_every_option_a_command_section_names_is_an_option_of_its_commands():
    """Issue 33: the sweep section promised `--center` and `--include/--exclude`, which `sweep` did not have."""
    import typer.main

    from weightdiag.cli import app

    commands = typer.main.get_command(app).commands
    for title, names in _COMMAND_SECTIONS.items():
        known = {opt for name in names for p in commands[name].params for opt in (*p.opts, *p.secondary_opts)}
        named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", _section(title)))
        assert named, title
        assert not named - known, f"{title}: the README names options its commands lack: {sorted(named - known)}"


def _pair_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_diff_pair", ROOT / "scripts" / "make_diff_pair.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_diff_section_runs_on_the_lora_pair(minilm_dir, tmp_path):
    """Issue 33: the diff section's commands (the install line, the script, the diffs), its LoRA excerpt and the
    gate's verdicts, against a run on the pair the script writes (its LoRA half: the fine-tune is minutes)."""
    import shlex

    script = _pair_script()
    section = _section("What fine-tuning changed: `diff`")
    commands = [line.split("  #", 1)[0].strip() for line in _blocks(section, "bash")[1].strip().splitlines()]
    assert commands == [
        f"pip install '{script.TORCH}'",
        f"pip install '{script.TRANSFORMERS}'",
        "python scripts/make_diff_pair.py OUT",
        "weightdiag diff BASE OUT/minilm-ft",
        "weightdiag diff BASE OUT/minilm-lora",
    ]
    out = tmp_path / "OUT"
    script.save(out / "minilm-lora", minilm_dir, script.lora_merge(minilm_dir))
    words = ["diff", str(minilm_dir), str(tmp_path / shlex.split(commands[-1])[-1])]  # diff BASE OUT/minilm-lora
    wide = {"COLUMNS": "100000"}
    done = run_cli(*words, "--no-save", "-q", env=wide)
    assert done.returncode == 0, done.stderr
    lora_excerpt = _blocks(section)[1]
    assert lora_excerpt.startswith("all-MiniLM-L6-v2 -> minilm-lora:")
    _excerpt_matches(lora_excerpt, done.stdout)
    # The CI gate's two examples, as the prose quotes their verdicts, with BASE and TUNED the LoRA pair.
    pair = (str(minilm_dir), str(out / "minilm-lora"))
    gates = re.findall(r"`weightdiag diff BASE TUNED (--fail-above[^`]*)`\s*\(([^)]*?)`([^`]*)`,? exit (\d)", section)
    assert len(gates) == 2, gates
    for options, _, verdict, code in gates:
        done = run_cli("diff", *pair, *shlex.split(options), "--no-save", env=wide)
        assert done.returncode == int(code), (options, done.stderr)
        printed = done.stdout.strip().splitlines()[-1]
        verdict = " ".join(verdict.split())  # the prose folds it
        assert re.fullmatch(re.escape(verdict).replace(r"\.\.\.", ".*"), printed), (verdict, printed)


def test_the_readme_quick_start_runs_on_the_demo_model(minilm_dir, tmp_path):
    """Issue 38: the quick start's commands, as written, on MiniLM for path/to/model, offline (its Hub line is the
    one left out: tests/test_hub*.py stream from a loopback Hub), and the row lands where the README says."""
    import shlex

    block = _blocks(_section("Quick start"), "bash")[0]
    commands = [line.split("  #", 1)[0].strip() for line in block.strip().splitlines()]
    assert commands[0] == "weightdiag fit path/to/model" and len(commands) >= 5
    env = {"WEIGHTDIAG_DB": str(tmp_path / "db"), "HF_HUB_OFFLINE": "1", "COLUMNS": "100000"}
    ran = 0
    for command in commands:
        words = shlex.split(command)
        assert words[0] == "weightdiag", command
        if any(re.fullmatch(r"[\w.-]+/[\w.-]+(@\S+)?", w) and w != "path/to/model" for w in words[2:]):
            continue  # a Hub id
        words = [str(minilm_dir) if w == "path/to/model" else w for w in words[1:]]
        quiet = ["-q"] if words[0] in ("fit", "compare", "report") else []
        done = run_cli(*words, *quiet, env=env, cwd=tmp_path)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stderr)
        ran += 1
    assert ran == len(commands) - 1
    rows = list((tmp_path / "db" / "rows").glob("all-MiniLM-L6-v2@*.json"))
    assert len(rows) == 1 and "<database>/rows/<model>@<revision>.json" in _section("Quick start")
    assert (tmp_path / "report.html").is_file()


def test_the_readme_lineage_example_is_a_real_run(minilm_dir, tmp_path):
    """`lineage` of MiniLM round-tripped through FP8 against MiniLM and a random initialisation of its shape."""
    torch = __import__("pytest").importorskip("torch")
    from transformers import BertConfig, BertModel

    from weightdiag.testing import lineage_cases as lc

    section = _section("Lineage: `lineage`")
    shown = _blocks(section)[0].splitlines()
    base = lc.load_state(minilm_dir)
    lc.save_state(lc.fp8_round_trip(base), tmp_path / "minilm-fp8", minilm_dir / "config.json")
    torch.manual_seed(0)
    init = {k: v.detach() for k, v in BertModel(BertConfig.from_pretrained(str(minilm_dir))).state_dict().items()}
    lc.save_state({k: v for k, v in init.items() if k in base}, tmp_path / "bert-random", minilm_dir / "config.json")
    for model in (str(minilm_dir), "bert-random"):
        assert run_cli("fit", model, "--db", "db", "-q", cwd=tmp_path).returncode == 0
    done = run_cli(*shown[0].split()[2:], cwd=tmp_path, env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == shown[1:]
