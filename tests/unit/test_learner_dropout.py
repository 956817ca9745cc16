"""The learner's models run without dropout in every role: the update's forward (training mode)
must compute what the engine sampled from and what the scoring pass (eval mode) computed. The
critic of algo=ppo is a token-classification model, whose head transformers builds with dropout
0.1 by default: its values moved by up to 0.37 between two forwards of the tiny model, against
a value clip of 0.2. LoRA's own dropout is refused at the door."""

import pytest
import torch
from pydantic import ValidationError

from agentrl.assets.build import resolve_builtin
from agentrl.learner import LoraConfig
from agentrl.learner.fsdp import load_model, no_dropout


@pytest.mark.parametrize("role", ["policy", "critic"])
def test_training_mode_forward_equals_the_scoring_pass(role):
    model = load_model(resolve_builtin("tiny"), role)
    ids = torch.arange(1, 40)[None]
    with torch.no_grad():
        model.eval()
        scored = model(input_ids=ids).logits
        model.train()
        trained = [model(input_ids=ids).logits for _ in range(2)]
    for out in trained:
        torch.testing.assert_close(out, scored, rtol=0, atol=1e-6)


def test_attention_dropout_rate_is_switched_off_too():
    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention_dropout = 0.1  # transformers reads it in training mode
            self.drop = torch.nn.Dropout(0.2)

    m = no_dropout(Attention())
    assert m.attention_dropout == 0.0 and m.drop.p == 0.0


def test_lora_dropout_is_refused_with_the_setting_and_the_fix():
    with pytest.raises(ValidationError, match=r"learner.lora.dropout=0.05.*learner.lora.dropout=0"):
        LoraConfig(rank=8, dropout=0.05)
    assert LoraConfig(rank=8).dropout == 0.0
