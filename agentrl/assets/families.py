"""The model families agentrl's rollouts are checked against: each family's chat template, the
tool-call parser that reads it, and an offline tokenizer carrying the family's markup tokens.

The templates are the real ones shipped in the `trl` package (`trl/chat_templates/*.jinja`, read
from the installed package, never copied) where trl has them, else written for agentrl from the
family's documented format (`agentrl/assets/templates/`). The tokenizers are the real Qwen BPE
(`cached_tokenizer`) with the family's markup added as special tokens, so a template renders and
tokenizes as it does for the real model: same markup ids in the same places, ordinary text between.

    from agentrl.assets.families import FAMILIES, family_tokenizer
    tok = family_tokenizer("gptoss")      # Qwen BPE + harmony markup, gpt-oss's template

`tests/unit/test_templates.py` runs the conformance episode for every family and writes
`docs/models.md` (`AGENTRL_WRITE_DOCS=1`); `report()` is that page.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OURS = Path(__file__).parent / "templates"

LLAMA = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
         "<|eom_id|>", "<|python_tag|>")  # fmt: skip
GLM = ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
       "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")  # fmt: skip
HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
           "<|call|>")  # fmt: skip
DEEPSEEK = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
            "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
            "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>")  # fmt: skip
KIMI = ("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>",
        "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>", "<|tool_call_end|>")  # fmt: skip


@dataclass(frozen=True)
class Family:
    key: str  # the template's file name, without .jinja
    name: str  # the models it stands for
    parser: str  # what rollout.parser=auto must pick
    source: str = "trl"  # trl: the installed trl package's template; agentrl: ours
    markup: tuple[str, ...] = ()  # added tokens beyond Qwen's own
    eos: str = "<|im_end|>"
    bos: str | None = None
    stable: bool = True  # re-rendering the whole episode must give the sampled ids, id for id
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    fails: str = ""  # why the family does not pass (the test expects that failure)

    def template(self) -> str:
        if self.source == "agentrl":
            return (OURS / f"{self.key}.jinja").read_text()
        import trl  # local: a dev dependency, only the tests and docs read trl's templates

        return (Path(trl.__file__).parent / "chat_templates" / f"{self.key}.jinja").read_text()

    @property
    def where(self) -> str:
        if self.source == "agentrl":
            return f"agentrl/assets/templates/{self.key}.jinja (written for agentrl)"
        return f"trl chat_templates/{self.key}.jinja"


_FAMILIES = [
    Family("qwen2_5", "Qwen2.5", "hermes"),
    Family("qwen3", "Qwen3 (hybrid thinking)", "hermes"),
    Family("qwen3_instruct_2507", "Qwen3-2507 Instruct", "hermes"),
    Family("qwen3_5_think", "Qwen3.5 (thinking)", "qwen3_coder", stable=False),
    Family("qwen3_6", "Qwen3.6 (thinking; Qwen3.6-35B-A3B MoE)", "qwen3_coder", stable=False),
    Family("qwen3_8", "Qwen3.8 (thinking)", "qwen3_coder", stable=False),
    Family(
        "llama3_1",
        "Llama 3.1",
        "llama3_json",
        markup=LLAMA,
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
    ),  # fmt: skip
    Family(
        "llama3_2",
        "Llama 3.2",
        "llama3_json",
        markup=LLAMA,
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
    ),  # fmt: skip
    # no marker after an assistant turn: the next message's tag ends it (Renderer.opens_next)
    Family("glm4moe", "GLM-4.5 / 4.6 (MoE)", "glm45", markup=GLM, eos="<|user|>"),
    # harmony: channels, to=functions.NAME recipients; a tool-call turn stops on <|call|>
    Family("gptoss", "gpt-oss (MoE)", "harmony", markup=HARMONY, eos="<|return|>", stable=False),
    Family(
        "deepseekv3",
        "DeepSeek-V3 (MoE)",
        "deepseek_v3",
        markup=DEEPSEEK,
        eos="<｜end▁of▁sentence｜>",
        bos="<｜begin▁of▁sentence｜>",
        stable=False,
        fails="its template never resets its first-call flag, so a second tool-call turn "
        "renders without <｜Assistant｜><｜tool▁calls▁begin｜>: one tool round only; use "
        "deepseek_v31",
    ),  # fmt: skip
    Family(
        "deepseek_v31",
        "DeepSeek-V3.1 (MoE, thinking)",
        "deepseek_v3",
        source="agentrl",
        markup=DEEPSEEK,
        eos="<｜end▁of▁sentence｜>",
        bos="<｜begin▁of▁sentence｜>",
        stable=False,
        template_kwargs={"thinking": True},
    ),  # fmt: skip
    Family("kimi_k2", "Kimi-K2 (MoE)", "kimi_k2", source="agentrl", markup=KIMI),
]
FAMILIES = {f.key: f for f in _FAMILIES}


@functools.cache
def _qwen() -> Any:
    from transformers import AutoTokenizer  # local: the family table imports no transformers

    from agentrl.assets.build import cached_tokenizer  # local: as above (build imports it)

    return AutoTokenizer.from_pretrained(cached_tokenizer("qwen3"))


def family_tokenizer(key: str) -> Any:
    """A fresh tokenizer for family `key`: the Qwen BPE, the family's markup as added special
    tokens, its bos/eos, its chat template (a copy of one loaded Qwen tokenizer: half the time
    of loading it again)."""
    fam = FAMILIES[key]
    tok = copy.deepcopy(_qwen())
    if fam.markup:
        tok.add_special_tokens({"additional_special_tokens": list(fam.markup)})
    tok.eos_token = fam.eos
    if fam.bos:
        tok.bos_token = fam.bos
    tok.chat_template = fam.template()
    return tok


def report(rows: list[dict[str, str]]) -> str:
    """docs/models.md: one row per family (the conformance test's findings)."""
    head = [
        "# Model families",
        "",
        "Generated by `tests/unit/test_templates.py` (`AGENTRL_WRITE_DOCS=1 pytest "
        "tests/unit/test_templates.py` rewrites it; the test fails when it is stale). For every",
        "family the test renders a two-round tool episode with the family's chat template on an",
        "offline tokenizer carrying its markup, samples each assistant turn as the template writes",
        "it (reasoning included where the family thinks), parses it back with the parser",
        "`rollout.parser=auto` picks, and checks that each tool result's delta is exactly the",
        "template's text after the turn and never changes an id already sampled.",
        "",
        "- **history**: whether re-rendering the whole episode with the template gives the sampled",
        "  ids id for id (`exact`), or the template renders earlier turns otherwise (`rewrites`:",
        "  it drops earlier reasoning, or closes an answer with another tag). agentrl trains the",
        "  ids the model sampled, one sequence per episode (see docs/rollouts.md, thinking).",
        "- **reasoning**: how the family's turns carry reasoning, and whether the template keeps",
        "  an answer's reasoning in the history once a user message follows it.",
        "",
        "| family | template | parser | reasoning | history | status |",
        "|---|---|---|---|---|---|",
    ]
    body = [
        f"| {r['name']} | {r['template']} | `{r['parser']}` | {r['reasoning']} | {r['history']} "
        f"| {r['status']} |"
        for r in rows
    ]
    return "\n".join([*head, *body, ""])
