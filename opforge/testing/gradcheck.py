"""Numeric checks of analytic gradients, for the library's ops and for users' own.

``gradcheck`` compares, for every element of every input that requires grad, the analytic
vector-Jacobian product uᵀJ (from autograd, with a random cotangent u) against central differences
of uᵀf in float64. ``gradgradcheck`` does the same for the function x, u ↦ uᵀJ(x), i.e. it checks
the gradient of the gradient (which the backward pass records with ``create_graph=True``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..autodiff import grad
from ..core.errors import ArgumentError, describe
from ..core.grad_mode import enable_grad, no_grad
from ..tensor import Tensor, wrap


class GradcheckError(AssertionError):
    """Analytic and numeric gradients disagree; the message says where and by how much."""


@dataclass
class InputReport:
    label: str
    shape: tuple
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    worst_index: tuple = ()
    analytic: float = 0.0
    numeric: float = 0.0
    ok: bool = True


@dataclass
class GradcheckResult:
    name: str
    inputs: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.inputs)

    def __bool__(self) -> bool:
        return self.ok

    def report(self) -> str:
        lines = [f"{self.name}: {'passed' if self.ok else 'FAILED'}"]
        for r in self.inputs:
            lines.append(
                f"  input {r.label} {r.shape}: max abs error {r.max_abs_error:.3g}, max rel error "
                f"{r.max_rel_error:.3g}"
                + ("" if r.ok else f"  <-- worst at index {r.worst_index}: analytic {r.analytic:.6g}, "
                   f"numeric {r.numeric:.6g}")
            )
        return "\n".join(lines)

    __str__ = report


def _outputs(result) -> list:
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    flat = []
    for item in items:
        flat.extend(item if isinstance(item, list) else [item])
    if not all(isinstance(t, Tensor) for t in flat):
        raise ArgumentError(f"gradcheck(): the function must return Tensors, returned {describe(result)}")
    return [t for t in flat if t.dtype.kind == "f"]


def _host(t: Tensor) -> np.ndarray:
    """A tensor's values as a NumPy array, whatever its device (the checks compute on the host)."""
    return t.device.to_host(t._data)


def _like(array: np.ndarray, t: Tensor, requires_grad: bool = False) -> Tensor:
    """A host array as a tensor on ``t``'s device."""
    return wrap(t.device.from_host(array), t.device, requires_grad=requires_grad)


def _labels(inputs, names) -> list:
    return list(names) if names is not None else [f"#{i}" for i in range(len(inputs))]


def gradcheck(fn, inputs, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3, seed: int = 0,
              names=None, raise_exception: bool = True, name: str | None = None) -> GradcheckResult:
    """Check the gradients of ``fn(*inputs)`` w.r.t. every input that requires grad (float64 only).

    Returns a ``GradcheckResult`` (truthy when every input passes); with ``raise_exception`` a failure
    raises ``GradcheckError`` whose message names the input, the worst index and both values.
    """
    inputs = list(inputs)
    labels = _labels(inputs, names)
    wrt = [i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad]
    for i in wrt:
        if inputs[i].dtype != np.float64:
            raise ArgumentError(
                f"gradcheck(): input {labels[i]} is {inputs[i].dtype}; central differences need float64 "
                "(make the inputs with dtype=of.float64)"
            )
    result = GradcheckResult(name or getattr(fn, "__name__", "function"))
    outs = _outputs(fn(*inputs))
    if not outs or not wrt:
        return result
    rng = np.random.default_rng(seed)
    cotangents = [_like(rng.standard_normal(o.shape).astype(o.dtype), o) for o in outs]
    linked = [(o, u) for o, u in zip(outs, cotangents) if o.requires_grad]  # others do not depend on inputs
    if linked:
        analytic = grad([o for o, _ in linked], [inputs[i] for i in wrt], grad_outputs=[u for _, u in linked],
                        allow_unused=True)
    else:
        analytic = [None] * len(wrt)

    def projected(args) -> float:
        with no_grad():
            values = _outputs(fn(*args))
        return float(sum(np.sum(_host(v).astype(np.float64) * _host(u)) for v, u in zip(values, cotangents)))

    for i, g in zip(wrt, analytic):
        base = _host(inputs[i])
        a = np.zeros(base.shape) if g is None else np.asarray(_host(g), dtype=np.float64)
        numeric = np.zeros(base.shape)
        for index in np.ndindex(base.shape):
            values = []
            for step in (eps, -eps):
                shifted = base.copy()
                shifted[index] += step
                args = list(inputs)
                args[i] = _like(shifted, inputs[i])
                values.append(projected(args))
            numeric[index] = (values[0] - values[1]) / (2 * eps)
        both_nan = np.isnan(a) & np.isnan(numeric)
        err = np.where(both_nan, 0.0, np.abs(a - numeric))
        err = np.where(np.isnan(err), np.inf, err)  # NaN on one side only is a failure
        bad = ~(err <= atol + rtol * np.abs(np.nan_to_num(numeric)))
        report = InputReport(labels[i], base.shape)
        if err.size:
            worst = np.unravel_index(int(np.argmax(err - (atol + rtol * np.abs(np.nan_to_num(numeric))))), err.shape)
            report.max_abs_error = float(err.max())
            report.max_rel_error = float((err / np.maximum(np.abs(np.nan_to_num(numeric)), 1e-12)).max())
            report.worst_index = tuple(int(k) for k in worst)
            report.analytic, report.numeric = float(a[worst]), float(numeric[worst])
            report.ok = not bad.any()
        result.inputs.append(report)
    if raise_exception and not result.ok:
        raise GradcheckError(result.report())
    return result


def gradgradcheck(fn, inputs, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3, seed: int = 0,
                  names=None, raise_exception: bool = True, name: str | None = None) -> GradcheckResult:
    """Check second derivatives: gradcheck of (inputs, u) ↦ uᵀ·∂fn/∂inputs, built with create_graph=True."""
    inputs = list(inputs)
    labels = _labels(inputs, names)
    wrt = [i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad]
    outs = _outputs(fn(*inputs))
    rng = np.random.default_rng(seed + 1)
    cotangents = [_like(rng.standard_normal(o.shape).astype(o.dtype), o, requires_grad=True) for o in outs]

    def first_derivative(*args):
        xs, us = list(args[:len(inputs)]), list(args[len(inputs):])
        with enable_grad():  # also when gradcheck evaluates it at shifted points under no_grad
            for i in wrt:
                if not xs[i].requires_grad:
                    xs[i] = wrap(xs[i]._data, xs[i].device, requires_grad=True)
            ys = _outputs(fn(*xs))
            pairs = [(y, u) for y, u in zip(ys, us) if y.requires_grad]
            if not pairs:
                return ()
            gs = grad([y for y, _ in pairs], [xs[i] for i in wrt], grad_outputs=[u for _, u in pairs],
                      create_graph=True, allow_unused=True)
        return tuple(g for g in gs if g is not None)

    return gradcheck(first_derivative, inputs + cotangents, eps=eps, atol=atol, rtol=rtol, seed=seed,
                     names=labels + [f"d{k}" for k in range(len(outs))], raise_exception=raise_exception,
                     name=f"{name or getattr(fn, '__name__', 'function')} (second order)")
