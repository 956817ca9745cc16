"""The evaluation set is held out of training by default (trainer.eval.split), and a chat template
that cannot work is a one-line start-up error whose advice names a setting that exists."""

import pytest
from transformers import AutoTokenizer

from agentrl.assets.build import resolve_builtin
from agentrl.config import compose, errors_for_people
from agentrl.data import held_out, prompt_text
from agentrl.evaluate import eval_task_sets
from agentrl.render import Renderer, RenderError
from agentrl.run import prepare_rollout, task_sets
from agentrl.types import ConfigError, Task

QUICK_START = ["env=code_exec", "trainer.eval.every=10"]  # README: + a fixed evaluation set


def overlap(train: list[Task], evaluation: list[Task]) -> tuple[int, int]:
    """Evaluation tasks whose id, and whose prompt, the training list holds."""
    ids, prompts = {t.id for t in train}, {prompt_text(t) for t in train}
    return sum(t.id in ids for t in evaluation), sum(prompt_text(t) in prompts for t in evaluation)


def sets(overrides: list[str]) -> tuple[list[Task], list[Task], str]:
    cfg = compose(overrides)
    return task_sets(cfg, cfg.env.load_class())


def test_the_quick_starts_evaluation_shares_no_task_with_training():
    train, evaluation, line = sets(QUICK_START)
    assert len(evaluation) == 32 and overlap(train, evaluation) == (0, 0)
    # the generated list holds some questions twice: those copies leave training too
    assert len(train) == 256 - 32 - 5 and "held-out" in line and "eval.split=heldout" in line
    # asked for, the old way: every evaluation task is a training task
    train, evaluation, line = sets([*QUICK_START, "trainer.eval.split=shared"])
    assert len(train) == 256 and overlap(train, evaluation) == (32, 32)
    assert "not held out (trainer.eval.split=shared)" in line


def test_an_eval_list_of_its_own_is_held_out_by_prompt_too():
    """The README's example, another seed of the generator: 1 of its 32 questions is in the
    training list; held out, training drops it."""
    other = [*QUICK_START, "+env.eval_tasks.seed=1"]
    train, evaluation, _ = sets([*other, "trainer.eval.split=shared"])
    assert len(train) == 256 and overlap(train, evaluation) == (0, 1)
    train, evaluation, line = sets(other)
    assert len(train) == 255 and overlap(train, evaluation) == (0, 0) and "env.eval_tasks" in line


def test_no_evaluation_keeps_the_whole_list():
    train, evaluation, line = sets(["env=code_exec"])
    assert len(train) == 256 and evaluation == [] and line == ""


def test_held_out_drops_same_ids_and_same_prompts():
    tasks = [Task(id=str(i), data={"prompt": f"q{i % 3}"}) for i in range(6)]
    assert [t.id for t in held_out(tasks, [Task(id="4", data={"prompt": "other"})])] == [
        "0", "1", "2", "3", "5"
    ]  # fmt: skip
    assert [t.id for t in held_out(tasks, [Task(id="x", data={"prompt": "q1"})])] == [
        "0", "2", "3", "5"
    ]  # fmt: skip
    no_prompt = [Task(id="a", data={"x": 1}), Task(id="b", data={"x": 2})]
    assert held_out(no_prompt, [Task(id="c", data={"x": 1})]) == no_prompt[1:]


def test_an_evaluation_that_leaves_nothing_to_train_on_is_a_config_error():
    tasks = [Task(id=str(i), data={"prompt": f"q{i}"}) for i in range(10)]
    with pytest.raises(ConfigError, match=r"leaving none to train on.*trainer.eval.split=shared"):
        eval_task_sets(tasks, None, 32, 0, "heldout")
    train, evaluation, _ = eval_task_sets(tasks, None, 32, 0, "shared")
    assert train == tasks and len(evaluation) == 10


# -- start-up errors of the chat template ------------------------------------------------------

TINY = resolve_builtin("tiny")
# a template whose thinking mode (on unless enable_thinking=false) leaves an assistant turn open
THINKING = (
    "{%- set thinking = enable_thinking is not defined or enable_thinking -%}"
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content }}"
    "{%- if m.role == 'assistant' and thinking %}{{ '<think>\\n' }}"
    "{%- else %}{{ '<|im_end|>\\n' }}{% endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif -%}"
)
NO_TOOLS = ["env=custom", "env._target_=agentrl.envs.synthetic.FixedLengthEnv"]


def test_an_eos_that_is_not_the_turn_end_names_the_setting_that_fixes_it(tmp_path):
    tok = AutoTokenizer.from_pretrained(TINY, eos_token="<|endoftext|>")
    with pytest.raises(RenderError) as e:
        Renderer(tok)
    msg = str(e.value)
    assert "'<|endoftext|>'" in msg and "it ends one with '<|im_end|>'" in msg
    assert "set rollout.end_of_turn='<|im_end|>'" in msg
    cfg = compose([*NO_TOOLS, "rollout.end_of_turn='<|im_end|>'"])  # the advice, followed
    prepare_rollout(tok, cfg.env.load_class(), cfg)
    assert Renderer(tok, end_of_turn=cfg.rollout.end_of_turn).eot == "<|im_end|>"


def test_a_template_that_cannot_work_is_one_line_at_the_door(capsys, monkeypatch):
    monkeypatch.delenv("AGENTRL_DEBUG", raising=False)
    cfg = compose(NO_TOOLS)
    tok = AutoTokenizer.from_pretrained(TINY, eos_token="<|endoftext|>")
    with pytest.raises(SystemExit) as e, errors_for_people():
        prepare_rollout(tok, cfg.env.load_class(), cfg)
    assert e.value.code == 2
    first, *rest = capsys.readouterr().err.splitlines()
    assert first.startswith("error: model.path=builtin:tiny: the chat template does not end")
    assert rest == ["(AGENTRL_DEBUG=1 shows the traceback)"]
    assert "enable_thinking" not in first  # thinking off does not help this one


def test_a_template_that_fails_only_in_thinking_mode_names_the_kwarg_that_works():
    tok = AutoTokenizer.from_pretrained(TINY)
    tok.chat_template = THINKING
    cfg = compose(NO_TOOLS)
    works = r"works only with its thinking mode off: set rollout\.template_kwargs\.enable_"
    with pytest.raises(ConfigError, match=works + "thinking=false"):
        prepare_rollout(tok, cfg.env.load_class(), cfg)
    off = compose([*NO_TOOLS, "rollout.template_kwargs.enable_thinking=false"])
    prepare_rollout(tok, off.env.load_class(), off)  # the advice, followed: no error


def test_a_turn_end_that_is_not_eos_is_sent_as_a_stop_token():
    from agentrl.rollout import Rollout, RolloutConfig

    tok = AutoTokenizer.from_pretrained(TINY, eos_token="<|endoftext|>")
    cfg = compose(NO_TOOLS)
    rc = RolloutConfig(end_of_turn="<|im_end|>")
    ro = Rollout(None, tok, cfg.env.load_class(), rc)
    assert ro._params(1000).stop_token_ids == [tok.convert_tokens_to_ids("<|im_end|>")]
    plain = Rollout(
        None, AutoTokenizer.from_pretrained(TINY), cfg.env.load_class(), RolloutConfig()
    )
    assert plain._params(1000).stop_token_ids == []
