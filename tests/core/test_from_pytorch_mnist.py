"""examples/from_pytorch/mnist.py (the pytorch/examples MNIST program, ported) runs and learns
on generated data, and -- where torch is installed -- its printed losses follow the original's,
trained by torch from the same starting weights on the same batches (dropout off on both sides,
so the two runs draw no masks; the port itself keeps it)."""

import argparse
import importlib.util
import math
import os
import re

import numpy as np
import pytest

import everyo as eo

PORT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "from_pytorch", "mnist.py")


def _port():
    spec = importlib.util.spec_from_file_location("from_pytorch_mnist", PORT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _losses(text):
    return [float(v) for v in re.findall(r"Loss: ([0-9.]+)", text)], [
        float(v) for v in re.findall(r"Average loss: ([0-9.]+)", text)
    ]


def test_the_port_runs_unchanged_and_learns(capsys):
    port = _port()
    port.main(
        ["--epochs", "2", "--batch-size", "32", "--train-size", "128", "--test-size", "64", "--log-interval", "1"]
    )
    train, test = _losses(capsys.readouterr().out)
    assert len(train) == 8 and len(test) == 2
    assert all(np.isfinite(train)) and max(train[4:]) < max(train[:4])
    assert test[1] < min(test[0], math.log(10))  # below the uniform guess over ten classes, and falling


def _torch_net(torch):
    nn, F = torch.nn, torch.nn.functional

    class Net(nn.Module):  # pytorch/examples mnist/main.py (BSD-3-Clause, (c) 2017 Pytorch contributors)
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1)
            self.dropout1 = nn.Dropout(0.25)
            self.dropout2 = nn.Dropout(0.5)
            self.fc1 = nn.Linear(9216, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            x = F.relu(self.conv2(F.relu(self.conv1(x))))
            x = self.dropout1(F.max_pool2d(x, 2))
            x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
            return F.log_softmax(self.fc2(x), dim=1)

    return Net()


def test_losses_follow_torchs_from_the_same_weights(capsys):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    port = _port()
    images, labels = port.synthetic_mnist(96, seed=3)
    test_images, test_labels = port.synthetic_mnist(64, seed=4)

    torch.manual_seed(0)
    reference = _torch_net(torch)
    reference.dropout1.p = reference.dropout2.p = 0.0
    model = eo.load_torch_state_dict(
        port.Net(),
        {k: v.detach().numpy() for k, v in reference.state_dict().items()},
        example_input=images[:1],
    )
    model.dropout1.p = model.dropout2.p = 0.0

    args = argparse.Namespace(log_interval=1, dry_run=False)
    optimizer = eo.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = eo.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    loader = eo.DataLoader(eo.TensorDataset(images, labels), batch_size=32)
    test_loader = eo.DataLoader(eo.TensorDataset(test_images, test_labels), batch_size=64)
    for epoch in (1, 2):
        port.train(args, model, None, loader, optimizer, epoch)
        port.test(model, None, test_loader)
        scheduler.step()
    train, test = _losses(capsys.readouterr().out)

    t_optimizer = torch.optim.Adadelta(reference.parameters(), lr=1.0)
    t_scheduler = torch.optim.lr_scheduler.StepLR(t_optimizer, step_size=1, gamma=0.7)
    x, y = torch.from_numpy(images.transpose(0, 3, 1, 2).copy()), torch.from_numpy(labels)
    tx, ty = torch.from_numpy(test_images.transpose(0, 3, 1, 2).copy()), torch.from_numpy(test_labels)
    t_train, t_test = [], []
    for _ in (1, 2):
        reference.train()
        for start in range(0, 96, 32):
            t_optimizer.zero_grad()
            loss = F.nll_loss(reference(x[start : start + 32]), y[start : start + 32])
            loss.backward()
            t_optimizer.step()
            t_train.append(loss.item())
        reference.eval()
        with torch.no_grad():
            t_test.append(F.nll_loss(reference(tx), ty, reduction="sum").item() / 64)
        t_scheduler.step()
    np.testing.assert_allclose(train, t_train, atol=2e-5)  # printed with 6 decimals
    np.testing.assert_allclose(test, t_test, atol=2e-4)  # printed with 4
    assert t_train[-1] < t_train[0]
