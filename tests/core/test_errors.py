"""Bad input raises the specific error, with a message that helps."""

import numpy as np
import pytest

import everyo as eo


def test_error_hierarchy():
    for cls in (
        eo.EveryOShapeError,
        eo.EveryODTypeError,
        eo.EveryOStateDictError,
        eo.EveryOIndexError,
        eo.EveryOSerializationError,
        eo.EveryODistributedError,
    ):
        assert issubclass(cls, eo.EveryOError)
    assert issubclass(eo.EveryOShapeError, ValueError) and issubclass(eo.EveryODTypeError, TypeError)


def test_wrong_feature_size_names_layer_and_shapes():
    with pytest.raises(eo.EveryOShapeError, match=r"Linear\(8, 4\) expected input with last dimension 8.*\(3, 5\)"):
        eo.Linear(8, 4, seed=0)(eo.ones(3, 5))


def test_sequential_names_the_position_even_when_nested():
    model = eo.Sequential(eo.Linear(8, 4, seed=0), eo.Sequential(eo.ReLU(), eo.Linear(5, 1, seed=1)))
    with pytest.raises(eo.EveryOShapeError, match=r"layer \[1\]\[1\] of Sequential: Linear\(5, 1\).*\(3, 4\)"):
        model(eo.ones(3, 8))


def test_wrong_rank_for_conv_and_pooling():
    with pytest.raises(eo.EveryOShapeError, match=r"Conv2D.*rank-4 NHWC input, got shape \(8, 8, 1\) \(rank 3\)"):
        eo.Conv2D(1, 2, 3)(eo.ones(8, 8, 1))
    with pytest.raises(eo.EveryOShapeError, match=r"last dimension 3"):
        eo.Conv2D(3, 2, 3)(eo.ones(1, 8, 8, 1))
    with pytest.raises(eo.EveryOShapeError, match="rank-4"):
        eo.MaxPool2D(2)(eo.ones(4, 4))
    with pytest.raises(eo.EveryOShapeError, match="rank-2 or 3"):
        eo.BatchNorm1D(3)(eo.ones(2, 2, 2, 3))
    with pytest.raises(eo.EveryOShapeError, match=r"last 1 dimension\(s\) are \(4,\)"):
        eo.LayerNorm(4)(eo.ones(2, 3))


def test_non_float_input_to_a_layer():
    with pytest.raises(eo.EveryODTypeError, match="int64.*floating-point"):
        eo.Linear(2, 2)(eo.tensor(np.array([[1, 2]])))


def test_window_larger_than_input():
    with pytest.raises(ValueError, match="does not fit"):
        eo.Conv2D(1, 1, 5)(eo.ones(1, 3, 3, 1))


def test_state_dict_missing_extra_and_misshaped_keys_leave_model_untouched():
    model = eo.Sequential(eo.Linear(3, 2, seed=0))
    before = {k: v.copy() for k, v in model.state_dict().items()}
    good = model.state_dict()
    missing = {"0.weight": good["0.weight"]}
    with pytest.raises(eo.EveryOStateDictError, match=r"missing keys \['0.bias'\]"):
        model.load_state_dict(missing)
    extra = dict(good, **{"1.weight": np.ones(2)})
    with pytest.raises(eo.EveryOStateDictError, match=r"unexpected keys \['1.weight'\]"):
        model.load_state_dict(extra)
    wrong = {"0.weight": np.zeros((2, 3)), "0.bias": np.zeros(2)}
    with pytest.raises(eo.EveryOStateDictError, match=r"0.weight: model has \(3, 2\), state dict has \(2, 3\)"):
        model.load_state_dict(wrong)
    for k, v in model.state_dict().items():
        assert np.array_equal(v, before[k])
    model.load_state_dict({"0.weight": np.zeros((3, 2))}, strict=False)
    assert np.all(model[0].weight.data == 0)


def test_loss_shape_and_target_errors():
    with pytest.raises(eo.EveryOShapeError, match=r"\(4, 1\).*\(4,\)"):
        eo.mse_loss(eo.ones(4, 1), eo.ones(4))
    with pytest.raises(eo.EveryODTypeError, match="integer class indices"):
        eo.cross_entropy(eo.ones(2, 3), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"targets must be in \[0, 3\)"):
        eo.cross_entropy(eo.ones(2, 3), np.array([0, 3]))


def test_optimizer_state_dict_validation():
    p = eo.Parameter(np.zeros(3, dtype=np.float32))
    opt = eo.SGD([p], lr=0.1, momentum=0.9)
    with pytest.raises(eo.EveryOStateDictError, match="'hyper' and 'state'"):
        opt.load_state_dict({"lr": 1})
    with pytest.raises(eo.EveryOStateDictError, match=r"shape \(4,\), the parameter has \(3,\)"):
        opt.load_state_dict({"hyper": {}, "state": {"0": {"momentum_buffer": np.zeros(4)}}})
    with pytest.raises(eo.EveryOStateDictError, match="parameter 5"):
        opt.load_state_dict({"hyper": {}, "state": {"5": {}}})
