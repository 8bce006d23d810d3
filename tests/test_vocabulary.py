"""weightdiag/vocabulary.py is the one place that names the tensor kinds, their classes and order, and
the cohort's trim: no other module spells out its own set of kinds."""

from __future__ import annotations

import ast
from pathlib import Path

from weightdiag import vocabulary
from weightdiag.vocabulary import (
    BLOCK_KEYS,
    COHORT_TRIM,
    FFN_KEYS,
    FFN_KINDS,
    KIND_ORDER,
    KINDS,
    MATRIX_KINDS,
    SELECTION_KEYS,
    SELECTION_KINDS,
    TRANSMISSION_KINDS,
    TRIMS,
    WEIGHT_KINDS,
    kind_class,
    kind_order,
)

PACKAGE = Path(vocabulary.__file__).resolve().parent
NAMES = frozenset(KINDS) | frozenset(KIND_ORDER)  # kinds and fused parts
MIN_ELEMENTS = 3  # ("gate", "ffn_in") and the like are a local test, not a vocabulary


def _kind_literal(node: ast.expr | None) -> list[str] | None:
    """The strings of a tuple/list/set literal of kind names (or frozenset/set/tuple of one), else None."""
    call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1
    if call and node.func.id in ("frozenset", "set", "tuple"):
        node = node.args[0]
    if not isinstance(node, (ast.Tuple, ast.List, ast.Set)) or len(node.elts) < MIN_ELEMENTS:
        return None
    values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return values if len(values) == len(node.elts) and set(values) <= NAMES else None


def _own_kind_sets(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        values = _kind_literal(node.value)
        if values is not None:
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {values}")
    return found


def test_no_module_defines_its_own_kind_set() -> None:
    found = [hit for p in sorted(PACKAGE.rglob("*.py")) if p.name != "vocabulary.py" for hit in _own_kind_sets(p)]
    assert found == [], "import these from weightdiag.vocabulary instead:\n" + "\n".join(found)


def test_the_scan_sees_a_kind_set(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        'A = ("q", "k", "v")\nB: frozenset[str] = frozenset({"gate", "up", "ffn_in[up]"})\n'
        'C = ("gate", "ffn_in")\nD = ("q", "k", "norm_x")\n'
    )
    body = ast.parse(module.read_text()).body
    assert [_kind_literal(n.value) for n in body if isinstance(n, ast.Assign | ast.AnnAssign)] == [
        ["q", "k", "v"],
        ["gate", "up", "ffn_in[up]"],
        None,  # two kinds: a local test
        None,  # not all kinds
    ]


def test_cohort_trim_is_a_fitted_trim() -> None:
    assert COHORT_TRIM in TRIMS


def test_kind_order_puts_fused_parts_after_their_parent() -> None:
    for key in KIND_ORDER:
        if "[" in key:
            parent, part = key.rstrip("]").split("[")
            assert kind_order(parent) < kind_order(key), key
            assert part in KINDS, key
    assert sorted(["ffn_in[up]", "v", "qkv[k]", "ffn_in", "qkv", "ffn_in[gate]"], key=kind_order) == [
        "qkv",
        "qkv[k]",
        "v",
        "ffn_in",
        "ffn_in[gate]",
        "ffn_in[up]",
    ]
    assert kind_order("something new") == len(KIND_ORDER)


def test_kind_order_covers_every_matrix_kind_once() -> None:
    assert len(set(KIND_ORDER)) == len(KIND_ORDER)
    assert set(MATRIX_KINDS) <= set(KIND_ORDER)
    assert KIND_ORDER[: len(BLOCK_KEYS)] == BLOCK_KEYS
    assert not {"embed", "unembed", "other"} & set(BLOCK_KEYS)


def test_classes_and_groups_agree() -> None:
    assert set(WEIGHT_KINDS) == SELECTION_KINDS | TRANSMISSION_KINDS
    assert not SELECTION_KINDS & TRANSMISSION_KINDS
    assert set(FFN_KINDS) <= TRANSMISSION_KINDS
    assert SELECTION_KINDS <= SELECTION_KEYS
    assert set(FFN_KINDS) <= FFN_KEYS
    assert {kind_class(k) for k in SELECTION_KINDS} == {"selection"}
    assert {kind_class(k) for k in TRANSMISSION_KINDS} == {"transmission"}
    assert [kind_class(k) for k in ("embed", "unembed", "other", "norm")] == ["embedding"] * 2 + ["other"] * 2
