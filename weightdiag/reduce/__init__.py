"""Stage 3, reduce: a model's bytes (decoded where they are quantized) -> exact per-tensor summaries.

stream (the chunk engine: chunks read several at once, each reduced as it lands, partial results
merged per tensor in a fixed order), reduction and reduction_torch (one piece's exact summary on the
CPU or with torch), vectors (1-D tensors summarised piece by piece). Nothing here knows about fits, rows
or the command line.
"""
