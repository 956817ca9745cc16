"""convkit: small conversions."""
