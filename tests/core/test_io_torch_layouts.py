"""eo.load_torch_state_dict is right or refuses: every layout converted (hand-made
PyTorch-layout state dicts against NumPy references written in PyTorch's layout),
a Linear after a flatten of an NHWC map permuted when its shape is traced or given
and refused otherwise; and the unmodified pytorch/examples MNIST ``Net`` against
torch's own logits where torch is installed."""

import numpy as np
import pytest

import everyo as eo

RNG = np.random.default_rng(0)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _conv_nchw(x, w, b):
    """PyTorch's Conv2d (stride 1, no padding) on NCHW with an (O, I, kh, kw) kernel, in NumPy."""
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1), np.float64)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", x[:, :, i : i + h - kh + 1, j : j + wd - kw + 1], w[:, :, i, j])
    return out + b[None, :, None, None]


def _small_cnn_state():
    return {"0.weight": _r(3, 2, 3, 3), "0.bias": _r(3), "3.weight": _r(4, 3 * 4 * 5), "3.bias": _r(4)}


def _small_cnn():
    return eo.Sequential(eo.Conv2D(2, 3, 3), eo.ReLU(), eo.Flatten(), eo.Linear(3 * 4 * 5, 4))


def _small_cnn_reference(state, x_nchw):
    h = np.maximum(_conv_nchw(x_nchw, state["0.weight"], state["0.bias"]), 0)
    return h.reshape(len(h), -1) @ state["3.weight"].T + state["3.bias"]  # PyTorch flattens (C, H, W)


def test_flatten_after_conv_is_permuted_when_traced():
    state, x = _small_cnn_state(), _r(2, 2, 6, 7)
    model = eo.load_torch_state_dict(_small_cnn(), state, example_input=np.zeros((1, 6, 7, 2), np.float32))
    np.testing.assert_allclose(
        model(x.transpose(0, 2, 3, 1)).data, _small_cnn_reference(state, x), rtol=1e-5, atol=1e-5
    )


def test_flatten_after_conv_is_permuted_when_its_shape_is_given():
    state, x = _small_cnn_state(), _r(2, 2, 6, 7)
    model = eo.load_torch_state_dict(_small_cnn(), state, flatten_from={"3": (4, 5, 3)})
    np.testing.assert_allclose(
        model(x.transpose(0, 2, 3, 1)).data, _small_cnn_reference(state, x), rtol=1e-5, atol=1e-5
    )


def test_a_conv_then_linear_model_without_a_shape_is_refused_and_nothing_is_copied():
    model = _small_cnn()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    with pytest.raises(eo.EveryOStateDictError) as info:
        eo.load_torch_state_dict(model, _small_cnn_state())
    message = str(info.value)
    assert "Linear ['3']" in message and "example_input=" in message and "flatten_from={'3': (H, W, C)}" in message
    assert all(np.array_equal(v, model.state_dict()[k]) for k, v in before.items())


def test_a_flatten_whose_order_cannot_be_known_is_refused_even_when_traced():
    class Transposed(eo.Module):  # a custom forward that moves axes before flattening: order unknown
        def __init__(self):
            super().__init__()
            self.conv = eo.Conv2D(2, 3, 3)
            self.fc = eo.Linear(60, 4)

        def forward(self, x):
            h = self.conv(x).transpose(0, 3, 1, 2)
            return self.fc(h.reshape(len(h.data), -1))

    state = {"conv.weight": _r(3, 2, 3, 3), "conv.bias": _r(3), "fc.weight": _r(4, 60), "fc.bias": _r(4)}
    with pytest.raises(eo.EveryOStateDictError, match=r"Linear \['fc'\].*traced on example_input"):
        eo.load_torch_state_dict(Transposed(), state, example_input=np.zeros((1, 6, 7, 2), np.float32))
    # ... and loads when the user says the features are in PyTorch's order already (they are: NCHW flatten)
    model = eo.load_torch_state_dict(Transposed(), state, flatten_from={"fc": None})
    x = _r(2, 2, 6, 7)
    ref = _conv_nchw(x, state["conv.weight"], state["conv.bias"])
    ref = ref.reshape(2, -1) @ state["fc.weight"].T + state["fc.bias"]
    np.testing.assert_allclose(model(x.transpose(0, 2, 3, 1)).data, ref, rtol=1e-5, atol=1e-5)


def test_a_custom_forward_reshape_after_pooling_is_traced():
    class Net(eo.Module):
        def __init__(self):
            super().__init__()
            self.conv = eo.Conv2D(2, 3, 3)
            self.fc = eo.Linear(3 * 2 * 2, 4)

        def forward(self, x):
            h = eo.max_pool2d(eo.relu(self.conv(x)), 2)
            return self.fc(h.reshape(h.shape[0], -1))

    state = {"conv.weight": _r(3, 2, 3, 3), "conv.bias": _r(3), "fc.weight": _r(4, 12), "fc.bias": _r(4)}
    x = _r(2, 2, 6, 6)
    h = np.maximum(_conv_nchw(x, state["conv.weight"], state["conv.bias"]), 0)
    h = h.reshape(2, 3, 2, 2, 2, 2).max(axis=(3, 5))
    ref = h.reshape(2, -1) @ state["fc.weight"].T + state["fc.bias"]
    model = eo.load_torch_state_dict(Net(), state, example_input=np.zeros((1, 6, 6, 2), np.float32))
    np.testing.assert_allclose(model(x.transpose(0, 2, 3, 1)).data, ref, rtol=1e-5, atol=1e-5)


def test_tracing_changes_nothing_in_the_model():
    model = eo.Sequential(eo.Conv2D(2, 3, 3), eo.BatchNorm2D(3), eo.Flatten(), eo.Dropout(0.5), eo.Linear(60, 4))
    state = {k: np.asarray(v) for k, v in model.state_dict().items()}
    torch_state = {
        "0.weight": _r(3, 2, 3, 3),
        "0.bias": _r(3),
        "1.weight": _r(3),
        "1.bias": _r(3),
        "4.weight": _r(4, 60),
        "4.bias": _r(4),
    }
    # the running statistics are left out of the file (strict=False): the trace must not have moved them
    eo.load_torch_state_dict(model, torch_state, strict=False, example_input=np.ones((1, 6, 7, 2), np.float32))
    assert model.training and all(m.training for m in model.modules())
    after = model.state_dict()
    for key in ("1.running_mean", "1.running_var", "3.generator"):  # no statistics updated, no mask drawn
        np.testing.assert_array_equal(np.asarray(after[key]), state[key])


def test_a_flatten_of_a_sequence_or_a_one_channel_map_needs_no_permutation():
    model = eo.Sequential(eo.Embedding(7, 3), eo.Flatten(), eo.Linear(12, 2))
    state = {"0.weight": _r(7, 3), "2.weight": _r(2, 12), "2.bias": _r(2)}
    ids = np.array([[1, 2, 3, 4], [0, 6, 5, 1]])
    eo.load_torch_state_dict(model, state, example_input=ids)
    ref = state["0.weight"][ids].reshape(2, -1) @ state["2.weight"].T + state["2.bias"]
    np.testing.assert_allclose(model(ids).data, ref, rtol=1e-5, atol=1e-5)


def test_conv1d_and_conv_transpose_kernels():
    x = _r(2, 3, 9)  # PyTorch's (N, C, L)
    w1, b1 = _r(4, 3, 3), _r(4)
    conv1 = eo.load_torch_state_dict(eo.Conv1D(3, 4, 3), {"weight": w1, "bias": b1})
    ref1 = _conv_nchw(x[:, :, None], w1[:, :, None], b1)[:, :, 0]
    np.testing.assert_allclose(conv1(x.transpose(0, 2, 1)).data, ref1.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)

    wt, bt = _r(3, 2, 2, 2), _r(2)  # ConvTranspose2d weight is (in, out, kh, kw); stride 1
    xt = _r(1, 3, 3, 3)
    ref = np.zeros((1, 2, 4, 4))
    for i in range(2):
        for j in range(2):
            ref[:, :, i : i + 3, j : j + 3] += np.einsum("nchw,co->nohw", xt, wt[:, :, i, j])
    ref += bt[None, :, None, None]
    deconv = eo.load_torch_state_dict(eo.Conv2DTranspose(3, 2, 2), {"weight": wt, "bias": bt})
    np.testing.assert_allclose(deconv(xt.transpose(0, 2, 3, 1)).data, ref.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)


def test_multihead_attention_packed_projection_and_groupnorm_layouts():
    mha = eo.MultiHeadAttention(4, 2)
    w, b, wo, bo = _r(12, 4), _r(12), _r(4, 4), _r(4)
    eo.load_torch_state_dict(mha, {"in_proj_weight": w, "in_proj_bias": b, "out_proj.weight": wo, "out_proj.bias": bo})
    np.testing.assert_array_equal(mha.in_proj_weight.data, w.T)
    np.testing.assert_array_equal(mha.out_proj.weight.data, wo.T)
    gn = eo.load_torch_state_dict(eo.GroupNorm(2, 4), {"weight": _r(4), "bias": _r(4)})
    assert gn.weight.data.shape == (4,)


class TestMnistNet:
    """The unmodified pytorch/examples mnist/main.py ``Net`` (BSD-3-Clause, (c) PyTorch contributors)."""

    def _torch_net(self, torch):
        nn, F = torch.nn, torch.nn.functional

        class Net(nn.Module):
            def __init__(self):
                super(Net, self).__init__()
                self.conv1 = nn.Conv2d(1, 32, 3, 1)
                self.conv2 = nn.Conv2d(32, 64, 3, 1)
                self.dropout1 = nn.Dropout(0.25)
                self.dropout2 = nn.Dropout(0.5)
                self.fc1 = nn.Linear(9216, 128)
                self.fc2 = nn.Linear(128, 10)

            def forward(self, x):
                x = self.conv1(x)
                x = F.relu(x)
                x = self.conv2(x)
                x = F.relu(x)
                x = F.max_pool2d(x, 2)
                x = self.dropout1(x)
                x = torch.flatten(x, 1)
                x = self.fc1(x)
                x = F.relu(x)
                x = self.dropout2(x)
                x = self.fc2(x)
                output = F.log_softmax(x, dim=1)
                return output

        return Net()

    def _everyo_net(self):
        class Net(eo.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = eo.Conv2D(1, 32, 3, 1)
                self.conv2 = eo.Conv2D(32, 64, 3, 1)
                self.dropout1 = eo.Dropout(0.25)
                self.dropout2 = eo.Dropout(0.5)
                self.fc1 = eo.Linear(9216, 128)
                self.fc2 = eo.Linear(128, 10)

            def forward(self, x):
                x = eo.relu(self.conv1(x))
                x = eo.relu(self.conv2(x))
                x = eo.max_pool2d(x, 2)
                x = self.dropout1(x)
                x = eo.flatten(x, 1)
                x = eo.relu(self.fc1(x))
                x = self.dropout2(x)
                return eo.log_softmax(self.fc2(x), axis=1)

        return Net()

    def test_logits_match_torch(self):
        torch = pytest.importorskip("torch")
        torch.manual_seed(0)
        net = self._torch_net(torch).eval()
        x = torch.randn(8, 1, 28, 28)
        with torch.no_grad():
            expected = net(x).numpy()
        state = {k: v.numpy() for k, v in net.state_dict().items()}
        model = eo.load_torch_state_dict(
            self._everyo_net(), state, example_input=np.zeros((1, 28, 28, 1), np.float32)
        ).eval()
        got = model(x.numpy().transpose(0, 2, 3, 1)).data
        assert np.abs(got - expected).max() <= 1e-5

    def test_without_an_example_it_is_refused(self):
        state = {k: np.asarray(v) for k, v in self._everyo_net().state_dict().items() if "generator" not in k}
        state = {k: (v.T if v.ndim == 2 else v.transpose(3, 2, 0, 1) if v.ndim == 4 else v) for k, v in state.items()}
        with pytest.raises(eo.EveryOStateDictError, match=r"Linear \['fc1', 'fc2'\].*example_input="):
            eo.load_torch_state_dict(self._everyo_net(), state)
