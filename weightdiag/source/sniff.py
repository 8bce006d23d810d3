"""What a checkpoint file is by its first bytes, whatever its name says: a GGUF file named `.safetensors` is no
damaged safetensors file to download again, it wants its own suffix (issue 42). Only the format is named, never
the bytes (the file may be anything the user pointed at)."""

from __future__ import annotations

HEAD_BYTES = 9  # enough for every format below


def format_of(head: bytes) -> tuple[str, str] | None:
    """(what the file is, the suffix that reads it) by its first HEAD_BYTES bytes, or None when they say nothing."""
    if head[:4] == b"GGUF":
        return "a GGUF file", ".gguf"
    if head[:4] == b"PK\x03\x04":
        return "a zip archive (a PyTorch checkpoint saved by torch.save)", ".bin"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a pickle (a legacy PyTorch checkpoint)", ".bin"
    if len(head) >= HEAD_BYTES and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100 * 1024 * 1024:
        return "a safetensors file", ".safetensors"
    return None


def misnamed(head: bytes, expected: str) -> str | None:
    """What to say of a file whose first bytes name another format than its reader's (`expected`, its suffix),
    else None: "by its first bytes it is a GGUF file; give it the suffix .gguf, which weightdiag reads as one"."""
    found = format_of(head)
    if found is None or found[1] == expected:
        return None
    what, suffix = found
    return f"by its first bytes it is {what}; give it the suffix {suffix}, which weightdiag reads as one"
