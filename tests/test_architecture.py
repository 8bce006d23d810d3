"""The shape of the code: the package's folders are the stages of the data flow, imports follow it
downward, with no cycles, and only weightdiag/settings.py reads the environment.

The stages, lowest first (a module may import its own stage and the ones before it):

  base      errors, settings, vocabulary, citations, dtypes, segments, codes (code -> value tables),
            build (this process's weightdiag build and kernels),
            executor (how passes run: the ordered window, this process or a Ray cluster),
            execution (threads, workers, device, kernels and executor of a job, decided once),
            tuning (the knobs that trade speed against memory: one registry tests override),
            kernels (the C / numpy hot loops)
  source    where bytes come from: the plan (files, tensors, byte ranges), the Reader protocol, and its
            readers (local safetensors, the Hub, GGUF, .bin); chunks (the bytes to read)
  layout    tensor names and config.json -> roles, fused parts
  decode    stored bytes -> values: quantized formats with their companions (grouping, decoders)
  reduce    values -> exact per-tensor summaries: the chunk engine, reductions on CPU or torch, vectors
  fit       summaries -> Weibull fits and statistics (pure numerics)
  record    the row: its schema, the records built from fits, the journal of a fit in progress
  diagnose  rows -> verdicts (pure)
  delta     two checkpoints compared: pairing, lockstep reads (the paired pass), exact figures, the spectrum
            of ΔW, findings, the typed result
  database  the database folder (fit rows, diff rows)
  run       whole jobs: a model measured (measure) and fitted into a row (fitting), a run's revisions
            (sweep), matrices re-read for plots (histograms), a diff (diff)
  render    tables, plots, HTML (of fits, comparisons and diffs)
  api       the Python API: one function per command
  cli       the command line: a package of small modules (app, one per command group, options, output,
            errors), none over CLI_MODULE_LINES lines

weightdiag/testing (synthetic checkpoints for tests, benchmarks and the demo) is imported by no stage.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "weightdiag"

STAGES = {
    "base": [
        "errors",
        "settings",
        "vocabulary",
        "citations",
        "dtypes",
        "segments",
        "codes",
        "kernels",
        "build",
        "executor",
        "execution",
        "tuning",
        "progress",
        "testing",
    ],
    "source": ["source"],
    "layout": ["layout"],
    "decode": ["decode"],
    "reduce": ["reduce"],
    "fit": ["fit"],
    "record": ["record"],
    "diagnose": ["diagnose"],
    "delta": ["delta"],
    "database": ["database"],
    "run": ["run"],
    "render": ["render"],
    "api": ["api"],
    "cli": ["cli", "__main__"],
}
RANK = {top: rank for rank, tops in enumerate(STAGES.values()) for top in tops}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """weightdiag module -> the weightdiag modules it imports (at any depth of its code)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    found.add(full if full in modules else target)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        edges[name] = {m for m in found if m in modules and m != name and m != "weightdiag"}
    return edges


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_folders_are_the_stages():
    """Every module but the shared base words lives in its stage's folder."""
    loose = sorted(
        p.stem for p in PACKAGE.glob("*.py") if p.stem not in {*STAGES["base"], "api", "cli", "__main__", "__init__"}
    )
    assert not loose, f"modules outside a stage folder: {loose}"


def test_no_stage_imports_the_test_helpers():
    users = sorted(
        m for m, targets in _imports().items() if _top(m) != "testing" and any(_top(t) == "testing" for t in targets)
    )
    assert not users, users


def test_every_module_has_a_stage():
    missing = sorted({_top(m) for m in _imports() if m != "weightdiag" and _top(m) not in RANK})
    assert not missing, f"add these to STAGES: {missing}"


def test_imports_go_downward():
    upward = [
        f"{m} ({_stage(m)}) imports {t} ({_stage(t)})"
        for m, targets in _imports().items()
        for t in sorted(targets)
        if m != "weightdiag" and RANK[_top(t)] > RANK[_top(m)]
    ]
    assert not upward, "\n".join(upward)


def _stage(module: str) -> str:
    return next(stage for stage, tops in STAGES.items() if _top(module) in tops)


def test_no_import_cycles():
    edges = _imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_only_settings_reads_the_environment():
    readers = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "settings.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
                line = path.read_text().splitlines()[node.lineno - 1]
                if "setdefault" not in line:  # sweep hands a thread count to its worker processes
                    readers.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not readers, readers


CLI_MODULE_LINES = 410  # options.py holds the table of every option: 405 lines with lineage's (issue 39)


def test_no_cli_module_is_long():
    """The command line is a package of modules of one topic each (issue 37: cli.py had grown to 1,459 lines
    of eight topics): none over CLI_MODULE_LINES lines."""
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in sorted((PACKAGE / "cli").rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > CLI_MODULE_LINES
    }
    assert not long, long


@pytest.mark.parametrize("module", ["weightdiag.cli", "weightdiag.api", "weightdiag.reduce.stream"])
def test_modules_import_on_their_own(module):
    """Each entry point imports in a fresh interpreter (an import cycle would show as an ImportError)."""
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, timeout=120)


def test_readers_and_decoders_are_never_probed_for_attributes():
    """Readers answer source/reader.py's Reader and decoders decode/decoder.py's Decoder: what a caller may
    ask is declared there, never discovered with hasattr/getattr."""
    probes = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr")
                and node.args
                and any(word in ast.unparse(node.args[0]) for word in ("reader", "decoder", "factory"))
            ):
                probes.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not probes, probes


def _concrete_readers_and_decoders() -> set[str]:
    """Classes of source/ and decode/ that implement the Reader or Decoder contract (not the contracts)."""
    names = set()
    for folder in ("source", "decode"):
        for path in (PACKAGE / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and node.name.endswith(("Reader", "Decoder", "Codes", "FP4")):
                    names.add(node.name)
                if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(base).endswith(("Reader", "Decoder", "_PackedLinear")) for base in node.bases
                ):
                    names.add(node.name)
    return names - {"Reader", "Decoder", "LazyDecoder"}


def test_concrete_readers_and_decoders_are_never_tested_for_their_class():
    """What a caller may ask of a reader or a decoder is declared by its contract: no isinstance/issubclass of a
    concrete reader or decoder outside the module that defines it (a caller that must know would be a fourth
    corridor through the execution wing)."""
    concrete = _concrete_readers_and_decoders()
    assert {"LocalReader", "HubReader", "GGUFReader", "TorchBinReader", "GPTQDecoder", "RowMajorDecoder"} <= concrete
    tests = []
    for path in PACKAGE.rglob("*.py"):
        defined = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)}
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2
            ):
                named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if (named & concrete) - defined:
                    tests.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not tests, tests


def test_every_source_returns_a_reader():
    """open_model and every source's open function are typed to return a Reader, and every reader is one."""
    import inspect
    import typing

    from weightdiag.source import gguf, hub, local, open, torch_bin
    from weightdiag.source.hub_stream import HubReader
    from weightdiag.source.reader import Reader

    for fn in (open.open_model, local.open_local, hub.open_hub, gguf.open_gguf, torch_bin.open_torch_bin):
        _plan, reader_type = typing.get_args(typing.get_type_hints(fn)["return"])
        assert inspect.isclass(reader_type) and issubclass(reader_type, Reader), fn.__name__
    for reader in (local.LocalReader, HubReader, gguf.GGUFReader, torch_bin.TorchBinReader):
        assert issubclass(reader, Reader) and not inspect.isabstract(reader), reader
