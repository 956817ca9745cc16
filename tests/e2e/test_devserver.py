"""The dev server on loopback, through EngineClient: exact logprobs, batching, SGLang semantics,
pause/abort, and the three weight-update paths (disk, gloo broadcast, tensors)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.assets.build import cached_tiny_random
from agentrl.engine import (
    EngineClient,
    EngineUnavailable,
    PromptTooLong,
    SamplingParams,
    encode_named_tensors,
)
from agentrl.learner.update_group import bind_listen_socket, init_update_group
from agentrl.types import FinishReason

TOL = 1e-4
PROMPT = [9707, 11, 1879, 0, 4340, 525, 498]


def load(path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def model0(tiny_model_dir):
    return load(tiny_model_dir)


@pytest.fixture(scope="module")
def model1_dir():
    return cached_tiny_random(seed=1)


def ref_logprobs(model, prompt: list[int], out: list[int], temperature: float = 1.0) -> list[float]:
    """log_softmax(logits / T) of `out` from one plain forward over prompt + out."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, -1)
    return lp[torch.arange(len(out)), torch.tensor(out)].tolist()


def assert_close(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < TOL, (a, b)


async def test_greedy_logprobs_equal_a_plain_forward(devserver, model0):
    async with EngineClient([devserver]) as engine:
        params = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
        comp = await engine.generate(PROMPT, params)
    assert comp.finish_reason is FinishReason.LENGTH and len(comp.token_ids) == 12
    assert_close(comp.logprobs, ref_logprobs(model0, PROMPT, comp.token_ids))
    with torch.no_grad():  # greedy: each id is the argmax after the ids before it
        logits = model0(torch.tensor([PROMPT + comp.token_ids])).logits[0]
    assert logits[len(PROMPT) - 1 : -1].argmax(-1).tolist() == comp.token_ids


async def test_sampled_logprobs_equal_a_plain_forward_and_seeds_repeat(devserver, model0):
    params = SamplingParams(max_new_tokens=10, temperature=0.8, top_p=0.95, top_k=500, seed=11)
    async with EngineClient([devserver]) as engine:
        a, b = await asyncio.gather(
            engine.generate(PROMPT, params), engine.generate(PROMPT, params)
        )
    assert a.token_ids == b.token_ids and len(set(a.token_ids)) > 1
    assert_close(a.logprobs, ref_logprobs(model0, PROMPT, a.token_ids, temperature=0.8))


async def test_concurrent_requests_are_batched_and_stay_exact(devserver, model0):
    async def state(engine: EngineClient) -> dict:
        return (await engine.control.server_info())[0]["internal_states"][0]

    async with EngineClient([devserver]) as engine:
        before = await state(engine)

        async def one(i: int):
            await asyncio.sleep(0 if i < 4 else 0.01 * i)  # 4 at once, then 4 joining later
            prompt = [(37 * i + 5 * j) % 150000 for j in range(3 + 4 * i)]
            params = SamplingParams(max_new_tokens=24 + 2 * i, temperature=0.0, ignore_eos=True)
            return prompt, await engine.generate(prompt, params)

        results = await asyncio.gather(*(one(i) for i in range(8)))
        after = await state(engine)
    sizes = {int(k): v - before["decode_batch_sizes"].get(k, 0)
             for k, v in after["decode_batch_sizes"].items()}  # fmt: skip
    assert max(k for k, v in sizes.items() if v > 0) >= 4, sizes
    joined = after["stats"]["joined_running_batch"] - before["stats"].get("joined_running_batch", 0)
    assert joined > 0  # continuous batching: requests were admitted into a running batch
    for i, (prompt, comp) in enumerate(results):
        assert len(comp.token_ids) == 24 + 2 * i
        assert_close(comp.logprobs, ref_logprobs(model0, prompt, comp.token_ids))


async def test_stop_token_is_returned_and_finish_reasons_follow_sglang(devserver):
    base = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5, ignore_eos=True)
    async with EngineClient([devserver]) as engine:
        free = (await engine.generate(PROMPT, base)).token_ids
        k = next(i for i in range(1, 8) if free[i] not in free[:i])
        stop = free[k]
        with_stop = base.model_copy(update={"ignore_eos": False, "stop_token_ids": [stop]})
        c = await engine.generate(PROMPT, with_stop)
        assert c.finish_reason is FinishReason.STOP and c.matched_stop == stop
        assert c.token_ids == free[: k + 1] and len(c.logprobs) == k + 1  # stop id included
        # the length limit is checked first: a stop id sampled as the last allowed token
        capped = await engine.generate(
            PROMPT, with_stop.model_copy(update={"max_new_tokens": k + 1})
        )
        assert capped.finish_reason is FinishReason.LENGTH and capped.token_ids == free[: k + 1]
        # ignore_eos turns off every token stop, stop_token_ids included (as in SGLang)
        ignored = await engine.generate(PROMPT, with_stop.model_copy(update={"ignore_eos": True}))
        assert ignored.finish_reason is FinishReason.LENGTH and ignored.token_ids == free


async def test_too_long_prompts_get_400_and_prompt_too_long(devserver):
    async with httpx.AsyncClient(base_url=devserver) as http:
        r = await http.post("/generate", json={"input_ids": [1] * 4096})
        assert r.status_code == 400
        assert "longer than the model's context length (4096" in r.json()["error"]["message"]
        body = {"input_ids": [1] * 4000, "sampling_params": {"max_new_tokens": 200}}
        r = await http.post("/generate", json=body)
        assert r.status_code == 400 and "Requested token count" in r.json()["error"]["message"]
        r = await http.post("/generate", json={"text": "hi"})
        assert r.status_code == 400 and "input_ids" in r.json()["error"]["message"]
        for sp in ({"max_new_tokens": "many"}, {"stop": ["\n"]}, {"top_p": 0}):
            r = await http.post("/generate", json={"input_ids": [1, 2], "sampling_params": sp})
            assert r.status_code == 400, sp
    async with EngineClient([devserver]) as engine:
        with pytest.raises(PromptTooLong):
            await engine.generate([1] * 4096, SamplingParams(max_new_tokens=1))


async def test_batch_input_ids_get_a_list_of_responses(devserver):
    body = {
        "input_ids": [[1, 2, 3], [4, 5]],
        "sampling_params": [{"max_new_tokens": 2, "temperature": 0}, {"max_new_tokens": 3}],
        "rid": ["a-batch-1", "a-batch-2"],
        "return_logprob": True,
    }
    async with httpx.AsyncClient(base_url=devserver) as http:
        r = await http.post("/generate", json=body)
    out = r.json()
    assert r.status_code == 200 and [o["meta_info"]["id"] for o in out] == body["rid"]
    assert [len(o["output_ids"]) for o in out] == [2, 3]
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [3, 2]


async def test_pause_continue_abort_and_retract(devserver, model0):
    long = SamplingParams(max_new_tokens=3000, temperature=0, ignore_eos=True)
    async with EngineClient([devserver]) as engine:
        await engine.control.pause_generation("in_place")
        task = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=3)))
        await asyncio.sleep(0.3)
        assert not task.done()  # the scheduler really is paused
        await engine.control.continue_generation()
        assert len((await asyncio.wait_for(task, 10)).token_ids) == 3

        async with httpx.AsyncClient(base_url=devserver, timeout=30) as http:
            body = {"input_ids": PROMPT, "rid": "abort-me", "return_logprob": True,
                    "sampling_params": long.to_sglang()}  # fmt: skip
            raw = asyncio.create_task(http.post("/generate", json=body))
            await _wait_running(engine)
            await engine.gen.abort(rid="abort-me")
            out = (await asyncio.wait_for(raw, 10)).json()
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(out["output_ids"]) < 3000

        task = asyncio.create_task(engine.generate(PROMPT, long))
        await _wait_running(engine)
        await engine.control.pause_generation("abort")  # aborts what is running, then pauses
        aborted = await asyncio.wait_for(task, 10)
        await engine.control.continue_generation()
        assert aborted.finish_reason is FinishReason.ABORT and len(aborted.token_ids) < 3000
        assert_close(aborted.logprobs, ref_logprobs(model0, PROMPT, aborted.token_ids))

        # retract: the KV cache is dropped, the request is re-prefilled and still exact
        task = asyncio.create_task(
            engine.generate(PROMPT, long.model_copy(update={"max_new_tokens": 60}))
        )
        await _wait_running(engine)
        await engine.control.pause_generation("retract")
        await engine.control.continue_generation()
        done = await asyncio.wait_for(task, 30)
        assert done.finish_reason is FinishReason.LENGTH and len(done.token_ids) == 60
        assert_close(done.logprobs, ref_logprobs(model0, PROMPT, done.token_ids))


async def _wait_running(engine: EngineClient) -> None:
    for _ in range(500):
        if (await engine.control.server_info())[0]["internal_states"][0]["num_running_reqs"]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("request never started")


async def test_admin_routes_answer(devserver):
    async with EngineClient([devserver]) as engine:
        await engine.control.wait_healthy(timeout_s=5)
        assert await engine.control.health() == {devserver: True}
        info = (await engine.control.model_info())[0]
        assert info["is_generation"] and info["context_length"] == 4096
        assert await engine.control.get_weight_version() == [info["weight_version"]]
        assert await engine.control.flush_cache() == [True]
        await engine.control.release_memory_occupation()
        await engine.control.resume_memory_occupation()
    async with httpx.AsyncClient(base_url=devserver) as http:
        assert (await http.get("/health_generate")).status_code == 200
        assert (await http.get("/get_model_info")).status_code == 200


async def test_a_generation_while_memory_is_released_kills_the_server_as_it_kills_sglang(
    tiny_model_dir, launch_devserver
):
    """SGLang's scheduler crashes when it runs a batch with its memory released (a health probe
    that generates did it); the dev server dies as loudly, so such a caller fails on CPU."""
    with launch_devserver(tiny_model_dir) as (url, proc):
        async with EngineClient([url], max_retries=0) as engine:
            await engine.control.release_memory_occupation()
            assert await engine.control.health() == {url: True}  # a liveness probe is safe
            await engine.control.resume_memory_occupation(["weights"])  # the KV cache is still out
            assert await engine.control.health() == {url: True}
            with pytest.raises(EngineUnavailable):
                await engine.generate(PROMPT, SamplingParams(max_new_tokens=2))
        assert proc.wait(timeout=30) == 70


# -- weight updates: on a server of their own, so the shared one keeps its weights; its memory
# released and resumed, and at the end of the module its SIGTERM (one server start, not three) ---


@pytest.fixture(scope="module")
def weights_server_proc(tiny_model_dir, launch_devserver):
    with launch_devserver(tiny_model_dir) as (url, proc):
        yield url, proc


@pytest.fixture(scope="module")
def weights_server(weights_server_proc):
    return weights_server_proc[0]


async def test_a_server_resumed_whole_generates_again(weights_server):
    url = weights_server
    async with EngineClient([url]) as engine:
        await engine.control.release_memory_occupation()
        await engine.control.resume_memory_occupation(["weights"])
        await engine.control.resume_memory_occupation(["kv_cache", "cuda_graph"])
        comp = await engine.generate(PROMPT, SamplingParams(max_new_tokens=3, ignore_eos=True))
        assert len(comp.token_ids) == 3
        assert await engine.control.health(deep=True) == {url: True}


async def served_logprobs(engine: EngineClient) -> tuple[list[int], list[float], str]:
    c = await engine.generate(
        PROMPT, SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True)
    )
    return c.token_ids, c.logprobs, c.weight_version


async def test_update_weights_from_disk(weights_server, tiny_model_dir, model0, model1_dir):
    model1 = load(model1_dir)
    async with EngineClient([weights_server]) as engine:
        ids, lps, _ = await served_logprobs(engine)
        assert_close(lps, ref_logprobs(model0, PROMPT, ids))
        await engine.control.update_weights_from_disk(str(model1_dir), weight_version="disk-1")
        assert await engine.control.get_weight_version() == ["disk-1"]
        ids1, lps1, version = await served_logprobs(engine)
        assert version == "disk-1" and (ids1, lps1) != (ids, lps)
        assert_close(lps1, ref_logprobs(model1, PROMPT, ids1))
        await engine.control.update_weights_from_disk(str(tiny_model_dir), weight_version="disk-0")
        assert (await served_logprobs(engine))[:2] == (ids, lps)


async def test_update_weights_over_a_gloo_group(weights_server, model0, model1_dir):
    """This process joins as rank 0, broadcasts model1's weights; the server then serves them."""
    model1 = load(model1_dir)
    named = dict(model1.state_dict())
    async with EngineClient([weights_server]) as engine:
        ids, lps, _ = await served_logprobs(engine)
        assert_close(lps, ref_logprobs(model0, PROMPT, ids))
        sock = bind_listen_socket("127.0.0.1")
        port = sock.getsockname()[1]
        pg_task = asyncio.create_task(
            asyncio.to_thread(init_update_group, "127.0.0.1", port, 0, 2, "wu", "gloo", 60, sock)
        )
        await engine.control.init_weights_update_group(
            "127.0.0.1", port, group_name="wu", backend="gloo"
        )
        pg = await pg_task

        def broadcast() -> None:
            for t in named.values():
                torch.distributed.broadcast(t, src=0, group=pg)

        sender = threading.Thread(target=broadcast)
        sender.start()
        await engine.control.update_weights_from_distributed(
            list(named),
            [t.dtype for t in named.values()],
            [list(t.shape) for t in named.values()],
            group_name="wu",
            weight_version="dist-1",
        )
        sender.join(timeout=60)
        await engine.control.destroy_weights_update_group("wu")
        torch.distributed.destroy_process_group(pg)
        sock.close()
        ids1, lps1, version = await served_logprobs(engine)
        assert version == "dist-1" and lps1 != lps
        assert_close(lps1, ref_logprobs(model1, PROMPT, ids1))
        # and back, through /update_weights_from_tensor (safetensors bytes on CPU)
        payload = encode_named_tensors(dict(model0.state_dict()))
        await engine.control.update_weights_from_tensor([payload], weight_version="tensor-0")
        ids0, lps0, version = await served_logprobs(engine)
        assert version == "tensor-0" and ids0 == ids
        assert_close(lps0, lps)


async def test_a_push_cuts_turns_in_flight_and_they_go_on_under_the_new_weights(
    weights_server, model0, model1_dir
):
    """trainer.async.partial_rollouts: `exclusive(pause=True)` cuts two long sampled generations
    (/pause_generation, abort mode), model1 is loaded, and each generation goes on from where it
    was cut. Every kept token keeps the logprob model0 gave it and its version; every later token
    has model1's logprob given everything before it. A call made during the push waits and runs
    wholly under model1."""
    model1 = load(model1_dir)
    n = 300  # long enough to be cut: the push lands about 30 tokens in here (800 took 7 s more)
    params = SamplingParams(max_new_tokens=n, temperature=1.0, ignore_eos=True)
    async with EngineClient([weights_server]) as engine:
        v0 = (await engine.control.get_weight_version())[0]
        long = [asyncio.create_task(engine.generate(p, params)) for p in (PROMPT, PROMPT[2:])]
        await _wait_running(engine)
        await asyncio.sleep(0.3)
        async with engine.exclusive(pause=True) as inflight:
            assert inflight == 2
            during = asyncio.create_task(engine.generate(PROMPT[1:], params.model_copy(
                update={"max_new_tokens": 8})))  # fmt: skip
            await asyncio.sleep(0.2)
            assert not during.done()
            await engine.control.update_weights_from_disk(
                str(model1_dir), weight_version="partial-1"
            )
        cut = await asyncio.wait_for(asyncio.gather(*long), 120)
        late = await asyncio.wait_for(during, 30)
        # back to model0 for the tests after this one
        payload = encode_named_tensors(dict(model0.state_dict()))
        await engine.control.update_weights_from_tensor([payload], weight_version=v0)
    for prompt, comp in zip((PROMPT, PROMPT[2:]), cut, strict=True):
        assert comp.finish_reason is FinishReason.LENGTH and len(comp.token_ids) == n
        assert [v for _, v in comp.segments] == [v0, "partial-1"] and comp.weight_version == v0
        k = comp.segments[0][0]
        assert 0 < k < n
        ids = comp.token_ids
        assert_close(comp.logprobs[:k], ref_logprobs(model0, prompt, ids[:k]))
        assert_close(comp.logprobs[k:], ref_logprobs(model1, prompt + ids[:k], ids[k:]))
    assert late.weight_version == "partial-1" and late.segments == []
    assert_close(late.logprobs, ref_logprobs(model1, PROMPT[1:], late.token_ids))


async def test_coalesced_generates_answer_as_single_requests_do(devserver):
    """engine.batch_window_ms: concurrent calls leave as one batched /generate; each caller gets
    exactly what it would alone (greedy ids and logprobs), and one member the server refuses
    (a prompt too long) fails alone while the others are answered."""
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:], [7, 8, 9, 10]]
    params = SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True)
    async with EngineClient([devserver]) as engine:
        alone = [await engine.generate(p, params) for p in prompts]
    async with EngineClient([devserver], batch_window_ms=50) as engine:
        together = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        mixed = await asyncio.gather(
            engine.generate(PROMPT, params),
            engine.generate([1] * 4096, SamplingParams(max_new_tokens=1)),
            return_exceptions=True,
        )
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        assert_close(a.logprobs, b.logprobs)
    assert mixed[0].token_ids == alone[0].token_ids and isinstance(mixed[1], PromptTooLong)


async def test_a_wave_of_calls_one_by_one_leaves_as_one_batch(devserver):
    """The window restarts with every call that joins (a wave of turns the client issues one by
    one stays together); batch_max_wait_ms still bounds how long the first call waits."""
    params = SamplingParams(max_new_tokens=2, temperature=0, ignore_eos=True)

    async def wave(engine: EngineClient, gap_s: float) -> list:
        calls = []
        for p in (PROMPT, PROMPT[:5], PROMPT[3:], [7, 8, 9, 10]):
            calls.append(asyncio.ensure_future(engine.generate(p, params)))
            await asyncio.sleep(gap_s)
        return await asyncio.gather(*calls)

    async with EngineClient([devserver], batch_window_ms=100, batch_max_wait_ms=2000) as engine:
        out = await wave(engine, 0.03)
        assert (engine.gen.coalescer.batches_sent, engine.gen.coalescer.batched_calls) == (1, 4)
    async with EngineClient([devserver], batch_window_ms=50, batch_max_wait_ms=60) as engine:
        out2 = await wave(engine, 0.03)
        assert engine.gen.coalescer.batches_sent >= 2 and engine.gen.coalescer.batched_calls == 4
    assert [c.token_ids for c in out] == [c.token_ids for c in out2]


async def test_a_batch_answers_in_chunks_so_the_next_wave_leaves_while_it_is_answered(devserver):
    """Members answered first run their next turn while later ones are still being answered: a
    client that spends CPU on each returning turn sends its next turns in several batches, the
    first before the last member of the wave has its answer (coalesce.SETTLE_CHUNK). Handed out
    at once, all 48 turns ran in one loop iteration and each turn left as one batch."""
    import time

    from agentrl.engine.coalesce import SETTLE_CHUNK

    params = SamplingParams(max_new_tokens=2, temperature=0, ignore_eos=True)
    n, turns = 3 * SETTLE_CHUNK, 3
    answered: list[tuple[int, int]] = []

    async def episode(engine: EngineClient, i: int) -> list[int]:
        ids = [7 + i, 8, 9, 10]
        for t in range(turns):
            ids = ids + (await engine.generate(ids, params)).token_ids
            answered.append((t, i))
            time.sleep(0.002)  # the client's own work on the turn (render, env step), CPU-bound
        return ids

    async with EngineClient([devserver], batch_window_ms=1, batch_max_wait_ms=10) as engine:
        together = await asyncio.gather(*(episode(engine, i) for i in range(n)))
        cz = engine.gen.coalescer
        assert cz.batched_calls == n * turns and cz.batches_sent > turns
    async with EngineClient([devserver]) as engine:
        alone = await asyncio.gather(*(episode(engine, i) for i in range(n)))
    assert together == alone  # greedy: the same ids whichever way they were batched


def test_sigterm_stops_the_server_cleanly(weights_server_proc):
    """The module's last test: it stops the weights server (after the tests that use it)."""
    url, proc = weights_server_proc
    assert httpx.get(url + "/health").status_code == 200
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert time.monotonic() - t0 < 15
