"""Config mistakes take one round trip (issue 38: 7): agentrl's own message, before Hydra's "use
`+`", with the closest name; and no key the docs show needs a `+`."""

from __future__ import annotations

import sys

import pytest

from agentrl.cli.overrides import check_argv
from agentrl.config import CONFIG_DIR, Config, check_command_line, compose
from agentrl.types import ConfigError


def test_a_misspelt_key_is_one_message_with_the_key_it_meant():
    with pytest.raises(ConfigError) as e:
        compose(["learner.lrr=1e-5", "rollout.max_turn=3", "lerner.lr=1"])
    msg = str(e.value)
    assert "learner.lrr: unknown key; did you mean learner.lr?" in msg
    assert "rollout.max_turn: unknown key; did you mean rollout.max_turns?" in msg
    assert "lerner.lr: unknown key; did you mean learner.lr?" in msg
    assert "+" not in msg  # never Hydra's "To append to your config use +…"
    with pytest.raises(ConfigError, match=r"learner\.lrr: unknown key; did you mean learner\.lr\?"):
        compose(["+learner.lrr=1e-5"])  # added on purpose (or written in a YAML file): validation


def test_an_env_attribute_set_on_env_itself_names_env_args():
    """env.system_prompt=… (an attribute of the user's Env class) listed only env's own keys."""
    with pytest.raises(ConfigError, match=r"env\.system_prompt: unknown key; an attribute of the "
                       r"Env class is env\.args\.system_prompt, an option of its load_tasks "
                       r"env\.tasks\.system_prompt"):  # fmt: skip
        compose(["env=code_exec", "env.system_prompt=hi"])
    with pytest.raises(ConfigError, match=r"is env\.envs\.units\.args\.max_turns, an option"):
        compose(["env=mixture", "env.envs.units.max_turns=2"])


def test_a_misspelt_env_option_names_the_one_it_meant():
    cfg = compose(["env=code_exec", "env.tasks.sed=1", "env.args.max_turn=3"])
    with pytest.raises(ConfigError, match=r"CodeExecEnv has no attribute 'max_turn'; did you mean "
                       r"env\.args\.max_turns\?"):  # fmt: skip
        cfg.env.load_class()
    env_cls = compose(["env=code_exec"]).env.load_class()
    with pytest.raises(ConfigError, match=r"env\.tasks\.sed: unknown option of CodeExecEnv\."
                       r"load_tasks; did you mean env\.tasks\.seed\?"):  # fmt: skip
        cfg.env.load_tasks(env_cls)


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("env.args.max_turns=four", "env.args.max_turns='four': Input should be a valid integer"),
        (
            "env.args.max_turns=0",
            "env.args.max_turns=0: Input should be greater than or equal to 1",
        ),
        ("env.args.system_prompt=5", "env.args.system_prompt=5: Input should be a valid string"),
        ("env.args.format_reward=x", "env.args.format_reward='x': Input should be a valid number"),
    ],
)
def test_a_wrong_env_setting_fails_at_the_start_by_name(arg, says):
    """A new user's try: these used to start the servers and abort every episode (four, 5), or
    run one empty step and end with rc=0 (0). The attribute's annotation, else its default's
    type, checks the value when the class loads."""
    with pytest.raises(ConfigError) as e:
        compose(["env=code_exec", arg]).env.load_class()
    assert says in str(e.value)
    assert compose(["env=code_exec", "env.args.max_turns=3"]).env.load_class()


def test_a_top_level_typo_names_the_key_one_level_down_and_load_tasks_errors_are_config_errors():
    """A new user's tries: `steps=3` listed the config's keys, twice each, and named none;
    a ValueError of load_tasks (an unknown task kind) came out as Hydra's raw traceback."""
    for typo, meant in (
        ("steps", "trainer.steps"),
        ("stepz", "trainer.steps"),
        ("lr", "learner.lr"),
    ):
        with pytest.raises(ConfigError, match=rf"{typo}: unknown key; did you mean {meant}\?"):
            compose([f"{typo}=3"])
    with pytest.raises(ConfigError) as e:
        compose(["xyzzy=1"])
    assert str(e.value).count("trainer") == 1  # each key once
    cfg = compose(["env=code_exec", "env.tasks.kinds=[arith,foo]"])
    with pytest.raises(ConfigError, match=r"env\.tasks: CodeExecEnv\.load_tasks: .*foo"):
        cfg.env.load_tasks(cfg.env.load_class())


def test_a_misspelt_group_option_lists_the_choices():
    with pytest.raises(ConfigError) as e:
        compose(["env=code_exex"])
    assert "did you mean env=code_exec?" in str(e.value)
    assert "(choices: code_exec, code_exec_turns, custom," in str(e.value)


def test_keys_inside_dict_settings_need_no_plus():
    cfg = compose([
        "env=units", "env.args.max_turns=3", "env.eval_tasks.seed=1",
        "rollout.template_kwargs.enable_thinking=false", "engine.ray_resources={rollout: 1}",
    ])  # fmt: skip
    assert cfg.env.args == {"max_turns": 3} and cfg.env.eval_tasks == {"seed": 1}
    assert cfg.rollout.template_kwargs == {"enable_thinking": False}
    assert cfg.engine.ray_resources == {"rollout": 1.0}
    env_cls = cfg.env.load_class()
    assert cfg.env.load_tasks(env_cls, evaluation=True) != cfg.env.load_tasks(env_cls)


def test_the_command_line_keeps_its_flags_and_user_config_dirs_keep_their_groups():
    argv = ["--cfg", "job", "learner.lr=1e-5", "+x=1", "hydra.run.dir=/tmp/r", "env=units", "-m"]
    assert check_argv(argv, Config, CONFIG_DIR) == [
        "--cfg", "job", "++learner.lr=1e-5", "+x=1", "hydra.run.dir=/tmp/r", "env=units", "-m",
    ]  # fmt: skip
    # with a config dir of the user's, `mine=a` may be their group and env=mine their file
    argv = ["-cd", "/tmp/conf", "mine=a", "env=mine", "learner.lr=1"]
    assert check_argv(argv, Config, CONFIG_DIR) == [*argv[:4], "++learner.lr=1"]


def test_train_and_preview_print_the_message_and_exit_2(monkeypatch, capsys):
    monkeypatch.delenv("AGENTRL_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["agentrl train", "learner.lrr=1e-5", "env=code_exex"])
    with pytest.raises(SystemExit) as e:
        check_command_line()  # what both mains run before Hydra reads sys.argv
    err = capsys.readouterr().err
    assert e.value.code == 2 and "did you mean learner.lr?" in err and "env=code_exec?" in err
    monkeypatch.setattr(sys, "argv", ["agentrl train", "env.args.max_turns=3"])
    check_command_line()
    assert sys.argv == ["agentrl train", "++env.args.max_turns=3"]


@pytest.mark.parametrize(("text", "read_as"), [("nan", "a number (nan)"),
                         ("1e3", "a number (1000.0)"), ("true", "a bool (True)"), ("null", "None")])  # fmt: skip
def test_a_run_name_hydra_reads_as_no_text_is_refused_before_it_names_a_directory(text, read_as):
    """An audit: `run_name=1e3` made runs/1000.0/ (Hydra names the directory first), then
    failed validation with "Input should be a valid string". The text is lost by then (1e3 is
    1000.0), so the command line is refused with the quoted form; quoted, the name is kept."""
    with pytest.raises(ConfigError) as e:
        check_argv([f"run_name={text}"], Config, CONFIG_DIR)
    assert str(e.value) == (
        f"invalid override:\n  run_name={text}: Hydra reads {text} as {read_as}, and run_name "
        f"takes text: quote it, run_name=\"'{text}'\" (the shell keeps the inner quotes)"
    )
    assert compose([f"run_name='{text}'"]).run_name == text
    assert compose(["model.tokenizer=null"]).model.tokenizer is None  # str | None takes null


def test_a_run_name_yaml_reads_as_no_text_is_refused_with_the_quoted_form():
    from agentrl.config import validate

    with pytest.raises(ConfigError, match=r"run_name: a float, not text: .* run_name: '1e3'"):
        validate({"env": {"_target_": "agentrl.envs.code_exec:CodeExecEnv"}, "run_name": 1000.0})


def test_a_run_name_yaml_reads_as_no_text_names_no_directory_after_its_lost_text():
    """Hydra names the run's directory (`${agentrl_run_name:...}`) before validation refuses the
    name: a float 1000.0 made runs/1000.0/; now it falls back like any invalid name."""
    from agentrl.config import _safe_run_name

    assert _safe_run_name(1000.0, "agentrl.envs.code_exec:CodeExecEnv") == "default"
    assert _safe_run_name(True, "x") == "default"
    assert _safe_run_name(None, "agentrl.envs.code_exec:CodeExecEnv") == "code_exec"
    assert _safe_run_name("mine", "x") == "mine"


def test_a_value_with_letters_outside_ascii_is_told_to_be_quoted(tmp_path):
    """Found by a red-team pass: `env.tasks.path=tâches.jsonl` was Hydra's lexer error (a caret
    under the letter and a link), not how to write it."""
    with pytest.raises(ConfigError, match=r"env\.tasks\.path=tâches\.jsonl: Hydra reads a value "
                       r"with letters outside ASCII only in quotes: write "
                       r"env\.tasks\.path='tâches\.jsonl' \(on the shell's command line: "
                       "\"env\\.tasks\\.path='tâches\\.jsonl'\"\\)"):  # fmt: skip
        compose(["env.tasks.path=tâches.jsonl"])
    (tmp_path / "tâches a.jsonl").write_text('{"id": "a", "prompt": "p", "answer": "1"}\n')
    quoted = compose([f"env.tasks.path='{tmp_path}/tâches a.jsonl'"])
    assert quoted.env.tasks["path"] == f"{tmp_path}/tâches a.jsonl"
