import sys
import time

import torch

sys.path.insert(0, ".")  # run from the repository root
from bench import hf

mode, layers = sys.argv[1], int(sys.argv[2])
m = hf.build("hf-llama", layers, 64, 4, 512, 64)
if "nested" in mode:
    cls = type(m.model.layers[0])
    cls.forward = torch.compiler.nested_compile_region(cls.forward)
ids = torch.randint(0, 500, (2, 64))
graphs = []


def backend(gm, inputs):
    from fcache.frontend.capture import aot

    def comp(g, i):
        graphs.append(g)
        return g

    return aot(comp, comp, comp)(gm, inputs)


if mode.startswith("fcache"):
    import fcache

    fn = fcache.jit(m)
else:
    fn = torch.compile(m, backend=backend)
s = time.perf_counter()
out = fn(input_ids=ids).logits.float().pow(2).mean()
out.backward()
print(mode, layers, "first step", round(time.perf_counter() - s, 2), "s")
for g in graphs:
    ops = {}
    for n in g.graph.nodes:
        if n.op == "call_function":
            ops[str(n.target)] = ops.get(str(n.target), 0) + 1
    print(
        " graph nodes",
        len(g.graph.nodes),
        "invoke_subgraph",
        sum(v for k, v in ops.items() if "invoke_subgraph" in k),
        "submodules",
        len([n for n in g.graph.nodes if n.op == "get_attr"]),
    )
