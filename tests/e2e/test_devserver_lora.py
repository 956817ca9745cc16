"""LoRA adapters on the dev server through SGLang's routes: a request that names an adapter
samples from the weights PEFT merges, one that names none from the base, exactly, before and
after switches; bad adapters and unknown names get SGLang's 400s."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from agentrl.engine import EngineClient, EngineError, EngineRequestError, SamplingParams
from agentrl.weight_sync import resolve_lora_sync

PROMPT = [9707, 11, 1879, 0, 4340, 525, 498]
GREEDY = SamplingParams(max_new_tokens=10, temperature=0, ignore_eos=True)


def base_model(path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def make_adapter(model_dir, out, seed: int, rank: int = 4) -> torch.nn.Module:
    """A PEFT adapter with non-zero B (a fresh one is the identity), saved to `out`; returns the
    merged model it defines."""
    torch.manual_seed(seed)
    peft = get_peft_model(base_model(model_dir), LoraConfig(r=rank, lora_alpha=8,
                                                           target_modules="all-linear"))  # fmt: skip
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    peft.save_pretrained(out)
    return peft.merge_and_unload().eval()


def logprobs(model, out: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + out])).logits[0].float()
    lp = torch.log_softmax(logits[len(PROMPT) - 1 : -1], -1)
    return lp[torch.arange(len(out)), torch.tensor(out)].tolist()


def close(a: list[float], b: list[float]) -> bool:
    return max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4


async def test_named_adapters_sample_from_the_merged_weights_and_the_base_stays_exact(
    scratch_base_server, tiny_model_dir, tmp_path
):
    merged_a = make_adapter(tiny_model_dir, tmp_path / "a", seed=1)
    merged_b = make_adapter(tiny_model_dir, tmp_path / "b", seed=2)
    base = base_model(tiny_model_dir)
    async with EngineClient([scratch_base_server]) as engine:
        before = await engine.generate(PROMPT, GREEDY)
        await engine.control.load_lora_adapter("a", str(tmp_path / "a"))
        await engine.control.load_lora_adapter("b", str(tmp_path / "b"))
        info = (await engine.control.server_info())[0]
        assert info["enable_lora"] and set(info["loaded_adapters"]) == {"a", "b"}
        assert await resolve_lora_sync("ask", engine) == "adapter"  # learner.lora.sync=auto

        async def sample(name: str | None):
            engine.gen.lora = name
            return await engine.generate(PROMPT, GREEDY)

        # one after another, then all at once (the scheduler runs one adapter per batch)
        order, at_once = ("a", None, "b", "a"), ("b", None, "a", "b", None)
        seq = [await sample(n) for n in order]
        together = await asyncio.gather(*(sample(n) for n in at_once))
        for name, comp in zip(order + at_once, seq + list(together), strict=True):
            model = {"a": merged_a, "b": merged_b, None: base}[name]
            assert close(comp.logprobs, logprobs(model, comp.token_ids)), name
        assert seq[0].token_ids != before.token_ids  # the adapter changes what is sampled
        assert seq[1].token_ids == before.token_ids  # and the base is back, bit for bit
        assert seq[1].logprobs == before.logprobs

        await engine.control.unload_lora_adapter("a")
        engine.gen.lora = "a"
        with pytest.raises(EngineRequestError, match="not loaded"):
            await engine.generate(PROMPT, GREEDY)
        engine.gen.lora = None
        assert (await engine.generate(PROMPT, GREEDY)).logprobs == before.logprobs
        await engine.control.unload_lora_adapter("b")
        assert (await engine.control.server_info())[0]["loaded_adapters"] == {}


async def test_bad_adapters_are_refused_with_the_reason(
    scratch_base_server, tiny_model_dir, tmp_path
):
    make_adapter(tiny_model_dir, tmp_path / "ok", seed=3)
    cfg = json.loads((tmp_path / "ok" / "adapter_config.json").read_text())
    (tmp_path / "dora").mkdir()
    (tmp_path / "dora" / "adapter_config.json").write_text(json.dumps(cfg | {"use_dora": True}))
    async with EngineClient([scratch_base_server]) as engine:
        with pytest.raises(EngineError, match="cannot load LoRA adapter"):
            await engine.control.load_lora_adapter("missing", str(tmp_path / "nowhere"))
        with pytest.raises(EngineError, match="DoRA"):
            await engine.control.load_lora_adapter("dora", str(tmp_path / "dora"))
        (tmp_path / "no_rank").mkdir()
        (tmp_path / "no_rank" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
        with pytest.raises(EngineError, match="integer r"):
            await engine.control.load_lora_adapter("no_rank", str(tmp_path / "no_rank"))
        async with httpx.AsyncClient() as http:  # not an object: a 400, not a server error
            r = await http.post(scratch_base_server + "/load_lora_adapter", json=["a", "b"])
            assert r.status_code == 400 and r.json()["success"] is False
            r = await http.post(
                scratch_base_server + "/unload_lora_adapter", json={"lora_name": [1]}
            )
            assert r.status_code == 400
        await engine.control.load_lora_adapter("ok", str(tmp_path / "ok"))
        with pytest.raises(EngineError, match="already loaded"):
            await engine.control.load_lora_adapter("ok", str(tmp_path / "ok"))
        with pytest.raises(EngineError, match="not loaded"):
            await engine.control.unload_lora_adapter("never")
        await engine.control.unload_lora_adapter("ok")
