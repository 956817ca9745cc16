"""Small example environments, each a complete file to copy from (see the README)."""
