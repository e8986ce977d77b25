"""Module API: hooks, traversal, registration, zero_grad, ModuleList/ModuleDict,
and the dtype rule at the layer boundary."""

import numpy as np
import pytest

import everyo as eo


class Net(eo.Module):
    def __init__(self):
        super().__init__()
        self.hidden = eo.Linear(4, 6, seed=0)
        self.act = eo.ReLU()
        self.out = eo.Linear(6, 2, seed=1)

    def forward(self, x):
        return self.out(self.act(self.hidden(x)))


X = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)


# --- forward hooks ---------------------------------------------------------------
def test_forward_pre_hook_sees_and_can_replace_the_arguments():
    layer, seen = eo.Linear(4, 2, seed=0), []
    handle = layer.register_forward_pre_hook(lambda m, args: seen.append((m, args[0].shape)))
    layer(X)
    assert seen == [(layer, (3, 4))]
    handle.remove()
    layer(X)
    assert len(seen) == 1
    with layer.register_forward_pre_hook(lambda m, args: args[0] * 0):  # a non-tuple is wrapped
        np.testing.assert_array_equal(layer(X).data, np.broadcast_to(layer.bias.data, (3, 2)))
    np.testing.assert_allclose(layer(X).data, X @ layer.weight.data + layer.bias.data, rtol=1e-6)


def test_forward_hook_sees_output_and_can_replace_it_in_registration_order():
    layer, calls = eo.Linear(4, 2, seed=0), []
    layer.register_forward_hook(lambda m, args, out: calls.append("first"))
    layer.register_forward_hook(lambda m, args, out: out * 2)
    layer.register_forward_hook(lambda m, args, out: calls.append("prepended"), prepend=True)
    y = layer(X)
    assert calls == ["prepended", "first"]
    np.testing.assert_allclose(y.data, 2 * (X @ layer.weight.data + layer.bias.data), rtol=1e-6)


def test_hooks_with_kwargs_and_gradients_flow_through_a_replaced_output():
    lstm = eo.LSTM(4, 3, seed=0)
    seen = {}
    lstm.register_forward_pre_hook(lambda m, args, kwargs: seen.update(kwargs), with_kwargs=True)
    lstm.register_forward_hook(lambda m, args, kwargs, out: (out[0] * 3, out[1]), with_kwargs=True)
    x = eo.tensor(np.ones((2, 5, 4), np.float32), requires_grad=True)
    out, _ = lstm(x, state=None)
    assert seen == {"state": None}
    out.sum().backward()
    plain_x = eo.tensor(np.ones((2, 5, 4), np.float32), requires_grad=True)
    lstm._forward_hooks.clear()
    lstm(plain_x)[0].sum().backward()
    np.testing.assert_allclose(x.grad, 3 * plain_x.grad, rtol=1e-5)


# --- traversal and registration -----------------------------------------------------
def test_children_modules_and_apply():
    net = Net()
    assert [name for name, _ in net.named_children()] == ["hidden", "act", "out"]
    assert net.children() == [net.hidden, net.act, net.out]
    assert [name for name, _ in net.named_modules()] == ["", "hidden", "act", "out"]
    visited = []
    assert net.apply(lambda m: visited.append(type(m).__name__)) is net
    assert visited == ["Linear", "ReLU", "Linear", "Net"]  # children first, as PyTorch


def test_shared_submodule_is_listed_and_its_parameters_counted_once():
    net = Net()
    net.again = net.hidden
    assert len(net.modules()) == 4 and len(net.parameters()) == 4


def test_register_parameter_and_module():
    m = eo.Module()
    m.register_parameter("scale", eo.Parameter(np.ones(3, np.float32)))
    m.register_parameter("shift", None)
    m.add_module("body", eo.Linear(3, 3, seed=0))
    m.register_module("tail", None)
    assert list(m.state_dict()) == ["scale", "body.weight", "body.bias"]
    assert m.shift is None and m.tail is None
    with pytest.raises(TypeError, match="eo.Parameter"):
        m.register_parameter("w", np.ones(3))
    with pytest.raises(KeyError, match="contain no '.'"):
        m.register_parameter("a.b", None)
    with pytest.raises(KeyError, match="already exists"):
        m.register_module("train", eo.ReLU())
    with pytest.raises(TypeError, match="expected a Module"):
        m.add_module("x", 3)


def test_zero_grad_sets_to_none_by_default_or_zeros_in_place():
    net = Net()
    net(X).sum().backward()
    grad = net.hidden.weight.grad
    net.zero_grad(set_to_none=False)
    assert net.hidden.weight.grad is grad and not grad.any()
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


# --- containers --------------------------------------------------------------------
class Stack(eo.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = eo.ModuleList([eo.Linear(4, 4, seed=i) for i in range(n)])
        self.heads = eo.ModuleDict({"a": eo.Linear(4, 1, seed=10), "b": eo.Linear(4, 2, seed=11)})

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        return {k: head(x) for k, head in self.heads.items()}


def test_module_list_and_dict_register_their_modules_with_pytorch_keys():
    model = Stack(2)
    assert list(model.state_dict()) == [
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "layers.1.bias",
        "heads.a.weight",
        "heads.a.bias",
        "heads.b.weight",
        "heads.b.bias",
    ]
    x = X
    for i in range(2):
        x = np.maximum(x @ model.layers[i].weight.data + model.layers[i].bias.data, 0)
    out = model(X)
    np.testing.assert_allclose(out["b"].data, x @ model.heads["b"].weight.data + model.heads["b"].bias.data, rtol=1e-5)
    clone = Stack(2)
    clone.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(clone(X)["a"].data, out["a"].data)


def test_module_list_behaves_like_a_list():
    a, b, c, d = (eo.Linear(2, 2, seed=i) for i in range(4))
    layers = eo.ModuleList([a])
    layers.append(b).extend([c])
    layers.insert(0, d)
    assert list(layers) == [d, a, b, c] and len(layers) == 4
    assert layers[-1] is c and list(layers[1:3]) == [a, b]
    assert list(layers.state_dict())[:2] == ["0.weight", "0.bias"]
    assert np.array_equal(layers.state_dict()["0.weight"], d.weight.data)
    del layers[0]
    assert list(layers) == [a, b, c] and layers[0] is a and "3" not in layers.__dict__
    layers[1] = d
    assert list(layers) == [a, d, c]
    layers += eo.ModuleList([b])
    assert len(layers) == 4 and len(layers.parameters()) == 8
    with pytest.raises(IndexError, match="out of range for 4"):
        layers[4]
    with pytest.raises(TypeError, match="must be a Module"):
        layers.append(np.ones(2))
    with pytest.raises(TypeError, match="item 1 must be a Module"):
        layers.extend([a, "x"])
    assert len(layers) == 4  # a bad extend adds nothing
    with pytest.raises(NotImplementedError, match="iterate over it"):
        layers(X)


def test_module_dict_behaves_like_a_dict():
    heads = eo.ModuleDict([("x", eo.ReLU()), ("y", eo.Tanh())])
    heads["z"] = eo.Linear(2, 2, seed=0)
    assert list(heads) == ["x", "y", "z"] and "y" in heads and len(heads) == 3
    assert isinstance(heads.pop("x"), eo.ReLU) and heads.keys() == ["y", "z"]
    del heads["y"]
    assert heads.items() == [("z", heads["z"])]
    with pytest.raises(KeyError, match="no key 'q'"):
        heads["q"]
    with pytest.raises(KeyError, match="already exists"):
        heads["keys"] = eo.ReLU()
    with pytest.raises(TypeError, match="must be a Module"):
        heads.update({"w": 1})
    heads.clear()
    assert len(heads) == 0 and heads.state_dict() == {}


@pytest.mark.parametrize(
    "value, container",
    [
        ([eo.ReLU(), eo.Linear(2, 2)], "ModuleList"),
        ((eo.ReLU(),), "ModuleList"),
        ({"a": eo.ReLU()}, "ModuleDict"),
    ],
)
def test_a_plain_container_of_modules_is_refused_naming_the_right_one(value, container):
    m = eo.Module()
    with pytest.raises(TypeError, match=f"eo.{container}"):
        m.blocks = value
    assert "blocks" not in m.__dict__
    m.sizes = [1, 2, 3]  # plain data is still fine
    m.names = {"a": "b"}


# --- dtype at the layer boundary (Keras's rule) -----------------------------------------
def test_float64_input_gives_float32_output_and_float32_gradients():
    net = Net()
    x = eo.tensor(X.astype(np.float64), requires_grad=True)
    y = net(x)
    assert y.dtype == "float32"
    y.sum().backward()
    assert all(p.grad.dtype == np.float32 for p in net.parameters())
    assert x.grad.dtype == np.float64  # the cast is differentiable; the input's gradient keeps its dtype
    reference = Net()
    reference(eo.tensor(X)).sum().backward()
    np.testing.assert_allclose(x.grad, reference_input_grad(reference), rtol=1e-5)
    assert Net()(X.astype(np.float64)).dtype == "float32"  # plain arrays too


def reference_input_grad(net):
    x = eo.tensor(X, requires_grad=True)
    net(x).sum().backward()
    return x.grad


def test_the_cast_reaches_recurrent_states_and_leaves_integers_alone():
    lstm = eo.LSTM(4, 3, seed=0)
    h0 = np.zeros((1, 2, 3))
    out, (h, c) = lstm(np.ones((2, 5, 4)), (h0, h0))
    assert out.dtype == h.dtype == c.dtype == "float32"
    emb = eo.Embedding(10, 4, seed=0)
    ids = np.array([[1, 2], [3, 9]], dtype=np.int64)
    np.testing.assert_array_equal(emb(ids).data, emb.weight.data[ids])
    np.testing.assert_array_equal(emb(eo.tensor(ids)).data, emb.weight.data[ids])


def test_narrower_input_is_not_cast_up_and_a_float64_model_keeps_float64():
    layer = eo.Linear(4, 2, seed=0)
    assert layer(X.astype(np.float16)).dtype == "float32"  # NumPy promotion inside, input untouched
    seen = []
    layer.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    layer.register_forward_hook(lambda m, args, out: seen.append(args[0].dtype))
    layer(X.astype(np.float16))
    assert seen == [np.float16, np.float16]
    assert eo.Linear(4, 2, seed=0).to("float64")(X.astype(np.float64)).dtype == "float64"
    # functional ops keep NumPy promotion
    assert eo.linear(eo.tensor(X.astype(np.float64)), layer.weight).dtype == "float64"


def test_assigning_a_tensor_to_a_buffer_name_keeps_it_a_registered_buffer():
    # PyTorch: `self.bias = self.bias[:, :, :n, :n]` (nanoGPT's crop_block_size) replaces the
    # buffer and it stays in state_dict; dropping it from the registry would lose it silently.
    m = eo.Module()
    m.register_buffer("mask", np.tril(np.ones((4, 4), dtype=np.float32)))
    m.mask = m.mask[:2, :2]
    assert "mask" in dict(m.named_buffers()) and m.state_dict()["mask"].shape == (2, 2)
    m.mask = np.zeros(3, dtype=np.float32)  # a plain array is wrapped, as register_buffer does
    assert isinstance(m.mask, eo.Tensor) and m.state_dict()["mask"].shape == (3,)
    m.mask = None
    assert "mask" not in m.state_dict()
    m.mask = eo.Parameter(np.ones(2, dtype=np.float32))  # a Parameter becomes a parameter
    assert "mask" in dict(m.named_parameters()) and "mask" not in dict(m.named_buffers())


# --- replacing and deleting registered attributes keeps the order (PyTorch) ------------
def test_replacing_a_sequential_layer_by_setattr_keeps_its_place():
    seq = eo.Sequential(eo.Linear(4, 6, seed=0), eo.ReLU(), eo.Linear(6, 2, seed=1))
    setattr(seq, "1", eo.Tanh())  # the middle layer replaced, as torch code does
    assert list(seq._modules) == ["0", "1", "2"] and isinstance(seq[1], eo.Tanh)
    first, last = seq[0], seq[2]
    want = np.tanh(X @ first.weight.data + first.bias.data) @ last.weight.data + last.bias.data
    np.testing.assert_allclose(seq(X).data, want, rtol=1e-6)


def test_replacing_a_parameter_keeps_the_parameter_and_state_dict_order():
    net = Net()
    before = [name for name, _ in net.named_parameters()]
    net.hidden.weight = eo.Parameter(np.zeros((4, 6), np.float32))
    net.hidden = eo.Linear(4, 6, seed=5)
    assert [name for name, _ in net.named_parameters()] == before
    assert list(net.state_dict()) == before


def test_deleting_a_submodule_or_parameter_unregisters_it():
    net = Net()
    del net.out
    assert [name for name, _ in net.named_parameters()] == ["hidden.weight", "hidden.bias"]
    assert "out.weight" not in net.state_dict() and not hasattr(net, "out")
    del net.hidden.bias
    assert [name for name, _ in net.named_parameters()] == ["hidden.weight"]


def test_a_refused_plain_container_leaves_the_registered_layer_in_place():
    net = Net()
    with pytest.raises(TypeError, match="ModuleList"):
        net.out = [eo.Linear(6, 2)]
    assert isinstance(net.out, eo.Linear) and "out.weight" in net.state_dict()
