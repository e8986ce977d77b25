"""Graph clean-ups after translation: cancel inverse Transpose pairs, drop dead nodes.

EveryO is channels-last and ONNX's Conv and pools are channels-first, so each
of them sits between two Transposes. Between two such nodes there are often
only elementwise ops (ReLU, a folded batch norm): those run just as well in
NCHW, so the Transpose out of one window node and the Transpose into the
next cancel, and a chain of convolutions has one Transpose in and one out.
"""

import numpy as np

# Elementwise ops that commute with a Transpose: unary ones, and binary ones
# whose other operand is a constant (permuted with them).
_UNARY = {"Relu", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Abs", "Neg", "Identity", "Elu", "LeakyRelu"}
_BINARY = {"Add", "Sub", "Mul", "Div"}


def _perm(node):
    return list(next(a.ints for a in node.attribute if a.name == "perm"))


def _maps(g):
    producer = {out: i for i, n in enumerate(g.nodes) for out in n.output}
    consumers = {}
    for i, n in enumerate(g.nodes):
        for name in n.input:
            consumers.setdefault(name, []).append(i)
    return producer, consumers


def cancel_transposes(g, outputs):
    """Remove ``Transpose(p) -> [elementwise ...] -> Transpose(inverse of p)`` chains."""
    changed = True
    while changed:
        changed = False
        producer, consumers = _maps(g)
        for i, last in enumerate(g.nodes):
            if last.op_type != "Transpose" or last.input[0] not in producer:
                continue
            chain, name, first = [], last.input[0], None
            while first is None:
                j = producer.get(name)
                if j is None or name in outputs or len(consumers.get(name, [])) != 1:
                    break
                n = g.nodes[j]
                operands = [x for x in n.input if x not in g.initializers]
                if n.op_type == "Transpose":
                    first = n
                elif n.op_type in _UNARY or (n.op_type in _BINARY and len(operands) == 1 and len(n.input) == 2):
                    chain.append(n)
                    name = operands[0]
                else:
                    break
            if first is None:
                continue
            p1, p2 = _perm(first), _perm(last)
            if [p1[k] for k in p2] != list(range(len(p1))):
                continue
            if not _move_constants(g, chain, p1):
                continue
            # The chain now reads the Transpose's input and runs in its layout.
            if chain:
                bottom = chain[-1]
                bottom.input[list(bottom.input).index(name)] = first.input[0]
                g.layout_changed.update(out for n in chain for out in n.output)
                replacement = chain[0].output[0]
            else:
                replacement = first.input[0]
            _rename_uses(g, last.output[0], replacement, outputs)
            del g.nodes[i], g.origins[i]  # the first Transpose is left for eliminate_dead
            changed = True
            break
    return g


def _move_constants(g, chain, perm):
    """Re-lay the constant operands of ``chain`` for the untransposed layout; False if one cannot be."""
    inverse = list(np.argsort(perm))
    rank = len(perm)
    updates = {}
    for n in chain:
        for name in n.input:
            if name in g.initializers:
                c = g.initializers[name]
                if c.ndim > rank:
                    return False
                updates[name] = c.reshape((1,) * (rank - c.ndim) + c.shape).transpose(inverse)
    for n in chain:
        for k, name in enumerate(n.input):
            if name in updates:
                # A fresh initializer: the original may be shared with nodes outside the chain.
                n.input[k] = g.constant(updates[name], name + "_nchw")
    return True


def _rename_uses(g, old, new, outputs):
    for n in g.nodes:
        for k, name in enumerate(n.input):
            if name == old:
                n.input[k] = new
    if old in outputs:
        outputs[outputs.index(old)] = new


def eliminate_dead(g, outputs):
    """Drop nodes no graph output depends on, and unused initializers."""
    producer, _ = _maps(g)
    live, stack = set(), list(outputs)
    while stack:
        name = stack.pop()
        j = producer.get(name)
        if j is None or j in live:
            continue
        live.add(j)
        stack.extend(x for x in g.nodes[j].input if x)
    keep = sorted(live)
    g.nodes = [g.nodes[j] for j in keep]
    g.origins = [g.origins[j] for j in keep]
    used = {x for n in g.nodes for x in n.input}
    g.initializers = {k: v for k, v in g.initializers.items() if k in used}
    return g


def identity_outputs(g, names, outputs):
    """Make each graph output a distinct node output named ``names[k]``."""
    from onnx import helper

    final = []
    g.origin = None
    for want, have in zip(names, outputs):
        g.nodes.append(helper.make_node("Identity", [have], [want], name=f"output_{want}"))
        g.origins.append(None)
        final.append(want)
    return final
