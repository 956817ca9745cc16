"""Tool-call forms from the hidden parser corpora (issue 37, item 9) and SGLang's detectors
(llama32_detector.py, qwen3_coder_detector.py) as the behavioural reference: each case is a turn a
model really writes, and what must run (or what the model must read)."""

import json

import pytest
from pydantic import BaseModel

from agentrl.parsers import ParseErrorKind, get_parser


class CodeArgs(BaseModel):
    code: str


class SearchArgs(BaseModel):
    query: str


TOOLS = {"python": CodeArgs}
QWEN = get_parser("qwen3_coder")
LLAMA = get_parser("llama3_json")


def xml(code: str, close_param: bool = True) -> str:
    end = "\n</parameter>" if close_param else ""
    return (
        f"<tool_call>\n<function=python>\n<parameter=code>\n{code}{end}\n</function>\n</tool_call>"
    )


def ran(res) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in res.tool_calls]


# -- qwen3_coder ----------------------------------------------------------------------------------

QWEN_CODES = [
    's = "</parameter>"\nprint(s)',  # the tag inside code: the whole code runs
    'print("</parameter>\\n<parameter=x>")',
    "html = '</function></tool_call>'\nprint(len(html))",
    "print(1)\n</parameter>\nprint(2)",  # a close tag on its own line, code goes on
]


@pytest.mark.parametrize("code", QWEN_CODES)
def test_qwen3_coder_tags_inside_code_run_the_whole_code(code):
    res = QWEN.parse("Run it.\n" + xml(code) + "\nDone.", TOOLS)
    assert ran(res) == [("python", {"code": code})] and not res.errors
    assert res.content == "Run it.\n\nDone."


def test_qwen3_coder_missing_parameter_close_reads_to_the_function_end():
    res = QWEN.parse(xml("print(1)", close_param=False), TOOLS)
    assert ran(res) == [("python", {"code": "print(1)"})] and not res.errors  # not "Field required"


def test_qwen3_coder_missing_parameter_close_before_the_next_parameter():
    class Two(BaseModel):
        code: str
        n: int

    text = (
        "<tool_call>\n<function=python>\n<parameter=code>\nprint(1)\n<parameter=n>\n3\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    res = QWEN.parse(text, {"python": Two})
    assert ran(res) == [("python", {"code": "print(1)", "n": 3})] and not res.errors


def test_qwen3_coder_two_calls_each_with_a_tag_in_code():
    a, b = 'print("</parameter>")', "x = '</tool_call>'"
    res = QWEN.parse(xml(a) + "\n" + xml(b), TOOLS)
    assert ran(res) == [("python", {"code": a}), ("python", {"code": b})]


def test_qwen3_coder_unclosed_call_is_still_an_error():
    text = "<tool_call>\n<function=python>\n<parameter=code>\nprint(1)\n</parameter>\n"
    assert QWEN.parse(text, TOOLS, truncated=True).errors[0].kind is ParseErrorKind.TRUNCATED
    assert QWEN.parse(text, TOOLS).errors[0].kind is ParseErrorKind.UNCLOSED_TAG
    assert not QWEN.parse(text, TOOLS).tool_calls


# -- llama3_json ----------------------------------------------------------------------------------


def j(code: str, key: str = "parameters") -> str:
    return json.dumps({"name": "python", key: {"code": code}})


@pytest.mark.parametrize(
    "text",
    [
        j("1") + "\n" + j("2"),  # newline-separated
        j("1") + "\n\n" + j("2"),
        "<|python_tag|>" + j("1") + "\n" + j("2"),
        j("1") + "; " + j("2"),  # the ';' separator SGLang writes
        j("1") + ";\n" + j("2") + ";",  # a trailing separator
        "[" + j("1") + ", " + j("2") + "]",  # a JSON array of calls
        "<|python_tag|>[" + j("1") + ",\n" + j("2", "arguments") + "]",
        "[" + j("1") + "]\n" + j("2"),
    ],
)
def test_llama_several_calls_all_run_without_an_error(text):
    res = LLAMA.parse(text, TOOLS)
    assert ran(res) == [("python", {"code": "1"}), ("python", {"code": "2"})]
    assert not res.errors and res.content == ""
    assert len({c.id for c in res.tool_calls}) == 2


@pytest.mark.parametrize("end", ["<|eom_id|>", "<|eot_id|>", "\n<|eom_id|>"])
def test_llama_turn_end_markers_are_not_text_after_the_call(end):
    res = LLAMA.parse("<|python_tag|>" + j("print(1)") + end, TOOLS)
    assert ran(res) == [("python", {"code": "print(1)"})] and not res.errors


def test_llama_prose_before_the_python_tag_is_content():
    res = LLAMA.parse("Let me check.\n<|python_tag|>" + j("print(1)"), TOOLS)
    assert res.content == "Let me check." and ran(res) == [("python", {"code": "print(1)"})]


def test_llama_text_after_a_call_is_still_an_error_the_model_reads():
    res = LLAMA.parse(j("1") + "\nThe answer is 4.", TOOLS)
    assert ran(res) == [("python", {"code": "1"})]
    assert [e.kind for e in res.errors] == [ParseErrorKind.BAD_JSON]
    assert "text after the tool call" in res.errors[0].message


@pytest.mark.parametrize("text", ["[1, 2, 3]", "[]", '["a"]', "The list is [1]."])
def test_llama_plain_lists_stay_answers(text):
    res = LLAMA.parse(text, TOOLS)
    assert res.content == text and not res.tool_calls and not res.errors


def test_llama_array_of_non_calls_is_a_parse_error():
    res = LLAMA.parse('[{"name": "python"}, 3]', TOOLS)
    assert not res.tool_calls and res.errors and not any(e.is_call_error for e in res.errors[1:])


@pytest.mark.parametrize("code", ["print(1)", "import math\nprint(math.pi)", "x = {'a': 1}\nx"])
def test_llama_python_tag_code_is_the_interpreter_mapped_to_the_python_tool(code):
    for end in ("", "<|eom_id|>"):
        res = LLAMA.parse("<|python_tag|>" + code + end, TOOLS)
        assert ran(res) == [("python", {"code": code})] and not res.errors


def test_llama_python_tag_code_without_a_python_tool_is_an_error_not_an_answer():
    res = LLAMA.parse("<|python_tag|>print(1)<|eom_id|>", {"search": SearchArgs})
    assert not res.tool_calls and res.content == ""
    (err,) = res.errors
    assert err.kind is ParseErrorKind.NOT_A_CALL and not err.is_call_error
    assert "code interpreter" in err.message and "search" in err.message


def test_llama_interpreter_maps_to_the_one_string_field_of_a_code_interpreter_tool():
    class Src(BaseModel):
        source: str
        timeout: int = 5

    res = LLAMA.parse("<|python_tag|>print(1)", {"code_interpreter": Src})
    assert ran(res) == [("code_interpreter", {"source": "print(1)"})]


def test_llama_cut_interpreter_code_never_runs():
    res = LLAMA.parse("<|python_tag|>for i in range(", TOOLS, truncated=True)
    assert not res.tool_calls and res.errors[0].kind is ParseErrorKind.TRUNCATED


def test_llama_builtin_tool_calls():
    text = '<|python_tag|>brave_search.call(query="weather in Paris")<|eom_id|>'
    res = LLAMA.parse(text, {"brave_search": SearchArgs, **TOOLS})
    assert ran(res) == [("brave_search", {"query": "weather in Paris"})]
    missing = LLAMA.parse(text, TOOLS)
    assert not missing.tool_calls and missing.errors[0].kind is ParseErrorKind.UNKNOWN_TOOL
    assert "brave_search" in missing.errors[0].message


def test_llama_empty_python_tag_is_an_error():
    res = LLAMA.parse("<|python_tag|><|eom_id|>", TOOLS)
    assert not res.tool_calls and res.errors[0].kind is ParseErrorKind.NOT_A_CALL


def test_parse_turn_holds_a_turn_to_the_template_limit():
    one = get_parser("llama3_json", max_calls=1)
    res = one.parse_turn(j("1") + "; " + j("2"), TOOLS)
    assert not res.tool_calls
    (err,) = res.errors
    assert err.kind is ParseErrorKind.TOO_MANY_CALLS and not err.is_call_error
    assert "allows 1 tool call per turn" in err.message
    assert ran(one.parse_turn(j("1"), TOOLS)) == [("python", {"code": "1"})]
    assert len(LLAMA.parse_turn(j("1") + "; " + j("2"), TOOLS).tool_calls) == 2  # no limit
