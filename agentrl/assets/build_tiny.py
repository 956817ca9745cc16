"""Build `agentrl/assets/tiny/`, the small model the quick start trains, deterministically, offline.

    python -m agentrl.assets.build_tiny OUT_DIR [--seed 0] [--steps 1500]

What it makes, in order:

1. **Dialogues**: synthetic code_exec episodes (envs/code_exec.py tasks) of mixed quality
   (agentrl/assets/code_exec_dialogues.py: the right program, a plausible wrong one, or a guess)
   and tool-use dialogues over the agentrl/assets/toolbox.py catalogue.
2. **Tokenizer**: byte-level BPE trained with `tokenizers` on those dialogues' text (digits are
   always single tokens; merges may cross spaces, so the fixed system prompt stays short), the
   chat / tool special tokens as added tokens, and agentrl's Qwen3 chat template
   (`templates/qwen3.jinja`): the hermes parser and `agentrl.render` work unchanged.
3. **Model**: a standard `Qwen3ForCausalLM` (about 3M parameters, tied embeddings), so
   transformers and SGLang load it as any Qwen3 checkpoint.
4. **Warm start**: supervised training on the dialogues, loss on the assistant tokens only, ids
   and masks built with the same `Renderer` calls the rollout makes (prompt ids, sampled turn,
   observation delta), so the model has seen exactly the token sequences it will be asked to
   continue. Sampling from it reproduces the mixture: a low, non-zero success rate that RL can
   raise by preferring the tool and the right program.

Same seed, same torch build and thread count → the same files. `build_info.json` records the
settings and the final SFT loss.

The shipped model is three builds. The base, on CPU (deterministic, about 50 min on 2 cores):

    python -m agentrl.assets.build_tiny BASE

then two stages that teach it to read tool and argument names from the schema (8 of 10 toolbox
tools named for their dialogue, `toolbox.open_name`), each continued from the one before on one
GPU (a GPU run is not bit-reproducible; build_info.json says where the last one ran):

    python -m agentrl.assets.build_tiny STAGE2 --init BASE --open-names 0.8 --toolbox 60000 \
        --steps 5500 --batch-size 256 --lr 1e-3 --device cuda                  # 7 min 15 s, H100
    python -m agentrl.assets.build_tiny OUT --init STAGE2 --open-names 0.8 --toolbox 300000 \
        --steps 1900 --batch-size 1024 --lr 1e-3 --max-minutes 6.3 --device cuda  # 6 min, H100

On held-out names (`python bench/tiny_schema.py --cases 16 --samples 8`, first turns): the base
called the right tool 0 times in 256; after stage 2 the right name in 0.16 (one tool) and 0.11
(two to choose from) of turns, right argument names and values in 0.016 and 0.055; after stage 3
(shipped) 0.32 and 0.28, and 0.078 and 0.164.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.assets.code_exec_dialogues import MODES, episodes
from agentrl.assets.toolbox import MODES as TOOLBOX_MODES
from agentrl.assets.toolbox import Example, examples
from agentrl.render import Renderer
from agentrl.types import Message

TINY_DIR = Path(__file__).parent / "tiny"
TEMPLATE = Path(__file__).parent / "templates" / "qwen3.jinja"

# Added tokens, in id order after the BPE vocabulary. The first three are "special" (skipped by
# decode(skip_special_tokens=True)); the rest are plain added tokens that are never split, as in
# Qwen3's tokenizer.
ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
]  # fmt: skip
VOCAB_SIZE = 1024  # at most: BPE tokens + ADDED (merges of one occurrence are not made)
MAX_TOKEN_CHARS = 16  # merges may cross spaces, up to this many characters


@dataclass(frozen=True)
class TinySpec:
    """Everything that determines the built files."""

    seed: int = 0
    # the quick start's task kinds (configs/env/code_exec.yaml): their programs copy one or two
    # short numbers from the question, which a 4-layer model learns to do reliably in minutes
    kinds: tuple[str, ...] = ("digit_sum", "primes", "fib_mod")
    dialogues: int = 6000
    # tool-use dialogues over the agentrl.assets.toolbox catalogue (varied tools, 1–3 per prompt)
    toolbox: int = 6000
    # the share of toolbox tools named for their dialogue (toolbox.open_name): 0 in the base
    # build, 0.8 in its second stage (the docstring). Tried before: 0.5-0.7 from scratch over 40k
    # dialogues x 3k batches of 128 on an H100 gave partial copies only (right name 0 of 256)
    open_names: float = 0.0
    # continue from a built model (its tokenizer and weights) instead of starting afresh
    init: str | None = None
    hidden_size: int = 128
    num_layers: int = 4
    steps: int = 10000
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 50
    # a wall-clock budget for the SFT loop (0: none): past it the loop stops where it is and the
    # model is saved, build_info.json saying at which step (a GPU call has a time limit)
    max_minutes: float = 0.0


# -- encoding ----------------------------------------------------------------------------------


def pieces(renderer: Any, ex: Example) -> list[tuple[str, int]]:
    """The episode as the rollout tokenizes it: (text, loss mask) pieces, each encoded on its own —
    the first prompt, every sampled turn (ending with the end-of-turn token), every observation
    delta. Encoding the pieces gives the rollout's ids exactly (see `encode_episode`)."""
    r = renderer
    history = [Message(role="system", content=ex.system)] if ex.system else []
    history.append(Message(role="user", content=ex.prompt))
    out = [(r.render(history, add_generation_prompt=True), 0)]
    for msg, obs in ex.turns:
        head = r.render(history, add_generation_prompt=True)
        full = r.render([*history, msg])
        if not full.startswith(head):
            raise AssertionError("the chat template re-rendered history")
        out.append((full[len(head) :].rstrip("\n"), 1))  # the turn, through <|im_end|>
        history.append(msg)
        if obs:
            out.append((r.separator + r.delta_text(obs), 0))
            history += obs
    return out


def encode_episode(renderer: Any, ex: Example) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one episode, built with the rollout's Renderer calls."""
    ids: list[int] = []
    mask: list[int] = []
    last: list[int] = []
    obs = iter([o for _, o in ex.turns if o])
    for text, m in pieces(renderer, ex):
        if m:
            part = renderer.encode(text)
            last = part
        elif ids:  # an observation: the rollout's own call, after the sampled ids `last`
            part = renderer.observation_ids(next(obs), last)
        else:
            part = renderer.encode(text)
        ids += part
        mask += [m] * len(part)
    return ids, mask


# -- tokenizer ---------------------------------------------------------------------------------


def _wrap(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=TEMPLATE.read_text(),
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )


def _empty_tokenizer(bpe: Any = None) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(bpe or models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(
        [
            AddedToken(t, special=i < 3, normalized=False, single_word=False)
            for i, t in enumerate(ADDED)
        ]
    )
    return tok


def train_tokenizer(texts: list[str]) -> Any:
    """Byte-level BPE over `texts` (split at the added tokens first, as encoding does)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    split = re.compile("|".join(re.escape(t) for t in ADDED))
    chunks = [c for t in texts for c in split.split(t) if c]
    plain = Tokenizer(models.BPE())
    plain.pre_tokenizer = _empty_tokenizer().pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(ADDED),
        min_frequency=2,
        max_token_length=MAX_TOKEN_CHARS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    plain.train_from_iterator(chunks, trainer=trainer)
    trained = _empty_tokenizer(plain.model)
    if trained.get_vocab_size() > VOCAB_SIZE:
        raise AssertionError(f"vocabulary of {trained.get_vocab_size()} tokens, not {VOCAB_SIZE}")
    return _wrap(trained)


# -- model + SFT -------------------------------------------------------------------------------


def make_model(tokenizer: Any, spec: TinySpec) -> Any:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    h = spec.hidden_size
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=h,
        intermediate_size=h * 3,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=h // 4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    return Qwen3ForCausalLM(config)


def common_prefix(rows: list[tuple[list[int], list[int]]]) -> int:
    """Length of the token prefix every row shares (the system prompt with the tools)."""
    first = rows[0][0]
    n = min(len(ids) for ids, _ in rows)
    for ids, _ in rows:
        n = next((i for i in range(n) if ids[i] != first[i]), n)
    return n


def batches(rows: list, families: list[int], size: int, gen: Any) -> list[list[int]]:
    """Row indices in batches, in a seeded random order: each family (code_exec, toolbox) apart,
    shuffled, then sorted by length within windows of 8 batches, so a batch pads little and its
    rows share their system prompt, yet it still mixes task kinds and behaviours."""
    import torch

    out = []
    for fam in sorted(set(families)):
        order = [i for i in torch.randperm(len(rows), generator=gen).tolist() if families[i] == fam]
        for w in range(0, len(order), 8 * size):
            window = sorted(order[w : w + 8 * size], key=lambda i: len(rows[i][0]))
            out += [window[i : i + size] for i in range(0, len(window), size)]
    return [out[i] for i in torch.randperm(len(out), generator=gen).tolist()]


def _lr_at(step: int, spec: TinySpec) -> float:
    """Linear warm-up over `spec.warmup` steps, then cosine decay to 5 % of `spec.lr`."""
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    frac = (step - spec.warmup) / max(spec.steps - spec.warmup, 1)
    return spec.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))


def _batch_loss(model: Any, batch: list[tuple[list[int], list[int]]], device: str) -> Any:
    """Next-token cross-entropy over the mask-1 tokens of `batch`: the shared prefix runs once
    and every row continues from its (repeated) KV cache."""
    import torch

    pad = model.config.pad_token_id
    n_pre = max(common_prefix(batch), 1)
    if any(any(m[:n_pre]) for _, m in batch):
        raise AssertionError("the shared prefix contains trained tokens")
    prefix = torch.tensor([batch[0][0][:n_pre]], device=device)
    width = max(len(ids) for ids, _ in batch) - n_pre
    ids_BT = torch.tensor(
        [ids[n_pre:] + [pad] * (width + n_pre - len(ids)) for ids, _ in batch], device=device
    )
    mask_BT = torch.tensor(
        [m[n_pre:] + [0] * (width + n_pre - len(m)) for _, m in batch],
        dtype=torch.bool,
        device=device,
    )
    cache = model.model(input_ids=prefix, use_cache=True).past_key_values
    cache.batch_repeat_interleave(len(batch))
    logits_BTV = model(input_ids=ids_BT, past_key_values=cache).logits[:, :-1]
    sel_BT = mask_BT[:, 1:]  # token t+1 is predicted at position t
    return torch.nn.functional.cross_entropy(logits_BTV[sel_BT], ids_BT[:, 1:][sel_BT])


def sft(
    model: Any,
    rows: list[tuple[list[int], list[int]]],
    families: list[int],
    spec: TinySpec,
    log: Callable,
    device: str = "cpu",
) -> tuple[float, int]:
    """Next-token cross-entropy on the mask-1 tokens; AdamW, warm-up then cosine decay.

    The rows of a batch share a prefix (code_exec's system prompt with its tool), so each batch
    runs that prefix once and continues all rows from its (repeated) KV cache: the same logits as
    full rows, a third of the compute for code_exec batches. Returns the final loss (an average
    over the last steps) and the number of steps run (fewer than `spec.steps` past
    `spec.max_minutes`)."""
    import time

    import torch

    model.to(device)
    start = time.monotonic()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(spec.seed)
    model.train()
    queue: list[list[int]] = []
    ema = math.nan
    for step in range(spec.steps):
        queue = queue or batches(rows, families, spec.batch_size, gen)
        loss = _batch_loss(model, [rows[i] for i in queue.pop()], device)
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, spec)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if math.isnan(ema) else 0.95 * ema + 0.05 * loss.item()
        elapsed = time.monotonic() - start
        if step % 50 == 0 or step == spec.steps - 1:
            log(f"sft step {step}/{spec.steps} loss {ema:.4f} ({elapsed:.0f} s)")
        if spec.max_minutes and elapsed > 60 * spec.max_minutes and step < spec.steps - 1:
            log(f"sft stopped at step {step + 1} of {spec.steps}: past --max-minutes")
            done = step + 1
            break
    else:
        done = spec.steps
    model.to("cpu").eval()
    return float(ema), done


# -- the build ---------------------------------------------------------------------------------


def _renderers(tokenizer: Any) -> Callable[[list[dict[str, Any]]], Renderer]:
    """A Renderer per distinct tool list (made once each)."""
    made: dict[str, Renderer] = {}

    def get(tools: list[dict[str, Any]]) -> Renderer:
        key = json.dumps(tools, sort_keys=True)
        if key not in made:
            made[key] = Renderer(tokenizer, tools)
        return made[key]

    return get


def _encode_chunk(chunk: list[Example]) -> list[tuple[list[int], list[int]]]:
    r = _renderers(_WORKER_TOKENIZER)
    return [encode_episode(r(ex.tools), ex) for ex in chunk]


_WORKER_TOKENIZER: Any = None  # set before the pool forks: the workers inherit it


def _toolbox_chunk(args: tuple[int, int, float]) -> list[Example]:
    return examples(*args)


CHUNK = 20_000  # toolbox dialogues drawn per process past this many (each takes ~0.5 ms)


def toolbox_examples(n: int, seed: int, open_names: float) -> list[Example]:
    """`n` toolbox dialogues: one seeded draw up to CHUNK (the base build's 6,000 are exactly
    `examples(n, seed)`), else chunks of CHUNK drawn in a process pool, chunk k from seed
    `seed * 1000 + k` (300k dialogues are 2.5 min on one core)."""
    import multiprocessing as mp
    import os

    if n <= CHUNK:
        return examples(n, seed=seed, open_names=open_names)
    parts = [(min(CHUNK, n - i), seed * 1000 + k, open_names)
             for k, i in enumerate(range(0, n, CHUNK))]  # fmt: skip
    with mp.get_context("fork").Pool(min(16, os.cpu_count() or 1)) as pool:
        return [ex for part in pool.map(_toolbox_chunk, parts) for ex in part]


def encode_all(tokenizer: Any, data: list[Example]) -> list[tuple[list[int], list[int]]]:
    """Every dialogue's (ids, mask), in order; over a process pool when there are many (each
    takes ~1.4 ms, most of it a Renderer per distinct tool list: 60k open-name dialogues are 85 s
    on one core)."""
    global _WORKER_TOKENIZER
    import multiprocessing as mp
    import os

    workers = min(16, os.cpu_count() or 1)
    if len(data) < 5000 or workers < 3:
        r = _renderers(tokenizer)
        return [encode_episode(r(ex.tools), ex) for ex in data]
    _WORKER_TOKENIZER = tokenizer
    size = math.ceil(len(data) / (4 * workers))
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    try:
        with mp.get_context("fork").Pool(workers) as pool:
            return [row for part in pool.map(_encode_chunk, chunks) for row in part]
    finally:
        _WORKER_TOKENIZER = None


def build(
    out_dir: str | Path, spec: TinySpec = TinySpec(), log: Callable = print, device: str = "cpu"
) -> Path:
    """Write tokenizer + model + generation config + build_info.json to out_dir (replaced)."""
    import torch
    from transformers import GenerationConfig

    data = episodes(spec.dialogues, spec.seed, list(spec.kinds))
    data += toolbox_examples(spec.toolbox, 20_000 + spec.seed, spec.open_names)
    if spec.init:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(spec.init)
    else:
        draft = _renderers(_wrap(_empty_tokenizer()))  # renders text; ids not used
        texts = [text for ex in data for text, _ in pieces(draft(ex.tools), ex)]
        tokenizer = train_tokenizer(texts)
    rows = encode_all(tokenizer, data)
    lengths = [len(ids) for ids, _ in rows]
    log(
        f"{len(rows)} dialogues, tokens/dialogue mean {sum(lengths) / len(rows):.0f} max {max(lengths)}"
    )
    if spec.init:
        model = AutoModelForCausalLM.from_pretrained(spec.init, dtype=torch.float32)
    else:
        model = make_model(tokenizer, spec)
    log(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    families = [0] * spec.dialogues + [1] * spec.toolbox
    loss, done = sft(model, rows, families, spec, log, device)

    out = Path(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=out.parent if out.parent.exists() else None))
    try:
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp, safe_serialization=True)
        eos = [model.config.eos_token_id, model.config.pad_token_id]
        GenerationConfig(eos_token_id=eos, pad_token_id=model.config.pad_token_id).save_pretrained(
            tmp
        )
        info = {**spec.__dict__, "modes": MODES, "toolbox_modes": TOOLBOX_MODES, "sft_loss": round(loss, 4), "steps_done": done,
                "torch": torch.__version__, "threads": torch.get_num_threads(),
                "device": torch.cuda.get_device_name() if device.startswith("cuda") else device}  # fmt: skip
        (tmp / "build_info.json").write_text(json.dumps(info, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(tmp), out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m agentrl.assets.build_tiny", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("out_dir", help=f"where to write the model (shipped copy: {TINY_DIR})")
    p.add_argument("--seed", type=int, default=TinySpec.seed)
    p.add_argument("--steps", type=int, default=TinySpec.steps)
    p.add_argument("--dialogues", type=int, default=TinySpec.dialogues)
    p.add_argument("--toolbox", type=int, default=TinySpec.toolbox)
    p.add_argument("--open-names", type=float, default=TinySpec.open_names)
    p.add_argument("--batch-size", type=int, default=TinySpec.batch_size)
    p.add_argument("--lr", type=float, default=TinySpec.lr)
    p.add_argument("--init", default=None, help="a built model to continue from")
    p.add_argument("--device", default="cpu", help="where the warm start runs (cpu, cuda)")
    p.add_argument("--max-minutes", type=float, default=0.0, help="stop the SFT loop past this")
    a = p.parse_args()
    spec = TinySpec(
        seed=a.seed,
        steps=a.steps,
        dialogues=a.dialogues,
        toolbox=a.toolbox,
        open_names=a.open_names,
        batch_size=a.batch_size,
        lr=a.lr,
        init=a.init,
        max_minutes=a.max_minutes,
    )
    print(build(a.out_dir, spec, device=a.device))


if __name__ == "__main__":
    main()
