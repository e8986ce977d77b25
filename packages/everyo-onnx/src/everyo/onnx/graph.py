"""A small ONNX graph builder: nodes, weights and unique names.

The converters only ever append to one ``GraphBuilder``; turning it into a
``ModelProto`` happens once, at the end, so a failure part-way leaves nothing
behind (the exporter writes the file only after the whole model is built and
checked).
"""
import numpy as np

# NHWC <-> NCHW permutations for the Transpose pair around Conv and the pools.
TO_NCHW = (0, 3, 1, 2)
TO_NHWC = (0, 2, 3, 1)


class GraphBuilder:
    """Collects nodes and initializers; names stay unique and readable.

    Value names carry the layer's position (``model[2][0]``), so a node in a
    viewer such as Netron can be traced back to the EveryO layer it came from.
    """

    def __init__(self, input_name, output_name, opset):
        self.input_name = input_name
        self.opset = opset
        self.nodes = []
        self.initializers = []
        # Both graph names are reserved up front so no generated name can take them.
        self._names = {input_name, output_name}

    def fresh(self, base):
        """A value name not used yet, derived from ``base``."""
        name, k = base, 1
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def weight(self, base, array):
        """Add a float32 initializer and return its name."""
        from onnx import numpy_helper

        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=np.float32), name))
        return name

    def node(self, op_type, inputs, where, label=None, **attributes):
        """Append one node with a single output and return the output's name
        (``where/label``, the label defaulting to the op type)."""
        from onnx import helper

        output = self.fresh(f"{where}/{label or op_type}")
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=output, **attributes))
        return output

    def transpose(self, value, perm, where):
        label = "ToNCHW" if tuple(perm) == TO_NCHW else "ToNHWC" if tuple(perm) == TO_NHWC else None
        return self.node("Transpose", [value], where, label, perm=list(perm))

    def rename_output(self, value, new_name):
        """Give the value ``value`` (produced by the last node) the graph's output name."""
        if value == self.input_name or not self.nodes or value not in self.nodes[-1].output:
            # An empty model (or one ending in a pass-through) still needs a node
            # that produces the named output.
            self.node("Identity", [value], "output")
            value = self.nodes[-1].output[0]
        node = self.nodes[-1]
        node.output[list(node.output).index(value)] = new_name
        node.name = new_name
        return new_name
