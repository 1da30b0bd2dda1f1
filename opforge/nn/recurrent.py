"""Recurrent layers as torch's: ``RNN``, ``LSTM``, ``GRU`` and their cells, and variable-length batches
(``PackedSequence``, ``pack_padded_sequence`` and the rest of ``torch.nn.utils.rnn``).

Constructors, parameter names and layouts (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0``,
``weight_hr_l0``, ``_reverse`` for the second direction), initialisation (every parameter U(±1/√hidden_size)) and
the forward contract (time-major unless ``batch_first``, unbatched (L, H_in) inputs, optional initial states,
``(output, h_n)`` / ``(output, (h_n, c_n))``, PackedSequence in and out) are torch's, so torch state dicts load.

How a layer runs: per layer and direction, the input projection of all steps is one ``linear``, then the sequence
op (``lstm_layer``, ``gru_layer``: opforge/ops/recurrent.py) runs the recursion. An Elman RNN (tanh or relu) and an
LSTM with ``proj_size`` run as ops per step instead (the same math, slower: no sequence op of their own). A
PackedSequence is run padded (T, B, ·) with its ``batch_sizes``: rows past their length keep their state, so the
final states are each sequence's own last step's, as in torch; the output is packed again.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np

from .. import ops as F
from ..core import dtypes as D
from ..core.errors import ArgumentError, ShapeError, describe
from ..creation import full, tensor, zeros
from ..tensor import Tensor
from . import init
from .layers import _dtype
from .module import Module

# -- PackedSequence and torch.nn.utils.rnn ---------------------------------------------------------------------------


class PackedSequence(NamedTuple):
    """Sequences of several lengths in one tensor, as torch's: ``data`` holds the steps of every sequence that is
    still running, time step by time step (the sequences sorted by decreasing length), ``batch_sizes`` (int64, one
    per step) how many there are at each step; ``sorted_indices`` is the order that sorting chose (None when the
    batch came sorted) and ``unsorted_indices`` its inverse. Make one with ``pack_padded_sequence`` or
    ``pack_sequence``; the recurrent layers take it as input and return their output as one."""

    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Tensor | None = None
    unsorted_indices: Tensor | None = None

    def to(self, *args, **kwargs) -> PackedSequence:
        data = self.data.to(*args, **kwargs)
        return self if data is self.data else self._replace(data=data)

    def double(self) -> PackedSequence:
        return self.to(D.float64)

    def float(self) -> PackedSequence:
        return self.to(D.float32)


def invert_permutation(permutation: Tensor | None) -> Tensor | None:
    """The permutation that undoes ``permutation`` (None stays None)."""
    if permutation is None:
        return None
    order = _host_ints(permutation, "invert_permutation", "permutation")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return tensor(inverse)


def _host_ints(values, fn: str, name: str) -> np.ndarray:
    """A list or tensor of ints as a 1-D int64 array (sequence lengths, batch sizes, permutations: host data, as
    torch keeps them on the CPU)."""
    array = np.asarray(values.numpy() if isinstance(values, Tensor) else values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise ArgumentError(f"{fn}(): {name} must be a 1-D list or tensor of ints, got {describe(values)}")
    return array.astype(np.int64)


def _packed_rows(batch_sizes: np.ndarray) -> np.ndarray:
    """For each row of a packed ``data``, its index in the padded (T, B) grid flattened: t·B + b."""
    b = int(batch_sizes[0]) if len(batch_sizes) else 0
    return np.concatenate([t * b + np.arange(n) for t, n in enumerate(batch_sizes)]) if b else np.zeros(0, np.int64)


def pack_padded_sequence(input, lengths, batch_first: bool = False, enforce_sorted: bool = True) -> PackedSequence:
    """Pack a padded batch (T, B, *) — (B, T, *) with ``batch_first`` — of sequences of the given ``lengths``
    (a list or a CPU tensor). With ``enforce_sorted`` the lengths must be decreasing; without, the batch is sorted
    (stably: torch's sort may order equal lengths otherwise, which changes ``data``'s row order, not what
    unpacking gives). Gradients flow back to ``input``."""
    lengths = _host_ints(lengths, "pack_padded_sequence", "lengths")
    if input.ndim < 2:
        raise ShapeError(f"pack_padded_sequence(): input must have a time and a batch dim, got shape {input.shape}")
    x = F.transpose(input, perm=[1, 0, *range(2, input.ndim)]) if batch_first else input
    steps, batch = x.shape[0], x.shape[1]
    if len(lengths) != batch:
        raise ShapeError(f"pack_padded_sequence(): expected len(lengths) to be equal to batch_size, but got "
                         f"{len(lengths)} (batch_size={batch})")
    if len(lengths) and lengths.min() <= 0:
        raise ArgumentError("pack_padded_sequence(): every length must be greater than 0, got "
                            f"{lengths.tolist()}")
    if len(lengths) and lengths.max() > steps:
        raise ShapeError(f"pack_padded_sequence(): a length of {lengths.max()} is more than the {steps} steps of "
                         "the padded input")
    if enforce_sorted:
        if np.any(np.diff(lengths) > 0):
            raise ArgumentError("pack_padded_sequence(): `lengths` array must be sorted in decreasing order when "
                                "`enforce_sorted` is True. Pass enforce_sorted=False to sort the batch here "
                                f"(got lengths {lengths.tolist()})")
        order = None
    else:
        order = np.argsort(-lengths, kind="stable")
        lengths = lengths[order]
    batch_sizes = (lengths[None, :] > np.arange(lengths[0] if len(lengths) else 0)[:, None]).sum(1)
    # the rows of data, t·B + (the sorted position's original row)
    rows = _packed_rows(batch_sizes)
    if order is not None:
        rows = rows // batch * batch + order[rows % batch]
    flat = F.reshape(x, shape=[steps * batch, *x.shape[2:]])
    data = F.index_select(flat, 0, tensor(rows))
    sorted_indices = None if order is None else tensor(order)
    return PackedSequence(data, tensor(batch_sizes.astype(np.int64)), sorted_indices,
                          invert_permutation(sorted_indices))


def _padded_index(batch_sizes: np.ndarray, steps: int, order: np.ndarray | None) -> np.ndarray:
    """For the padded (steps, B) grid flattened (B in the original order when ``order`` maps original -> sorted
    positions): the row of packed data at each place, or len(data) (a padding row) past a sequence's end."""
    batch = int(batch_sizes[0])
    index = np.full((steps, batch), int(batch_sizes.sum()), np.int64)
    index[:len(batch_sizes)].reshape(-1)[_packed_rows(batch_sizes)] = np.arange(int(batch_sizes.sum()))
    return (index if order is None else index[:, order]).reshape(-1)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length: int | None = None):
    """Unpack a PackedSequence into a padded (T, B, *) tensor — (B, T, *) with ``batch_first`` — with
    ``padding_value`` past each sequence's end, in the batch's original order; returns ``(padded, lengths)``.
    ``total_length`` pads to that many steps (at least the longest sequence's)."""
    data, batch_sizes = sequence.data, _host_ints(sequence.batch_sizes, "pad_packed_sequence", "batch_sizes")
    steps = len(batch_sizes)
    if total_length is not None:
        if total_length < steps:
            raise ArgumentError("pad_packed_sequence(): expected total_length to be at least the length of the "
                                f"longest sequence in input, but got total_length={total_length} and max sequence "
                                f"length being {steps}")
        steps = total_length
    unsorted = None if sequence.unsorted_indices is None else \
        _host_ints(sequence.unsorted_indices, "pad_packed_sequence", "unsorted_indices")
    batch = int(batch_sizes[0])
    pad = full((1, *data.shape[1:]), padding_value, dtype=data.dtype, device=data.device)
    index = _padded_index(batch_sizes, steps, unsorted)
    padded = F.reshape(F.index_select(F.concat([data, pad], axis=0), 0, tensor(index)),
                       shape=[steps, batch, *data.shape[1:]])
    lengths = (batch_sizes[:, None] > np.arange(batch)[None, :]).sum(0)
    if unsorted is not None:
        lengths = lengths[unsorted]
    if batch_first:
        padded = F.transpose(padded, perm=[1, 0, *range(2, padded.ndim)])
    return padded, tensor(lengths.astype(np.int64))


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0, padding_side: str = "right"):
    """Stack tensors of shapes (L_i, *) into one (T, B, *) — (B, T, *) with ``batch_first`` — T the longest L_i,
    filling with ``padding_value`` after (``padding_side="right"``) or before ("left") each one."""
    if padding_side not in ("right", "left"):
        raise ArgumentError(f"pad_sequence(): padding_side must be 'right' or 'left', got {padding_side!r}")
    sequences = list(sequences)
    if not sequences:
        raise ArgumentError("pad_sequence(): expected at least one sequence")
    steps = max(s.shape[0] for s in sequences)
    padded = []
    for s in sequences:
        missing = steps - s.shape[0]
        if missing:
            widths = [0, 0] * (s.ndim - 1) + ([0, missing] if padding_side == "right" else [missing, 0])
            s = F.pad(s, pad=widths, value=float(padding_value))
        padded.append(s)
    return F.stack(padded, axis=0 if batch_first else 1)


def unpad_sequence(padded_sequences, lengths, batch_first: bool = False) -> list:
    """The sequences of a padded batch, each cut to its length: the inverse of ``pad_sequence``."""
    lengths = _host_ints(lengths, "unpad_sequence", "lengths")
    return [(padded_sequences[b] if batch_first else padded_sequences[:, b])[:n]
            for b, n in enumerate(lengths.tolist())]


def pack_sequence(sequences, enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of tensors (L_i, *): ``pack_padded_sequence(pad_sequence(sequences), lengths)``."""
    sequences = list(sequences)
    return pack_padded_sequence(pad_sequence(sequences), [s.shape[0] for s in sequences],
                                enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list:
    """The list of tensors a PackedSequence holds: the inverse of ``pack_sequence``."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)


# -- the layers ------------------------------------------------------------------------------------------------------

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _size(value, name: str, layer: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentError(f"{layer}(): {name} should be of type int, got: {type(value).__name__}")
    if value < minimum:
        raise ArgumentError(f"{layer}(): {name} must be greater than {'zero' if minimum else 'or equal to zero'}, "
                            f"got {value}")
    return int(value)


def _flag(value, name: str, layer: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{layer}(): {name} should be of type bool, got: {type(value).__name__}")
    return bool(value)


def _parameter(shape, dtype, device) -> Tensor:
    """A zero parameter; ``reset_parameters`` gives it its initial values."""
    return Tensor(np.zeros(shape, _dtype(dtype)), requires_grad=True, device=device)


def _check_state(layer: str, name: str, state, expected: tuple, dtype):
    if not isinstance(state, Tensor) and not hasattr(state, "shape"):
        raise ArgumentError(f"{layer}: {name} must be a tensor, got {describe(state)}")
    # sizes known only at run time (a traced batch: Dims of two inputs) cannot be compared until then
    if len(state.shape) != len(expected) or any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(state.shape, expected)):
        raise ShapeError(f"{layer}: expected {name} of size {tuple(expected)}, got {tuple(state.shape)}")
    if state.dtype != dtype:
        raise ArgumentError(f"{layer}: {name} has dtype {state.dtype}, the input {dtype}")


class RNNBase(Module):
    """What RNN, LSTM and GRU share: torch's constructor, parameters and their initialisation, and the forward
    pass over layers and directions (the cell of each mode is ``_run``)."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None):
        super().__init__()
        name = {"RNN_TANH": "RNN", "RNN_RELU": "RNN"}.get(mode, mode)
        if mode not in _GATES:
            raise ArgumentError(f"{name}(): unrecognized RNN mode {mode!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise ArgumentError(f"{name}(): dropout should be a number in range [0, 1] representing the "
                                f"probability of an element being zeroed, got {dropout!r}")
        self.mode = mode
        self.input_size = _size(input_size, "input_size", name)
        self.hidden_size = _size(hidden_size, "hidden_size", name)
        self.num_layers = _size(num_layers, "num_layers", name)
        self.bias = _flag(bias, "bias", name)
        self.batch_first = _flag(batch_first, "batch_first", name)
        self.dropout = float(dropout)
        self.bidirectional = _flag(bidirectional, "bidirectional", name)
        self.proj_size = _size(proj_size, "proj_size", name, 0)
        if self.proj_size and mode != "LSTM":
            raise ArgumentError(f"{name}(): proj_size argument is only supported for LSTM, not RNN or GRU")
        if self.proj_size >= self.hidden_size:
            raise ArgumentError(f"{name}(): proj_size has to be smaller than hidden_size, got proj_size="
                                f"{self.proj_size} and hidden_size={self.hidden_size}")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout "
                          f"expects num_layers greater than 1, but got dropout={dropout} and "
                          f"num_layers={num_layers}", stacklevel=2)
        gate_size = _GATES[mode] * self.hidden_size
        real_hidden = self.proj_size or self.hidden_size
        directions = 2 if self.bidirectional else 1
        self._flat_weights_names, self._all_weights = [], []
        for layer in range(self.num_layers):
            layer_input = self.input_size if layer == 0 else real_hidden * directions
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                shapes = {"weight_ih": (gate_size, layer_input), "weight_hh": (gate_size, real_hidden)}
                if self.bias:
                    shapes |= {"bias_ih": (gate_size,), "bias_hh": (gate_size,)}
                if self.proj_size:
                    shapes["weight_hr"] = (self.proj_size, self.hidden_size)
                names = []
                for kind, shape in shapes.items():
                    setattr(self, kind + suffix, _parameter(shape, dtype, device))
                    names.append(kind + suffix)
                self._flat_weights_names += names
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """torch's cuDNN weight packing: nothing to do here."""

    @property
    def all_weights(self) -> list:
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s

    # -- forward ---------------------------------------------------------------------------------------------------

    def _layer_name(self) -> str:
        return type(self).__name__

    def _weights(self, layer: int, direction: int) -> dict:
        suffix = f"_l{layer}" + ("_reverse" if direction else "")
        return {kind: getattr(self, kind + suffix, None)
                for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")}

    def forward(self, input, hx=None):
        name = self._layer_name()
        lstm = self.mode == "LSTM"
        directions = 2 if self.bidirectional else 1
        packed = isinstance(input, PackedSequence)
        batch_sizes = order = None
        if packed:
            data, batch_sizes = input.data, _host_ints(input.batch_sizes, name, "batch_sizes")
            if data.ndim != 2:
                raise ShapeError(f"{name}: a PackedSequence's data must have 2 dimensions, got {data.ndim}")
            batch, steps = int(batch_sizes[0]), len(batch_sizes)
            x = F.index_select(F.concat([data, zeros(1, data.shape[1], dtype=data.dtype, device=data.device)],
                                        axis=0), 0, tensor(_padded_index(batch_sizes, steps, None)))
            x = F.reshape(x, shape=[steps, batch, data.shape[1]])
            batched = True
        else:
            if input.ndim not in (2, 3):
                raise ShapeError(f"{name}: Expected input to be 2D or 3D, got {input.ndim}D instead")
            batched = input.ndim == 3
            x = input if batched else F.unsqueeze(input, axis=1)
            if batched and self.batch_first:
                x = F.transpose(x, perm=[1, 0, 2])
            steps, batch = x.shape[0], x.shape[1]
        if x.shape[-1] != self.input_size:
            raise ShapeError(f"{name}: input.size(-1) must be equal to input_size. Expected {self.input_size}, got "
                             f"{x.shape[-1]}")
        if steps == 0:
            raise ShapeError(f"{name}: expected sequence length to be larger than 0")
        dtype = self.weight_ih_l0.dtype
        if x.dtype != dtype:
            raise ArgumentError(f"{name}: input dtype ({x.dtype}) does not match weight dtype ({dtype}); convert "
                                f"the input (x.to({dtype})) or the model (model.to({x.dtype}))")
        real_hidden = self.proj_size or self.hidden_size
        h_shape = (self.num_layers * directions, batch, real_hidden)
        c_shape = (self.num_layers * directions, batch, self.hidden_size)
        if packed:
            order = None if input.sorted_indices is None else input.sorted_indices
        h0, c0 = self._initial_states(name, hx, lstm, batched, h_shape, c_shape, x, order)
        sizes = None if batch_sizes is None else tensor(batch_sizes)
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for direction in range(directions):
                k = layer * directions + direction
                y, h, c = self._run(x, h0[k], None if c0 is None else c0[k], self._weights(layer, direction),
                                    sizes, batch_sizes, bool(direction))
                outs.append(y)
                h_n.append(h)
                c_n.append(c)
            x = outs[0] if directions == 1 else F.concat(outs, axis=2)
            if self.dropout and self.training and layer + 1 < self.num_layers:
                x = F.dropout(x, p=self.dropout, training=True)
        h_n = F.stack(h_n, axis=0)
        c_n = F.stack(c_n, axis=0) if lstm else None
        if packed:
            unsorted = input.unsorted_indices
            if unsorted is not None:
                h_n = F.index_select(h_n, 1, unsorted)
                c_n = None if c_n is None else F.index_select(c_n, 1, unsorted)
            rows = tensor(_packed_rows(batch_sizes))
            out = PackedSequence(F.index_select(F.reshape(x, shape=[steps * batch, x.shape[2]]), 0, rows),
                                 input.batch_sizes, input.sorted_indices, input.unsorted_indices)
        else:
            out = x
            if not batched:
                out, h_n = F.squeeze(out, axis=[1]), F.squeeze(h_n, axis=[1])
                c_n = None if c_n is None else F.squeeze(c_n, axis=[1])
            elif self.batch_first:
                out = F.transpose(out, perm=[1, 0, 2])
        return (out, (h_n, c_n)) if lstm else (out, h_n)

    def _initial_states(self, name, hx, lstm, batched, h_shape, c_shape, x, order):
        """(h0, c0) as (layers·directions, B, ·) tensors (c0 None but for an LSTM): zeros when ``hx`` is None, else
        the given ones checked (unbatched ones given a batch dim, packed ones put in the sorted order)."""
        if hx is None:
            h0 = zeros(*h_shape, dtype=x.dtype, device=x.device)
            return h0, zeros(*c_shape, dtype=x.dtype, device=x.device) if lstm else None
        if lstm:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise ArgumentError(f"{name}: hx must be a tuple (h_0, c_0), got {describe(hx)}")
            h0, c0 = hx
        else:
            h0, c0 = hx, None
        for state, label in ((h0, "hx"), (c0, "cx")):
            if state is not None and state.ndim != (3 if batched else 2):
                raise ShapeError(f"{name}: for {'batched 3-D' if batched else 'unbatched 2-D'} input, {label} "
                                 f"should also be {3 if batched else 2}-D but got {state.ndim}-D")
        if not batched:
            h0 = F.unsqueeze(h0, axis=1)
            c0 = None if c0 is None else F.unsqueeze(c0, axis=1)
        _check_state(name, "hidden[0]" if lstm else "hx", h0, h_shape, x.dtype)
        if lstm:
            _check_state(name, "hidden[1]", c0, c_shape, x.dtype)
        if order is not None:  # torch's permute_hidden: the states follow the batch into the sorted order
            h0 = F.index_select(h0, 1, order)
            c0 = None if c0 is None else F.index_select(c0, 1, order)
        return h0, c0

    def _run(self, x, h0, c0, w, sizes, batch_sizes, reverse):
        """One layer and direction over the time-major ``x``: (y, h_n, c_n)."""
        raise NotImplementedError


def _last(y, reverse: bool):
    """The final state from a sequence op's per-step states: the last step the recursion visited."""
    return y[0] if reverse else y[-1]


def _masks(batch_sizes: np.ndarray | None, batch: int):
    """Per step, a (B, 1) bool tensor of the rows that take part (None: all of them)."""
    if batch_sizes is None:
        return None
    return tensor((np.arange(batch)[None, :] < batch_sizes[:, None])[:, :, None])


def _scan(step_fn, x, state: tuple, batch_sizes, reverse: bool):
    """Run ``step_fn(x_t, state) -> state`` (state[0] is h) over the time steps, with ops per step; rows past their
    length keep their state. Returns (y (T, B, H), final state)."""
    steps = x.shape[0]
    masks = _masks(batch_sizes, x.shape[1])
    ys = [None] * steps
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        new = step_fn(x[t], state)
        state = new if masks is None else tuple(F.where(masks[t], a, b) for a, b in zip(new, state))
        ys[t] = state[0]
    return F.stack(ys, axis=0), state


class RNN(RNNBase):
    """Elman RNN, torch's ``nn.RNN``: h_t = tanh (or relu) of x_t·W_ihᵀ + b_ih + h_{t−1}·W_hhᵀ + b_hh, over
    ``num_layers`` (optionally bidirectional) layers. Runs as ops per step (no sequence op of its own)."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ArgumentError("RNN(): proj_size argument is only supported for LSTM, not RNN or GRU")
        if len(args) > 3:
            nonlinearity, args = args[3], args[:3] + args[4:]
        else:
            nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if nonlinearity not in ("tanh", "relu"):
            raise ArgumentError(f"RNN(): Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", *args, **kwargs)
        self.nonlinearity = nonlinearity

    def _run(self, x, h0, c0, w, sizes, batch_sizes, reverse):
        act = F.tanh if self.nonlinearity == "tanh" else F.relu
        gx = F.linear(x, w["weight_ih"], _bias_sum(w))
        y, (h,) = _scan(lambda g, s: (act(g + F.linear(s[0], w["weight_hh"])),), gx, (h0,), batch_sizes, reverse)
        return y, h, None


def _bias_sum(w):
    """b_ih + b_hh, added once to the input projection (None without biases)."""
    return None if w["bias_ih"] is None else w["bias_ih"] + w["bias_hh"]


class LSTM(RNNBase):
    """Long short-term memory, torch's ``nn.LSTM``: gates i, f, g, o = σ, σ, tanh, σ of x_t·W_ihᵀ + b_ih +
    h_{t−1}·W_hhᵀ + b_hh, c_t = f·c_{t−1} + i·g, h_t = o·tanh(c_t) (projected by W_hr when ``proj_size``).
    Returns ``(output, (h_n, c_n))``."""

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)

    def _run(self, x, h0, c0, w, sizes, batch_sizes, reverse):
        gx = F.linear(x, w["weight_ih"], _bias_sum(w))
        if w["weight_hr"] is None:
            y, cells, _ = F.lstm_layer(gx, h0, c0, w["weight_hh"], sizes, reverse=reverse)
            return y, _last(y, reverse), _last(cells, reverse)
        w_hh, w_hr = w["weight_hh"], w["weight_hr"]

        def step(g, state):  # with a projection: ops per step
            i, f, gg, o = F.split(g + F.linear(state[0], w_hh), sections=4, axis=-1)
            c = F.sigmoid(f) * state[1] + F.sigmoid(i) * F.tanh(gg)
            return F.linear(F.sigmoid(o) * F.tanh(c), w_hr), c

        y, (h, c) = _scan(step, gx, (h0, c0), batch_sizes, reverse)
        return y, h, c


class GRU(RNNBase):
    """Gated recurrent unit, torch's ``nn.GRU``: r, z = σ(x_t·W_irᵀ + b_ir + h·W_hrᵀ + b_hr), σ(...z...),
    n = tanh(x_t·W_inᵀ + b_in + r·(h·W_hnᵀ + b_hn)), h_t = (1 − z)·n + z·h_{t−1}."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ArgumentError("GRU(): proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)

    def _run(self, x, h0, c0, w, sizes, batch_sizes, reverse):
        gx = F.linear(x, w["weight_ih"], w["bias_ih"])
        y, _, _ = F.gru_layer(gx, h0, w["weight_hh"], w["bias_hh"], sizes, reverse=reverse)
        return y, _last(y, reverse), None


# -- cells -----------------------------------------------------------------------------------------------------------


class RNNCellBase(Module):
    """One step of a recurrent layer, torch's cells: ``weight_ih`` (gates·H, I), ``weight_hh`` (gates·H, H),
    ``bias_ih``, ``bias_hh`` (gates·H,), all U(±1/√H)."""

    _chunks = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        name = type(self).__name__
        self.input_size = _size(input_size, "input_size", name)
        self.hidden_size = _size(hidden_size, "hidden_size", name)
        self.bias = _flag(bias, "bias", name)
        gates = self._chunks * self.hidden_size
        self.weight_ih = _parameter((gates, self.input_size), dtype, device)
        self.weight_hh = _parameter((gates, self.hidden_size), dtype, device)
        self.bias_ih = _parameter((gates,), dtype, device) if bias else None
        self.bias_hh = _parameter((gates,), dtype, device) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s

    def _prepare(self, input, states: tuple):
        """(input as (N, I), states as (N, H) — zeros where None —, whether the input had a batch dim)."""
        name = type(self).__name__
        if input.ndim not in (1, 2):
            raise ShapeError(f"{name}: Expected input to be 1D or 2D, got {input.ndim}D instead")
        if input.shape[-1] != self.input_size:
            raise ShapeError(f"{name}: input has {input.shape[-1]} features, expected input_size "
                             f"{self.input_size}")
        batched = input.ndim == 2
        x = input if batched else F.unsqueeze(input, axis=0)
        out = []
        for k, s in enumerate(states):
            label = "hidden" if len(states) == 1 else f"hx[{k}]"
            if s is None:
                out.append(zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device))
                continue
            if s.ndim not in (1, 2):
                raise ShapeError(f"{name}: Expected {label} to be 1D or 2D, got {s.ndim}D instead")
            s = s if batched else F.unsqueeze(s, axis=0)
            _check_state(name, label, s, (x.shape[0], self.hidden_size), x.dtype)
            out.append(s)
        return x, out, batched


class RNNCell(RNNCellBase):
    """torch's ``nn.RNNCell``: h' = tanh (or relu) of x·W_ihᵀ + b_ih + h·W_hhᵀ + b_hh."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ArgumentError(f"RNNCell(): Unknown nonlinearity: {nonlinearity}")
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        x, (h,), batched = self._prepare(input, (hx,))
        act = F.tanh if self.nonlinearity == "tanh" else F.relu
        h = act(F.linear(x, self.weight_ih, self.bias_ih) + F.linear(h, self.weight_hh, self.bias_hh))
        return h if batched else F.squeeze(h, axis=[0])


class LSTMCell(RNNCellBase):
    """torch's ``nn.LSTMCell``: one step of the LSTM (the ``lstm_layer`` op over one step); returns (h', c')."""

    _chunks = 4

    def forward(self, input, hx=None):
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise ArgumentError(f"LSTMCell: hx must be a tuple (h_0, c_0), got {describe(hx)}")
        x, (h, c), batched = self._prepare(input, (None, None) if hx is None else tuple(hx))
        bias = None if self.bias_ih is None else self.bias_ih + self.bias_hh
        gx = F.unsqueeze(F.linear(x, self.weight_ih, bias), axis=0)
        y, cells, _ = F.lstm_layer(gx, h, c, self.weight_hh)
        h, c = y[0], cells[0]
        return (h, c) if batched else (F.squeeze(h, axis=[0]), F.squeeze(c, axis=[0]))


class GRUCell(RNNCellBase):
    """torch's ``nn.GRUCell``: one step of the GRU (the ``gru_layer`` op over one step)."""

    _chunks = 3

    def forward(self, input, hx=None):
        x, (h,), batched = self._prepare(input, (hx,))
        gx = F.unsqueeze(F.linear(x, self.weight_ih, self.bias_ih), axis=0)
        y, _, _ = F.gru_layer(gx, h, self.weight_hh, self.bias_hh)
        return y[0] if batched else F.squeeze(y[0], axis=[0])


__all__ = ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell", "PackedSequence", "RNNBase", "RNNCell", "RNNCellBase",
           "invert_permutation", "pack_padded_sequence", "pack_sequence", "pad_packed_sequence", "pad_sequence",
           "unpack_sequence", "unpad_sequence"]
