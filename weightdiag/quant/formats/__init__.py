"""One module per family of quantized formats; importing this package registers every decoder."""

from . import bnb, fp4, gptq, intpack, scaled  # noqa: F401
