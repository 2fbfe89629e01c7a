"""tghost-calculator: the safe evaluator, then both tools over a real embedded broker, then discovery."""

from __future__ import annotations

import math

import pytest
from tghost_calculator import MAX_DEPTH, MAX_LENGTH, calculate, evaluate, solve_steps

import tghost
from tghost import ToolCallError, discover
from tghost.protocol import encode_request
from tghost.testing import EmbeddedBroker, LocalHost, RawWire


@pytest.mark.parametrize(
    ("expression", "value"),
    [("2 + 3 * 4", 14), ("(2 + 3) * 4", 20), ("2 ** 3 ** 2", 512), ("10 - 4 - 3", 3), ("7 // 2", 3),
     ("7 % 3", 1), ("-7 // 2", -4), ("2 * (3 + 4)", 14)],
)
def test_evaluate_follows_python_precedence_and_associativity(expression: str, value: int) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "value"),
    [("-3", -3), ("- -3", 3), ("-(3 - 5)", 2), ("+4", 4), ("-2 ** 2", -4), ("(-2) ** 2", 4), ("2 * -3", -6)],
)
def test_unary_minus_binds_looser_than_power_and_tighter_than_product(expression: str, value: int) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "text"),
    [("2 * (3 + 4)", "14"), ("1 / 2", "0.5"), ("7 / 2", "3.5"), ("4 / 2", "2.0"), ("2 ** 100", str(2**100)),
     ("0.1 + 0.2", "0.30000000000000004"), ("round(2.7)", "3"), ("abs(-3)", "3"), ("sqrt(16)", "4.0"),
     ("2 ** -1", "0.5"), ("0 * -1.0", "0.0")],
)
def test_calculate_keeps_ints_exact_and_floats_as_floats(expression: str, text: str) -> None:
    assert calculate(expression) == text


def test_named_constants_and_functions_come_from_math() -> None:
    assert evaluate("2 * pi") == 2 * math.pi
    assert evaluate("e ** 1") == math.e
    assert (evaluate("floor(-2.5)"), evaluate("ceil(2.1)")) == (-3, 3)


@pytest.mark.parametrize(
    ("expression", "culprit"),
    [("__import__('os').system('ls')", "call"), ("x + 1", "name 'x'"), ("'a' * 3", "constant"),
     ("True + 1", "constant 'True'"), ("1 < 2", "comparison '1 < 2'"), ("[1, 2]", "list"),
     ("(1).real", "attribute"), ("(lambda: 1)()", "call"), ("1j * 2", "constant '1j'"),
     ("1 if 1 else 2", "ifexp"), ("sqrt(x=4)", "call 'sqrt(x=4)'"), ("sqrt(1, 2)", "call 'sqrt(1, 2)'"),
     ("open('f')", "call \"open('f')\""), ("1 << 2", "operator '1 << 2'"), ("not 1", "operator 'not 1'"),
     ("sqrt", "name 'sqrt'"), ("(1, 2)", "tuple")],
)
def test_anything_outside_the_whitelist_is_refused_by_name(expression: str, culprit: str) -> None:
    with pytest.raises(tghost.InvalidArguments) as info:
        evaluate(expression)
    assert info.value.error_type == "invalid-arguments"
    assert culprit in str(info.value) and "is not allowed" in str(info.value)


@pytest.mark.parametrize("expression", ["1 / 0", "1 // 0", "1 % 0", "0 ** -1", "1.5 / (2 - 2)"])
def test_division_by_zero_is_invalid_arguments(expression: str) -> None:
    with pytest.raises(tghost.InvalidArguments, match="division by zero"):
        evaluate(expression)


def test_a_huge_power_is_refused_before_it_is_computed() -> None:
    with pytest.raises(tghost.InvalidArguments, match=r"9 \*\* 387420489 would have about [\d,]+ digits"):
        evaluate("9 ** 9 ** 9")


@pytest.mark.parametrize(
    ("expression", "message"),
    [("10 ** 999 * 10", "more than 1000 digits"), ("10.0 ** 400", "too large"), ("1e999", "too large"),
     ("2.0 ** 100000", "too large"), ("10 ** 999 / 3", "too large"), ("sqrt(-1)", "math domain error"),
     ("(-8) ** 0.5", "not a real number"), ("", "not an arithmetic expression"), ("1 +", "not an arithmetic")],
)
def test_results_too_large_or_not_real_and_syntax_errors_are_refused(expression: str, message: str) -> None:
    with pytest.raises(tghost.InvalidArguments, match=message):
        evaluate(expression)


def test_expressions_too_long_or_too_deep_are_refused_before_evaluation() -> None:
    with pytest.raises(tghost.InvalidArguments, match=f"the limit is {MAX_LENGTH}"):
        evaluate("1 + " * 300 + "1")
    with pytest.raises(tghost.InvalidArguments, match=f"the limit is {MAX_DEPTH}"):
        evaluate("-" * 999 + "1")
    assert evaluate("+".join(["1"] * 90)) == 90


@pytest.mark.parametrize(
    ("expression", "lines"),
    [("2 * (3 + 4)", ["2 * (3 + 4)\n", "= 2 * 7\n", "= 14\n"]),
     ("(1 + 2) * (10 - 4) / 4", ["(1 + 2) * (10 - 4) / 4\n", "= 3 * 6 / 4\n", "= 18 / 4\n", "= 4.5\n"]),
     ("(2 - 5) ** 2", ["(2 - 5) ** 2\n", "= (-3) ** 2\n", "= 9\n"]),
     ("sqrt(9) + pi * 0", ["sqrt(9) + pi * 0\n", f"= 3.0 + {math.pi} * 0\n", "= 3.0 + 0.0\n", "= 3.0\n"]),
     ("42", ["42\n"])],
)
def test_solve_steps_yields_one_line_per_step_innermost_first(expression: str, lines: list[str]) -> None:
    assert list(solve_steps(expression)) == lines


@pytest.mark.parametrize("expression", ["2 * (3 + 4)", "-(2 - 5) ** 2 / 3", "((1 + 2) * 3 - 4) // 2", "2 ** -2 * 8"])
def test_every_step_has_the_value_of_the_expression_and_the_last_is_the_answer(expression: str) -> None:
    first, *steps = list(solve_steps(expression))
    assert [evaluate(step.removeprefix("= ")) for step in steps] == [evaluate(first)] * len(steps)
    assert steps[-1] == f"= {calculate(expression)}\n"


def test_solve_steps_refuses_a_bad_expression_before_yielding_anything() -> None:
    steps = solve_steps("(1 + 2) * x")
    with pytest.raises(tghost.InvalidArguments, match="name 'x'"):
        next(steps)


async def test_calculate_over_pulsar(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [calculate]) as host:
        assert await host.call("calculator", {"expression": "2 * (3 + 4)"}) == "14"
        assert await host.call("calculator", {"expression": "1 / 2"}) == "0.5"


async def test_refusals_over_pulsar_are_invalid_arguments_errors(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [calculate]) as host:
        with pytest.raises(ToolCallError) as huge:
            await host.call("calculator", {"expression": "9 ** 9 ** 9"})
        with pytest.raises(ToolCallError) as missing:
            await host.call("calculator", {})
        with pytest.raises(ToolCallError) as unsafe:
            await host.call("calculator", {"expression": "__import__('os').getcwd()"})
    assert huge.value.error_type == "invalid-arguments" and "digits" in huge.value.message
    assert missing.value.error_type == "invalid-arguments" and "'expression'" in missing.value.message
    assert unsafe.value.error_type == "invalid-arguments" and "is not allowed" in unsafe.value.message


async def test_calculate_reply_on_the_wire_echoes_the_id_with_exactly_the_contract_fields(
    pulsar_broker: EmbeddedBroker,
) -> None:
    async with LocalHost(pulsar_broker.url, [calculate]), RawWire(pulsar_broker.url, calculate.descriptor) as raw:
        await raw.send(encode_request("alice", {}, {"expression": "6 * 7"}), {"id": "calc-1"})
        [(properties, body)] = await raw.replies("calc-1")
    assert properties["id"] == "calc-1"
    assert body == {"error": None, "response": "42", "end_of_stream": True}


async def test_solve_steps_streams_one_reply_per_line_then_an_empty_final_one(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [solve_steps]), RawWire(pulsar_broker.url, solve_steps.descriptor) as raw:
        await raw.send(encode_request("alice", {}, {"expression": "2 * (3 + 4)"}), {"id": "steps-1"})
        replies = await raw.replies("steps-1")
    assert all(properties["id"] == "steps-1" for properties, _ in replies)
    assert all(set(body) == {"error", "response", "end_of_stream"} for _, body in replies)
    assert [(body["response"], body["end_of_stream"]) for _, body in replies] == [
        ("2 * (3 + 4)\n", False), ("= 2 * 7\n", False), ("= 14\n", False), ("", True)
    ]
    assert all(body["error"] is None for _, body in replies)


async def test_solve_steps_over_pulsar_streams_the_same_lines_as_a_direct_call(pulsar_broker: EmbeddedBroker) -> None:
    expression = "((1 + 2) * 3 - 4) // 2"
    async with LocalHost(pulsar_broker.url, [solve_steps]) as host:
        chunks = [chunk async for chunk in host.stream("calculator-steps", {"expression": expression})]
    assert chunks == list(solve_steps(expression))


def test_installed_plugin_is_discovered_with_both_services_and_tools() -> None:
    catalog = discover(strict=False)
    assert catalog.descriptors["calculator"].request_queue == "non-persistent://tg/request/calculator"
    assert catalog.descriptors["calculator-steps"].response_queue == "non-persistent://tg/response/calculator-steps"
    calc, steps = catalog.tools["calculate"], catalog.tools["solve-steps"]
    assert (calc.service, calc.group, calc.state) == ("calculator", ("default", "compute"), "results")
    assert (steps.service, steps.group, steps.state) == ("calculator-steps", ("default", "compute"), None)
    assert calc.description.startswith("Evaluate an arithmetic expression")
    [argument] = calc.arguments
    assert (argument.name, argument.type) == ("expression", "string") and "2 * (3 + 4)" in argument.description
    assert {catalog.service_origin[s].name for s in ("calculator", "calculator-steps")} == {"calculator"}
