"""Scaled dot-product attention as ONNX's standard ``Attention`` op (opset 23+).

``MultiHeadAttention`` records ``matmul(q * scale, transpose(k)) -> softmax
(blocked=mask) -> matmul(weights, v)``. When the opset has ``Attention`` and
the installed ONNX Runtime runs it (probed once, on a tiny graph that must
also give zeros for a fully masked row, as core does), those three ops become
one ``Attention`` node; the MatMul/Softmax form stays for every other case
(and is removed as dead code when nothing else reads it).
"""

import functools

import numpy as np

MIN_OPSET = 23


@functools.cache
def runtime_runs_attention(opset):
    """Whether the installed ONNX Runtime runs ``Attention`` at ``opset`` as core computes attention."""
    try:
        import onnxruntime as ort

        from onnx import TensorProto, helper
    except ImportError:
        return False
    b, h, n, d = 1, 1, 2, 2
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [b, h, n, d]) for x in "qkv"]
    inputs.append(helper.make_tensor_value_info("m", TensorProto.BOOL, [b, 1, n, n]))
    graph = helper.make_graph(
        [helper.make_node("Attention", ["q", "k", "v", "m"], ["y"], scale=0.5)],
        "probe",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    ids = [helper.make_opsetid("", opset)]
    try:
        model = helper.make_model(graph, opset_imports=ids, ir_version=helper.find_min_ir_version_for(ids))
    except ValueError:  # the installed onnx does not know this opset (onnx < 1.18 stops at 21 or 22)
        return False
    q = k = np.eye(2, dtype=np.float32).reshape(b, h, n, d)
    v = np.array([[1, 2], [3, 4]], np.float32).reshape(b, h, n, d)
    mask = np.array([[True, False], [False, False]]).reshape(b, 1, n, n)  # row 1: every key blocked
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (y,) = session.run(None, {"q": q, "k": k, "v": v, "m": mask})
    except Exception:
        return False
    return bool(np.allclose(y.reshape(n, d), [[1, 2], [0, 0]], atol=1e-6))


def _pattern(t, node):
    """``(q, k, v, scale, context Value)`` when ``node`` (a softmax over the last
    axis) is the middle of scaled dot-product attention, else None."""
    scores = node.inputs[0]
    if scores.data.ndim != 4 or int(node.attrs.get("axis", -1)) % 4 != 3:
        return None
    product = scores.node
    if product is None or product.op != "matmul":
        return None
    scaled, k_t = product.inputs
    if scaled.node is None or scaled.node.op != "mul" or k_t.node is None or k_t.node.op != "transpose":
        return None
    if tuple(k_t.node.attrs["axes"]) != (0, 1, 3, 2):
        return None
    q, factor = scaled.node.inputs
    if factor.kind != "const" or factor.data.size != 1 or not q.dynamic:
        return None
    readers = t.tracer.consumers_of(node.outputs[0])
    after = [r for r, position in readers if r.op == "matmul" and position == 0]
    if len(after) != 1:
        return None
    v = after[0].inputs[1]
    return q, k_t.node.inputs[0], v, float(factor.data.reshape(())), after[0].outputs[0]


def fuse(t, node, blocked_mask):
    """Emit an ``Attention`` node for the context this softmax feeds, if it can be."""
    if t.g.opset < MIN_OPSET or not runtime_runs_attention(t.g.opset):
        return
    found = _pattern(t, node)
    if found is None:
        return
    q, k, v, scale, context = found
    inputs = [t.name(q, np.float32), t.name(k, np.float32), t.name(v, np.float32)]
    if blocked_mask is not None:
        inputs.append(t.g.node("Not", [blocked_mask]))  # ONNX: True = attend; core: True = blocked
    t.fused[id(context)] = t.g.node("Attention", inputs, scale=scale)
