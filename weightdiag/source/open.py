"""Which source a model spec names: a local path first, else a Hub repo id ORG/NAME[@REVISION]."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import HubUnreachableError, ModelPathError, NotCachedError, OptionError, param
from .plan import ModelPlan
from .reader import Reader

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?(@[^\s]+)?$")
# A name ending like a weights or config file names a file, never a Hub repo (repo ids have no such suffix
# in practice): a missing `model.safetensors` is a mistyped path, answered at once, not a 16 s Hub lookup.
FILE_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".json", ".ckpt")


def is_hub_id(spec: str) -> bool:
    """ORG/NAME[@REV] (or NAME[@REV]) that is not an existing local path nor named like a file."""
    name = split_revision(spec)[0]
    if name.lower().endswith(FILE_SUFFIXES):
        return False
    return bool(_HUB_ID.match(spec)) and not Path(spec).exists() and not spec.startswith((".", "/", "~"))


def split_revision(spec: str) -> tuple[str, str | None]:
    if "@" in spec:
        repo, rev = spec.rsplit("@", 1)
        return repo, rev or None
    return spec, None


def with_revision(spec: str, revision: str | None) -> str:
    """`spec` with `--revision REV` as the one name ORG/NAME@REV that every command reads (report, check and compare
    take --revision as fit does); refused when the two name different revisions, or `spec` is a local path or a row
    file, which have no revisions."""
    if revision is None:
        return spec
    if not revision.strip() or "@" in revision:
        raise OptionError(f"{param('revision')} {revision!r}: give a branch, tag or commit", param="revision")
    if Path(spec).expanduser().exists():
        raise OptionError(
            f"{param('revision')} applies to a Hub id or a fitted model's id; {spec} is a local path", param="revision"
        )
    name, rev = split_revision(spec)
    if rev and rev != revision:
        raise OptionError(
            f"{param('revision')} {revision} and {spec} name two revisions; give one of them", param="revision"
        )
    return f"{name}@{revision}"


def open_model(
    spec: str,
    *,
    model_id: str | None = None,
    revision: str | None = None,
    token: str | None = None,
    download: bool = False,
) -> tuple[ModelPlan, Reader]:
    """Resolve a model spec to (plan, reader): local path first, else a Hub repo id."""
    if not spec.strip():  # Path("") is the current folder: an empty argument must not fit it
        raise ModelPathError(
            "empty model: give a .safetensors file, a model folder or a Hub id ORG/NAME[@REVISION]", path=spec
        )
    path = Path(spec).expanduser()
    if path.exists():
        from .local import open_local

        if revision:
            raise OptionError(f"{param('revision')} applies to Hub repos; {spec} is a local path", param="revision")
        return open_local(path, model_id)
    if is_hub_id(spec):
        from .hub import open_hub

        repo, rev = split_revision(spec)
        if revision and rev and revision != rev:
            raise OptionError(
                f"{param('revision')} {revision} and {spec} name two revisions; give one of them", param="revision"
            )
        try:
            return open_hub(repo, revision or rev, token=token, download=download, model_id=model_id)
        except (HubUnreachableError, NotCachedError) as exc:
            # Offline, a name that is no local path may just be mistyped: say both, and the nearest name here.
            nearest = _nearest_local(spec)
            if "/" not in repo or nearest:
                hint = f" (did you mean {nearest}?)" if nearest else ""
                exc.args = (f"no file or folder {spec} here{hint}, and {exc.message[0].lower()}{exc.message[1:]}",)
            raise
    if split_revision(spec)[0].lower().endswith(FILE_SUFFIXES):
        nearest = _nearest_local(spec)
        hint = f" (did you mean {nearest}?)" if nearest else ""
        raise ModelPathError(f"{spec}: no such file{hint}; check the path", path=spec)
    raise ModelPathError(f"{spec}: no such file or folder, and not a Hub id (ORG/NAME[@REVISION])", path=spec)


def _nearest_local(spec: str) -> str | None:
    """The entry of the folder `spec` names (the current one for a bare name) closest to it, if any is close."""
    import difflib

    path = Path(spec).expanduser()
    folder = path.parent if str(path.parent) not in ("", ".") else Path(".")
    try:
        names = [entry.name for entry in os.scandir(folder) if not entry.name.startswith(".")]
    except OSError:
        return None
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.75)
    return str(folder / close[0]) if close else None
