"""``append_backward``: the backward pass as a transformation of the program.

It walks the ops that lie on a path from the variables to differentiate (``wrt``) to the loss, in reverse, and
runs each op's gradient rule on program Variables: the rule is the same Python function eager autograd calls,
and here the ops it calls *emit* the gradient OpDescs (PaddlePaddle's GradOpDescMaker, with no second copy of
any rule). Gradients written more than once are summed by one ``add_n``. Running it again on a program that
holds backward ops gives second-order gradients.
"""

from __future__ import annotations

from .. import ops as F
from ..autodiff.rules import call_rule, fit, missing_rule
from ..core import dtypes as D
from ..core.errors import ArgumentError, GradientError
from ..core.grad_mode import set_grad_enabled
from ..core.interpreters import interpreting
from ..core.opdef import registry
from ..core.spec import Spec
from .desc import OpDesc, Program
from .trace import Tracer, Variable


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

    Returns ``{"<variable>@GRAD": gradient Variable}`` for ``wrt`` — the names under which ``Executor.run`` returns
    them; gradients are also listed in ``program.grad_names``. Variables in ``no_grad`` and those marked
    ``stop_gradient`` are not differentiated.
    """
    grads = gradients(program, loss, wrt, no_grad)
    program.grad_names.update(grads)
    return {f"{n}@GRAD": Variable(program, g) for n, g in grads.items()}


def gradients(program: Program, loss, wrt=None, no_grad=()) -> dict:
    """``append_backward`` without touching ``program.grad_names``: ``{variable name: its gradient's variable
    name}`` for the variables of ``wrt`` the loss depends on (``of.grad`` and ``loss.backward()`` in traced code)."""
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
    found: dict = {}  # filled below: what the request made, kept with it (a pass that redoes it maps them)
    program.backward_requests.append((loss_name, tuple(wrt_names), tuple(sorted(blocked)), found))
    # The rules' ops — also those on constants or with no input at all (zeros of a run-time shape) — are appended
    # to the program, marked as backward ops; they stay differentiable (second order) whatever the grad mode.
    with interpreting(Tracer(program, role="backward")), set_grad_enabled(True):
        grads = _emit(program, loss_name, wrt_names, blocked)
    found.update((n, grads[n]) for n in wrt_names if grads.get(n) is not None)
    return dict(found)


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
        out_grads = [_total(program, n, contributions) for n in op.output_names()]
        if all(g is None for g in out_grads):
            continue
        if opdef.grad_rule is None:
            raise missing_rule(op.type, _path(op, consumer, loss_name), "put its input in no_grad")
        call = _OpCall(program, op, opdef, [p.differentiable and n in live and n in reaches
                                             for p in opdef.inputs for n in op.inputs[p.name]])
        flat = call_rule(call, [None if g is None else Variable(program, g) for g in out_grads])
        # A missing Tensor? input has a place in the rule's result but no variable in the OpDesc: drop it.
        present = [bool(op.inputs[p.name]) for p, n in zip(opdef.inputs, call.in_layout) for _ in range(max(n, 1))]
        input_grads = [g for keep, g in zip(present, flat) if keep]
        for n, want, g in zip(op.input_names(), call.wanted, input_grads):
            if want and g is not None:
                target = Variable(program, n)
                contributions.setdefault(n, []).append(fit(opdef, n, g, target.shape, target.dtype, Variable).name)
    return {n: _total(program, n, contributions) for n in wrt_names if n in contributions}


class _OpCall:
    """A program's recorded call (an OpDesc) as the view ``autodiff.rules.call_rule`` reads: its inputs and
    outputs are Variables, so the rule's ops append the gradient ops."""

    def __init__(self, program: Program, op: OpDesc, opdef, wanted: list):
        self.program, self.desc, self.op, self.attrs = program, op, opdef, op.attrs
        self.wanted = wanted  # per flat input present in the OpDesc: whether its gradient is wanted
        self.in_layout = tuple(len(op.inputs[p.name]) if p.is_list else -1 for p in opdef.inputs)
        self.out_layout = tuple(len(op.outputs[o.name]) if o.is_list else -1 for o in opdef.outputs)

    def _values(self, params, slots: dict, i: int, make):
        p = params[i]
        values = [make(n) for n in slots[p.name]]
        return values if p.is_list else (values[0] if values else None)

    def saved_inputs(self) -> dict:
        var = lambda n: Variable(self.program, n)  # noqa: E731
        return {name: self._values(self.op.inputs, self.desc.inputs, i, var)
                for name, i in self.op.grad_rule.saved_inputs}

    def saved_output(self, name: str, i: int, linked: bool):
        return self._values(self.op.outputs, self.desc.outputs, i, lambda n: Variable(self.program, n))

    def zeros(self, k: int):
        return F.zeros_like(Variable(self.program, self.desc.output_names()[k]))

    def residual(self, name: str, linked: bool):
        return None  # a program keeps no kernel residuals: the rule computes from its inputs (OpDef.saves)

    def spec(self, where: str, i: int):
        params, slots = (self.op.inputs, self.desc.inputs) if where == "in" else (self.op.outputs, self.desc.outputs)
        block = self.program.block
        return self._values(params, slots, i, lambda n: Spec(Variable(self.program, n).shape, block.vars[n].spec.dtype))

    def needs_input_grad(self) -> tuple:
        per_input, k = [], 0
        for p in self.op.inputs:
            count = len(self.desc.inputs[p.name])
            per_input.append(any(self.wanted[k:k + count]))
            k += count
        return tuple(per_input)


def _seed(program: Program, loss_name: str) -> str:
    return F.ones_like(Variable(program, loss_name)).name


def _total(program: Program, name: str, contributions: dict) -> str | None:
    """The gradient of ``name``: its only contribution, or one add_n of all of them."""
    parts = contributions.get(name)
    if not parts:
        return None
    if len(parts) > 1:
        parts[:] = [F.add_n([Variable(program, p) for p in parts]).name]
    return parts[0]


def _path(op, consumer: dict, loss_name: str) -> list:
    names = [op.type]
    out = op.output_names()[0]
    seen = set()
    while out != loss_name and out in consumer and out not in seen:
        seen.add(out)
        nxt, out = consumer[out]
        names.append(nxt.type)
    return [*names, loss_name]
