import pytest
from transformers import AutoTokenizer

from agentrl.assets.build import cached_tokenizer


@pytest.fixture(scope="session")
def qwen_tokenizer_dir():
    return cached_tokenizer("qwen3")


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_tokenizer_dir):
    """Shared: a test that changes the chat template must restore it."""
    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir)


@pytest.fixture(scope="session")
def qwen2_tokenizer():
    """The same BPE with the Qwen2.5-style template (keeps <think> blocks in history)."""
    return AutoTokenizer.from_pretrained(cached_tokenizer("qwen"))
