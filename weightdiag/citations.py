"""The sources weightdiag's cuts come from, cited by title (and author where the source names one).

User-facing text names these, never the project's internal file numbers: a user has no seed files.
The layer-wise std manual and the norm article name no author.
"""

from __future__ import annotations

WEIBULL_PAPER = (
    'T. Ding, "A Two-Parameter Weibull Framework for Diagnosing Transformer Weight Distributions" '
    "(arXiv:2605.18898, 2026)"
)
CURSE_OF_DEPTH = 'W. Sun, X. Song, P. Li et al., "The Curse of Depth in Large Language Models" (arXiv:2502.05795, 2025)'
LAYERWISE_STD_MANUAL = '"Layer-wise Weight Standard Deviation Reference Manual"'
NORM_ARTICLE = '"Why √d_model Is Your North Star" (norm-weight article)'
MASSIVE_ACTIVATIONS = (
    'M. Sun, X. Chen, J. Z. Kolter and Z. Liu, "Massive Activations in Large Language Models" (arXiv:2402.17762, 2024)'
)

# Short forms (the title) for tables, plot titles and one-line reasons.
NORM_ARTICLE_SHORT = "“Why √d_model Is Your North Star”"
LAYERWISE_STD_SHORT = "the Layer-wise Weight Std Reference Manual"
CURSE_OF_DEPTH_SHORT = "“The Curse of Depth in LLMs” (Sun et al. 2025)"
