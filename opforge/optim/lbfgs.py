"""``LBFGS``: limited-memory BFGS over all parameters as one flat vector, with torch's optional strong-Wolfe line
search. Eager only: a step calls the closure several times and decides on the values it returns (line search,
convergence tests), which a compiled program cannot; the closure itself may be a compiled function."""

from __future__ import annotations

import math

import numpy as np

from .. import ops as F
from ..core.errors import ArgumentError, describe
from ..core.grad_mode import enable_grad, no_grad
from ..core.interpreters import current_interpreter
from ..creation import cat, tensor
from ..tensor import Tensor
from .optimizer import Optimizer

_VECTORS = ("d", "prev_flat_grad")  # state entries that are one flat vector
_LISTS = ("old_dirs", "old_stps")  # lists of flat vectors
_SCALAR_LISTS = ("ro", "al")  # lists of numbers (al: None until filled)


def _dot(a: Tensor, b: Tensor) -> float:
    return F.matmul(a, b).item()


def _absmax(v: Tensor) -> float:
    return F.amax(F.abs(v)).item()


def _cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=None):
    """The minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2), clipped to ``bounds`` (default: between
    x1 and x2); their middle when the cubic has none — torch's ``_cubic_interpolate``."""
    xmin_bound, xmax_bound = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 ** 2 - g1 * g2
    if d2_square >= 0:
        d2 = math.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(min_pos, xmin_bound), xmax_bound)
    return (xmin_bound + xmax_bound) / 2.0


def _strong_wolfe(obj_func, x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """A step length t along d meeting the strong Wolfe conditions (sufficient decrease c1, curvature c2), by
    bracketing then zooming with cubic interpolation — torch's ``_strong_wolfe``, step for step.
    Returns (f, g, t, evaluations)."""
    d_norm = _absmax(d)
    f_new, g_new = obj_func(x, t, d)
    ls_func_evals = 1
    gtd_new = _dot(g_new, d)
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    ls_iter = 0
    while ls_iter < max_ls:  # bracketing phase
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f, bracket_g, bracket_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new], \
                [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f, bracket_g, bracket_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new], \
                [gtd_prev, gtd_new]
            break
        min_step, max_step = t + 0.01 * (t - t_prev), t * 10  # interpolate, extrapolating at most 10x
        t_prev, t = t, _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))
        f_prev, g_prev, gtd_prev = f_new, g_new, gtd_new
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = _dot(g_new, d)
        ls_iter += 1
    if ls_iter == max_ls:  # reached the most evaluations allowed
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]
    # zoom phase: a point meeting the conditions, or the bracket shrunk below tolerance_change
    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1])
        # too close to a bound (or outside it) twice in a row: move 10% of the bracket away from it
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                t = max(bracket) - eps if abs(t - max(bracket)) < abs(t - min(bracket)) else min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = _dot(g_new, d)
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:  # not enough decrease: t is the new high
            bracket[high_pos], bracket_f[high_pos], bracket_g[high_pos], bracket_gtd[high_pos] = \
                t, f_new, g_new, gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:  # the old high becomes the low
                bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
                bracket_g[high_pos], bracket_gtd[high_pos] = bracket_g[low_pos], bracket_gtd[low_pos]
            bracket[low_pos], bracket_f[low_pos], bracket_g[low_pos], bracket_gtd[low_pos] = t, f_new, g_new, gtd_new
    return bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], ls_func_evals


class LBFGS(Optimizer):
    """``torch.optim.LBFGS``, step for step: ``step(closure)`` runs up to ``max_iter`` iterations of L-BFGS (the
    last ``history_size`` curvature pairs; the first step scaled to min(1, 1/|g|₁)·lr), with a fixed step ``lr``
    or, with ``line_search_fn="strong_wolfe"``, torch's line search, stopping as torch's does (``max_eval``
    closure calls, gradient below ``tolerance_grad``, change below ``tolerance_change``). ``closure`` clears the
    gradients, computes the loss, calls ``backward()`` and returns the loss; it is always required.

    One parameter group only, as torch's. The state (of the first parameter, as torch keeps it) has torch's
    entries: ``func_evals``, ``n_iter``, ``d``, ``t``, ``old_dirs``, ``old_stps``, ``ro``, ``H_diag``,
    ``prev_flat_grad``, ``prev_loss`` and ``al``; numbers are Python floats here (0-d tensors in torch, which load
    as well). Eager only: inside a compiled function ``step`` is refused; compile the closure instead.
    """

    def __init__(self, params, lr: float = 1, max_iter: int = 20, max_eval: int | None = None,
                 tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9, history_size: int = 100,
                 line_search_fn: str | None = None):
        if max_eval is None and isinstance(max_iter, int) and not isinstance(max_iter, bool):
            max_eval = max_iter * 5 // 4
        super().__init__(params, {"lr": lr, "max_iter": max_iter, "max_eval": max_eval,
                                  "tolerance_grad": tolerance_grad, "tolerance_change": tolerance_change,
                                  "history_size": history_size, "line_search_fn": line_search_fn})
        self._params = self.param_groups[0]["params"]

    def _check(self, hyper: dict) -> None:
        if hyper["line_search_fn"] not in (None, "strong_wolfe"):
            raise self._error(f"line_search_fn must be None or 'strong_wolfe', got {describe(hyper['line_search_fn'])}")
        for key in ("max_iter", "max_eval", "history_size"):
            value = hyper[key]
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
                raise self._error(f"{key} must be a positive int, got {describe(value)}")
        super()._check({k: v for k, v in hyper.items() if k != "line_search_fn"})
        self._check_nonnegative(hyper, "tolerance_grad", "tolerance_change")

    def add_param_group(self, group: dict) -> None:
        if self.param_groups:
            raise ArgumentError("LBFGS(): parameter groups (per-parameter options) are not supported: it has one "
                                "group, as torch's")
        super().add_param_group(group)

    # -- the flat vector of all parameters ------------------------------------------------------------------------

    def _gather_flat_grad(self) -> Tensor:
        return cat([F.zeros_like(p).reshape(-1) if p.grad is None else p.grad.reshape(-1) for p in self._params])

    def _add_grad(self, step_size: float, update: Tensor) -> None:
        offset = 0
        for p in self._params:
            n = p.size
            p.add_(update[offset:offset + n].reshape(p.shape) * step_size)
            offset += n

    def _directional_evaluate(self, closure, x: list, t: float, d: Tensor):
        """The loss and flat gradient at x + t·d; the parameters are back at x afterwards."""
        self._add_grad(t, d)
        with enable_grad():
            loss = float(closure())
        flat_grad = self._gather_flat_grad()
        for p, saved in zip(self._params, x):
            p.copy_(saved)
        return loss, flat_grad

    # -- the step -------------------------------------------------------------------------------------------------

    def step(self, closure=None):
        name = type(self).__name__
        if closure is None or not callable(closure):
            raise ArgumentError(f"{name}.step(): needs a closure that recomputes the loss (clears the gradients, "
                                f"computes the loss, calls backward() and returns it), got {describe(closure)}")
        if current_interpreter().symbolic:
            raise ArgumentError(f"{name}.step() cannot run inside a compiled function: it calls the closure several "
                                "times and decides on the values it returns (line search, convergence tests). Call "
                                "it eagerly; the closure may be compiled (of.compile)")
        with no_grad():
            return self._step(closure)

    def _step(self, closure):
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        line_search_fn, history_size = group["line_search_fn"], group["history_size"]
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        with enable_grad():
            orig_loss = closure()
        loss = float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        if _absmax(flat_grad) <= tolerance_grad:  # already optimal
            return orig_loss

        d, t = state.get("d"), state.get("t")
        old_dirs, old_stps, ro, H_diag = state.get("old_dirs"), state.get("old_stps"), state.get("ro"), \
            state.get("H_diag")
        prev_flat_grad, prev_loss = state.get("prev_flat_grad"), state.get("prev_loss")
        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:  # the first direction: steepest descent
                d = -flat_grad
                old_dirs, old_stps, ro, H_diag = [], [], [], 1
            else:  # L-BFGS: update the memory with the last step, then the two-loop recursion
                y = flat_grad - prev_flat_grad
                s = d * t
                ys = _dot(y, s)
                if ys > 1e-10:  # only pairs of positive curvature
                    if len(old_dirs) == history_size:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    H_diag = ys / _dot(y, y)  # the initial Hessian's scale
                num_old = len(old_dirs)
                if "al" not in state:
                    state["al"] = [None] * history_size
                al = state["al"]
                q = -flat_grad
                for i in range(num_old - 1, -1, -1):
                    al[i] = _dot(old_stps[i], q) * ro[i]
                    q = q + old_dirs[i] * -al[i]
                r = q * H_diag
                for i in range(num_old):
                    be_i = _dot(old_dirs[i], r) * ro[i]
                    r = r + old_stps[i] * (al[i] - be_i)
                d = r
            prev_flat_grad = flat_grad  # a new tensor per gather: nothing writes into it later
            prev_loss = loss
            t = min(1.0, 1.0 / F.sum(F.abs(flat_grad)).item()) * lr if state["n_iter"] == 1 else lr
            gtd = _dot(flat_grad, d)  # the directional derivative
            if gtd > -tolerance_change:  # not a descent direction
                break

            ls_func_evals = 0
            if line_search_fn is not None:
                x_init = [p.clone() for p in self._params]
                loss, flat_grad, t, ls_func_evals = _strong_wolfe(
                    lambda x, t, d: self._directional_evaluate(closure, x, t, d), x_init, t, d, loss, flat_grad,
                    gtd, max_ls=max_eval - current_evals)
                self._add_grad(t, d)
                opt_cond = _absmax(flat_grad) <= tolerance_grad
            else:  # a fixed step; re-evaluate unless this is the last iteration
                self._add_grad(t, d)
                opt_cond = False
                if n_iter != max_iter:
                    with enable_grad():
                        loss = float(closure())
                    flat_grad = self._gather_flat_grad()
                    opt_cond = _absmax(flat_grad) <= tolerance_grad
                    ls_func_evals = 1
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals

            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if _absmax(d * t) <= tolerance_change or abs(loss - prev_loss) < tolerance_change:  # no progress
                break

        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=H_diag,
                     prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        return orig_loss

    # -- state dicts ----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """torch's structure: ``{"state": {0: {...}}, "param_groups": [{..., "params": [0, 1, ...]}]}``, the state
        kept under the first parameter; tensors are copies."""
        def copy(value):
            if isinstance(value, Tensor):
                return tensor(value, device=value.device)
            return [copy(v) for v in value] if isinstance(value, list) else value

        state = self.state[self._params[0]]
        group = self.param_groups[0]
        return {"state": {0: {k: copy(v) for k, v in state.items()}} if state else {},
                "param_groups": [{**group.hyper(), "params": list(range(len(self._params)))}]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what ``state_dict`` returned, here or in torch (tensors as Tensors or NumPy arrays; 0-d ones become
        numbers). Every entry is checked before anything is loaded."""
        name = f"{type(self).__name__}.load_state_dict()"
        if not isinstance(state_dict, dict) or sorted(state_dict) != ["param_groups", "state"]:
            raise ArgumentError(f"{name}: expected a dict with 'state' and 'param_groups', got {describe(state_dict)}")
        groups = state_dict["param_groups"]
        numel = sum(p.size for p in self._params)
        if len(groups) != 1 or list(groups[0].get("params", [])) != list(range(len(self._params))):
            raise ArgumentError(f"{name}: expected one parameter group holding parameters "
                                f"{list(range(len(self._params)))}")
        hyper = {k: v for k, v in groups[0].items() if k != "params"}
        known = set(self.param_groups[0].hyper())
        if set(hyper) - {"initial_lr"} != known:
            raise ArgumentError(f"{name}: parameter group entries {sorted(hyper)}, expected {sorted(known)}")
        self._check(dict(hyper))
        entries = dict(state_dict["state"].get(0, {})) if state_dict["state"] else {}
        allowed = {"func_evals", "n_iter", "t", "H_diag", "prev_loss", *_VECTORS, *_LISTS, *_SCALAR_LISTS}
        if set(entries) - allowed or set(state_dict["state"]) - {0}:
            raise ArgumentError(f"{name}: unexpected state entries {sorted(set(entries) - allowed)}")

        def vector(value, key):
            host = value._device.to_host(value._data) if isinstance(value, Tensor) else np.asarray(value)
            if host.shape != (numel,):
                raise ArgumentError(f"{name}: state '{key}' must be a vector of {numel} values, got shape "
                                    f"{host.shape}")
            return tensor(host.astype(self._params[0].dtype), device=self._params[0].device)

        def number(value):
            return None if value is None else (value.item() if hasattr(value, "item") else value)

        state = {}
        for key, value in entries.items():
            if key in _VECTORS:
                state[key] = None if value is None else vector(value, key)
            elif key in _LISTS:
                state[key] = [vector(v, key) for v in value]
            elif key in _SCALAR_LISTS:
                state[key] = [number(v) for v in value]
            else:
                state[key] = number(value)
        first = self.state[self._params[0]]
        first.clear()
        first.update(state)
        for key, value in hyper.items():
            self.param_groups[0][key] = value
