import math

import pytest

from slime_envs.calculator import CalculatorEnv, safe_eval


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("2 * (3 + 4) ** 2", 98),
        ("7 // 2 + 7 % 2", 4),
        ("-3 + +2", -1),
        ("sqrt(16) + abs(-2)", 6.0),
        ("max(1, 5, 3) - min(4, 2)", 3),
        ("round(2 * pi, 3)", 6.283),
        ("factorial(5) / 4", 30.0),
        ("1.5e2", 150.0),
        ("round(12345, -2) + round(1.5, -10000)", 12300),  # up to the limit: rounded as before
        ("(-8) ** 2 + 8 ** (1 / 3)", 66.0),
    ],
)
def test_safe_eval_values(expr, value):
    assert safe_eval(expr) == pytest.approx(value, abs=1e-12)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("__import__('os').system('true')", "unsupported"),
        ("(1).__class__", "unsupported"),
        ("'a' * 3", "unsupported"),
        ("x + 1", "unsupported"),
        ("1 / 0", "ZeroDivisionError"),
        ("2 ** 100000", "exponent"),
        ("factorial(5000)", "factorial"),
        ("sqrt(-1)", "math domain error"),
        ("1 +", "syntax error"),
        ("1" * 2000, "longer than"),
        ("round(1.234, ndigits=1)", "keyword"),
        # Found in round 12: round(5, -10**9) builds 10**(10**9) (minutes on the rollout loop; -20000 is quick).
        ("round(5, -20000)", r"round\(\) digits -20000 are too many \(limit 10000\)"),
        # A power with no real value was answered as Python's complex number "(1.7e-16+2.8j)".
        ("(-8) ** 0.5", r"-8 \*\* 0.5 has no real value"),
        ("abs((-1) ** 0.5)", "has no real value"),
    ],
)
def test_safe_eval_rejects(expr, message):
    with pytest.raises(ValueError, match=message):
        safe_eval(expr)


async def test_calculator_env_steps():
    env = CalculatorEnv(max_tool_calls=2)
    env.reset(prompt="p", label="42", metadata={})
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    step = await env.step(call)
    assert not step.done and step.tool_responses == ["42"]
    step = await env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "x"}}</tool_call>')
    assert step.tool_responses[0].startswith("Error: unsupported expression element")
    step = await env.step(call)
    assert step.tool_responses == ["Error: the tool-call limit (2) is reached; give your final answer."]
    env.reset(prompt="p", label="42", metadata={})  # a new episode resets the call count
    step = await env.step('<tool_call>{"name": "calc", "arguments": {}}</tool_call>')
    assert step.tool_responses == ["Error: unknown tool 'calc'. Available tools: calculator."]
    step = await env.step('<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>')
    assert step.tool_responses[0].startswith("Error: bad arguments for tool 'calculator'")
    step = await env.step("The answer is 42.")
    assert step.done and step.reward is None and step.observation == ""
    assert math.isclose(safe_eval("e"), math.e)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "expr, bits",
    [
        ("(9**9999)**9999", (9**9999).bit_length() * 9999),  # nested exponents: minutes on the rollout loop
        ("factorial(1000)**9999", math.factorial(1000).bit_length() * 9999),
        ("((2**9999)**5)*((2**9999)**6)", (2**49995).bit_length() + (2**59994).bit_length()),
    ],
)
def test_integer_results_are_bounded_before_they_are_computed(expr, bits):
    with pytest.raises(ValueError, match=f"the result would have about {bits:,} bits") as raised:
        safe_eval(expr)
    assert "(limit 100,000)" in str(raised.value)


def test_results_within_the_bound_are_exact():
    assert safe_eval("(2**9999)*(2**9999)") == 2**19998
    assert safe_eval("(3**20)**500") == 3**10000
    assert safe_eval("2**-3") == 0.125  # a negative exponent is a float, not a size


async def test_an_integer_result_longer_than_python_prints_is_one_clear_error():
    # 9**9999 (9,542 digits) is within the 100,000-bit bound, but str() of an int past Python's 4,300-digit limit
    # raises: the model was told "Exceeds the limit (4300 digits) for integer string conversion; use
    # sys.set_int_max_str_digits() to increase the limit", advice about the tool's own interpreter.
    env = CalculatorEnv()
    env.reset(prompt="p", label="1", metadata={})
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'
    step = await env.step(call % "9**9999")
    assert step.tool_responses == ["Error: the result has more than 4300 digits (limit 4300)"]
    step = await env.step(call % "10**4299")  # 4,300 digits: printed whole
    assert step.tool_responses == ["1" + "0" * 4299]


def test_nesting_past_the_recursion_limit_is_a_value_error():
    # It parses, then the walk raised RecursionError, which safe_eval's callers do not expect.
    with pytest.raises(ValueError, match="nested too deeply"):
        safe_eval("-" * 999 + "1")
