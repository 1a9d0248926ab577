"""Small pieces of the eval harness: stop strings, code extraction, a server's max_tokens error, the answer
picked from BFCL's possible answers, FIM middles, evenly spread subsets."""

from glmstack.eval.bfcl import ground_truth_calls, source_literal
from glmstack.eval.client import context_room, cut_at_stop, message_calls
from glmstack.eval.fim import middle_of, spread
from glmstack.eval.humaneval import chat_program, extract_code


def test_cut_at_stop_takes_the_first_stop():
    assert cut_at_stop("    return 1\ndef g():\nprint(2)", ["\nprint(", "\ndef "]) == "    return 1"
    assert cut_at_stop("abc", None) == "abc"


def test_code_from_chat_replies():
    problem = {"prompt": "import math\ndef f(x):\n    '''doc'''\n", "entry_point": "f"}
    reply = "Sure:\n```python\ndef f(x):\n    return math.sqrt(x)\n```\nDone."
    assert extract_code(reply) == "def f(x):\n    return math.sqrt(x)\n"
    assert chat_program(problem, reply).startswith("import math\n")  # the prompt's imports come first
    assert chat_program(problem, "```python\n    return 1\n") == problem["prompt"] + "    return 1\n"  # body only


def test_context_room_from_server_errors():
    serve = (
        "Error code: 400 - max_tokens = 512 is too large: the prompt has 155 tokens and the context is 256, leaving 101"
    )
    vllm = ("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
            "(3900 in the messages, 1100 in the completion).")  # fmt: skip
    assert context_room(serve) == 101
    assert context_room(vllm) == 196
    assert context_room("invalid tool_choice") is None


def test_message_calls_decode_json_arguments():
    msg = {"tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}, {"name": "g", "arguments": ""}]}
    assert message_calls(msg) == [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]


def test_ground_truth_pick():
    answers = [{"math.f": {"x": [3], "unit": ["", "cm"], "opt": ["", None], "must": [None], "d": [{"k": ["v", "w"]}]}}]
    assert ground_truth_calls(answers, []) == [
        {"name": "math_f", "arguments": {"x": 3, "unit": "cm", "must": None, "d": {"k": "v"}}}
    ]
    assert source_literal(True, {"type": "boolean"}, "java") == "true"
    assert source_literal(5, {"type": "long"}, "java") == "5L"
    assert source_literal(["a", "b"], {"type": "array", "items": {"type": "String"}}, "javascript") == '["a", "b"]'


def test_fim_middle_and_spread():
    assert middle_of("    x = 1\n    y = 2\n", "single-line") == "    x = 1\n"
    assert middle_of("    x = 1", "multi-line") == "    x = 1\n"
    assert spread(list(range(10)), 3) == [0, 3, 6] and spread([1, 2], None) == [1, 2]
