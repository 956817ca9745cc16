"""textkit: small string helpers."""
