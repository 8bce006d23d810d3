"""Stage 5, record: the row (schema, records built from fits) and the journal of a fit in progress."""
