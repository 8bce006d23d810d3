"""Stage 2, decode: stored bytes plus companions (scales, zero points, group indices) -> float32 values.

group (detect a checkpoint's quantization and group each weight with its companions), loader
(companions read on demand), decoder + formats/ (one module per format family).
"""
