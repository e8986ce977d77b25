"""everyo.onnx.registry: one table for every rule module, and no silent second rule for an op."""

import pytest

from everyo.onnx.registry import RULES, rule
from everyo.onnx.rules import RULES as EXPORTED


def test_every_rule_module_registers_into_the_one_table():
    assert EXPORTED is RULES
    # one op from each rule module, including those registered in loops or by factories
    for op in (
        "matmul",
        "max_pool2d",
        "avg_pool2d",
        "mse_loss",
        "cross_entropy",
        "lstm_scan",
        "gru_scan",
        "argmax",
        "argmin",
        "take_along_axis",
        "gelu",
    ):
        assert op in RULES, op


def test_a_second_rule_for_an_op_is_an_error_naming_both_modules():
    def again(translator, node):
        return None

    with pytest.raises(ValueError, match=r"two ONNX rules for op 'max_pool2d': everyo\.onnx\.rules and "):
        rule("max_pool2d")(again)
    assert RULES["max_pool2d"] is not again
