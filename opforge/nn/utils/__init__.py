"""``torch.nn.utils``: gradient clipping (``clip_grad_norm_``, ``clip_grad_value_``, the functions of
``opforge.optim.clip``), the parameters as one vector (``parameters_to_vector``, ``vector_to_parameters``), and
``nn.utils.rnn``, the variable-length batch helpers of the recurrent layers."""

from __future__ import annotations

from ...core.errors import ArgumentError, ShapeError, describe
from ...core.grad_mode import no_grad
from ...creation import cat
from ...optim.clip import clip_grad_norm_, clip_grad_value_
from ...tensor import Tensor
from . import rnn


def _tensors(parameters, name: str) -> list:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise ArgumentError(f"{name}(): parameter {i} must be a Tensor, got {describe(p)}")
    if not params:
        raise ArgumentError(f"{name}(): got no parameters")
    devices = {p.device.name for p in params}
    if len(devices) > 1:
        raise ArgumentError(f"{name}(): the parameters are on several devices ({sorted(devices)}), as torch refuses")
    return params


def parameters_to_vector(parameters) -> Tensor:
    """All ``parameters`` flattened and concatenated into one vector, in order (differentiable, as torch's)."""
    return cat([p.reshape(-1) for p in _tensors(parameters, "parameters_to_vector")])


def vector_to_parameters(vec, parameters) -> None:
    """Copy consecutive slices of ``vec`` into ``parameters``, each reshaped to its parameter (the inverse of
    ``parameters_to_vector``). The values are written into the parameters' own arrays, so optimizers and compiled
    functions holding them see the change (torch rebinds ``param.data``). ``vec`` must hold exactly as many values
    as the parameters, in their dtype: torch would ignore extra values, or change a parameter's dtype."""
    if not isinstance(vec, Tensor):
        raise ArgumentError(f"vector_to_parameters(): vec must be a Tensor, got {describe(vec)}")
    params = _tensors(parameters, "vector_to_parameters")
    total = sum(p.size for p in params)
    if vec.ndim != 1 or vec.shape[0] != total:
        raise ShapeError(f"vector_to_parameters(): vec must be a vector of {total} values (the parameters' count), "
                         f"got shape {tuple(vec.shape)}")
    start = 0
    with no_grad():
        for i, p in enumerate(params):
            if p.dtype != vec.dtype:
                raise ArgumentError(f"vector_to_parameters(): vec is {vec.dtype}, parameter {i} is {p.dtype}")
            p.copy_(vec[start:start + p.size].reshape(p.shape))
            start += p.size


__all__ = ["clip_grad_norm_", "clip_grad_value_", "parameters_to_vector", "rnn", "vector_to_parameters"]
