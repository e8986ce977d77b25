"""What a graph keeps alive for backward, op by op: name, dtype and bytes of every
array the backward closures hold, for the bench_amp workloads under autocast and in
float32. A diagnostic for the saved-activation ratio of bench_amp.py.

    python benchmarks/saved_tensors.py [workload ...]     (mlp, cnn, transformer)

Walks the graph from the loss; each node's output (kept alive through its children's
``_parents``: marked [out]) and its backward closure ([saved]) is searched (through
nested closures, tuples, lists and Tensors) for ndarrays. Arrays are counted once,
by the memory they own (views are charged to their base), and charged to the first
node (in reverse topological order, i.e. from the loss) that reaches them. Parameters
and the input batch are left out (they are not activations).
"""

import collections
import os
import sys
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_amp  # noqa: E402

import everyo as eo  # noqa: E402
from everyo.tensor import Tensor  # noqa: E402


def _owner(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _arrays(obj, seen, out, depth=0):
    """ndarrays reachable from a closure value (not through other graph nodes' closures)."""
    if depth > 6 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        out.append(obj)
    elif isinstance(obj, Tensor):
        if obj._data is not None:
            out.append(obj._data)
    elif isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                _arrays(cell.cell_contents, seen, out, depth + 1)
            except ValueError:  # empty cell
                pass
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            _arrays(v, seen, out, depth + 1)
    elif isinstance(obj, dict):
        for v in obj.values():
            _arrays(v, seen, out, depth + 1)
    elif hasattr(obj, "f32"):  # a Rounded
        out.append(obj.f32)


def _name(fn):
    q = getattr(fn, "__qualname__", repr(fn)).replace(".<locals>", "")
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ())) if hasattr(fn, "__code__") else {}
    if "inner" in cells:  # the 16-bit wrapper of everyo.low_precision: name the op inside
        return _name(cells["inner"].cell_contents) + " (16-bit in float32)"
    return q


def saved(loss, exclude):
    order, stack, visited = [], [loss], set()
    while stack:  # nodes from the loss down (parents after children)
        t = stack.pop()
        if id(t) in visited:
            continue
        visited.add(id(t))
        order.append(t)
        stack.extend(t._parents)
    owners = {id(_owner(a)) for a in exclude}
    counted, rows = set(), collections.defaultdict(lambda: [0, 0])
    for t in order:
        if t._backward is None:
            continue
        found = []
        if t._data is not None:  # the graph keeps every node's output alive through _parents
            found.append((t._data, "out"))
        closure = []
        _arrays(t._backward, set(), closure)
        found += [(a, "saved") for a in closure]
        for a, what in found:
            base = _owner(a)
            if id(base) in counted or id(base) in owners:
                continue
            counted.add(id(base))
            key = (f"{_name(t._backward)} [{what}]", str(base.dtype))
            rows[key][0] += 1
            rows[key][1] += base.nbytes
    return rows


def report(label, make, x, y, loss_fn, dtype):
    model = make()
    exclude = [p.data for p in model.parameters()] + [x.data]
    with eo.autocast(enabled=dtype is not None, dtype=dtype or "float16"):
        out = model(x)
    loss = loss_fn(out, y)
    rows = saved(loss, exclude)
    total = sum(b for _, b in rows.values())
    print(f"{label}: {total / 1e6:.3f} MB held by backward closures")
    for (name, dt), (n, b) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:60s} {dt:9s} {n:4d} arrays {b / 1e6:9.3f} MB")
    return total


CASES = {"mlp": bench_amp.mlp_case, "cnn": bench_amp.cnn_case, "transformer": bench_amp.transformer_case}


def main(names):
    for name in names or CASES:
        make, x, y, loss_fn = CASES[name]()
        t32 = report(f"{name} float32", make, x, y, loss_fn, None)
        t16 = report(f"{name} autocast float16", make, x, y, loss_fn, "float16")
        print(f"{name}: autocast / float32 = {t16 / t32:.3f}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
