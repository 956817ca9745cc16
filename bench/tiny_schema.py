"""Does a tiny model call the tools its prompt lists, by names it never saw?

    python bench/tiny_schema.py [--model DIR ...] [--samples 8] [--device cpu]

Envs shaped as users write them, with tool and argument names from
`agentrl.assets.toolbox.HELD_OUT_NAMES` (never in the warm-up data): the README's AddEnv renamed,
and a two-tool converter (pick the right one by its description). For each model (the shipped
`builtin:tiny` first, as the reference, then each --model), the first turn is sampled at
temperature 1 and parsed with the rollout's hermes parser. Printed per model and env: the share of
turns that make a call at all, that call the right tool by name, and whose arguments are the right
names with the right values; then each rate's ratio against the shipped model's.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, create_model

from agentrl.assets.toolbox import tool_schema
from agentrl.config import ModelConfig
from agentrl.parsers import get_parser
from agentrl.render import Renderer
from agentrl.types import Message


@dataclass
class Case:
    system: str
    tools: list[tuple[str, str, tuple[str, ...], type]]  # name, description, args, arg type
    prompt: str
    target: str
    values: tuple


def add_cases(n: int, rng: random.Random) -> list[Case]:
    names = [("tally_pair", ("first_amount", "second_amount")), ("blend_totals", ("augend", "addend")),
             ("combine_qty", ("lhs_value", "rhs_value")), ("plus_two", ("quantity", "amount"))]  # fmt: skip
    out = []
    for i in range(n):
        name, args = names[i % len(names)]
        a = rng.randint(0, 99)
        b = a + 1 if i % 2 else rng.randint(0, 99)
        system = (f"Use the {name} tool, then reply with the number only." if i % 3 else
                  "Use the tools to answer. Reply with the result only.")  # fmt: skip
        out.append(Case(system, [(name, "Add two integers.", args, int)], f"What is {a} + {b}?",
                        name, (a, b)))  # fmt: skip
    return out


def convert_cases(n: int, rng: random.Random) -> list[Case]:
    heat = ("heat_scale", "Convert Celsius to Fahrenheit.", ("measure",), float)
    dist = ("convert_it", "Convert kilometers to miles.", ("quantity",), float)
    out = []
    for i in range(n):
        tools = [heat, dist] if i % 2 else [dist, heat]
        if i % 4 < 2:
            x = rng.randint(-40, 100)
            out.append(Case("Use the tools to answer. Reply with the result only.", tools,
                            f"Convert {x} C to Fahrenheit.", "heat_scale", (x,)))  # fmt: skip
        else:
            x = rng.randint(1, 500)
            out.append(Case("Use the tools to answer. Reply with the result only.", tools,
                            f"Convert {x} km to miles.", "convert_it", (x,)))  # fmt: skip
    return out


def _args_model(args: tuple[str, ...], typ: type) -> type[BaseModel]:
    return create_model("Args", **{a: (typ, Field(...)) for a in args})  # type: ignore[call-overload]


def score(model_dir: Path, cases: list[Case], samples: int, device: str, seed: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).to(device).eval()
    parser = get_parser("hermes")
    rng = random.Random(seed)
    called = right_name = right_args = 0
    torch.manual_seed(seed)
    for case in cases:
        schemas = [tool_schema(n, d, a, t, rng) for n, d, a, t in case.tools]
        r = Renderer(tok, schemas)
        msgs = [
            Message(role="system", content=case.system),
            Message(role="user", content=case.prompt),
        ]
        ids = torch.tensor([r.encode(r.render(msgs, add_generation_prompt=True))] * samples,
                           device=device)  # fmt: skip
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=64,
                                 pad_token_id=tok.pad_token_id)  # fmt: skip
        models = {n: _args_model(a, t) for n, _, a, t in case.tools}
        target = next(t for t in case.tools if t[0] == case.target)
        for row in out[:, ids.shape[1] :].tolist():
            text = r.assistant_text(row)
            res = parser.parse(text)
            if not res.tool_calls and not any(e.is_call_error for e in res.errors):
                continue
            called += 1
            if not res.tool_calls or res.tool_calls[0].name != case.target:
                continue
            right_name += 1
            try:
                got = models[case.target].model_validate(res.tool_calls[0].arguments)
            except ValueError:
                continue
            want = dict(zip(target[2], case.values, strict=True))
            right_args += got.model_dump() == {k: target[3](v) for k, v in want.items()}
    n = len(cases) * samples
    return {"call": called / n, "right_name": right_name / n, "right_args": right_args / n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[], help="a model dir to compare")
    p.add_argument("--cases", type=int, default=32, help="prompts per env")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    models = [("shipped", ModelConfig().resolve())] + [(m, Path(m)) for m in a.model]
    envs = {"add (renamed)": add_cases(a.cases, random.Random(a.seed)),
            "convert (2 tools)": convert_cases(a.cases, random.Random(a.seed + 1))}  # fmt: skip
    ref: dict[str, dict[str, Any]] = {}
    for label, path in models:
        for env, cases in envs.items():
            got = score(path, cases, a.samples, a.device, a.seed)
            ref.setdefault(env, got)
            ratio = "  ".join(
                f"{k} x{got[k] / ref[env][k]:.2f}" if ref[env][k] else f"{k} (ref 0)" for k in got
            )
            rates = "  ".join(f"{k} {v:.3f}" for k, v in got.items())
            print(f"{label:>10} | {env:<18} | {rates} | vs shipped: {ratio}")


if __name__ == "__main__":
    main()
