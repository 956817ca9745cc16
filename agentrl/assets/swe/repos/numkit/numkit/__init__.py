"""numkit: small number helpers."""
