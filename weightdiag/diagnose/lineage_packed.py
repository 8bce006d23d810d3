"""A row's lineage fingerprint packed for the database's index (docs/lineage.md, "Speed"): everything judging
needs of a reference row, in a few tens of kilobytes of binary, so that `lineage` against thousands of rows
parses no row JSON and ranks no samples.

The blob: a magic line, the length and bytes of a JSON header (k, the number of layers, each matrix record's
name, shape, kind, block, expert and dtype, and the sampled matrices by record index and size), then the records'
position-free statistics as they are compared (_role_stats: float64), the samples' scales (float64, as the row
states them), their float16 values and their ranks (ties averaged, times two: uint16). Decoded, the values and
ranks are bit for bit those the row gives (record.lineage.read_fingerprint, scipy's rankdata). Then the pair
cosines' one-byte ranks (reduce/pairs.py; the header names the matrices that have them, by record index and
count): twice the ranks record.lineage.read_pairs gives, as the row stores them. Rows of one architecture share
their header: it is parsed once per command (Layout).
"""

from __future__ import annotations

import base64
import json
import struct
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.stats import rankdata

from ..record.lineage import read_fingerprint, read_pairs
from .lineage import Fingerprint, _key, _role_stats, pair_groups

MAGIC = b"weightdiag.lineage-packed/2\n"  # /2: the pair cosines' ranks
_LEN = struct.Struct("<I")


def pack(row: Mapping[str, Any]) -> bytes:
    """The row's packed fingerprint; b"" when it has none (a row written before issue 39, a cohort summary)."""
    if (row.get("model") or {}).get("source") == "cohort":
        return b""
    samples = read_fingerprint(row)
    if samples is None:
        return b""
    records = {m["name"]: m for m in row.get("matrices", [])}  # as Fingerprint.of: a repeated name, the last
    blocks = [m.get("block") for m in records.values() if m.get("block") is not None]
    where = {name: i for i, name in enumerate(records)}
    sampled = [(name, v) for name, v in samples.items() if name in records]  # the others are never compared
    paired = [name for name in read_pairs(row) if name in records]
    pair_bytes = [_pair_bytes(row, name) for name in paired]
    header = {
        "k": int((row.get("lineage") or {}).get("k", 0)),
        "blocks": (max(blocks) + 1) if blocks else None,
        "records": [
            [name, list(rec.get("shape", ())), rec.get("kind"), rec.get("block"), rec.get("expert"), rec.get("dtype")]
            for name, rec in records.items()
        ],
        "sampled": [[where[name], int(v.size)] for name, v in sampled],
        "paired": [[where[name], int(b.size)] for name, b in zip(paired, pair_bytes, strict=True)],
    }
    text = json.dumps(header, separators=(",", ":")).encode("utf-8", "surrogatepass")
    _, role_values = _role_stats(records)
    scales = np.array([_scale(row, name) for name, _ in sampled], dtype="<f8")
    stored = [sampled[i] for i in _stored_order([(tuple(records[n]["shape"]), v.size) for n, v in sampled])]
    values = np.concatenate([_halves(row, name) for name, _ in stored]) if stored else np.zeros(0, "<f2")
    ranks = [rankdata(v) * 2 for _, v in stored]  # average ranks are halves: twice them are integers <= 512
    doubled = np.concatenate(ranks).astype("<u2") if ranks else np.zeros(0, "<u2")
    body = [role_values.astype("<f8").tobytes(), scales.tobytes(), values.astype("<f2").tobytes(), doubled.tobytes()]
    body += [b.tobytes() for b in pair_bytes]
    return MAGIC + _LEN.pack(len(text)) + text + b"".join(body)


def _stored_order(keys: list[tuple[tuple[int, ...], int]]) -> list[int]:
    """The sampled matrices in the order their samples are stored: by stack (shape and samples, in order of
    first appearance), in the row's order within one, so that a stack's samples are one block of the blob."""
    first: dict[tuple[tuple[int, ...], int], int] = {}
    for key in keys:
        first.setdefault(key, len(first))
    return sorted(range(len(keys)), key=lambda i: (first[keys[i]], i))


def _scale(row: Mapping[str, Any], name: str) -> float:
    return float(row["lineage"]["matrices"][name]["scale"])


def _pair_bytes(row: Mapping[str, Any], name: str) -> np.ndarray:
    """The matrix's pair-cosine ranks as stored (twice read_pairs' ranks: uint8)."""
    return np.frombuffer(base64.b64decode(row["lineage"]["matrices"][name]["pairs"]), dtype=np.uint8)


def _halves(row: Mapping[str, Any], name: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(row["lineage"]["matrices"][name]["values"]), dtype="<f2")


@dataclass
class Layout:
    """What rows of one header share: their matrices, the groups judging compares, and a Fingerprint of their
    records alone (no samples) for what judging says of the relation (shapes, dtypes, layers)."""

    names: list[str]  # the sampled matrices, in the row's order
    sizes: list[int]
    offsets: list[int]  # of each sampled matrix's samples in the blob's (stored by stack: _stored_order)
    total: int
    records: dict[str, Mapping[str, Any]]
    role_keys: list[tuple[Any, ...]]
    # per (shape, samples): indices into `names` (in order), as Fingerprint.stacks
    stacks: dict[tuple[tuple[int, ...], int], list[int]] = field(default_factory=dict)
    groups: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # per _key: indices into `names`
    shell: Fingerprint | None = None
    pair_names: list[str] = field(default_factory=list)  # the matrices with pair cosines, in the row's order
    pair_offsets: list[int] = field(default_factory=list)  # of each one's ranks in the blob's pair section
    pair_total: int = 0
    # per (shape, side, pairs), as Fingerprint.pair_stacks: the names and their ranks' columns in the pair section
    pair_stacks: dict[tuple[tuple[int, ...], int, int], tuple[list[str], np.ndarray]] = field(default_factory=dict)

    @property
    def n_records(self) -> int:
        return len(self.records)


@lru_cache(maxsize=64)
def layout_of(header: bytes) -> Layout:
    """The Layout of a packed header (parsed once per distinct header)."""
    doc = json.loads(header.decode("utf-8", "surrogatepass"))
    records: dict[str, Mapping[str, Any]] = {}
    for name, shape, kind, block, expert, dtype in doc["records"]:
        records[name] = {
            "name": name,
            "shape": list(shape),
            "kind": kind,
            "block": block,
            "expert": expert,
            "dtype": dtype,
        }
    order = list(records)
    names = [order[i] for i, _ in doc["sampled"]]
    sizes = [int(n) for _, n in doc["sampled"]]
    offsets = [0] * len(names)
    at = 0
    for i in _stored_order([(tuple(records[n]["shape"]), size) for n, size in zip(names, sizes, strict=True)]):
        offsets[i] = at
        at += sizes[i]
    keys, _ = _role_stats(records)
    out = Layout(names, sizes, offsets, at, records, keys)
    stacks: dict[tuple[tuple[int, ...], int], list[int]] = defaultdict(list)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, name in enumerate(names):
        stacks[(tuple(records[name]["shape"]), sizes[i])].append(i)
        groups[_key(records[name]["shape"])].append(i)
    out.stacks, out.groups = dict(stacks), dict(groups)
    out.shell = Fingerprint({}, records, int(doc["k"]), doc["blocks"])
    sizes_of: dict[str, int] = {}
    for i, size in doc.get("paired", []):
        out.pair_names.append(order[i])
        out.pair_offsets.append(out.pair_total)
        sizes_of[order[i]] = int(size)
        out.pair_total += int(size)
    offset_of = dict(zip(out.pair_names, out.pair_offsets, strict=True))
    for pkey, group in pair_groups(records, sizes_of).items():
        columns = np.concatenate([np.arange(offset_of[n], offset_of[n] + pkey[2]) for n in group])
        out.pair_stacks[pkey] = (group, columns)
    return out


def _header(blob: bytes) -> tuple[Layout, int]:
    if not blob.startswith(MAGIC):
        raise ValueError("not a packed lineage fingerprint")
    start = len(MAGIC) + _LEN.size
    (length,) = _LEN.unpack_from(blob, len(MAGIC))
    return layout_of(bytes(blob[start : start + length])), start + length


def layout_in(blob: bytes) -> Layout:
    """The Layout of a packed fingerprint (its header only)."""
    return _header(blob)[0]


def unpack(blobs: list[bytes]) -> Packed:
    """Packed fingerprints of one layout, side by side (rows: the blobs)."""
    layout, at = _header(blobs[0])
    n, s, t = layout.n_records, len(layout.names), layout.total
    size = at + n * 32 + s * 8 + t * 4 + layout.pair_total
    if any(len(blob) != size or not blob.startswith(blobs[0][:at]) for blob in blobs):
        raise ValueError("packed lineage fingerprints of different layouts")
    whole = np.frombuffer(b"".join(blobs), np.uint8).reshape(len(blobs), size)
    role = whole[:, at : at + n * 32].view("<f8").reshape(len(blobs), n, 4)
    scales = whole[:, at + n * 32 : at + n * 32 + s * 8].view("<f8")
    halves = whole[:, at + n * 32 + s * 8 : at + n * 32 + s * 8 + t * 2].view("<f2")
    doubled = whole[:, at + n * 32 + s * 8 + t * 2 : at + n * 32 + s * 8 + t * 4].view("<u2")
    pairs = whole[:, at + n * 32 + s * 8 + t * 4 :]
    return Packed(layout, role, scales, halves, doubled, pairs)


@dataclass
class Packed:
    """Rows of one layout: their role values (rows x records x 4), the samples' scales (rows x sampled matrices),
    float16 values and doubled ranks (rows x samples, the matrices' concatenated), and the pair cosines' doubled
    ranks (rows x pair cosines: uint8)."""

    layout: Layout
    roles: np.ndarray
    scales: np.ndarray
    halves: np.ndarray
    doubled: np.ndarray
    pairs: np.ndarray

    def values(self, matrix: int, samples: np.ndarray) -> np.ndarray:
        """float64 values (as read_fingerprint gives them) of each row's sampled matrix `matrix` at the sample
        indices `samples`: (rows x samples)."""
        start = self.layout.offsets[matrix]
        return self.halves[:, start + samples].astype(np.float64) * self.scales[:, matrix : matrix + 1]

    def stack_values(self, key: tuple[tuple[int, ...], int], chosen: np.ndarray) -> np.ndarray:
        """float64 values of the stack `key`'s matrix chosen[row, i] (an index into the stack) of each row:
        (rows x len(i) x samples)."""
        rows = np.arange(chosen.shape[0])[:, None]
        picked = self._block(self.halves, key)[rows, chosen].astype(np.float64)  # whole rows of samples: fast
        return picked * self.scales[:, self.layout.stacks[key]][rows, chosen][..., None]

    def stack_doubled(self, key: tuple[tuple[int, ...], int]) -> np.ndarray:
        """The stack `key`'s doubled ranks (rows x its matrices x samples; a view)."""
        return self._block(self.doubled, key)

    def _block(self, data: np.ndarray, key: tuple[tuple[int, ...], int]) -> np.ndarray:
        members = self.layout.stacks[key]
        start = self.layout.offsets[members[0]]
        return data[:, start : start + len(members) * key[1]].reshape(data.shape[0], len(members), key[1])
