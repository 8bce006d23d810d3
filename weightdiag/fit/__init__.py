"""Stage 4, fit: Weibull fits and statistics of one matrix, from its exact summary alone (pure numerics)."""
