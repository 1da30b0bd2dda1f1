"""The eager backward pass: walk the recorded graph from the outputs back, calling each op's gradient rule.

``grad`` is the whole algorithm: one walk finds the nodes between the outputs and the tensors whose gradients are
wanted (tinygrad's ``_deepwalk``), in an order where each node comes after every node that consumes it; then each
node's rule turns its outputs' summed gradients into its inputs' gradients (``rules.call_rule``, the one copy that
program mode uses too). ``backward`` is ``grad`` with respect to every leaf that requires grad, each gradient added
into ``leaf.grad`` as soon as it is final.

Rules are written with ops, so with ``create_graph=True`` the backward pass is itself recorded and can be
differentiated again (second, third ... derivatives).
"""

from __future__ import annotations

import threading

from .. import ops as F
from ..core.errors import ArgumentError, GradientError, describe
from ..core.grad_mode import set_grad_enabled
from ..core.interpreters import EAGER, current_interpreter
from ..dispatch import owner_of
from ..tensor import Node, Tensor, _epoch, _leaf_hooks, _node_hooks, check_saved, wrap
from . import replay
from .anomaly import AnomalyDetection
from .rules import call_rule, fit_inputs, input_label, missing_rule


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False) -> None:
    """Accumulate d(tensors)/d(leaf) into ``leaf.grad`` for every leaf that requires grad; then run the callbacks
    queued while it ran (``queue_callback``)."""
    tensors = _as_list(tensors, "backward", "tensors")
    seeds = _seeds(tensors, grad_tensors, "backward")
    depth = _running.depth  # a hook may call backward() itself: callbacks wait for the outermost one
    if depth == 0:
        _running.callbacks = []
    _running.depth = depth + 1
    try:
        _backprop(tensors, seeds, None, create_graph, create_graph if retain_graph is None else retain_graph)
    finally:
        _running.depth = depth
        queued, _running.callbacks = (_running.callbacks, None) if depth == 0 else (None, _running.callbacks)
    for fn in queued or ():
        fn()


class _Running(threading.local):
    depth = 0  # backward() calls running in this thread, one inside another's hook
    callbacks = None  # those queued during the outermost one


_running = _Running()


def queue_callback(fn) -> None:
    """Run ``fn()`` once the ``backward()`` now running (the outermost, in this thread) has made every gradient
    final — torch's ``Variable._execution_engine.queue_callback``: for a post-accumulate hook that must act after
    the last gradient, even if some leaf gets none (DistributedDataParallel)."""
    if _running.callbacks is None:
        raise GradientError("queue_callback(): no backward() is running in this thread")
    _running.callbacks.append(fn)


def grad(outputs, inputs, grad_outputs=None, create_graph=False, retain_graph=None, allow_unused=False):
    """The gradients of ``outputs`` with respect to ``inputs``, as a tuple (``.grad`` is left alone).

    On program variables (inside a traced function) the program's interpreter answers instead, by appending the
    backward ops to the program: ``of.grad`` reads the same in eager and compiled code.
    """
    if type(outputs) is not Tensor or (type(inputs) is not list and type(inputs) is not tuple) or \
            any(type(t) is not Tensor for t in inputs):  # the common eager call skips the look for program values
        interpreter = owner_of([outputs, inputs])
        if interpreter is not EAGER:
            return interpreter.differentiate(outputs, inputs, grad_outputs, allow_unused)
    outputs = _as_list(outputs, "grad", "outputs")
    inputs = _as_list(inputs, "grad", "inputs")
    for i, t in enumerate(inputs):
        if not t._requires_grad:
            raise GradientError(f"grad(): inputs[{i}] does not require grad, so no gradient reaches it")
    seeds = _seeds(outputs, grad_outputs, "grad")
    targets = {_key(t) for t in inputs}
    found = _backprop(outputs, seeds, targets, create_graph, create_graph if retain_graph is None else retain_graph)
    result = []
    for i, t in enumerate(inputs):
        g = found.get(_key(t))
        if g is not None and t._node is None and _leaf_hooks:
            for fn in list(_leaf_hooks.get(id(t), ())):
                g = _call_hook(fn, g)
        if g is None and not allow_unused:
            raise GradientError(
                f"grad(): inputs[{i}] (shape {t.shape}) was not used to compute the outputs; "
                "pass allow_unused=True to get None for it"
            )
        result.append(g)
    return tuple(result)


def _as_list(value, fn: str, arg: str) -> list:
    if type(value) is Tensor:
        return [value]
    items = [value] if isinstance(value, Tensor) else list(value) if isinstance(value, (list, tuple)) else None
    if items is None or not all(isinstance(t, Tensor) for t in items):
        raise ArgumentError(f"{fn}(): argument '{arg}' expected a Tensor or a sequence of Tensors, "
                            f"got {describe(value)}")
    return items


def _seeds(outputs: list, given, fn: str) -> list:
    if type(given) is Tensor and len(outputs) == 1:  # one output, its gradient given: checked here, shortly
        t = outputs[0]
        if t._requires_grad and given._data.shape == t._data.shape:
            return [given]
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

                g = tensor(g, dtype=t.dtype, device=t.device)
            if g.shape != t.shape:
                raise ArgumentError(
                    f"{fn}(): the gradient for output {i} has shape {g.shape}, the output has shape {t.shape}"
                )
        seeds.append(g)
    return seeds


def _key(t: Tensor):
    """Where the gradient of ``t`` collects: its leaf self, or (its node, output index)."""
    return t if t._node is None else (t._node, t._index)


def _walk(roots: list, targets: set | None) -> tuple[list, set, dict]:
    """The nodes reachable from ``roots``, each after every node that consumes its outputs; those whose rule must
    run (every one when ``targets`` is None, else those with an edge to a target or to a node that runs); and, when
    ``targets`` is None, node -> the leaves whose gradient is final once that node has run (their last consumer)."""
    post, visited, runs, finals, placed = [], set(), set(), {}, set()
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
            else:  # every producer is placed: this node's turn (post-order)
                post.append(node)
                if targets is None:
                    runs.add(node)
                    for edge in edges:  # the first consumer in post-order is the last one to run
                        if edge is not None and edge[1] < 0 and edge[0] not in placed:
                            placed.add(edge[0])
                            finals.setdefault(node, []).append(edge[0])
                else:
                    for e in edges:
                        if e is not None and (e[0] in runs or e[0] in targets or e in targets):
                            runs.add(node)
                            break
    post.reverse()
    return post, runs, finals


def _backprop(outputs: list, seeds: list, targets: set | None, create_graph: bool, retain_graph: bool) -> dict:
    """Propagate ``seeds`` back from ``outputs``. With ``targets`` (keys, see ``_key``) return their gradients;
    without, add every leaf's gradient into its ``.grad`` as soon as it is final."""
    roots = [t._node for t in outputs if t._node is not None]
    order, runs, finals = _walk(roots, targets)
    input_grads_of = _rule_caller(create_graph)
    pending: dict = {}  # node -> gradients of its flat outputs, summed as they arrive
    found: dict = {}  # target key (or, in backward(), leaf) -> its summed gradient
    given: set = set()  # gradients already stored as some leaf's .grad (each .grad owns its memory)
    # register_hook / retain_grad on some non-leaf (looked up per node only then). The mapping's own dict: its len()
    # is a Python method (0.4 µs); an entry whose node just died only costs a lookup that misses.
    hooked = bool(_node_hooks.data)
    target_nodes = {key[0] for key in targets if type(key) is tuple} if targets else ()  # nodes whose output is one

    with set_grad_enabled(create_graph):
        for t, g in zip(outputs, seeds):
            if t._node is None:
                found[t] = g if t not in found else found[t] + g
            else:
                _add(pending, t._node, t._index, g)
        if targets is None:  # an output that is itself a leaf and feeds no node is final already
            fed = {leaf for leaves in finals.values() for leaf in leaves}
            for leaf in [leaf for leaf in found if leaf not in fed]:
                _into_grad(leaf, found.pop(leaf), given)
        for node in order:
            grads = pending.pop(node, None)
            if grads is not None:
                if hooked and node in _node_hooks:
                    _run_hooks(_node_hooks[node], grads)
                if node in target_nodes:
                    for i, g in enumerate(grads):
                        if g is not None and (node, i) in targets:
                            found[(node, i)] = g
                if node in runs:
                    if node.op.grad_rule is None or node.saved is None:
                        _cannot_run(node, roots)
                    if node.epoch != _epoch[0]:  # an in-place write since the node was made: on what it saved?
                        check_saved(node)
                    for edge, g in zip(node.edges, input_grads_of(node, grads)):  # each input's gradient goes on
                        if edge is None or g is None:
                            continue
                        target, index = edge
                        if index < 0:
                            if targets is None or target in targets:
                                found[target] = g if target not in found else found[target] + g
                        elif target in runs or (targets is not None and (target, index) in targets):
                            slots = pending.get(target)
                            if slots is None:
                                slots = pending[target] = [None] * len(target.out_meta)
                            slots[index] = g if slots[index] is None else slots[index] + g
                    if not retain_graph:
                        node.saved = None
                        node.saved_out = None
                        node.residuals = None
            if finals:
                for leaf in finals.get(node, ()):
                    g = found.pop(leaf, None)
                    if g is not None:
                        _into_grad(leaf, g, given)
    return found


def _rule_caller(create_graph: bool):
    """How this backward pass turns a node's output gradients into its inputs' (fitted to their shapes and dtypes),
    chosen once per pass: under ``of.detect_anomaly()``, the rule checked for non-finite values; when the pass is
    not recorded, the rule replayed on arrays (``replay.py``); else the rule as written."""
    interpreter = current_interpreter()
    if type(interpreter) is AnomalyDetection:
        def checked(node: Node, grads: list) -> list:
            input_grads = fit_inputs(node, _call_checked(node, grads, create_graph, interpreter), Tensor)
            for i, (edge, g) in enumerate(zip(node.edges, input_grads)):
                if edge is not None and g is not None:
                    interpreter.check_gradient(node, input_label(node.op, i, node.in_layout), g)
            return input_grads

        return checked
    if not create_graph and replay.usable():
        return replay.run

    def as_written(node: Node, grads: list) -> list:
        return fit_inputs(node, call_rule(node, grads, create_graph), Tensor)

    return as_written


def _call_checked(node: Node, grads: list, create_graph: bool, anomaly: AnomalyDetection) -> list:
    """``call_rule`` under ``of.detect_anomaly()``: the rule's ops know whose backward they compute."""
    anomaly.backward_of = (node, getattr(node, "origin", None) or "an unknown place")
    try:
        return call_rule(node, grads, create_graph)
    finally:
        anomaly.backward_of = None


def _cannot_run(node: Node, roots: list) -> None:
    """The errors for a node on the path whose rule cannot run: none registered, or its saved values freed."""
    op = node.op
    if getattr(op, "refusal", None):  # a stand-in that says why no gradient passes (a compiled call's result)
        raise GradientError(op.refusal)
    if op.grad_rule is None:
        raise missing_rule(op.name, _path(node, roots), "detach its input")
    raise GradientError(
        f"backward through op '{op.name}' a second time: its saved values were freed "
        "after the first backward; pass retain_graph=True to the first call"
    )


def _add(pending: dict, node: Node, index: int, g: Tensor) -> None:
    slots = pending.get(node)
    if slots is None:
        slots = pending[node] = [None] * len(node.out_meta)
    slots[index] = g if slots[index] is None else slots[index] + g


def _run_hooks(hooks: dict, grads: list) -> None:
    """``register_hook``s (and ``retain_grad``) of a node's outputs: each may replace the output's gradient."""
    for index, fns in hooks.items():
        if grads[index] is not None:
            for fn in list(fns):
                grads[index] = _call_hook(fn, grads[index])


def _call_hook(fn, g: Tensor) -> Tensor:
    """The gradient after a ``register_hook`` hook saw it: ``g`` if the hook returned None, else what it returned,
    which must be a Tensor of g's shape, dtype and device (as torch checks): anything else would flow on as the
    gradient, and leave a ``.grad`` of another shape, or fail far from the hook."""
    new = fn(g)
    if new is None:
        return g
    if not isinstance(new, Tensor) or new._data.shape != g._data.shape or new._data.dtype != g._data.dtype \
            or new._device is not g._device:
        code = getattr(fn, "__code__", None)
        where = f" (defined at {code.co_filename}:{code.co_firstlineno})" if code is not None else ""
        raise GradientError(
            f"hook {getattr(fn, '__qualname__', type(fn).__name__)!r}{where} returned {describe(new)} for a gradient "
            f"of shape {tuple(g.shape)}, dtype {g.dtype} on '{g.device}': a hook returns None (keep the gradient) or "
            "a Tensor of the gradient's shape, dtype and device (to replace it)"
        )
    return new


def _into_grad(leaf: Tensor, g: Tensor, given: set) -> None:
    """Add a leaf's final gradient into ``leaf.grad``; then run the hooks registered for that moment."""
    if _leaf_hooks:
        for fn in list(_leaf_hooks.get(id(leaf), ())):
            g = _call_hook(fn, g)
    if leaf._grad is not None:
        leaf._grad = leaf._grad + g
    elif g.requires_grad or (g._data.base is None and g not in given):
        given.add(g)
        leaf._grad = g
    else:  # shared with another leaf's .grad or a view of a live array: .grad must own its memory
        leaf._grad = wrap(g._data.copy(), g._device)
    for hook in getattr(leaf, "_hooks", None) or ():
        hook(leaf)


def _path(node: Node, roots: list) -> list:
    """Op names on a path from ``node`` to an output (found only when an error needs it)."""
    came_from, frontier = {root: None for root in roots}, list(roots)
    while frontier and node not in came_from:
        nxt = []
        for n in frontier:
            for edge in n.edges:
                if edge is not None and edge[1] >= 0 and edge[0] not in came_from:
                    came_from[edge[0]] = n
                    nxt.append(edge[0])
        frontier = nxt
    names = []
    while node is not None:
        names.append(node.op.name)
        node = came_from.get(node)
    return [*names, "output"]

