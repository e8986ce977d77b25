"""pytorch/examples ``mnist/main.py`` ported to EveryO with the fewest changes.

Original: https://github.com/pytorch/examples/blob/main/mnist/main.py,
BSD 3-Clause License, Copyright (c) 2017, Pytorch contributors (the licence
text: https://github.com/pytorch/examples/blob/main/LICENSE). This port is
EveryO code written after it, under the same licence terms for the parts taken.

Run: ``python examples/from_pytorch/mnist.py --epochs 1 --train-size 256 --test-size 128``
(seconds); the defaults are the original's (14 epochs over 60,000 images).

Of the original's 141 lines, 42 are changed or removed, and the port has 26
changed or new lines (``difflib.SequenceMatcher`` over the two files, this
docstring and ``synthetic_mnist`` not counted; most of the 42 are the accelerator
and torchvision blocks). Why:

- imports: ``everyo`` for ``torch`` (``import everyo as F``: the functional
  ops live at the top level), no torchvision;
- the layers' names (``Conv2D``, EveryO is channels-last) and
  ``torch.flatten`` -> ``eo.flatten``; the rest of ``Net`` is unchanged,
  including the 9216 features of ``fc1``;
- no devices: the ``.to(device)`` lines and the accelerator block go (EveryO
  runs on NumPy);
- no download: ``synthetic_mnist`` makes 28x28 one-channel images of ten
  classes (NHWC, normalised as the original's transform), with two arguments
  for their number; ``main`` takes ``argv`` so a test can run it;
- ``eo.save`` writes ``.npz`` (no pickle) instead of ``torch.save``'s ``.pt``.
"""

import argparse

import numpy as np

import everyo as eo
import everyo as F
from everyo import nn, optim
from everyo.optim.lr_scheduler import StepLR


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2D(1, 32, 3, 1)
        self.conv2 = nn.Conv2D(32, 64, 3, 1)
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
        x = eo.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))
            if args.dry_run:
                break


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with eo.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))


def synthetic_mnist(n, seed):
    """``n`` 28x28 one-channel images (NHWC) of ten classes and their labels: each class is a fixed
    pattern of strokes, shifted by up to two pixels, with noise; normalised as the original."""
    strokes = (np.random.default_rng(1234).random((10, 28, 28)) > 0.8).astype(np.float32)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    shifts = rng.integers(-2, 3, (n, 2))
    images = np.stack([np.roll(strokes[y], tuple(s), axis=(0, 1)) for y, s in zip(labels, shifts)])
    images = np.clip(images + rng.normal(0, 0.3, images.shape), 0, 1)
    return ((images - 0.1307) / 0.3081)[..., None].astype(np.float32), labels


def main(argv=None):
    # Training settings
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=64, metavar='N',
                        help='input batch size for training (default: 64)')
    parser.add_argument('--test-batch-size', type=int, default=1000, metavar='N',
                        help='input batch size for testing (default: 1000)')
    parser.add_argument('--epochs', type=int, default=14, metavar='N',
                        help='number of epochs to train (default: 14)')
    parser.add_argument('--lr', type=float, default=1.0, metavar='LR',
                        help='learning rate (default: 1.0)')
    parser.add_argument('--gamma', type=float, default=0.7, metavar='M',
                        help='Learning rate step gamma (default: 0.7)')
    parser.add_argument('--train-size', type=int, default=60000, help='generated training images')
    parser.add_argument('--test-size', type=int, default=10000, help='generated test images')
    parser.add_argument('--dry-run', action='store_true',
                        help='quickly check a single pass')
    parser.add_argument('--seed', type=int, default=1, metavar='S',
                        help='random seed (default: 1)')
    parser.add_argument('--log-interval', type=int, default=10, metavar='N',
                        help='how many batches to wait before logging training status')
    parser.add_argument('--save-model', action='store_true', 
                        help='For Saving the current Model')
    args = parser.parse_args(argv)

    device = None

    eo.manual_seed(args.seed)

    train_kwargs = {'batch_size': args.batch_size}
    test_kwargs = {'batch_size': args.test_batch_size}

    dataset1 = eo.TensorDataset(*synthetic_mnist(args.train_size, seed=args.seed))
    dataset2 = eo.TensorDataset(*synthetic_mnist(args.test_size, seed=args.seed + 1))
    train_loader = eo.DataLoader(dataset1,**train_kwargs)
    test_loader = eo.DataLoader(dataset2, **test_kwargs)

    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()

    if args.save_model:
        eo.save(model.state_dict(), "mnist_cnn.npz")


if __name__ == '__main__':
    main()
