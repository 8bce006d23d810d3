"""Stage 6, database: rows in the database folder, written atomically, listed and found by model and revision."""
