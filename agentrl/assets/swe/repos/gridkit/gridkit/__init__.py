"""gridkit: small helpers for grids (lists of rows)."""
