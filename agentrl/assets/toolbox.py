"""Synthetic tool-use dialogues: the shipped tiny model's lessons in following the tools it is given.

Each example is one prompt with 1–3 tools drawn from a catalogue of small deterministic operations
(arithmetic, unit conversions, string functions, table look-ups). Descriptions vary per example (a
pool per operation); tool and argument names come from a pool per operation, or with
`open_names` > 0 that share of tools is named for the example (`open_name`, `open_arg`: invented
syllables, words and affixes), so a name is something to copy from the schema, not to recall.
The shipped model was built with pooled names only: it calls the pool's names whatever the
schema says (README: "What it can start on"); `open_names` is the way to a model that copies. The schemas are made by pydantic exactly as a
user's `Tool.Args` would be, and the system prompt asks either for the bare result or for
`<answer>RESULT</answer>`. The model learns to read the question, pick the tool whose description
fits it, copy its name and argument names from the schema and values from the question, and
reply with the tool's result in the asked format. `HELD_OUT_NAMES` never occur, so tests can
check that on names the model never saw (tests/e2e/test_learning_envs.py).

Behaviours, as in the code_exec warm-up: call the right tool with the right arguments and reply
with its result (`good`); call with a wrong value or the wrong tool and reply with that result
(`wrong_call`); reply at once with a guess (`no_tool`). RL then has a low success rate to raise.

Used only by `agentrl.assets.build_tiny`; the README's AddEnv and `envs/examples/units.py` are
instances of this catalogue's shapes, not of its exact texts.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import Field, create_model

from agentrl.types import Message, ToolCall

MODES = {"good": 0.35, "wrong_call": 0.3, "no_tool": 0.35}

BARE_PROMPTS = (
    "Use the {tool} tool, then reply with the number only.",
    "Use the {tool} tool, then reply with the result only.",
    "Use the tools to answer. Reply with the result only.",
    "You can call tools. Call the right one, then reply with its result and nothing else.",
    "Answer the question with the help of the tools. Reply with the answer only.",
    "Call a tool to get the answer, then reply with just the value.",
    None,  # no system prompt: only the tools block
)
TAG_PROMPTS = (
    "Use the tools to answer. When you know the result, reply with <answer>RESULT</answer>.",
    "Call a tool, then give the final value as <answer>VALUE</answer>.",
    "Use the {tool} tool. Reply with <answer>RESULT</answer> containing only the result.",
)

_WORDS = (
    "apple", "river", "stone", "garden", "planet", "silver", "window", "forest", "candle",
    "rocket", "pencil", "mirror", "castle", "thunder", "harbor", "violet", "marble", "falcon",
    "lemon", "engine", "bridge", "cookie", "desert", "ocean", "tiger", "spark", "cloud",
)  # fmt: skip
_ITEMS = ("apple", "bread", "cheese", "coffee", "eggs", "milk", "rice", "tea", "butter", "honey",
          "pasta", "salt", "sugar", "juice", "soap", "paper", "lamp", "chair", "book", "pen")  # fmt: skip
_CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Delhi", "Quito", "Rome", "Seoul", "Accra",
           "Dakar", "Hanoi", "Bern", "Riga", "Sofia", "Tunis", "Minsk", "Perth", "Porto", "Kyiv")  # fmt: skip


# Names no warm-up dialogue uses, as tool or argument names (`example` draws again on a clash):
# the tests' envs take theirs from here, so "the model never saw this name" holds by construction.
HELD_OUT_NAMES = frozenset({
    "tally_pair", "blend_totals", "combine_qty", "plus_two", "sum_up", "accumulate",
    "first_amount", "second_amount", "augend", "addend", "lhs_value", "rhs_value",
    "quantity", "amount", "measure", "convert_it", "heat_scale", "scale_temp",
})  # fmt: skip

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "gr",
           "st", "tr", "pl", "sk", "ch", "sh", "qu", "w", "h", "j", "c", "fl")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ou", "ea", "y")
_CODAS = ("", "", "", "n", "r", "s", "x", "l", "m", "k", "t", "nd", "st")
_AFFIXES = ("get", "calc", "do", "find", "run", "compute", "my", "fn", "tool", "op", "eval",
            "apply", "query", "lookup", "fetch", "make", "check", "to", "from", "the")  # fmt: skip
_NOUNS = ("value", "num", "number", "val", "input", "arg", "param", "x", "n", "data", "item",
          "amount", "count", "size", "key", "term", "text", "str", "in", "operand")  # fmt: skip


def _made_up(rng: random.Random) -> str:
    """A pronounceable invented word of 1–3 syllables."""
    n = rng.choice((1, 2, 2, 2, 3))
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(n))


def _word(rng: random.Random) -> str:
    return _made_up(rng) if rng.random() < 0.6 else rng.choice(_WORDS + _ITEMS).lower()


_NAME_SHAPES: tuple[Callable[[random.Random], str], ...] = (  # as users name functions
    _made_up,
    lambda r: f"{r.choice(_AFFIXES)}_{_word(r)}",
    lambda r: f"{_word(r)}_{_word(r)}",
    lambda r: f"{_word(r)}_{r.choice(_NOUNS)}",
    lambda r: r.choice(_AFFIXES) + _word(r).capitalize(),  # camelCase
    lambda r: f"{_word(r)}{r.randint(1, 99)}",
)
_ARG_SHAPES: tuple[Callable[[random.Random], str], ...] = (
    _made_up,
    lambda r: f"{_made_up(r)}_{r.choice(_NOUNS)}",
    lambda r: f"{r.choice(_NOUNS)}_{_word(r)}",
    lambda r: f"{r.choice(_NOUNS)}{r.randint(1, 9)}",
    lambda r: r.choice(string.ascii_lowercase) + r.choice(("", "", "_" + r.choice(_NOUNS))),
)


def open_name(rng: random.Random) -> str:
    """A tool name never drawn from a pool: made-up words joined as users name functions."""
    return rng.choice(_NAME_SHAPES)(rng)


def open_arg(rng: random.Random) -> str:
    """An argument name never drawn from a pool."""
    return rng.choice(_ARG_SHAPES)(rng)


def _open_args(rng: random.Random, arity: int) -> tuple[str, ...]:
    while True:
        names = tuple(open_arg(rng) for _ in range(arity))
        if len(set(names)) == arity and not set(names) & HELD_OUT_NAMES:
            return names


def _names(op: Op, rng: random.Random, open_p: float) -> tuple[str, tuple[str, ...]]:
    """(tool name, argument names) of one tool of an example: pooled or (with `open_p`) made up."""
    arity = len(op.args[0])
    if rng.random() < open_p:
        while (name := open_name(rng)) in HELD_OUT_NAMES:
            pass
        args = _open_args(rng, arity) if rng.random() < 0.8 else rng.choice(op.args)
        return name, args
    args = _open_args(rng, arity) if rng.random() < 0.3 else rng.choice(op.args)
    return rng.choice(op.names), args


def _hash_int(text: str, lo: int, hi: int) -> int:
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    return lo + h % (hi - lo + 1)


def _num(x: float) -> str:
    return f"{x:.2f}"


@dataclass(frozen=True)
class Op:
    """One operation: its tool-name pool, argument-name pool, questions and function."""

    kind: str
    names: tuple[str, ...]
    descriptions: tuple[str, ...]
    args: tuple[tuple[str, ...], ...]  # alternative argument-name tuples, all of one arity
    arg_type: type  # int, float or str
    questions: tuple[str, ...]  # templates over the argument values {0}, {1}
    fn: Callable[..., str]
    values: Callable[[random.Random], tuple]
    numeric: bool = True  # the result is a number ("reply with the number only" fits)


def _two_ints(lo: int, hi: int) -> Callable[[random.Random], tuple]:
    def draw(rng: random.Random) -> tuple:
        if rng.random() < 0.3:  # small numbers, some consecutive (as users' first envs have)
            a = rng.randint(0, 99)
            return a, a + rng.choice([1, 1, 2, rng.randint(0, 99)])
        return rng.randint(lo, hi), rng.randint(lo, hi)

    return draw


_PAIRS = (("a", "b"), ("x", "y"), ("first", "second"), ("num1", "num2"), ("left", "right"),
          ("m", "n"), ("lhs", "rhs"))  # fmt: skip

OPS: tuple[Op, ...] = (
    Op("add", ("add", "sum", "plus", "add_numbers", "addition"),
       ("Add two integers.", "Return the sum of two numbers.", "Add a and b."), _PAIRS, int,
       ("What is {0} + {1}?", "Add {0} and {1}.", "What is the sum of {0} and {1}?",
        "Compute {0} + {1}."),
       lambda a, b: str(a + b), _two_ints(0, 999)),
    Op("subtract", ("subtract", "minus", "difference", "sub"),
       ("Subtract the second integer from the first.", "Return a minus b."), _PAIRS, int,
       ("What is {0} - {1}?", "Subtract {1} from {0}.", "Compute {0} - {1}."),
       lambda a, b: str(a - b), _two_ints(0, 999)),
    Op("multiply", ("multiply", "mul", "times", "product"),
       ("Multiply two integers.", "Return the product of two numbers."), _PAIRS, int,
       ("What is {0} * {1}?", "Multiply {0} by {1}.", "What is the product of {0} and {1}?"),
       lambda a, b: str(a * b), _two_ints(2, 99)),
    Op("power", ("power", "pow", "exponent"),
       ("Raise a number to a power.", "Return base to the power exp."),
       (("base", "exp"), ("a", "b"), ("x", "n"), ("base", "exponent")), int,
       ("What is {0} to the power of {1}?", "Compute {0}**{1}.", "What is {0} raised to {1}?"),
       lambda a, b: str(a**b), lambda r: (r.randint(2, 12), r.randint(2, 9))),
    Op("mod", ("mod", "remainder", "modulo"),
       ("Remainder of a divided by b.", "Return a mod b."), _PAIRS, int,
       ("What is {0} mod {1}?", "What is the remainder of {0} divided by {1}?"),
       lambda a, b: str(a % b), lambda r: (r.randint(10, 9999), r.randint(2, 99))),
    Op("km_to_miles", ("km_to_miles", "kilometers_to_miles", "convert_km"),
       ("Convert kilometers to miles.", "Kilometers to miles, two decimals."),
       (("km",), ("kilometers",), ("value",), ("distance",)), float,
       ("Convert {0} km to miles.", "How many miles is {0} km?", "What is {0} kilometers in miles?"),
       lambda x: _num(x * 0.621371), lambda r: (r.randint(1, 500),)),
    Op("miles_to_km", ("miles_to_km", "miles_to_kilometers", "convert_miles"),
       ("Convert miles to kilometers.", "Miles to kilometers, two decimals."),
       (("miles",), ("value",), ("distance",)), float,
       ("Convert {0} miles to km.", "How many km is {0} miles?", "What is {0} miles in kilometers?"),
       lambda x: _num(x * 1.609344), lambda r: (r.randint(1, 500),)),
    Op("kg_to_pounds", ("kg_to_pounds", "kilograms_to_pounds", "kg_to_lb"),
       ("Convert kilograms to pounds.", "Kilograms to pounds, two decimals."),
       (("kg",), ("kilograms",), ("value",), ("weight",)), float,
       ("Convert {0} kg to pounds.", "How many pounds is {0} kg?", "What is {0} kg in pounds?"),
       lambda x: _num(x * 2.20462), lambda r: (r.randint(1, 300),)),
    Op("c_to_f", ("celsius_to_fahrenheit", "c_to_f", "to_fahrenheit"),
       ("Convert Celsius to Fahrenheit.", "Degrees Celsius to Fahrenheit."),
       (("celsius",), ("c",), ("value",), ("temp",)), float,
       ("Convert {0} C to Fahrenheit.", "What is {0} degrees Celsius in Fahrenheit?"),
       lambda x: _num(x * 9 / 5 + 32), lambda r: (r.randint(-40, 100),)),
    Op("reverse", ("reverse", "reverse_text", "flip"),
       ("Reverse a string.", "Return the text backwards."),
       (("text",), ("word",), ("s",), ("value",)), str,
       ("Reverse the word {0}.", "What is {0} spelled backwards?", "Write {0} in reverse."),
       lambda s: s[::-1], lambda r: (r.choice(_WORDS),), numeric=False),
    Op("length", ("length", "count_letters", "strlen", "word_length"),
       ("Count the letters of a word.", "Return the length of a string."),
       (("text",), ("word",), ("s",)), str,
       ("How many letters are in {0}?", "What is the length of the word {0}?"),
       lambda s: str(len(s)), lambda r: (r.choice(_WORDS) * r.choice([1, 1, 2]),)),
    Op("price", ("get_price", "price_of", "lookup_price"),
       ("Look up the price of an item in cents.", "Price of an item (cents)."),
       (("item",), ("name",), ("product",)), str,
       ("What is the price of {0}?", "How much does {0} cost in cents?"),
       lambda s: str(_hash_int("price:" + s, 50, 2000)), lambda r: (r.choice(_ITEMS),)),
    Op("weather", ("get_temperature", "temperature", "weather"),
       ("Current temperature of a city in Celsius.", "Look up a city's temperature."),
       (("city",), ("location",), ("place",)), str,
       ("What is the temperature in {0}?", "How warm is it in {0} right now?"),
       lambda s: str(_hash_int("temp:" + s, -10, 38)), lambda r: (r.choice(_CITIES),)),
)  # fmt: skip


def tool_schema(name: str, description: str, arg_names: tuple[str, ...], arg_type: type,
                rng: random.Random) -> dict[str, Any]:  # fmt: skip
    """The schema a user's pydantic `Tool.Args` would render (agentrl.tool.Tool.schema)."""
    described = rng.random() < 0.3
    fields = {
        a: (arg_type, Field(description=f"the {a.replace('_', ' ')}") if described else ...)
        for a in arg_names
    }
    params = create_model("Args", **fields).model_json_schema()  # type: ignore[call-overload]
    params.pop("title", None)
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": params}}  # fmt: skip


@dataclass
class Example:
    """One warm-up dialogue: system prompt, tools, task prompt and the assistant turns (each with
    the observations that answer it)."""

    system: str | None
    tools: list[dict[str, Any]]
    prompt: str
    answer: str
    turns: list[tuple[Message, list[Message]]]


def _wrong_value(v: Any, rng: random.Random) -> Any:
    if isinstance(v, str):
        i = rng.randrange(len(v))
        return v[:i] + v[i + 1 :] if len(v) > 2 else v + v[-1]
    delta = rng.randint(1, 9)
    return v - delta if v - delta >= 0 or v < 0 and rng.random() < 0.5 else v + delta


def _guess(answer: str, rng: random.Random) -> str:
    """A wrong answer of the right shape."""
    if not any(c.isdigit() for c in answer):
        letters = list(answer)
        rng.shuffle(letters)
        g = "".join(letters)
        return g if g != answer else answer + rng.choice(string.ascii_lowercase)
    out = "".join(rng.choice("0123456789") if c.isdigit() else c for c in answer)
    if out.lstrip("-").startswith("0") and len(out.lstrip("-")) > 1 and "." not in out:
        out = out.replace("0", "1", 1)
    return out if out != answer else _guess(answer, rng)


def _json_value(v: Any, arg_type: type) -> Any:
    return float(v) if arg_type is float and not isinstance(v, int) else v


def _offered(rng: random.Random, open_names: float) -> tuple[Op, list[tuple]]:
    """The task's op and the tools the prompt offers, shuffled: (op, name, description, argument
    names) for the op and one or two others of other kinds, their names distinct."""
    op = rng.choice(OPS)
    k = rng.choice([1, 1, 2, 2, 3])
    others = rng.sample([o for o in OPS if o.kind != op.kind], k - 1)
    if open_names <= 0:  # pooled names only (the shipped model's build draws exactly these)
        chosen = [(o, rng.choice(o.names), rng.choice(o.descriptions), rng.choice(o.args))
                  for o in [op, *others]]  # fmt: skip
    else:
        chosen = []
        for o in [op, *others]:
            name, args = _names(o, rng, open_names)
            while name in {c[1] for c in chosen}:
                name, args = _names(o, rng, open_names)
            chosen.append((o, name, rng.choice(o.descriptions), args))
    rng.shuffle(chosen)
    return op, chosen


def _call(
    chosen: list[tuple], target: tuple, values: tuple, mode: str, rng: random.Random
) -> tuple[ToolCall, str]:
    """The call the assistant makes and what the tool answers: the target tool with the task's
    values (`good`), or under `wrong_call` a same-shaped other tool or one wrong value."""
    op, name, _, arg_names = target
    call_name, call_args, call_op = name, arg_names, op
    call_values = values
    if mode == "wrong_call":
        twins = [c for c in chosen if c[0] is not op and len(c[3]) == len(arg_names)
                 and c[0].arg_type is op.arg_type]  # fmt: skip
        if twins and rng.random() < 0.5:
            call_op, call_name, _, call_args = rng.choice(twins)
        else:
            i = rng.randrange(len(values))
            call_values = tuple(_wrong_value(v, rng) if j == i else v for j, v in enumerate(values))
    try:
        out = call_op.fn(*call_values)
    except (ValueError, ZeroDivisionError, OverflowError):
        out = ""
    if not out or len(out) > 16:  # the wrong tool blew up on these values: a wrong value instead
        call_op, call_name, call_args = op, name, arg_names
        call_values = (_wrong_value(values[0], rng), *values[1:])
        out = op.fn(*call_values)
    arguments = {
        a: _json_value(v, call_op.arg_type) for a, v in zip(call_args, call_values, strict=True)
    }
    return ToolCall(id="call_0", name=call_name, arguments=arguments), out


def example(rng: random.Random, mode: str, open_names: float = 0.0) -> Example:
    op, chosen = _offered(rng, open_names)
    tools = [tool_schema(n, d, a, o.arg_type, rng) for o, n, d, a in chosen]
    target = next(c for c in chosen if c[0] is op)
    name = target[1]
    values = op.values(rng)
    question = rng.choice(op.questions).format(*values)
    right = op.fn(*values)

    tag = rng.random() < 0.35
    prompts = TAG_PROMPTS if tag else BARE_PROMPTS
    if not op.numeric:
        prompts = tuple(p for p in prompts if p is None or "number" not in p)
    system = rng.choice(prompts)
    if system is not None:
        system = system.format(tool=name)

    def reply(text: str) -> Message:
        return Message(role="assistant", content=f"<answer>{text}</answer>" if tag else text)

    if mode == "no_tool":
        return Example(system, tools, question, right, [(reply(_guess(right, rng)), [])])
    call, out = _call(chosen, target, values, mode, rng)
    return Example(
        system,
        tools,
        question,
        right,
        [
            (
                Message(role="assistant", content="", tool_calls=[call]),
                [Message(role="tool", content=out, tool_call_id="call_0", name=call.name)],
            ),
            (reply(out), []),
        ],
    )


def examples(n: int, seed: int, open_names: float = 0.0) -> list[Example]:
    rng = random.Random(seed)
    names, weights = list(MODES), list(MODES.values())
    return [example(rng, rng.choices(names, weights)[0], open_names) for _ in range(n)]
