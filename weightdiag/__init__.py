"""weightdiag: diagnose trained transformer checkpoints from their weights alone."""

from __future__ import annotations

__version__ = "0.1.0"
