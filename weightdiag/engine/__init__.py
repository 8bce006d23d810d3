"""The numeric engine: bytes in, exact per-tensor summaries and Weibull fits out.

codes (code -> value and bin tables), kernels (the C / numpy hot loops), reduce and reduce_torch
(one tensor's exact summary on the CPU or with torch), stream (the chunked, parallel reading of a
whole model), fit (the probability-plot fits), stats (statistics of one summary), device (where
reductions run). Nothing here knows about rows, the database or the command line.
"""
