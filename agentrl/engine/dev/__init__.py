"""The CPU engine: a transformers-backed server speaking the SGLang HTTP subset agentrl uses.

    python -m agentrl.engine.dev --model PATH --host 127.0.0.1 --port 30000 [--device cpu]

server.py (the process: scheduler, admin routes, weight updates), batch.py (requests, batching,
sampling; no HTTP), routes.py (generation, health and admin routes, the Bearer check), cache.py
(the prefix cache), lora.py (LoRA adapters). Nothing outside agentrl/engine/ imports these: a run
starts the server as a process (agentrl.engine.launch_fleet).
"""
