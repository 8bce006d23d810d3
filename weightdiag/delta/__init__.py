"""`weightdiag diff BASE TUNED`: what fine-tuning changed, tensor by tensor, from two checkpoints streamed in
lockstep (pairing -> paired -> measures + spectrum -> findings -> result; run.py ties them together)."""

from .result import DiffOptions, DiffResult, Finding, GroupSummary, TensorDiff

__all__ = ["DiffOptions", "DiffResult", "Finding", "GroupSummary", "TensorDiff"]
