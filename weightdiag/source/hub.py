"""Hugging Face Hub source (streamed ranged reads or --download)."""

from __future__ import annotations

from ..errors import HubError


def open_hub(
    repo: str,
    revision: str | None,
    *,
    token: str | None = None,
    download: bool = False,
    model_id: str | None = None,
):
    raise HubError(
        f"{repo}: Hub access is not available in this build; download the model and pass its folder"
    )
