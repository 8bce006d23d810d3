"""One module per family of quantized formats; importing this package registers every decoder."""

import numpy as np

from ...source.plan import Quantized
from ..decoder import FACTORIES, Companions, Decoder
from . import bnb, fp4, gguf, gptq, intpack, scaled  # noqa: F401  (each registers its formats)


def build_decoder(q: Quantized, companions: Companions) -> Decoder:
    """The decoder of `q`'s format over its loaded companions."""
    return FACTORIES[q.spec.format](q, companions)


def decoded_positions(q: Quantized, logical: np.ndarray) -> np.ndarray:
    """Where in `q`'s decoded order (the order its stream delivers values) the logical flat positions are."""
    return FACTORIES[q.spec.format].decoded_positions(q, logical)


def selects_any_elements(fmt: str) -> bool:
    """Whether a weight of this format can be reduced over any selection of its elements, not only whole rows."""
    factory = FACTORIES.get(fmt)
    return factory is not None and factory.any_selection


def known_formats() -> list[str]:
    return sorted(FACTORIES)
