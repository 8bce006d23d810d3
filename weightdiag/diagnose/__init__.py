"""Diagnoses built on fitted rows: classes, cohort comparison, trajectories, health checks."""
