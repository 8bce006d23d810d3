"""What a job tells whoever watches it, as it goes: one typed protocol for every job and every watcher.

A fit, a sweep's fits and a diff call these methods on the `Progress` they are given (the command line's bar
in render/tables.py, a notebook's own, a test's recorder); `Silent` says nothing and is the base to override
only what one watches. The job calls them from the thread that merges results (never from workers), in this
order: `started`, then `read` and `measured` as tensors are folded (`node_done` as cluster tasks are handed
back), then, with `fit --spectrum`, `spectra_started` and one `spectrum_taken` per matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class Progress(Protocol):
    """A job's progress, as it goes (see the module docstring)."""

    def started(self, model: str, tensors: int, nbytes: int) -> None:
        """A pass over `model` begins: `tensors` to measure, `nbytes` of them to read."""
        ...

    def read(self, nbytes: int) -> None:
        """`nbytes` more of the tensors' bytes were read and reduced."""
        ...

    def measured(self, tensor: str) -> None:
        """One tensor (or, in a diff, one pair of tensors) is done."""
        ...

    def node_done(self, node: str, nbytes: int, spectrum: bool) -> None:
        """A task of a Ray cluster's `node` was handed back, having read `nbytes` (`spectrum`: of the spectrum pass)."""
        ...

    def spectra_started(self, matrices: int, flops: float) -> None:
        """The spectrum pass begins: `matrices` spectra to take, about `flops` of work."""
        ...

    def spectrum_taken(self, flops: float) -> None:
        """One matrix's spectrum is taken (or found impossible): `flops` of the work done."""
        ...


class Silent:
    """A Progress that says nothing; subclass it and override what you watch."""

    def started(self, model: str, tensors: int, nbytes: int) -> None:
        return None

    def read(self, nbytes: int) -> None:
        return None

    def measured(self, tensor: str) -> None:
        return None

    def node_done(self, node: str, nbytes: int, spectrum: bool) -> None:
        return None

    def spectra_started(self, matrices: int, flops: float) -> None:
        return None

    def spectrum_taken(self, flops: float) -> None:
        return None


SILENT = Silent()


class Relay:
    """A Progress that hands every call on to `inner`: subclass it and override what to add or change."""

    def __init__(self, inner: Progress) -> None:
        self.inner = inner

    def started(self, model: str, tensors: int, nbytes: int) -> None:
        self.inner.started(model, tensors, nbytes)

    def read(self, nbytes: int) -> None:
        self.inner.read(nbytes)

    def measured(self, tensor: str) -> None:
        self.inner.measured(tensor)

    def node_done(self, node: str, nbytes: int, spectrum: bool) -> None:
        self.inner.node_done(node, nbytes, spectrum)

    def spectra_started(self, matrices: int, flops: float) -> None:
        self.inner.spectra_started(matrices, flops)

    def spectrum_taken(self, flops: float) -> None:
        self.inner.spectrum_taken(flops)


@dataclass
class Events(Silent):
    """Every call, recorded in order as (method name, its arguments): for tests and notebooks."""

    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)

    def started(self, model: str, tensors: int, nbytes: int) -> None:
        self.calls.append(("started", (model, tensors, nbytes)))

    def read(self, nbytes: int) -> None:
        self.calls.append(("read", (nbytes,)))

    def measured(self, tensor: str) -> None:
        self.calls.append(("measured", (tensor,)))

    def node_done(self, node: str, nbytes: int, spectrum: bool) -> None:
        self.calls.append(("node_done", (node, nbytes, spectrum)))

    def spectra_started(self, matrices: int, flops: float) -> None:
        self.calls.append(("spectra_started", (matrices, flops)))

    def spectrum_taken(self, flops: float) -> None:
        self.calls.append(("spectrum_taken", (flops,)))

    def of(self, name: str) -> list[tuple[Any, ...]]:
        """The arguments of every call of `name`, in order."""
        return [args for called, args in self.calls if called == name]
