"""Tensor.dtype is a numpy.dtype; Python conversions behave as NumPy's."""

import operator

import numpy as np
import pytest

import everyo as eo


def test_dtype_is_a_numpy_dtype_equal_to_its_name():
    t = eo.ones(2, 3)
    assert isinstance(t.dtype, np.dtype)
    assert t.dtype == np.float32 and t.dtype == "float32" and t.dtype == np.dtype("float32")
    assert str(t.dtype) == "float32" and f"{t.dtype}" == "float32" and t.dtype.itemsize == 4
    assert eo.tensor(np.arange(3)).dtype.kind == "i"
    assert "dtype=float32" in repr(t)


def test_python_values():
    assert float(eo.tensor(2.5)) == 2.5 and int(eo.tensor(np.array(7))) == 7
    assert operator.index(eo.tensor(np.array(3))) == 3 and [10, 20, 30, 40][eo.tensor(np.array(2))] == 30
    with pytest.raises(TypeError):
        operator.index(eo.tensor(2.5))  # as NumPy: only integers index
    assert eo.tensor([[1.0, 2.0]]).tolist() == [[1.0, 2.0]] and isinstance(eo.tensor([1.0]).item(), float)
    with pytest.raises(ValueError):
        eo.tensor([1.0, 2.0]).item()
    assert bool(eo.tensor(np.float32(0.5))) and not bool(eo.tensor([0.0]))
