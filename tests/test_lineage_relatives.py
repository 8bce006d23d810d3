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


@pytest.fixture(scope="module")
def minilm_rows(minilm_dir, tmp_path_factory):
    """MiniLM's row, a random initialisation of its shape (independent of it), and MiniLM with 2% noise."""
    import json

    torch = pytest.importorskip("torch")
    lc = pytest.importorskip("weightdiag.testing.lineage_cases")
    from transformers import BertConfig, BertModel

    from weightdiag.run.measure import FitOptions

    root = tmp_path_factory.mktemp("relatives")
    base = lc.load_state(minilm_dir)
    torch.manual_seed(3)
    init = {k: v.detach() for k, v in BertModel(BertConfig.from_pretrained(str(minilm_dir))).state_dict().items()}
    init_dir = lc.save_state({k: v for k, v in init.items() if k in base}, root / "init", minilm_dir / "config.json")
    noisy = lc.save_state(lc.noise(base, 0.02), root / "noisy", minilm_dir / "config.json")
    rows = {
        name: api.fit(str(folder), FitOptions(device="cpu"), save=False).row
        for name, folder in (("minilm", minilm_dir), ("init", init_dir))
    }
    return rows, noisy, json


def _db(tmp_path, rows, names):
    import json

    from weightdiag.database.store import write_row

    db = tmp_path / "db"
    for name, as_id in names:
        row = json.loads(json.dumps(rows[name]))
        row["model"] = {**row["model"], "id": as_id, "fingerprint": f"local-{as_id}", "location": f"/nowhere/{as_id}"}
        write_row(row, db)
    return db


def test_null_independent_rows_are_no_relatives_and_no_copy(minilm_rows, minilm_dir, tmp_path, capsys):
    """A database of a model independent of the candidate: compare names no relative, report says nothing."""
    rows, _, _ = minilm_rows
    db = _db(tmp_path, rows, [("init", "bert-random")])
    (compared,) = api.compare([str(minilm_dir)], db_dir=db, save=False)
    assert compared["lineage"]["relatives"] == [] and compared["lineage"]["judged"] == 1
    assert not any("lineage" in f for f in compared["findings"])
    reported = api.report(str(minilm_dir), db_dir=db, save=False).result
    assert reported["lineage"]["relatives"] == [] and reported["lineage"]["judged"] == 1
    assert not any("lineage" in line for line in reported["observations"])
    code, out, _ = _main(capsys, "compare", str(minilm_dir), "--db", str(db), "--no-save")
    assert code == 0 and "relatives by lineage" not in out


def test_planted_a_copy_in_the_database_is_said_and_a_derived_model_named(minilm_rows, minilm_dir, tmp_path, capsys):
    """MiniLM's row under another name: report says MiniLM appears to be a copy of it; compare of a noised MiniLM
    names that row as its nearest relative (derived, not a copy), in --json and in the text."""
    rows, noisy, json = minilm_rows
    db = _db(tmp_path, rows, [("init", "bert-random"), ("minilm", "rebranded")])
    reported = api.report(str(minilm_dir), db_dir=db, save=False).result
    (found,) = reported["lineage"]["relatives"]
    assert found["reference"] == "rebranded" and found["copy"] is True
    assert any(line.startswith("appears to be a copy of rebranded (same weights") for line in reported["observations"])
    code, out, _ = _main(capsys, "compare", str(noisy), "--db", str(db), "--no-save", "--json")
    assert code == 0, out
    (compared,) = json.loads(out) if out.lstrip().startswith("[") else [json.loads(out)]
    (relative,) = compared["lineage"]["relatives"]
    assert relative["reference"] == "rebranded" and relative["copy"] is False and relative["log10_p"] <= -10
    assert any(f.startswith("nearest relative by lineage: derived from rebranded") for f in compared["findings"])
    code, out, _ = _main(capsys, "compare", str(noisy), "--db", str(db), "--no-save")
    assert code == 0 and "nearest relatives by lineage" in out and "rebranded" in out
