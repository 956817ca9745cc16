"""`python -m agentrl.engine.dev`: the dev server (agentrl/engine/dev/server.py says what it does)."""

from agentrl.engine.dev.server import main

if __name__ == "__main__":
    raise SystemExit(main())
