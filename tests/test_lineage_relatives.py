"""Issue 39: lineage where other commands meet it. A diff row named as a reference is refused in one line that
says what to name instead."""

from __future__ import annotations

import shutil

import pytest

from weightdiag import api


def _main(capsys, *args: str) -> tuple[int, str, str]:
    """weightdiag.cli.main in this process, as the console script runs it: (exit code, stdout, stderr)."""
    from weightdiag import cli

    with pytest.raises(SystemExit) as ended:
        cli.main(list(args))
    out = capsys.readouterr()
    return int(ended.value.code or 0), out.out, out.err


def test_a_diff_row_named_as_a_reference_is_refused_and_says_what_to_name(small_llama, tmp_path, capsys):
    """It said "not a weightdiag row (no 'schema' field)" of a file weightdiag wrote itself."""
    db = tmp_path / "db"
    tuned = tmp_path / "tuned"
    shutil.copytree(small_llama, tuned)
    api.diff(str(small_llama), str(tuned), db_dir=db, save=True)
    (written,) = (db / "diffs").glob("*.json")
    code, out, err = _main(capsys, "lineage", str(small_llama), "--against", str(written), "--db", str(db))
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "a diff row (weightdiag.diff/1" in err and "not a model's row" in err, err
    assert f"'{small_llama.name}'" in err and "tuned" in err, err
