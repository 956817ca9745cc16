"""Batching and sampling for `agentrl.engine.dev` (the model side; no HTTP here). What a request
is and how it is read and answered: agentrl/engine/dev/request.py.

`BatchEngine.step` is one scheduler step: drop aborted rows, prefill newly admitted requests as
one left-padded batch, merge their KV caches into the running batch (left-padding to a common
length), decode one token for every running row, drop finished rows and trim columns that are
padding in every row. Positions are tracked per row, so padding never shifts RoPE positions and
each row's logprobs equal a plain forward over its own ids (tests/e2e/test_devserver.py).

Prefill computes only what the prefix cache (agentrl/engine/dev/cache.py) does not hold: a row's cached
keys/values sit right-aligned before its new tokens (the padding between them is masked), and
identical prompts admitted together are computed once and their cache rows copied.

Batched, a row's logprobs still move in the last bits with its neighbours (2e-5 on the tiny
model: the matrix products take another path for another row count, the padding shifts the
attention's sums) and with what the prefix cache held. `solo` (the server's
--enable-deterministic-inference) computes every request alone, a batch of one with no prefix
cache, so its ids and logprobs follow from its prompt, parameters and sampling seed only.
"""

from __future__ import annotations

from collections import Counter
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.cache_utils import DynamicCache, DynamicLayer

from agentrl import moe
from agentrl.engine.dev.cache import PrefixCache
from agentrl.engine.dev.request import BadRequest, Req, abort_reason

GREEDY_EPS = 1e-6  # SGLang treats temperature below this as greedy (top_k=1, temperature=1)


@dataclass
class Batch:
    """The running batch: its KV cache covers prompt + out[:-1] of every row (left-padded);
    out[-1] of each row is fed at the next decode step, at position `pos`."""

    reqs: list[Req]
    cache: DynamicCache
    mask: torch.Tensor  # [B, L] 1 = real token
    pos: torch.Tensor  # [B]


def _pad_left(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def _filtered_probs(logp: torch.Tensor, r: Req) -> torch.Tensor:
    """Sampling distribution of one row: top-k, then top-p, then min-p on softmax(logits/T)."""
    probs = logp.exp()
    if 0 < r.top_k < probs.numel():
        kth = torch.topk(probs, r.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if r.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        drop = (torch.cumsum(sorted_p, 0) - sorted_p) > r.top_p * sorted_p.sum()
        probs = torch.zeros_like(probs).scatter(0, idx, sorted_p.masked_fill(drop, 0.0))
    if r.min_p > 0.0:
        probs = torch.where(probs >= r.min_p * probs.max(), probs, torch.zeros_like(probs))
    return probs


def penalized(logits: torch.Tensor, r: Req) -> torch.Tensor:
    """One row's logits under SGLang's penalties, over the ids the request sampled so far (never
    its prompt, as SGLang's penalizers): a seen id's logit divided by the repetition penalty
    (multiplied where negative), then less frequency_penalty per time it was sampled and
    presence_penalty once. Before the temperature, as SGLang applies them."""
    if not r.out:
        return logits
    out = torch.tensor(r.out, device=logits.device)
    counts = torch.bincount(out, minlength=logits.numel()).to(logits)
    seen = counts > 0
    if r.repetition_penalty != 1.0:
        scale = torch.where(seen, r.repetition_penalty, 1.0).to(logits)
        logits = torch.where(logits < 0, logits * scale, logits / scale)
    return logits - r.frequency_penalty * counts - r.presence_penalty * seen.to(logits)


def _filters(r: Req, vocab: int) -> bool:
    """Whether a row's distribution is cut (top-k, top-p, min-p) before the draw."""
    return 0 < r.top_k < vocab or r.top_p < 1.0 or r.min_p > 0.0


def _draw(logp: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One id per row from softmax rows given as log-probabilities: inverse CDF, one uniform per
    row from `gen`. The CDF is summed in float64 (the exp in float32: half the time) and the
    draw is scaled by its total, so a row's own rounding never lets the draw run past its last
    token (clamped all the same)."""
    cdf = torch.cumsum(logp.exp(), -1, dtype=torch.float64)
    u = torch.rand(cdf.shape[0], 1, generator=gen, dtype=torch.float64) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp_(max=cdf.shape[1] - 1)


class BatchEngine:
    """Model, batch state and the work of one scheduler step. Runs in a worker thread; the
    event loop only touches it between steps (under DevServer.model_lock)."""

    def __init__(
        self,
        model_path: str,
        device: str,
        dtype: torch.dtype,
        attn: str,
        seed: int,
        prefix_cache_mb: float = 0.0,
        solo: bool = False,
    ):
        self.device, self.dtype, self.attn = torch.device(device), dtype, attn
        self.model = self.load(model_path)
        self.solo = solo  # each request computed alone, its KV never cached (module docstring)
        self.prefix = PrefixCache(0 if solo else int(prefix_cache_mb * 2**20))
        self.epoch = 0  # counts weight changes: KV from an older epoch is never cached
        cfg = self.model.config
        eos = set(_as_list(cfg.eos_token_id))
        with suppress(OSError):
            eos |= set(_as_list(GenerationConfig.from_pretrained(model_path).eos_token_id))
        self.eos_ids = frozenset(eos)
        self.vocab_size = int(cfg.vocab_size)
        self.context_len = int(getattr(cfg, "max_position_embeddings", 0) or 32768)
        self.batch: Batch | None = None  # the running batch (batched mode)
        self.rows: list[Batch] = []  # solo: one single-row batch per running request
        self.gen = torch.Generator().manual_seed(seed)
        self.stats: Counter[str] = Counter()
        self.decode_batch_sizes: Counter[int] = Counter()

    def load(self, path: str) -> torch.nn.Module:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=self.dtype, attn_implementation=self.attn
        )
        return model.to(self.device).eval()

    # -- one scheduler step ---------------------------------------------------------------------

    def batches(self) -> list[Batch]:
        """The running batches: the batch, or in solo mode one per request."""
        return self.rows if self.solo else [b for b in (self.batch,) if b is not None]

    def running(self) -> list[Req]:
        return [r for b in self.batches() for r in b.reqs]

    @property
    def idle(self) -> bool:
        return self.batch is None and not self.rows

    def clear(self) -> None:
        """Forget every running request (a failed step; the caller fails them)."""
        self.batch, self.rows = None, []

    @torch.no_grad()
    def step(self, new: list[Req]) -> list[Req]:
        """Drop aborted rows, prefill `new` into the batch, decode one token. Returns finished,
        with the routes of those that asked for them (`return_routed_experts`): one forward of
        the request's ids alone at the weights that finished it, the experts each position goes
        to there (agentrl/moe.py); the batched decode's own may differ where two experts tie to
        the last bits."""
        done = self._step(new)
        for r in done:
            if r.routed and r.out and r.finish and r.finish.get("type") != "abort":
                r.routes = moe.routes_of(self.model, r.prompt + r.out[:-1])
        return done

    def _step(self, new: list[Req]) -> list[Req]:
        done = self.drop_aborted()
        if self.solo:  # one request at a time: its numbers never depend on the others
            for r in new:
                self.stats["prefill_steps"] += 1
                nb = self.prefill([r])
                done += self.remove_finished(nb)
                if nb.reqs:
                    self.rows.append(nb)
            for b in self.rows:
                done += self.decode(b)
            self.rows = [b for b in self.rows if b.reqs]
            return done
        if new:
            self.stats["prefill_steps"] += 1
            self.stats["joined_running_batch"] += self.batch is not None
            nb = self.prefill(new)
            done += self.remove_finished(nb)
            if nb.reqs:
                self.batch = self.merge(self.batch, nb)
        if self.batch is not None:
            done += self.decode(self.batch)
            if not self.batch.reqs:
                self.batch = None
        return done

    def decode(self, b: Batch) -> list[Req]:
        """One token for every row of `b`; the rows that finished leave it and come back."""
        self.stats["decode_steps"] += 1
        self.decode_batch_sizes[len(b.reqs)] += 1
        ids = torch.tensor([[r.out[-1]] for r in b.reqs], device=self.device)
        b.mask = torch.cat([b.mask, b.mask.new_ones(len(b.reqs), 1)], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=b.mask,
            position_ids=b.pos[:, None],
            past_key_values=b.cache,
            use_cache=True,
        )
        b.pos = b.pos + 1
        self.sample(out.logits[:, -1, :], b.reqs)
        return self.remove_finished(b)

    def prefill(self, reqs: list[Req]) -> Batch:
        seqs = [r.prompt + r.out for r in reqs]  # out is non-empty only for retracted requests
        unique: dict[tuple[int, ...], int] = {}
        row_of = [unique.setdefault(tuple(s), len(unique)) for s in seqs]
        useqs = [list(u) for u in unique]
        hits = [self.prefix.get(s) for s in useqs]
        past = [h.tokens if h else 0 for h in hits]
        news = [s[p:] for s, p in zip(useqs, past, strict=True)]
        n = max(len(x) for x in news)
        ids = torch.tensor([[0] * (n - len(x)) + x for x in news], device=self.device)
        mask = torch.tensor([[0] * (n - len(x)) + [1] * len(x) for x in news], device=self.device)
        pos = torch.tensor(past, device=self.device)[:, None] + (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        if max(past):
            mask = self.cached_past(cache, hits, mask)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        for layer in cache.layers:
            if type(layer) is not DynamicLayer:
                raise RuntimeError("devserver supports full-attention models only")
        for row, s in enumerate(useqs if self.prefix.on else ()):
            self.prefix.put(s, self.row_kv(cache, mask, row))
        logits = out.logits[:, -1, :]
        if len(useqs) < len(seqs):  # identical prompts: one computed row each, copied
            idx = torch.tensor(row_of, device=self.device)
            logits, mask = logits[idx], mask[idx]
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys[idx], layer.values[idx]
        for r, row in zip(reqs, row_of, strict=True):
            r.cached, r.epoch = past[row], self.epoch
        self.stats["prefill_tokens"] += sum(len(x) for x in news)
        self.stats["cached_tokens"] += sum(past[row] for row in row_of)
        self.sample(logits, reqs)
        lens = torch.tensor([len(s) for s in seqs], device=self.device)
        return Batch(list(reqs), cache, mask, lens)

    def cached_past(self, cache: DynamicCache, hits: list, new_mask: torch.Tensor) -> torch.Tensor:
        """Fill `cache` with the rows' cached keys/values, right-aligned in as many columns as
        the longest hit (left-padded); the attention mask over those columns + the new ones."""
        c = max(h.tokens if h else 0 for h in hits)
        longest = next(h for h in hits if h is not None and h.tokens == c)
        for i, (k0, _) in enumerate(longest.kv):
            keys = k0.new_zeros(len(hits), k0.shape[0], c, k0.shape[2])
            values = torch.zeros_like(keys)
            for row, h in enumerate(hits):
                if h is not None:
                    keys[row, :, c - h.tokens :] = h.kv[i][0]
                    values[row, :, c - h.tokens :] = h.kv[i][1]
            cache.update(keys, values, i)
        past = [[0] * (c - t) + [1] * t for t in (h.tokens if h else 0 for h in hits)]
        return torch.cat([torch.tensor(past, device=self.device), new_mask], dim=1)

    @staticmethod
    def row_kv(
        cache: DynamicCache, mask: torch.Tensor, row: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One row's keys/values over its real columns, in order: [kv_heads, tokens, d]."""
        cols = mask[row].nonzero()[:, 0]
        return [(la.keys[row][:, cols], la.values[row][:, cols]) for la in cache.layers]

    def remember(self, b: Batch) -> None:
        """Put finished rows' KV (prompt + output but its last token) in the prefix cache,
        unless the weights changed since it was computed."""
        for i, r in enumerate(b.reqs):
            if r.finish is not None and r.abort is None and r.epoch == self.epoch:
                self.prefix.put(r.prompt + r.out[:-1], self.row_kv(b.cache, b.mask, i))

    def weights_changed(self) -> None:
        self.epoch += 1
        self.prefix.clear()

    def sample(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        """Append one sampled id (and its logprob) to every request; mark finished ones.

        logprob = log_softmax(logits / T)[id], the logits penalized first where the request
        asked (`penalized`); greedy rows (T = 1) take the argmax. Batched
        over rows, except the filtering and draw of sampled rows (each has its own generator)."""
        temps = [r.temperature if r.temperature >= GREEDY_EPS else 1.0 for r in reqs]
        logits = logits.float()
        if any(r.penalized for r in reqs):  # a copy: the model's own logits stay as they were
            logits = torch.stack([penalized(x, r) if r.penalized else x
                                  for x, r in zip(logits, reqs, strict=True)])  # fmt: skip
        logp = torch.log_softmax(logits / torch.tensor(temps)[:, None].to(logits), -1)
        toks = logp.argmax(-1)
        sampled = [i for i, r in enumerate(reqs) if r.temperature >= GREEDY_EPS and r.top_k != 1]
        plain = [i for i in sampled if reqs[i].gen is None and not _filters(reqs[i], logp.shape[1])]
        if plain:  # one draw for all of them: a multinomial call per row was most of the CPU
            toks[plain] = _draw(logp[plain], self.gen)
        for i in sampled:
            if i not in plain:  # a seed of its own (reproducible alone) or a filtered support
                r = reqs[i]
                probs = _filtered_probs(logp[i], r).cpu()
                toks[i] = int(torch.multinomial(probs, 1, generator=r.gen or self.gen))
        lps = logp.gather(1, toks[:, None])[:, 0].tolist()
        for r, tok, lp in zip(reqs, toks.tolist(), lps, strict=True):
            r.out.append(tok)
            r.logprobs.append(lp)
            self.check_finished(r)
        self.stats["generated_tokens"] += len(reqs)

    def check_finished(self, r: Req) -> None:
        """SGLang's order: the length limit first, then stop tokens (all off with ignore_eos)."""
        if len(r.out) >= r.max_new_tokens:
            r.finish = {"type": "length", "length": r.max_new_tokens}
        elif not r.ignore_eos and (r.out[-1] in r.stop_ids or r.out[-1] in self.eos_ids):
            r.finish = {"type": "stop", "matched": r.out[-1]}

    # -- batch surgery -------------------------------------------------------------------------

    def select(self, b: Batch, keep: list[int]) -> None:
        """Keep rows `keep` of `b`, then cut cache columns that are padding in every row."""
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        b.reqs = [b.reqs[i] for i in keep]
        b.mask, b.pos = b.mask[idx], b.pos[idx]
        start = int(b.mask.any(0).int().argmax()) if keep else 0
        b.mask = b.mask[:, start:]
        for layer in b.cache.layers:
            layer.keys = layer.keys[idx, :, start:]
            layer.values = layer.values[idx, :, start:]

    def remove_finished(self, b: Batch) -> list[Req]:
        done = [r for r in b.reqs if r.finish is not None]
        if done:
            if self.prefix.on:
                self.remember(b)
            self.select(b, [i for i, r in enumerate(b.reqs) if r.finish is None])
        return done

    def drop_aborted(self) -> list[Req]:
        gone = []
        for b in self.batches():
            out = [r for r in b.reqs if r.abort is not None]
            if out:
                self.select(b, [i for i, r in enumerate(b.reqs) if r.abort is None])
                gone += out
        if self.batch is not None and not self.batch.reqs:
            self.batch = None
        self.rows = [b for b in self.rows if b.reqs]
        for r in gone:
            r.finish = abort_reason(r.abort)
        return gone

    def merge(self, a: Batch | None, b: Batch) -> Batch:
        if a is None:
            return b
        la, lb = a.mask.shape[1], b.mask.shape[1]
        n = max(la, lb)
        for x, y in zip(a.cache.layers, b.cache.layers, strict=True):
            x.keys = torch.cat([_pad_left(x.keys, n - la, 2), _pad_left(y.keys, n - lb, 2)])
            x.values = torch.cat([_pad_left(x.values, n - la, 2), _pad_left(y.values, n - lb, 2)])
        a.mask = torch.cat([_pad_left(a.mask, n - la, 1), _pad_left(b.mask, n - lb, 1)])
        a.pos = torch.cat([a.pos, b.pos])
        a.reqs = a.reqs + b.reqs
        return a

    def retract(self) -> list[Req]:
        """Drop the KV cache of every running request; they are re-prefilled later."""
        reqs = self.running()
        self.clear()  # prefill(prompt + out) rebuilds the cache and samples the next id
        return reqs

    # -- weights -------------------------------------------------------------------------------

    @torch.no_grad()
    def load_named(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy `tensors` (HF checkpoint names) into the model; all are checked before any copy.
        A mixture-of-experts model's experts may come one by one (a checkpoint's layout, as
        SGLang takes them) and are stacked into its fused parameters (moe.py)."""
        sd = self.model.state_dict()
        try:
            tensors = moe.from_checkpoint(tensors, sd)
        except ValueError as e:  # a layer's experts sent in part
            raise BadRequest(str(e)) from e
        for name, t in tensors.items():
            if name not in sd:
                raise BadRequest(f"unknown parameter {name!r}: names follow model.state_dict()")
            if tuple(sd[name].shape) != tuple(t.shape):
                raise BadRequest(f"{name}: shape {list(t.shape)} != {list(sd[name].shape)}")
        self.weights_changed()
        for name, t in tensors.items():
            sd[name].copy_(t.to(device=sd[name].device, dtype=sd[name].dtype))


def _as_list(x: Any) -> list[int]:
    if x is None:
        return []
    return [int(v) for v in (x if isinstance(x, list | tuple) else [x])]
