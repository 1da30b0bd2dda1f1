"""The eager ``Tensor``: a NumPy array plus what autograd needs to know about where it came from.

Every operator and method here calls a registered op (``opforge.ops``); none touches the array
directly, so nothing bypasses autograd or program tracing.
"""

from __future__ import annotations

import numpy as np

from .core import dtypes as D
from .core.devices import CPU, Device, default_device, get_device
from .core.errors import ArgumentError, GradientError, describe
from .core.opdef import flat_ranges, split_by_layout
from .core.spec import Spec


class Node:
    """One recorded op call: what its gradient rule needs, and where each input's gradient goes.

    ``edges[i]`` is ``(node, output_index)`` for an input made by a recorded op, ``(leaf_tensor, -1)``
    for a leaf that requires grad, and ``None`` for an input that gets no gradient. Saved outputs are
    kept as bare arrays (a Tensor would point back at this node and make a reference cycle).

    A Node is one of the two views of a recorded call that ``autodiff.rules.call_rule`` reads (the other is a
    program's ``OpDesc``): ``saved_inputs``, ``saved_output``, ``zeros``, ``spec`` and ``needs_input_grad``.
    """

    __slots__ = ("__weakref__", "attrs", "device", "edges", "in_layout", "in_meta", "op", "origin", "out_layout",
                 "out_meta", "saved", "saved_out")  # origin: the user's call site, kept under of.detect_anomaly()

    def __init__(self, op, attrs, edges, in_layout, in_meta, out_layout, out_meta, saved, saved_out, device):
        self.op = op
        self.attrs = attrs
        self.edges = edges
        self.in_layout = in_layout  # per schema input: -1 a Tensor (or None), k a list of k tensors
        self.in_meta = in_meta  # per flattened input: (shape, dtype)
        self.out_layout = out_layout
        self.out_meta = out_meta  # per flattened output: (shape, dtype)
        self.saved = saved  # name -> Tensor (or list) of inputs the rule names; None once freed
        self.saved_out = saved_out  # name -> [(flat output index, array), ...] (one pair unless a Tensor[])
        self.device = device  # where the call ran: its outputs, and the gradients of its inputs, live there

    # -- the view of the call a gradient rule reads ---------------------------------------------------------

    def saved_inputs(self) -> dict:
        return dict(self.saved)

    def saved_output(self, name: str, i: int, create_graph: bool):
        """Output ``i`` (named ``name`` by the rule) as Tensors; linked to this node when the backward pass is
        itself recorded, so that a rule using its output differentiates again."""
        entries = self.saved_out[name]
        node = self if create_graph else None
        tensors = [wrap_output(array, node, k, self.device) if node is not None else wrap(array, self.device)
                   for k, array in entries]
        return tensors if self.op.outputs[i].is_list else tensors[0]

    def zeros(self, k: int) -> Tensor:
        """The gradient of flat output ``k`` when none reached it (a multi-output op, some outputs unused)."""
        shape, dtype = self.out_meta[k]
        return wrap(self.device.xp.zeros(shape, dtype), self.device)

    def spec(self, where: str, i: int):
        meta, layout = (self.in_meta, self.in_layout) if where == "in" else (self.out_meta, self.out_layout)
        start, count, is_list = flat_ranges(layout)[i]
        specs = [None if meta[k] is None else Spec(*meta[k]) for k in range(start, start + count)]
        return specs if is_list else specs[0]

    def needs_input_grad(self) -> tuple:
        """Per schema input: whether any of its tensors gets a gradient (a rule may skip the others)."""
        per_flat = [e is not None for e in self.edges]
        if all(n < 0 for n in self.in_layout):
            return tuple(per_flat)
        return tuple(any(v) if isinstance(v, list) else v for v in split_by_layout(per_flat, self.in_layout))

    def __repr__(self) -> str:
        return f"<{self.op.name} node>"


def wrap(data, device: Device = CPU, requires_grad: bool = False) -> Tensor:
    """A Tensor around ``data``, an array of ``device`` (no copy), with no autograd history."""
    t = object.__new__(Tensor)
    t._data = data
    t._requires_grad = requires_grad
    t._node = None
    t._index = 0
    t._device = device
    t.grad = None
    return t


def wrap_output(data, node: Node, index: int, device: Device) -> Tensor:
    """Output ``index`` of the recorded call ``node``: it requires grad, and its gradient flows to ``node``."""
    t = object.__new__(Tensor)
    t._data = data
    t._requires_grad = True
    t._node = node
    t._index = index
    t._device = device
    t.grad = None
    return t


class TensorOps:
    """Operators and methods shared by eager Tensors and program Variables: each one calls a registered op,
    so nothing bypasses autograd or tracing. Subclasses provide ``dtype`` and ``device``."""

    __slots__ = ()
    __array_priority__ = 1000  # so ndarray + Tensor calls Tensor.__radd__
    __hash__ = object.__hash__  # == is elementwise, so hash by identity (as PyTorch does)

    def __add__(self, other):
        return F.add(self, other if type(other) is Tensor else _lift(other, self))

    def __radd__(self, other):
        return F.add(_lift(other, self), self)

    def __sub__(self, other):
        return F.sub(self, other if type(other) is Tensor else _lift(other, self))

    def __rsub__(self, other):
        return F.sub(_lift(other, self), self)

    def __mul__(self, other):
        return F.mul(self, other if type(other) is Tensor else _lift(other, self))

    def __rmul__(self, other):
        return F.mul(_lift(other, self), self)

    def __truediv__(self, other):
        return F.div(self, other if type(other) is Tensor else _lift(other, self))

    def __rtruediv__(self, other):
        return F.div(_lift(other, self), self)

    def __pow__(self, other):
        return F.pow(self, other if type(other) is Tensor else _lift(other, self))

    def __rpow__(self, other):
        return F.pow(_lift(other, self), self)

    def __matmul__(self, other):
        return F.matmul(self, other)

    def __rmatmul__(self, other):
        return F.matmul(other, self)

    def __neg__(self):
        return F.neg(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return F.abs(self)

    def __lt__(self, other):
        return F.less(self, other if type(other) is Tensor else _lift(other, self))

    def __le__(self, other):
        return F.less_equal(self, other if type(other) is Tensor else _lift(other, self))

    def __gt__(self, other):
        return F.greater(self, other if type(other) is Tensor else _lift(other, self))

    def __ge__(self, other):
        return F.greater_equal(self, other if type(other) is Tensor else _lift(other, self))

    def __eq__(self, other):
        return F.equal(self, other if type(other) is Tensor else _lift(other, self))

    def __ne__(self, other):
        return F.not_equal(self, other if type(other) is Tensor else _lift(other, self))

    def __getitem__(self, index):
        return _index(self, index)

    def __setitem__(self, index, value):
        raise ArgumentError(
            "Tensor does not support item assignment: it would change a value autograd may need; "
            "build a new tensor with F.where or F.concat instead"
        )

    # -- methods: each one is a registered op --------------------------------------------------------------

    def sum(self, axis=None, keepdim=False):
        return F.sum(self, axis=axis, keepdim=keepdim)

    def mean(self, axis=None, keepdim=False):
        return F.mean(self, axis=axis, keepdim=keepdim)

    def reshape(self, *shape):
        return F.reshape(self, shape=shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape)

    def transpose(self, *perm):
        perm = perm[0] if len(perm) == 1 and not isinstance(perm[0], int) else perm
        return F.transpose(self, perm=perm or None)

    @property
    def T(self):
        return F.transpose(self)

    def broadcast_to(self, shape):
        return F.broadcast_to(self, shape=shape)

    def astype(self, dtype):
        return F.cast(self, dtype=dtype)

    def float(self):
        return F.cast(self, dtype=D.float32)

    def double(self):
        return F.cast(self, dtype=D.float64)

    def half(self):
        return F.cast(self, dtype=D.float16)

    def bfloat16(self):
        return F.cast(self, dtype=D.bfloat16)

    def matmul(self, other):
        return F.matmul(self, other)

    def pow(self, exponent):
        return F.pow(self, exponent)

    def maximum(self, other):
        return F.maximum(self, other)

    def exp(self):
        return F.exp(self)

    def log(self):
        return F.log(self)

    def sqrt(self):
        return F.sqrt(self)

    def square(self):
        return F.square(self)

    def abs(self):
        return F.abs(self)

    def tanh(self):
        return F.tanh(self)

    def sigmoid(self):
        return F.sigmoid(self)

    def relu(self):
        return F.relu(self)



class Tensor(TensorOps):
    """An n-dimensional array that records the ops applied to it when it requires grad."""

    __slots__ = ("__weakref__", "_data", "_device", "_hooks", "_index", "_node", "_requires_grad", "grad")

    def __init__(self, data, dtype=None, requires_grad=False, device=None):
        self._device = default_device() if device is None else get_device(device, "tensor()")
        self._data = self._device.from_host(as_array(data, dtype))
        self._node = None
        self._index = 0
        self.grad = None
        self._requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    # -- what it is --------------------------------------------------------------------------------------

    @property
    def shape(self) -> tuple:
        return self._data.shape

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def device(self) -> Device:
        """Where the data lives (a ``Device``; it compares equal to its name: ``t.device == "cpu"``)."""
        return self._device

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    @property
    def grad_fn(self) -> Node | None:
        return self._node

    def numpy(self) -> np.ndarray:
        """The underlying array, without a copy (writing to it changes this tensor). Only for tensors whose data is
        host memory; copy others to the host first."""
        if not self._device.host:
            raise ArgumentError(f"numpy(): the tensor is on device '{self._device}', not in host memory; "
                                "copy it to the host first")
        return self._data

    def item(self):
        if self._data.size != 1:
            raise ArgumentError(f"item(): only a tensor with one element converts, this one has shape {self.shape}")
        return self._data.item()

    def tolist(self):
        return self._device.to_host(self._data).tolist()

    def __array__(self, dtype=None, copy=None):
        data = self.numpy()
        if copy:
            return np.array(data, dtype=dtype, copy=True)
        return data if dtype is None else data.astype(dtype, copy=False)

    def __dlpack__(self, *args, **kwargs):
        return self._data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    def __len__(self) -> int:
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return len(self._data)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __bool__(self) -> bool:
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __repr__(self) -> str:
        body = np.array2string(self._device.to_host(self._data), separator=", ", prefix="tensor(")
        extra = [f"dtype={self.dtype}"] if self.dtype not in (D.float32, D.int64, D.bool_) else []
        if self._node is not None:
            extra.append(f"grad_fn={self._node.op.name}")
        elif self._requires_grad:
            extra.append("requires_grad=True")
        if self._device is not CPU:
            extra.append(f"device='{self._device}'")
        return f"tensor({body}{', ' if extra else ''}{', '.join(extra)})"

    # -- autograd ----------------------------------------------------------------------------------------

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if not isinstance(requires_grad, bool):
            raise ArgumentError(f"requires_grad_(): expected a bool, got {describe(requires_grad)}")
        if self._node is not None and not requires_grad:
            raise GradientError(
                "requires_grad_(False) on a tensor computed by a recorded op; use .detach() instead"
            )
        if requires_grad and not D.is_floating(self.dtype):
            raise GradientError(f"only floating-point tensors can require grad, this one is {self.dtype}")
        self._requires_grad = requires_grad
        return self

    def detach(self) -> Tensor:
        """The same data, cut from the graph (no copy)."""
        return wrap(self._data, self._device)

    def register_post_accumulate_grad_hook(self, hook):
        """Run ``hook(tensor)`` each time ``backward()`` has added this leaf's final gradient into ``.grad``: as soon
        as it is final, while the rest of the backward pass still runs (data-parallel training all-reduces it
        then). Returns a handle whose ``remove()`` unregisters it."""
        if self._node is not None:
            raise GradientError("register_post_accumulate_grad_hook(): only a leaf tensor accumulates into .grad")
        if not callable(hook):
            raise ArgumentError(f"register_post_accumulate_grad_hook(): expected a callable, got {describe(hook)}")
        hooks = getattr(self, "_hooks", None)
        if hooks is None:
            hooks = self._hooks = []
        hooks.append(hook)
        return _HookHandle(hooks, hook)

    def backward(self, gradient=None, retain_graph=None, create_graph=False) -> None:
        from .autodiff import backward

        backward([self], None if gradient is None else [gradient],
                 retain_graph=retain_graph, create_graph=create_graph)

class _HookHandle:
    __slots__ = ("hook", "hooks")

    def __init__(self, hooks: list, hook):
        self.hooks, self.hook = hooks, hook

    def remove(self) -> None:
        if self.hook in self.hooks:
            self.hooks.remove(self.hook)


def as_array(data, dtype=None) -> np.ndarray:
    """Data -> a fresh host array of a supported dtype. Python floats become float32, ints int64;
    NumPy arrays keep their dtype unless ``dtype`` says otherwise."""
    if isinstance(data, Tensor):
        data = data._device.to_host(data._data)
    if isinstance(data, (np.ndarray, np.generic)):
        dt = D.as_dtype(data.dtype if dtype is None else dtype, arg="dtype")
        return np.array(data, dtype=dt)
    try:
        array = np.asarray(data)
    except (ValueError, TypeError) as e:
        raise ArgumentError(f"tensor(): cannot make a tensor from {describe(data)}: {e}") from None
    if dtype is not None:
        return np.array(array, dtype=D.as_dtype(dtype))
    if array.dtype.kind == "f":
        return array.astype(D.DEFAULT_FLOAT)
    if array.dtype.kind in "iu":
        return array.astype(D.DEFAULT_INT)
    if array.dtype.kind == "b":
        return array
    raise ArgumentError(f"tensor(): cannot make a tensor from {describe(data)} (dtype {array.dtype})")


_SCALARS: dict = {}  # (type, value, peer dtype, device) -> Tensor of a read-only 0-d array: constants cost nothing


def _lift(value, like):
    """A Python number meeting ``like`` as a Tensor of the dtype it takes there (weak typing, see
    core.dtypes); anything else is returned as it is, for the op to convert or refuse."""
    kind = type(value)
    if kind is not float and kind is not int and kind is not bool:
        return value
    key = (kind, value, like.dtype, like.device)
    constant = _SCALARS.get(key)
    if constant is None:
        if len(_SCALARS) > 4096:
            _SCALARS.clear()
        device = like.device
        array = np.array(value, D.scalar_dtype(value, like.dtype))
        array.flags.writeable = False
        constant = _SCALARS[key] = wrap(device.from_host(array), device)
    return constant


def _basic_index(x: Tensor, index) -> Tensor:
    """``x[index]`` for ints, slices, None and Ellipsis: one ``slice`` op, then a ``reshape`` if dims go or come."""
    items = index if isinstance(index, tuple) else (index,)
    for item in items:
        if isinstance(item, (bool, np.bool_)) or not (
            item is None or item is Ellipsis or isinstance(item, (slice, int, np.integer))
        ):
            raise ArgumentError(
                f"Tensor indexing: only ints, slices, None and ... (and arrays of ints or bools) are supported, "
                f"got {describe(item)}"
            )
    if sum(item is Ellipsis for item in items) > 1:
        raise ArgumentError("Tensor indexing: an index can hold only one '...'")
    used = sum(1 for item in items if item is not None and item is not Ellipsis)
    if used > x.ndim:
        raise ArgumentError(f"Tensor indexing: too many indices ({used}) for a tensor of shape {x.shape}")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = items[:at] + (slice(None),) * (x.ndim - used) + items[at + 1:]
    else:
        items = items + (slice(None),) * (x.ndim - used)
    axes, starts, ends, steps, shape = [], [], [], [], []
    dim = 0
    for item in items:
        if item is None:
            shape.append(1)
            continue
        size = x.shape[dim]
        if isinstance(item, slice) and item == slice(None):  # the whole dim (its size may be a run-time Dim)
            shape.append(size)
            dim += 1
            continue
        if isinstance(item, slice):
            start, stop, step = item.indices(size)
            if (start, stop, step) != (0, size, 1):
                axes.append(dim), starts.append(start), ends.append(stop), steps.append(step)
            shape.append(len(range(start, stop, step)))
        else:
            i = int(item)
            if not -size <= i < size:
                raise ArgumentError(f"Tensor indexing: index {i} is out of range for dim {dim} of size {size}")
            i %= size
            axes.append(dim), starts.append(i), ends.append(i + 1), steps.append(1)
        dim += 1
    y = F.slice(x, axes=axes, starts=starts, ends=ends, steps=steps) if axes else x
    if tuple(shape) != y.shape:
        return F.reshape(y, shape=shape)
    return y if y is not x else F.identity(x)  # x[...] is a new tensor, as every index result


def _index(x, index):
    """``x[index]``: basic indexing (ints, slices, None, ...) when the index holds no array, else advanced."""
    items = index if isinstance(index, tuple) else (index,)
    if any(isinstance(item, (list, tuple, np.ndarray, TensorOps)) for item in items):
        return _advanced_index(x, items)
    return _basic_index(x, index)


class _Array:
    """An array item of an index: integer positions along one dim, or a bool mask over ``dims`` dims. ``value`` is
    a NumPy array, or the Tensor (or program variable) that was given, so that ``take`` can read it directly."""

    __slots__ = ("mask", "value")

    def __init__(self, item):
        value = item if isinstance(item, TensorOps) else np.asarray(item)
        if isinstance(value, np.ndarray) and value.size == 0 and value.dtype.kind == "f":  # x[[]]: no positions
            value = value.astype(np.int64)
        kind = np.dtype(value.dtype).kind
        if kind not in "iub":
            raise ArgumentError(f"Tensor indexing: an index array must hold integers or bools, got {describe(item)}")
        self.mask = kind == "b"
        if self.mask:
            value = value._data if isinstance(value, Tensor) else value
            if not isinstance(value, np.ndarray) or value.ndim == 0:
                raise ArgumentError("Tensor indexing: a bool mask must be an eager array of at least one dim")
        self.value = value.astype(np.int64) if kind == "u" else value

    @property
    def dims(self) -> int:
        return self.value.ndim if self.mask else 1


def _advanced_index(x, items):
    """``x[index]`` with integer arrays, lists, Tensors or bool masks among the items, as PyTorch does it.

    Ints, slices and None are applied first (one ``slice`` op, as basic indexing); a bool mask stands for the
    integer arrays of its true positions. One array then picks along its dim with ``take``: the dim is replaced by
    the array's shape. Several arrays broadcast together and pick points: their dims are merged into one (moved
    to the front first if other dims separate them, as NumPy does) and ``take`` reads the flat positions.
    Unlike NumPy, an int between arrays does not count as an array (``x[0, :, [1, 2]]`` has shape (n, 2)).
    The gradient of ``take`` scatter-adds, so a position picked twice gets both gradients.
    """
    items = [_Array(item) if isinstance(item, (list, tuple, np.ndarray, TensorOps)) else item for item in items]
    if sum(item is Ellipsis for item in items) > 1:
        raise ArgumentError("Tensor indexing: an index can hold only one '...'")
    used = sum(item.dims if isinstance(item, _Array) else 1 for item in items
               if item is not None and item is not Ellipsis)
    if used > x.ndim:
        raise ArgumentError(f"Tensor indexing: too many indices ({used}) for a tensor of shape {x.shape}")
    fill = [slice(None)] * (x.ndim - used)
    at = items.index(Ellipsis) if Ellipsis in items else len(items)
    items = items[:at] + fill + items[at + 1:]
    basic, where, arrays = [], [], []  # the index without arrays; the result dim and the positions of each array
    dim_x = dim_y = 0
    for item in items:
        if isinstance(item, _Array) and item.mask:
            if item.value.shape != tuple(x.shape[dim_x:dim_x + item.dims]):
                raise ArgumentError(f"Tensor indexing: a bool mask of shape {item.value.shape} does not match "
                                    f"dims {dim_x}..{dim_x + item.dims - 1} of a tensor of shape {x.shape}")
            for positions in item.value.nonzero():
                basic.append(slice(None)), where.append(dim_y), arrays.append(positions)
                dim_x, dim_y = dim_x + 1, dim_y + 1
        elif isinstance(item, _Array):
            basic.append(slice(None)), where.append(dim_y), arrays.append(item.value)
            dim_x, dim_y = dim_x + 1, dim_y + 1
        else:
            basic.append(item)
            dim_x += item is not None
            dim_y += not isinstance(item, (int, np.integer))
    if any(not (isinstance(b, slice) and b == slice(None)) for b in basic):
        x = _basic_index(x, tuple(basic))
    if len(arrays) == 1:
        index = arrays[0]
        return F.take(x, index if isinstance(index, TensorOps) else _host_tensor(index, x.device), axis=where[0])
    arrays = [a._data if isinstance(a, Tensor) else a for a in arrays]
    if any(isinstance(a, TensorOps) for a in arrays):
        raise ArgumentError("Tensor indexing: several index arrays need eager (concrete) values")
    sizes = [x.shape[w] for w in where]
    for a, n in zip(arrays, sizes):
        if a.size and not -n <= a.min() <= a.max() < n:
            bad = a.min() if a.min() < -n else a.max()
            raise ArgumentError(f"Tensor indexing: index {bad} is out of range for a dim of size {n}")
    try:
        arrays = np.broadcast_arrays(*arrays)
    except ValueError:
        raise ArgumentError(f"Tensor indexing: index arrays of shapes {[a.shape for a in arrays]} do not broadcast "
                            "together") from None
    flat = np.ravel_multi_index([np.where(a < 0, a + n, a) for a, n in zip(arrays, sizes)], sizes)
    k = len(where)
    first = where[0] if where == list(range(where[0], where[0] + k)) else 0  # where the picked points go
    rest = [d for d in range(x.ndim) if d not in where]
    perm = rest[:first] + where + rest[first:]
    if perm != list(range(x.ndim)):
        x = F.permute(x, dims=perm)
    x = F.reshape(x, shape=[*x.shape[:first], int(np.prod(sizes)), *x.shape[first + k:]])
    return F.take(x, _host_tensor(flat.astype(np.int64), x.device), axis=first)


def _host_tensor(array: np.ndarray, device) -> Tensor:
    """A host array made while indexing (positions), as a Tensor on ``device``."""
    return wrap(device.from_host(array), device)


from . import ops as F  # noqa: E402  (the ops need Tensor defined first; methods look them up at call time)
