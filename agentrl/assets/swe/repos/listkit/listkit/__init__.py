"""listkit: small list helpers."""
