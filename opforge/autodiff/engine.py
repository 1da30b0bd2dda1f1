"""The eager backward pass: walk the recorded graph from the outputs back, calling each op's gradient rule.

Rules are written with ops, so with ``create_graph=True`` the backward pass is itself recorded and
can be differentiated again (second, third ... derivatives).
"""

from __future__ import annotations

from ..core import dtypes as D
from ..core.errors import ArgumentError, GradientError, describe
from ..core.grad_mode import set_grad_enabled
from ..core.opdef import flat_ranges, split_by_layout
from ..core.spec import Spec
from ..tensor import Node, Tensor, _new
from .rules import flatten_input_grads, input_label, reduce_to

# Set by the program layer: computes gradients of program Variables by appending backward ops.
symbolic_grad = None


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False) -> None:
    """Accumulate d(tensors)/d(leaf) into ``leaf.grad`` for every leaf that requires grad."""
    tensors = _as_list(tensors, "backward", "tensors")
    seeds = _seeds(tensors, grad_tensors, "backward")
    _run(tensors, seeds, None, create_graph, create_graph if retain_graph is None else retain_graph)


def grad(outputs, inputs, grad_outputs=None, create_graph=False, retain_graph=None, allow_unused=False):
    """The gradients of ``outputs`` with respect to ``inputs``, as a tuple (``.grad`` is left alone).

    Inside a traced function (outputs are program Variables) this appends the backward ops to the program
    instead: ``of.grad`` reads the same in eager and compiled code.
    """
    if symbolic_grad is not None and not isinstance(outputs, Tensor) and any(
            not isinstance(o, Tensor) for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])):
        return symbolic_grad(outputs, inputs, grad_outputs, allow_unused)
    outputs = _as_list(outputs, "grad", "outputs")
    inputs = _as_list(inputs, "grad", "inputs")
    for i, t in enumerate(inputs):
        if not t.requires_grad:
            raise GradientError(f"grad(): inputs[{i}] does not require grad, so no gradient reaches it")
    seeds = _seeds(outputs, grad_outputs, "grad")
    found = _run(outputs, seeds, inputs, create_graph, create_graph if retain_graph is None else retain_graph)
    result = []
    for i, t in enumerate(inputs):
        g = found.get(_key(t))
        if g is None and not allow_unused:
            raise GradientError(
                f"grad(): inputs[{i}] (shape {t.shape}) was not used to compute the outputs; "
                "pass allow_unused=True to get None for it"
            )
        result.append(g)
    return tuple(result)


def _as_list(value, fn: str, arg: str) -> list:
    items = [value] if isinstance(value, Tensor) else list(value) if isinstance(value, (list, tuple)) else None
    if items is None or not all(isinstance(t, Tensor) for t in items):
        raise ArgumentError(f"{fn}(): argument '{arg}' expected a Tensor or a sequence of Tensors, "
                            f"got {describe(value)}")
    return items


def _seeds(outputs: list, given, fn: str) -> list:
    if given is None:
        given = [None] * len(outputs)
    else:
        given = [given] if isinstance(given, Tensor) or not isinstance(given, (list, tuple)) else list(given)
    if len(given) != len(outputs):
        raise ArgumentError(f"{fn}(): got {len(given)} output gradients for {len(outputs)} outputs")
    seeds = []
    for i, (t, g) in enumerate(zip(outputs, given)):
        if not t.requires_grad:
            raise GradientError(
                f"{fn}(): output {i} does not require grad: no recorded op made it from a tensor that "
                "requires grad (was it computed under no_grad, or from detached inputs?)"
            )
        if g is None:
            if t.size != 1:
                raise GradientError(
                    f"{fn}(): output {i} has shape {t.shape}; a gradient is implicit only for a single "
                    "value: pass the output gradient explicitly"
                )
            g = F.ones_like(t)
        else:
            if not isinstance(g, Tensor):
                from ..creation import tensor

                g = tensor(g, dtype=t.dtype)
            if g.shape != t.shape:
                raise ArgumentError(
                    f"{fn}(): the gradient for output {i} has shape {g.shape}, the output has shape {t.shape}"
                )
        seeds.append(g)
    return seeds


def _key(t: Tensor):
    """Where the gradient of ``t`` collects: its leaf self, or (its node, output index)."""
    return t if t._node is None else (t._node, t._index)


def _topological_order(roots: list) -> list:
    """Nodes reachable from ``roots``, each after every node that consumes its outputs."""
    post, visited = [], set()
    for root in roots:
        if root in visited:
            continue
        visited.add(root)
        stack = [(root, 0)]
        while stack:
            node, i = stack.pop()
            edges = node.edges
            while i < len(edges):
                edge = edges[i]
                i += 1
                if edge is not None and edge[1] >= 0 and edge[0] not in visited:
                    visited.add(edge[0])
                    stack.append((node, i))
                    stack.append((edge[0], 0))
                    break
            else:
                post.append(node)
    post.reverse()
    return post


def _run(outputs: list, seeds: list, capture: list | None, create_graph: bool, retain_graph: bool) -> dict:
    order = _topological_order([t._node for t in outputs if t._node is not None])
    if capture is None:
        runs = set(order)  # backward(): every recorded node leads to some leaf that requires grad
        capture_keys = set()
    else:
        capture_keys = {_key(t) for t in capture}
        reach, runs = set(), set()  # reach: gradient wanted at the node's outputs; runs: its rule is needed
        for node in reversed(order):
            if any(e is not None and (e in capture_keys or e[0] in capture_keys or e[0] in reach)
                   for e in node.edges):
                runs.add(node)
                reach.add(node)
            elif any((node, i) in capture_keys for i in range(len(node.out_meta))):
                reach.add(node)

    pending: dict = {}  # node -> list of gradients of its outputs, summed as they arrive
    found: dict = {}  # capture key -> gradient
    consumer: dict = {}  # node -> the node its gradient came from (to name the path in errors)
    given: set = set()  # gradients already stored as some leaf's .grad (each .grad owns its memory)

    with set_grad_enabled(create_graph):
        for t, g in zip(outputs, seeds):
            _accumulate(t, g, pending, found, capture_keys, capture is None, given)
        for node in order:
            grads = pending.pop(node, None)
            if grads is None:
                continue
            if capture_keys:
                for i, g in enumerate(grads):
                    if g is not None and (node, i) in capture_keys:
                        found[(node, i)] = g
            if node not in runs:
                continue
            if node.saved is None:
                raise GradientError(
                    f"backward through op '{node.op.name}' a second time: its saved values were freed "
                    "after the first backward; pass retain_graph=True to the first call"
                )
            input_grads = _call_rule(node, grads, create_graph, consumer)
            for i, (edge, g) in enumerate(zip(node.edges, input_grads)):
                if edge is None or g is None:
                    continue
                g = _fit(node, i, g)
                target, index = edge
                if index < 0:
                    if capture is None or target in capture_keys:
                        _accumulate(target, g, pending, found, capture_keys, capture is None, given)
                elif target in runs or (capture is not None and target in reach) or capture is None:
                    consumer.setdefault(target, node)
                    slots = pending.get(target)
                    if slots is None:
                        slots = pending[target] = [None] * len(target.out_meta)
                    slots[index] = g if slots[index] is None else slots[index] + g
            if not retain_graph:
                node.saved = None
                node.saved_out = None
    return found


def _accumulate(t: Tensor, g: Tensor, pending: dict, found: dict, capture_keys: set, into_grad: bool,
                given: set) -> None:
    """Add the gradient ``g`` of tensor ``t``: into ``t.grad`` for a leaf in backward(), else where it collects."""
    if g.dtype != t.dtype:
        g = F.cast(g, dtype=t.dtype)
    if t._node is None:
        if into_grad:
            if t.grad is not None:
                t.grad = t.grad + g
            elif g.requires_grad or (g._data.base is None and g not in given):
                given.add(g)
                t.grad = g
            else:  # shared with another leaf's .grad or a view of a live array: .grad must own its memory
                t.grad = _new(g._data.copy(), False, None, 0, g._device)
        elif t in capture_keys:
            found[t] = g if t not in found else found[t] + g
        return
    slots = pending.get(t._node)
    if slots is None:
        slots = pending[t._node] = [None] * len(t._node.out_meta)
    slots[t._index] = g if slots[t._index] is None else slots[t._index] + g


def _call_rule(node: Node, grads: list, create_graph: bool, consumer: dict) -> list:
    op = node.op
    rule = op.grad_rule
    if rule is None:
        raise GradientError(
            f"op '{op.name}' has no gradient rule, but it lies on the path to the output being "
            f"differentiated ({_path(node, consumer)}); give it one with @{op.name}.grad, mark it "
            f"traits=['no_grad'], or detach its input"
        )
    kwargs = dict(node.saved)
    plain_out = node.out_layout == (-1,)
    if plain_out and not rule.spec_params and len(rule.output_grads) == 1 and grads[0] is not None:
        # the common case, kept short: one output, plain inputs
        kwargs[rule.output_grads[0][0]] = grads[0]
        for name, entries in node.saved_out.items():
            kwargs[name] = _new(entries[0][1], create_graph, node if create_graph else None, 0)
        for name in rule.attrs:
            kwargs[name] = node.attrs[name]
        if rule.wants_needs:
            kwargs["needs_input_grad"] = _needs_input_grad(node)
        return flatten_input_grads(op, rule.fn(**kwargs), node.in_layout)
    outs = None if plain_out else flat_ranges(node.out_layout)
    for name, entries in node.saved_out.items():
        tensors = [_new(array, create_graph, node if create_graph else None, k) for k, array in entries]
        kwargs[name] = tensors if len(entries) != 1 or (not plain_out and outs[entries[0][0]][2]) else tensors[0]
    for name, i in rule.output_grads:
        start, count, is_list = (0, 1, False) if plain_out else outs[i]
        gs = []
        for k in range(start, start + count):
            g = grads[k]
            if g is None:  # a multi-output op where only some outputs got gradients
                shape, dtype = node.out_meta[k]
                g = F.zeros(shape=shape, dtype=dtype)
            gs.append(g)
        kwargs[name] = gs if is_list else gs[0]
    for name, where, i in rule.spec_params:
        meta, layout = (node.in_meta, node.in_layout) if where == "in" else (node.out_meta, node.out_layout)
        start, count, is_list = flat_ranges(layout)[i]
        specs = [None if meta[k] is None else Spec(*meta[k]) for k in range(start, start + count)]
        kwargs[name] = specs if is_list else specs[0]
    for name in rule.attrs:
        kwargs[name] = node.attrs[name]
    if rule.wants_needs:
        kwargs["needs_input_grad"] = _needs_input_grad(node)
    return flatten_input_grads(op, rule.fn(**kwargs), node.in_layout)


def _needs_input_grad(node: Node) -> tuple:
    """Per schema input: whether any of its tensors gets a gradient (a rule may skip the others)."""
    per_flat = [e is not None for e in node.edges]
    if all(n < 0 for n in node.in_layout):
        return tuple(per_flat)
    return tuple(any(v) if isinstance(v, list) else v for v in split_by_layout(per_flat, node.in_layout))


def _fit(node: Node, i: int, g) -> Tensor:
    """Check one gradient a rule returned: a Tensor, of its input's shape (summed down if broadcast)."""
    op = node.op
    if type(g) is Tensor and node.in_meta[i] == (g._data.shape, g._data.dtype):
        return g  # the common case: nothing to fix
    if not isinstance(g, Tensor):
        raise GradientError(
            f"gradient rule of op '{op.name}' returned {describe(g)} for input "
            f"'{input_label(op, i, node.in_layout)}'; rules compute with ops (F.*, Tensor operators) "
            "and return Tensors"
        )
    shape, dtype = node.in_meta[i]
    if g.shape != shape:
        g = reduce_to(op, input_label(op, i, node.in_layout), g, shape, F.sum_to)
    if g.dtype != dtype:
        if not D.is_floating(g.dtype):
            raise GradientError(
                f"gradient rule of op '{op.name}' returned a {g.dtype} gradient for input "
                f"'{input_label(op, i, node.in_layout)}' of dtype {dtype}"
            )
        g = F.cast(g, dtype=dtype)
    return g


def _path(node: Node, consumer: dict) -> str:
    names = [node.op.name]
    seen = {node}
    while node in consumer and consumer[node] not in seen:
        node = consumer[node]
        seen.add(node)
        names.append(node.op.name)
    return " -> ".join(names) + " -> output"


from .. import ops as F  # noqa: E402  (rules and the engine compute with ops)
