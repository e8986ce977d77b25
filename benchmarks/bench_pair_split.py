"""Row and elementwise kernels split over everyo-kernels' pair: when it pays (issue 24).

    python benchmarks/bench_pair_split.py [--repeats N]

The pair (``everyo.kernels.pair``) runs the LSTM's scans on two threads. The
transformer workloads spend their one-thread time in row and elementwise kernels
(GELU, LayerNorm, softmax) between large products that OpenBLAS runs on its own
threads. This script measures whether splitting such a kernel over the pair would
pay, in the two situations a training step has:

- ``idle``: OpenBLAS's workers asleep (the harness's idle gap before each run),
  the pair's worker asleep too (its first job wakes it) or awake (an empty job
  just before: it spins for ``pair.SPIN_S`` after each job, as between the
  kernels of a step);
- ``after a product``: right after a (2048, 512) @ (512, 128) product on
  OpenBLAS's default threads, as in a transformer step, where OpenBLAS's worker
  keeps spinning on the second core for a while after the product returns.

Each kernel runs whole on this thread, or as two halves by rows (the caller's
and the pair worker's), alternating A B A B in this process with an idle gap
before each round (same-framework A/B, see harness.py). The halves are checked to
give the whole kernel's bits first. The ratio is the median of the pairwise ratios
split / whole (below 1: splitting pays).
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import blas_info, interleaved, machine_info, median_ratio, print_table  # noqa: E402


def cases(pair):
    from everyo.kernels.gelu import gelu_forward
    from everyo.kernels.rows import layer_norm_forward

    rng = np.random.default_rng(0)
    n = 2048 * 512  # the GPT's feed-forward activations
    x = rng.standard_normal(n).astype(np.float32)
    out, cdf = np.empty_like(x), np.empty_like(x)
    h = n // 2

    def gelu_whole():
        gelu_forward(x, out, cdf)

    def gelu_split():
        pair.run(lambda: gelu_forward(x[:h], out[:h], cdf[:h]), lambda: gelu_forward(x[h:], out[h:], cdf[h:]))

    rows, width = 2048, 128  # the encoder's and GPT's LayerNorm input
    a = rng.standard_normal((rows, width)).astype(np.float32)
    w, b = rng.standard_normal(width).astype(np.float32), rng.standard_normal(width).astype(np.float32)
    y, mean, rstd = np.empty_like(a), np.empty(rows, np.float32), np.empty(rows, np.float32)
    eps = np.float32(1e-5)
    r = rows // 2

    def ln_whole():
        layer_norm_forward(a, w, b, True, eps, y, mean, rstd)

    def ln_split():
        pair.run(
            lambda: layer_norm_forward(a[:r], w, b, True, eps, y[:r], mean[:r], rstd[:r]),
            lambda: layer_norm_forward(a[r:], w, b, True, eps, y[r:], mean[r:], rstd[r:]),
        )

    def check(whole, split, outputs):
        whole()
        expected = [o.copy() for o in outputs]
        for o in outputs:
            o.fill(np.nan)
        split()
        for e, o in zip(expected, outputs):
            if not np.array_equal(e.view(np.uint32), o.view(np.uint32)):
                raise AssertionError("the halves do not give the whole kernel's bits")

    check(gelu_whole, gelu_split, [out, cdf])
    check(ln_whole, ln_split, [y, mean, rstd])
    return {
        f"gelu_forward ({n},)": (gelu_whole, gelu_split),
        f"layer_norm_forward ({rows}, {width})": (ln_whole, ln_split),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(machine_info())
    print(blas_info())
    try:
        import everyo as eo
        from everyo.kernels import pair

        status = eo.kernels()
        table = cases(pair)
    except ImportError as error:
        print(f"everyo-kernels is not installed ({error}): nothing to measure")
        return 0
    if not status.enabled:
        print(f"kernels are off ({status.reason}): nothing to measure")
        return 0
    rng = np.random.default_rng(1)
    p = rng.standard_normal((2048, 512)).astype(np.float32)
    q = rng.standard_normal((512, 128)).astype(np.float32)
    product = np.empty((2048, 128), np.float32)

    def gemm():
        np.matmul(p, q, out=product)

    def wake():  # an empty job: the worker stays awake (spinning) for pair.SPIN_S after it
        pair.run(lambda: None, lambda: None)

    def gemm_awake():
        gemm()
        wake()

    situations = (
        ("idle, worker asleep", None),
        ("idle, worker awake", wake),
        ("after a product, worker awake", gemm_awake),
    )
    rows = []
    for label, (whole, split) in table.items():
        whole(), split()  # compile / warm
        for situation, before in situations:
            times = interleaved({"whole": whole, "split": split}, repeats=args.repeats, warmup=0, before=before)
            t_whole, t_split = times["whole"], times["split"]
            rows.append(
                [
                    label,
                    situation,
                    float(np.median(t_whole) * 1e3),
                    float(np.median(t_split) * 1e3),
                    median_ratio(t_split, t_whole),
                ]
            )
    print_table(
        f"Whole on one thread vs halves on the pair (median ms of {args.repeats}; ratio: median of split / whole)",
        ["kernel", "situation", "whole ms", "split ms", "split/whole"],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
