"""EveryO against PyTorch as a user gets them: each framework alone in its own process.

    python benchmarks/bench_vs_torch.py [--rounds 3] [--busy] [--workloads mlp,cnn,...]
        [--dtypes float32,float16,bfloat16] [--torch-python PATH] [--tuned]

Workloads (one training step each: forward, loss, backward, optimizer step; same
shapes and hyper-parameters on both sides, dropout 0):

- ``mlp``: the spec's seed MLP 64-128-128-1 (ReLU), 4096 rows full batch, MSE, SGD 0.05;
  a process runs 60 steps (the spec's run) and its figure is the median step;
- ``cnn``: 28x28x1 images, Conv 3x3 1->32 'same', ReLU, MaxPool 2, Conv 3x3 32->64 'same',
  ReLU, Flatten, Linear 12544->10, cross-entropy, SGD, batch 128;
- ``lstm``: LSTM 32 -> 128, batch 32, 50 steps, loss sum(out * dout), SGD;
- ``encoder``: 2-layer transformer encoder d 128, 4 heads, feed-forward 512, post-norm,
  ReLU, batch 32 x 64 tokens, causal mask, MSE, SGD;
- ``gpt``: causal character GPT: token + learned position embeddings (65 symbols,
  context 64), 4 pre-norm layers d 128, 4 heads, feed-forward 512, GELU, final
  LayerNorm, Linear head, cross-entropy over batch 32 x 64 tokens, AdamW 3e-4.

Each (framework, workload, dtype) runs in a fresh interpreter, the two frameworks
alternating A B A B for ``--rounds`` (>= 3); a process times ``steps`` steps after 2
warm-up steps and reports their median; the figure is the ratio of the medians over
the rounds. Under ``float16``/``bfloat16`` the forward runs under ``eo.autocast`` and
``torch.autocast("cpu")`` of that dtype (loss in float32 on both sides, no scaler).
Nothing is tuned: glibc's malloc defaults, BLAS and torch at their default threads
(``--tuned`` adds EveryO after ``eo.tune_allocator()`` as a labelled column).

``--busy`` repeats every round with two CPU-bound processes (``python -c "while True:
pass"``) beside it and prints busy/quiet per framework (item 3 of issue 24: EveryO's
growth must not exceed PyTorch's by more than 10%).

The torch side runs under ``--torch-python`` (default: this interpreter); without
torch there the script says so and exits 0. EveryO's side runs under this interpreter.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import numpy as np  # noqa: E402
from harness import (  # noqa: E402
    QUIET_OTHERS,
    ProcessFailed,
    alternate_processes,
    blas_info,
    cpu_hogs,
    machine_info,
    other_cpu,
    print_table,
    ratio_of_medians,
    torch_or_say,
    verdict,
)

WORKLOADS = ("mlp", "cnn", "lstm", "encoder", "gpt")
STEPS = {"mlp": 60, "cnn": 8, "lstm": 8, "encoder": 8, "gpt": 8}
# Targets of issue 24 item 5 (EveryO / torch, as a user gets it).
TARGETS = {"mlp": 1.0, "cnn": 1.2, "lstm": 1.2, "encoder": 1.0, "gpt": 1.2}
AUTOCAST_TARGET = 0.5
VOCAB, CONTEXT = 65, 64


# --- the workloads, EveryO ----------------------------------------------------------------
def everyo_step(workload, dtype):
    import everyo as eo

    rng = np.random.default_rng(0)
    if workload == "mlp":
        model = eo.Sequential(eo.Linear(64, 128), eo.ReLU(), eo.Linear(128, 128), eo.ReLU(), eo.Linear(128, 1))
        x, y = eo.tensor(rng.standard_normal((4096, 64), dtype=np.float32)), rng.standard_normal((4096, 1))
        y, opt, loss_fn = eo.tensor(y.astype(np.float32)), eo.SGD(model.parameters(), lr=0.05), eo.mse_loss
        forward = model
    elif workload == "cnn":
        model = eo.Sequential(
            eo.Conv2D(1, 32, 3, padding="same"),
            eo.ReLU(),
            eo.MaxPool2D(2),
            eo.Conv2D(32, 64, 3, padding="same"),
            eo.ReLU(),
            eo.Flatten(),
            eo.Linear(14 * 14 * 64, 10),
        )
        x, y = eo.tensor(rng.standard_normal((128, 28, 28, 1), dtype=np.float32)), rng.integers(0, 10, 128)
        opt, loss_fn, forward = eo.SGD(model.parameters(), lr=0.01), eo.cross_entropy, model
    elif workload == "lstm":
        model = eo.LSTM(32, 128)
        x = eo.tensor(rng.standard_normal((32, 50, 32), dtype=np.float32))
        y = eo.tensor(rng.standard_normal((32, 50, 128), dtype=np.float32))
        opt = eo.SGD(model.parameters(), lr=0.01)

        def forward(inp):
            return model(inp)[0]

        def loss_fn(out, dout):
            return eo.sum(out * dout)
    elif workload == "encoder":
        model = eo.TransformerEncoder(2, 128, 4, dim_feedforward=512, dropout=0.0)
        x = eo.tensor(rng.standard_normal((32, 64, 128), dtype=np.float32))
        y = eo.tensor(rng.standard_normal((32, 64, 128), dtype=np.float32))
        opt, loss_fn = eo.SGD(model.parameters(), lr=0.01), eo.mse_loss

        def forward(inp):
            return model(inp, is_causal=True)
    elif workload == "gpt":
        tok, pos = eo.Embedding(VOCAB, 128), eo.Embedding(CONTEXT, 128)
        body = eo.TransformerEncoder(4, 128, 4, dim_feedforward=512, dropout=0.0, activation="gelu", norm_first=True)
        head = eo.Linear(128, VOCAB)
        model = eo.ModuleList([tok, pos, body, head])
        x, y = rng.integers(0, VOCAB, (32, CONTEXT)), rng.integers(0, VOCAB, (32, CONTEXT))
        positions = np.arange(CONTEXT)
        opt, loss_fn = eo.AdamW(model.parameters(), lr=3e-4), eo.cross_entropy

        def forward(inp):
            return head(body(tok(inp) + pos(positions), is_causal=True))
    else:
        raise SystemExit(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")

    def step():
        opt.zero_grad()
        if dtype == "float32":
            out = forward(x)
        else:
            with eo.autocast(dtype=dtype):
                out = forward(x)
            out = out.astype("float32")
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        return loss

    return step


# --- the same workloads, PyTorch -----------------------------------------------------------
def torch_step(workload, dtype):
    import torch

    nn, F = torch.nn, torch.nn.functional
    torch.manual_seed(0)
    if workload == "mlp":
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1))
        x, y, loss_fn, lr = torch.randn(4096, 64), torch.randn(4096, 1), F.mse_loss, 0.05
        forward = model
    elif workload == "cnn":
        model = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding="same"),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding="same"),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(14 * 14 * 64, 10),
        )
        x, y, loss_fn, lr, forward = (
            torch.randn(128, 1, 28, 28),
            torch.randint(0, 10, (128,)),
            F.cross_entropy,
            0.01,
            model,
        )
    elif workload == "lstm":
        model = nn.LSTM(32, 128, batch_first=True)
        x, y, lr = torch.randn(32, 50, 32), torch.randn(32, 50, 128), 0.01

        def forward(inp):
            return model(inp)[0]

        def loss_fn(out, dout):
            return (out * dout).sum()
    elif workload == "encoder":
        layer = nn.TransformerEncoderLayer(128, 4, dim_feedforward=512, dropout=0.0, batch_first=True)
        model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        x, y, loss_fn, lr = torch.randn(32, 64, 128), torch.randn(32, 64, 128), F.mse_loss, 0.01
        mask = nn.Transformer.generate_square_subsequent_mask(64)

        def forward(inp):
            return model(inp, mask=mask, is_causal=True)
    elif workload == "gpt":
        layer = nn.TransformerEncoderLayer(
            128, 4, dim_feedforward=512, dropout=0.0, activation="gelu", norm_first=True, batch_first=True
        )
        body = nn.TransformerEncoder(layer, 4, norm=nn.LayerNorm(128), enable_nested_tensor=False)
        tok, pos, head = nn.Embedding(VOCAB, 128), nn.Embedding(CONTEXT, 128), nn.Linear(128, VOCAB)
        model = nn.ModuleList([tok, pos, body, head])
        x, y = torch.randint(0, VOCAB, (32, CONTEXT)), torch.randint(0, VOCAB, (32, CONTEXT))
        positions, mask = torch.arange(CONTEXT), nn.Transformer.generate_square_subsequent_mask(CONTEXT)

        def forward(inp):
            return head(body(tok(inp) + pos(positions), mask=mask, is_causal=True))

        def loss_fn(out, target):
            return F.cross_entropy(out.reshape(-1, VOCAB), target.reshape(-1))
    else:
        raise SystemExit(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=3e-4) if workload == "gpt" else torch.optim.SGD(params, lr=lr)
    cast = None if dtype == "float32" else getattr(torch, dtype)

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=cast or torch.bfloat16, enabled=cast is not None):
            out = forward(x)
        loss = loss_fn(out.float(), y)
        loss.backward()
        opt.step()
        return loss

    return step


def child(framework, workload, dtype):
    """One process, one framework: time the workload's steps, print one JSON line."""
    step = everyo_step(workload, dtype) if framework == "everyo" else torch_step(workload, dtype)
    for _ in range(2):
        step()
    times, cpu = [], []
    for _ in range(STEPS[workload]):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    if framework == "torch":
        import torch

        threads = torch.get_num_threads()
    else:
        threads = None
    print(
        json.dumps(
            {
                "ms": statistics.median(times) * 1e3,
                "cpu_ms": statistics.median(cpu) * 1e3,  # every thread of the process, spinning included
                "total_ms": sum(times) * 1e3,
                "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "threads": threads,
                "blas": blas_info() if framework == "everyo" else None,
            }
        )
    )


# --- the driver ---------------------------------------------------------------------------
def compare(args, workload, dtype):
    """Rounds of A B A B for one (workload, dtype): name -> list of per-process results."""
    me = [str(Path(__file__).resolve()), "--child"]
    commands = {
        "everyo": [sys.executable, *me, "everyo", workload, dtype],
        "torch": [args.torch_python, *me, "torch", workload, dtype],
    }
    env = {"everyo": {"EVERYO_BENCH_TUNE_MALLOC": "0"}, "torch": {}}
    if args.tuned and dtype == "float32":
        commands["everyo tuned"] = commands["everyo"]
        env["everyo tuned"] = {"EVERYO_BENCH_TUNE_MALLOC": "1"}
    return alternate_processes(commands, rounds=args.rounds, env=env)


def ms(results):
    return [r["ms"] for r in results]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--torch-python", default=sys.executable, help="interpreter with torch (default: this one)")
    parser.add_argument("--busy", action="store_true", help="also run beside two CPU-bound processes")
    parser.add_argument("--tuned", action="store_true", help="add EveryO after eo.tune_allocator() (labelled)")
    parser.add_argument("--child", nargs=3, metavar=("FRAMEWORK", "WORKLOAD", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    torch_version = torch_or_say(args.torch_python)
    if torch_version is None:
        return 0
    workloads = [w for w in args.workloads.split(",") if w]
    dtypes = [d for d in args.dtypes.split(",") if d]
    print("EveryO vs PyTorch, each alone in its own process:", machine_info())
    print("EveryO side: BLAS", blas_info(), "(default threads)")
    print(f"torch side: {args.torch_python}, torch {torch_version[0]}, {torch_version[1]} threads (default)")
    print(f"{args.rounds} rounds of alternating processes; figure = ratio of medians of per-process median steps")
    print(f"load average before: {os.getloadavg()[0]:.2f}\n")

    rows, busy_rows, targets = [], [], []
    for dtype in dtypes:
        for workload in workloads:
            try:
                with other_cpu() as others:
                    quiet = compare(args, workload, dtype)
            except ProcessFailed as exc:
                if exc.name != "torch":
                    raise  # EveryO failing is never a table entry
                # PyTorch cannot run this workload here (e.g. oneDNN has no float16 LSTM on this CPU):
                # said in both tables, not judged, and the other workloads still run.
                print(f"  {workload} {dtype}: torch failed: {exc.reason}", flush=True)
                rows.append(
                    [f"{workload} {dtype}", "-", f"torch failed: {exc.reason[:60]}", "-", "-", "-"]
                    + (["-"] if args.tuned else [])
                )
                target = TARGETS[workload] if dtype == "float32" else AUTOCAST_TARGET
                targets.append([f"{workload} {dtype}", f"<= {target}", "-", "-", "not judged (torch failed)"])
                continue
            ratio = ratio_of_medians(ms(quiet["everyo"]), ms(quiet["torch"]))
            row = [
                f"{workload} {dtype}",
                statistics.median(ms(quiet["everyo"])),
                statistics.median(ms(quiet["torch"])),
                ratio,
                statistics.median(r["peak_mib"] for r in quiet["everyo"]),
                statistics.median(r["peak_mib"] for r in quiet["torch"]),
            ]
            if args.tuned:
                tuned = quiet.get("everyo tuned")
                row.append(ratio_of_medians(ms(quiet["everyo"]), ms(tuned)) if tuned else "-")
            rows.append(row)
            target = TARGETS[workload] if dtype == "float32" else AUTOCAST_TARGET
            others_cores = "-" if others.cores is None else others.cores
            targets.append(
                [f"{workload} {dtype}", f"<= {target}", ratio, others_cores, verdict(ratio <= target, others)]
            )
            print(f"  {workload} {dtype}: everyo/torch {ratio:.3g}", flush=True)
            if args.busy:
                with cpu_hogs(2):
                    busy = compare(args, workload, dtype)
                eo_growth = ratio_of_medians(ms(busy["everyo"]), ms(quiet["everyo"]))
                torch_growth = ratio_of_medians(ms(busy["torch"]), ms(quiet["torch"]))
                # Judged only when the quiet baseline was quiet (the busy run's competition is the hogs).
                busy_verdict = verdict(eo_growth <= 1.1 * torch_growth, others)
                busy_rows.append(
                    [
                        f"{workload} {dtype}",
                        statistics.median(ms(busy["everyo"])),
                        eo_growth,
                        statistics.median(ms(busy["torch"])),
                        torch_growth,
                        busy_verdict,
                    ]
                )
    headers = ["workload", "everyo ms", "torch ms", "everyo/torch", "everyo MiB", "torch MiB"]
    if args.tuned:
        headers.append("untuned/tuned everyo")
    print()
    print_table("Training step, as a user gets it (median ms per step; peak RSS of the process)", headers, rows)
    print_table(
        "Targets of issue 24 (EveryO / torch; judged only when other processes used <= "
        f"{QUIET_OTHERS} cores during the comparison)",
        ["workload", "target", "reached", "others' cores", "verdict"],
        targets,
    )
    if args.busy:
        print_table(
            "Beside two CPU-bound processes (busy / quiet step time, each framework alone)",
            ["workload", "everyo busy ms", "everyo busy/quiet", "torch busy ms", "torch busy/quiet", "<= 1.1x torch's"],
            busy_rows,
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
