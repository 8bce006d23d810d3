"""Turning rows and diagnoses into terminal tables, plots and HTML."""
