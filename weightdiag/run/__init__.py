"""Whole jobs over the stages: measure a model (measure), fit it into the database (fitting), a run's
revisions (sweep), matrices re-read for plots (histograms)."""
