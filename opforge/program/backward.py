"""``append_backward``: the backward pass as a transformation of the program.

It walks the ops that lie on a path from the variables to differentiate (``wrt``) to the loss, in reverse, and
runs each op's gradient rule on program Variables: the rule is the same Python function eager autograd calls,
and here the ops it calls *emit* the gradient OpDescs (PaddlePaddle's GradOpDescMaker, with no second copy of
any rule). Gradients written more than once are summed by one ``add_n``. Running it again on a program that
holds backward ops gives second-order gradients.
"""

from __future__ import annotations

from ..autodiff.rules import flatten_input_grads
from ..core import dtypes as D
from ..core.errors import ArgumentError, GradientError
from ..core.opdef import registry
from ..core.spec import Spec, broadcast_shapes
from ..dispatch import tracing
from .desc import Program
from .trace import Variable, building


def _name(program: Program, v, what: str) -> str:
    if isinstance(v, Variable):
        if v.program is not program:
            raise ArgumentError(f"append_backward(): {what} {v.name!r} belongs to another program")
        return v.name
    if isinstance(v, str) and v in program.block.vars:
        return v
    raise ArgumentError(f"append_backward(): {what} must be a Variable of the program or a variable name, got {v!r}")


def append_backward(program: Program, loss, wrt=None, no_grad=()) -> dict:
    """Append the ops computing d(loss)/d(v) for every v in ``wrt`` (default: every persistable float variable).

    Returns ``{variable name: gradient Variable}`` for ``wrt``; gradients are also listed in
    ``program.grad_names``. Variables in ``no_grad`` and those marked ``stop_gradient`` are not differentiated.
    """
    loss_name = _name(program, loss, "loss")
    block = program.block
    if wrt is None:
        wrt_names = [v.name for v in block.vars.values()
                     if v.persistable and not v.stop_gradient and D.is_floating(v.spec.dtype)]
    else:
        wrt_names = [_name(program, v, "wrt") for v in (wrt if isinstance(wrt, (list, tuple)) else [wrt])]
    for n in wrt_names:
        if not D.is_floating(block.vars[n].spec.dtype):
            raise GradientError(f"append_backward(): cannot differentiate with respect to {n!r}, "
                                f"a {block.vars[n].spec.dtype} variable")
    if not D.is_floating(block.vars[loss_name].spec.dtype):
        raise GradientError(f"append_backward(): the loss {loss_name!r} is {block.vars[loss_name].spec.dtype}")
    blocked = {_name(program, v, "no_grad") for v in no_grad}
    program.backward_requests.append((loss_name, tuple(wrt_names), tuple(sorted(blocked))))
    previous_role, previous_program = building.role, building.program
    building.role, building.program = "backward", program
    tracing.active += 1  # rules' ops on constants or with no inputs (zeros of a run-time shape) are recorded too
    try:
        grads = _emit(program, loss_name, wrt_names, blocked)
    finally:
        tracing.active -= 1
        building.role, building.program = previous_role, previous_program
    result = {}
    for n in wrt_names:
        g = grads.get(n)
        if g is not None:
            program.grad_names[n] = g
            result[n] = Variable(program, g)
    return result


def _emit(program: Program, loss_name: str, wrt_names: list, blocked: set) -> dict:
    block = program.block
    ops = list(block.ops)  # the ops present now (backward ops of an earlier call included: second order)
    # Forward: which variables depend differentiably on wrt.
    live = {n for n in wrt_names if n not in blocked}
    for op in ops:
        opdef = registry.get(op.type)
        if "no_grad" in opdef.traits:
            continue
        if any(n in live for p in opdef.inputs if p.differentiable for n in op.inputs[p.name]):
            live.update(n for n in op.output_names() if not block.vars[n].stop_gradient and n not in blocked
                        and D.is_floating(block.vars[n].spec.dtype))
    # Backward: which ops lie on a path to the loss; consumer[n] remembers the path for error messages.
    reaches = {loss_name}
    consumer: dict = {}
    on_path = []
    for op in reversed(ops):
        outs = [n for n in op.output_names() if n in reaches and n in live]
        if not outs:
            continue
        opdef = registry.get(op.type)
        diff_inputs = [n for p in opdef.inputs if p.differentiable for n in op.inputs[p.name] if n in live]
        if not diff_inputs:
            continue
        on_path.append(op)
        for n in diff_inputs:
            reaches.add(n)
            consumer.setdefault(n, (op, outs[0]))
    contributions: dict = {loss_name: [_seed(program, loss_name)]}
    for op in on_path:
        opdef = registry.get(op.type)
        out_grads = {n: _total(program, n, contributions) for n in op.output_names()}
        if all(g is None for g in out_grads.values()):
            continue
        if opdef.grad_rule is None:
            raise GradientError(
                f"op '{op.type}' has no gradient rule, but it lies on the path to the loss "
                f"({_path(op, consumer, loss_name)}); give it one with @{op.type}.grad, mark it "
                f"traits=['no_grad'], or put its input in no_grad"
            )
        wanted = []
        for p in opdef.inputs:
            for n in op.inputs[p.name]:
                wanted.append(p.differentiable and n in live and n in reaches)
        input_grads = _call_rule(program, op, opdef, out_grads, wanted)
        for n, want, g in zip(op.input_names(), wanted, input_grads):
            if want and g is not None:
                contributions.setdefault(n, []).append(_fit(program, opdef, n, g))
    return {n: _total(program, n, contributions) for n in wrt_names if n in contributions}


def _seed(program: Program, loss_name: str) -> str:
    from .. import ops as F

    return F.ones_like(Variable(program, loss_name)).name


def _total(program: Program, name: str, contributions: dict) -> str | None:
    """The gradient of ``name``: its only contribution, or one add_n of all of them."""
    parts = contributions.get(name)
    if not parts:
        return None
    if len(parts) > 1:
        from .. import ops as F

        parts[:] = [F.add_n([Variable(program, p) for p in parts]).name]
    return parts[0]


def _call_rule(program: Program, op, opdef, out_grads: dict, wanted: list) -> list:
    from .. import ops as F

    rule = opdef.grad_rule
    block = program.block
    kwargs = {}
    for name, i in rule.saved_inputs:
        slot = op.inputs[opdef.inputs[i].name]
        if opdef.inputs[i].is_list:
            kwargs[name] = [Variable(program, n) for n in slot]
        else:
            kwargs[name] = Variable(program, slot[0]) if slot else None
    def one_or_list(names, is_list, make):
        values = [make(n) for n in names]
        return values if is_list else (values[0] if values else None)

    def grad_of(n):
        g = out_grads[n]
        return Variable(program, g) if g is not None else F.zeros_like(Variable(program, n))

    def spec_of(n):
        return Spec(Variable(program, n).shape, block.vars[n].spec.dtype)

    for name, i in rule.saved_outputs:
        o = opdef.outputs[i]
        kwargs[name] = one_or_list(op.outputs[o.name], o.is_list, lambda n: Variable(program, n))
    for name, i in rule.output_grads:
        o = opdef.outputs[i]
        kwargs[name] = one_or_list(op.outputs[o.name], o.is_list, grad_of)
    for name, where, i in rule.spec_params:
        p = (opdef.inputs if where == "in" else opdef.outputs)[i]
        names = (op.inputs if where == "in" else op.outputs)[p.name]
        kwargs[name] = one_or_list(names, p.is_list, spec_of)
    for name in rule.attrs:
        kwargs[name] = op.attrs[name]
    layout = tuple(len(op.inputs[p.name]) if p.is_list else -1 for p in opdef.inputs)
    if rule.wants_needs:
        per_input, k = [], 0
        for p in opdef.inputs:
            count = len(op.inputs[p.name])
            per_input.append(any(wanted[k:k + count]))
            k += count
        kwargs["needs_input_grad"] = tuple(per_input)
    flat = flatten_input_grads(opdef, rule.fn(**kwargs), layout)
    # A missing Tensor? input has a place in the rule's result but no variable in the OpDesc: drop it.
    present = [bool(op.inputs[p.name]) for p, n in zip(opdef.inputs, layout) for _ in range(max(n, 1))]
    return [g for keep, g in zip(present, flat) if keep]


def _fit(program: Program, opdef, name: str, g) -> str:
    from .. import ops as F

    if not isinstance(g, Variable):
        raise GradientError(f"gradient rule of op '{opdef.name}' returned {type(g).__name__} for input {name!r}; "
                            "rules compute with ops and return program variables here")
    target = Variable(program, name)
    have, want = g.spec.shape, target.spec.shape
    same = len(have) == len(want) and all(a is None or b is None or a == b for a, b in zip(have, want))
    if not same:  # a broadcast input: sum the gradient down to its shape (unknown dims resolved at run time)
        try:
            fits = len(broadcast_shapes(want, have)) == len(have)
        except ValueError:
            fits = False
        if not fits:
            raise GradientError(f"gradient rule of op '{opdef.name}' returned a gradient of shape {have} for "
                                f"input {name!r} of shape {want}")
        g = F.sum_to(g, shape=target.shape)
    if g.dtype != target.dtype:
        g = F.cast(g, dtype=target.dtype)
    return g.name


def _path(op, consumer: dict, loss_name: str) -> str:
    names = [op.type]
    out = op.output_names()[0]
    seen = set()
    while out != loss_name and out in consumer and out not in seen:
        seen.add(out)
        nxt, out = consumer[out]
        names.append(nxt.type)
    return " -> ".join(names) + f" -> {loss_name}"
