"""The quantized-weight records, defined with the tensor table they belong to (source.plan)."""

from ..source.plan import Quantized, QuantSpec

__all__ = ["QuantSpec", "Quantized"]
