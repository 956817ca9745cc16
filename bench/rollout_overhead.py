"""The rollout client's own CPU work per assistant turn, without any engine: render the prompt,
decode the sampled ids, parse tool calls, render the observation delta (agentrl.render,
agentrl.parsers), against the reference of one plain `tokenizer.encode` of the same prompt text.

    python bench/rollout_overhead.py [--prompt-words 128] [--new-tokens 128] [--repeats 200]

Prints milliseconds per call of each part, their sum per turn, and the ratio turn / encode.
"""

from __future__ import annotations

import argparse
import random
import time


def per_call(fn, repeats: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompt-words", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=200)
    a = p.parse_args()

    from transformers import AutoTokenizer

    from agentrl.assets.build import cached_tokenizer
    from agentrl.parsers import get_parser
    from agentrl.render import Renderer
    from agentrl.types import Message

    tok = AutoTokenizer.from_pretrained(cached_tokenizer("qwen"))
    r, parser = Renderer(tok, []), get_parser("hermes")
    text = " ".join(["alpha"] * a.prompt_words)
    msgs = [Message(role="user", content=text)]
    sampled = [random.Random(0).randint(0, 150000) for _ in range(a.new_tokens)]
    said = r.assistant_text(sampled)
    obs = [Message(role="tool", content="ok", name="noop")]
    parts = {
        "prompt_ids": per_call(lambda: r.prompt_ids(msgs), a.repeats),
        "assistant_text": per_call(lambda: r.assistant_text(sampled), a.repeats),
        "parse": per_call(lambda: parser.parse(said, {}, truncated=False), a.repeats),
        "observation_ids": per_call(lambda: r.observation_ids(obs, sampled), a.repeats),
    }
    encode = per_call(lambda: tok.encode(text), a.repeats)
    for k, v in parts.items():
        print(f"{k:<16} {v:7.3f} ms")
    turn = sum(parts.values())
    print(f"per turn {turn:.3f} ms; plain encode {encode:.3f} ms; ratio {turn / encode:.1f}")


if __name__ == "__main__":
    main()
