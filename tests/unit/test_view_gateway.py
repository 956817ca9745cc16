"""`agentrl view runs/<name>` of a run that only served the gateway (`agentrl gateway`): its
episodes are in runs/<name>/gateway/<date>_<time>/trajectories.jsonl, written by the standalone
gateway's close route; the view draws the newest session's, its newest episodes first. The real
Standalone writes them here, in front of a canned engine (the model's answer is not under test)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from agentrl.assets.build import resolve_builtin
from agentrl.cli.gateway import Standalone, session_dir
from agentrl.cli.view import main
from agentrl.gateway import Gateway
from agentrl.parsers import get_parser
from agentrl.types import Completion, FinishReason


@pytest.fixture(scope="module")
def tiny_dir() -> str:
    return str(resolve_builtin("tiny"))


async def one_session(out: Path, tok, questions: list[str]) -> None:
    """An `agentrl gateway` session: per question an episode opened with the admin token, one
    chat request answered, the episode closed with a reward (its sequences written to `out`)."""
    ids = tok.encode("It is 3.<|im_end|>", add_special_tokens=False)

    class Canned:
        async def generate(self, input_ids, params, key=None):
            return Completion(list(ids), [-0.5] * len(ids), FinishReason.STOP)

    app = Standalone(Gateway(Canned(), tok, get_parser("hermes")), out)
    url = await app.gateway.start(app.routes)
    root, admin = url.removesuffix("/v1"), {"Authorization": f"Bearer {app.token}"}
    try:
        async with httpx.AsyncClient() as http:
            for q in questions:
                ep = (await http.post(f"{root}/admin/episodes", headers=admin)).json()
                body = {"model": "m", "messages": [{"role": "user", "content": q}]}
                r = await http.post(f"{url}/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {ep['key']}"})  # fmt: skip
                assert r.status_code == 200, r.text
                closed = await http.post(f"{root}/admin/episodes/{ep['key']}/close",
                                         headers=admin, json={"reward": 1.0})  # fmt: skip
                assert closed.status_code == 200, closed.text
    finally:
        await app.gateway.aclose()


def test_view_of_a_gateway_run_draws_its_newest_sessions_episodes(tmp_path, tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    run = tmp_path / "runs" / "by_hand"
    older = session_dir(run, time.time() - 3600)
    newer = session_dir(run)
    asyncio.run(one_session(older, tok, ["What is 5 + 5?"]))
    asyncio.run(one_session(newer, tok, ["What is 1 + 2?", "What is 2 + 1?"]))
    assert (newer / "trajectories.jsonl").exists() and not (run / "trajectories.jsonl").exists()

    main([str(run), "-n", "2", "--tokenizer", tiny_dir])
    page = (newer / "view_0.html").read_text()
    assert "2 + 1" in page and "1 + 2" in page and "5 + 5" not in page
    assert page.index("2 + 1") < page.index("1 + 2")  # the newest episode first
    assert not (older / "view_0.html").exists()
