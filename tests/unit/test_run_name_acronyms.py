"""The default run name is the env class's name in snake case, acronyms kept whole: `KVEnv` made
runs/k_v/ and `HTTPFetchEnv` runs/h_t_t_p_fetch/."""

from agentrl.config import run_name


def test_the_default_run_name_keeps_acronyms_whole():
    cases = {
        "my_env:KVEnv": "kv",
        "my_env:HTTPFetchEnv": "http_fetch",
        "agentrl.envs.code_exec:CodeExecEnv": "code_exec",
        "my_env.MyEnv2": "my_env2",
        "my_env.GSM8KEnv": "gsm8k",
        "my_env.Math500Env": "math500",
        "agentrl.envs.examples.agent_sdk.AddAgentSDK": "add_agent_sdk",
        "my_env.XMLParseEnv": "xml_parse",
        "my_env.Tool2CallEnv": "tool2_call",
        "my_env.SweEnv": "swe",
        "my_env.Env": "default",
    }
    assert {target: run_name("", target) for target in cases} == cases


def test_a_given_run_name_is_kept_as_written():
    assert run_name("KV-exp1", "my_env:HTTPFetchEnv") == "KV-exp1"
