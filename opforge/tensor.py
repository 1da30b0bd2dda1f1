"""The eager ``Tensor``: a NumPy array plus what autograd needs to know about where it came from.

Every operator and method here calls a registered op (``opforge.ops``); none touches the array
directly, so nothing bypasses autograd or program tracing.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from . import ops as F  # the op namespace: it imports core alone, and is filled as ops are declared
from . import torch_forms
from .core import dtypes as D
from .core.devices import CPU, Device, default_device, get_device, using_device
from .core.errors import ArgumentError, GradientError, ShapeError, describe
from .core.grad_mode import _mode as _grad_mode
from .core.grad_mode import no_grad as _grad_mode_off
from .core.interpreters import EAGER, interpreting
from .core.interpreters import current_interpreter as _interpreter
from .core.keys import exact
from .core.opdef import flat_ranges, split_by_layout
from .core.spec import Dim, Elem, Spec


class Node:
    """One recorded op call: what its gradient rule needs, and where each input's gradient goes.

    ``edges[i]`` is ``(node, output_index)`` for an input made by a recorded op, ``(leaf_tensor, -1)``
    for a leaf that requires grad, and ``None`` for an input that gets no gradient. Saved outputs are
    kept as bare arrays (a Tensor would point back at this node and make a reference cycle).

    A Node is one of the two views of a recorded call that ``autodiff.rules.call_rule`` reads (the other is a
    program's ``OpDesc``): ``saved_inputs``, ``saved_output``, ``zeros``, ``spec`` and ``needs_input_grad``.
    """

    # origin: the user's call site (of.detect_anomaly())
    __slots__ = ("__weakref__", "attrs", "device", "edges", "epoch", "in_layout", "in_meta", "op", "origin",
                 "out_layout", "out_meta", "residuals", "saved", "saved_out")

    def __init__(self, op, attrs, edges, in_layout, in_meta, out_layout, out_meta, saved, saved_out, device,
                 residuals=None):
        self.op = op
        self.attrs = attrs
        self.edges = edges
        self.in_layout = in_layout  # per schema input: -1 a Tensor (or None), k a list of k tensors
        self.in_meta = in_meta  # per flattened input: (shape, dtype)
        self.out_layout = out_layout
        self.out_meta = out_meta  # per flattened output: (shape, dtype)
        self.saved = saved  # name -> Tensor (or list) of inputs the rule names; None once freed
        self.saved_out = saved_out  # name -> ((flat output index, array), ...) (one pair unless a Tensor[])
        self.device = device  # where the call ran: its outputs, and the gradients of its inputs, live there
        self.epoch = _epoch[0]  # in-place writes after this one may have changed what it saved (see check_saved)
        self.residuals = residuals  # name -> array the kernel saved for the rule (op.saves), or None

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

    def residual(self, name: str, create_graph: bool):
        """What the kernel saved as ``name`` (a Tensor), or None: when it saved nothing, and when the backward
        pass is recorded (the array has no history, so a rule must compute from its inputs to be differentiated
        again)."""
        residuals = self.residuals
        if create_graph or not residuals or name not in residuals:
            return None
        return wrap(residuals[name], self.device)

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
        if max(self.in_layout) < 0:  # no list input: one flag per input
            return tuple(per_flat)
        return tuple(any(v) if isinstance(v, list) else v for v in split_by_layout(per_flat, self.in_layout))

    def __repr__(self) -> str:
        return f"<{self.op.name} node>"


# -- versions: what in-place writes changed ------------------------------------------------------------------------
#
# PyTorch's rule: backward refuses a saved value that was modified in place after it was saved. PyTorch keeps a
# version counter per tensor, shared by its views; here the counter belongs to the memory itself (a NumPy array and
# its views share one owner, ``array.base``), so views, ``detach()`` and ``state_dict()`` aliases share it without
# being tracked. The table is written only by in-place writes; a recorded call remembers the epoch it was made in
# (one integer), and backward looks at the table only for calls older than the last write.

_epoch = [0]  # bumped by every in-place write
_written: dict = {}  # id(memory owner) -> [weakref to it, epoch of its last write, writes so far, what wrote last]
_rebound: dict = {}  # id(Tensor) -> [weakref, epoch, what]: tensors given a new value (and history) by a recorded
#                      in-place op, which leaves their old memory as it was


def _owner(array):
    base = getattr(array, "base", None)
    return array if base is None else base


def _entry(table: dict, obj) -> list:
    key = id(obj)
    entry = table.get(key)
    if entry is None or entry[0]() is not obj:
        def forget(ref, key=key):
            if table.get(key, (None,))[0] is ref:
                del table[key]
        try:
            ref = weakref.ref(obj, forget)
        except TypeError:  # memory owned by something that cannot be weakly referenced (bytes): keep it
            ref = lambda obj=obj: obj  # noqa: E731
        entry = table[key] = [ref, 0, 0, ""]
    return entry


def note_write(array, what: str) -> None:
    """Record that ``array``'s memory was written in place by ``what`` (an in-place method, an optimizer's assign,
    a compiled run's update): recorded calls made before now that saved any of that memory refuse to backward."""
    _epoch[0] += 1
    entry = _entry(_written, _owner(array))
    entry[1], entry[2], entry[3] = _epoch[0], entry[2] + 1, what


def write_records(arrays) -> list:
    """The records ``note_write`` keeps for these arrays' memory, to count writes to all of them at once
    (``note_writes``): what a compiled run does to the tensors it updates."""
    return [_entry(_written, _owner(a)) for a in arrays]


def note_writes(records: list, what: str) -> None:
    _epoch[0] += 1
    for record in records:
        record[1], record[2], record[3] = _epoch[0], record[2] + 1, what


def _note_rebound(t: Tensor, what: str) -> None:
    _epoch[0] += 1
    entry = _entry(_rebound, t)
    entry[1], entry[2], entry[3] = _epoch[0], entry[2] + 1, what


def _changed_since(t: Tensor | None, array, epoch: int) -> str | None:
    """What changed ``array`` (or the Tensor ``t`` holding it) after ``epoch``, or None."""
    owner = _owner(array)
    entry = _written.get(id(owner))
    if entry is not None and entry[0]() is owner and entry[1] > epoch:
        return entry[3]
    entry = _rebound.get(id(t)) if t is not None else None
    if entry is not None and entry[0]() is t and entry[1] > epoch:
        return entry[3]
    return None


def check_saved(node: Node) -> None:
    """Raise if a value ``node`` saved for its gradient rule was modified in place since (backward calls this only
    for nodes made before the latest in-place write)."""
    for name, value in (node.saved or {}).items():
        for t in value if isinstance(value, list) else (value,):
            what = None if t is None else _changed_since(t, t._data, node.epoch)
            if what:
                _refuse(node, f"input '{name}'", t._data, what)
    for name, entries in (node.saved_out or {}).items():
        for _, array in entries:
            what = _changed_since(None, array, node.epoch)
            if what:
                _refuse(node, f"output '{name}'", array, what)


def _refuse(node: Node, which: str, array, what: str):
    raise GradientError(
        f"backward through op '{node.op.name}': its saved {which} (a tensor of shape {tuple(array.shape)} and dtype "
        f"{array.dtype}) was modified in place by {what} after the op saved it, so its gradient would be wrong. "
        f"Compute a new tensor instead (t = t + x rather than t.add_(x)), or clone() the value before changing it"
    )


def version(t: Tensor) -> int:
    """How many in-place writes changed ``t``'s memory (shared with its views and aliases) or ``t`` itself."""
    count = 0
    for table, key in ((_written, _owner(t._data)), (_rebound, t)):
        entry = table.get(id(key))
        if entry is not None and entry[0]() is key:
            count += entry[2]
    return count


# -- views: tensors that share memory, kept in step by recorded in-place ops ----------------------------------------
#
# Eagerly a view op's result (a slice, a transpose, a reshape NumPy makes without copying: the ops with the trait
# "view", and ``detach()``) shares its input's memory, so an in-place write to either shows in the other, as in
# torch. A write recorded for autograd does not write memory (the old values stay for whatever saved them): it gives
# the tensor a new value with history. So that its views and its base see that value too, as torch's views see
# their base's writes, each view is noted with its root (the tensor whose memory it cuts: the root of a view is the
# root of its input) and the chain of view calls that cut it from the root. A recorded write through a view puts
# the new elements into the root at their positions (``put``: the gradient goes to the written value and to the
# rest of the root, as torch's CopySlices), and the root and every live view of it take the value the chain cuts
# from the root's new value.

_noting_views = [True]  # off while views are cut again from a root's new value


def note_view(x, out, op, attrs: dict):
    """Note that ``out`` (one Tensor, or a list of them), the eager result of the view op ``op`` called on ``x``
    with ``attrs``, shares ``x``'s memory: the view keeps its root and chain (slot ``_base``), the root a weak
    reference to the view (slot ``_views``, unset until its first view). Returns ``out``."""
    if not isinstance(x, Tensor) or not _noting_views[0]:
        return out
    if isinstance(out, Tensor):
        _note_view(x, out, (op, attrs, None))
    else:
        for i, o in enumerate(out):
            _note_view(x, o, (op, attrs, i))
    return out


def _note_view(x, view, step) -> None:
    base = getattr(x, "_base", None)
    root, chain = (x, ()) if base is None else base
    data, view_data = root._data, view._data
    if view is root or (data if data.base is None else data.base) is not \
            (view_data if view_data.base is None else view_data.base):
        return  # a copy (a reshape NumPy cannot make as a view)
    view._base = (root, (*chain, step))
    try:
        views = root._views
    except AttributeError:
        views = root._views = []
    views.append(weakref.ref(view))
    if len(views) >= 64 and not len(views) & (len(views) - 1):  # at each power of two: drop the dead
        views[:] = [ref for ref in views if ref() is not None]


def _cut(root, chain: tuple):
    """The view ``chain`` cuts from ``root`` (recorded as ``root``'s own history says)."""
    y = root
    for op, attrs, index in chain:
        y = y.detach() if op is None else op.fn(y, **attrs)
        if index is not None:
            y = y[index]
    return y


def _root_of(t) -> tuple:
    base = getattr(t, "_base", None)
    if base is None or _owner(base[0]._data) is not _owner(t._data):  # no view, or no longer (t._data = ...)
        return t, ()
    return base


def _rebind_views(t, value, what: str) -> None:
    """``t`` takes ``value`` (a recorded Tensor): so do its root, written at ``t``'s positions, and the root's views."""
    _noting_views[0] = False  # the views cut below are not views the user holds
    try:
        _rebind(t, value, what)
    finally:
        _noting_views[0] = True


def _rebind(t, value, what: str) -> None:
    root, chain = _root_of(t)
    if root is not t:
        if root._requires_grad and root._node is None:
            raise GradientError(
                f"{what}: a view of a leaf tensor that requires grad (shape {root.shape}) cannot be changed in place "
                "while gradients are recorded (torch refuses it too); clone() the leaf first, or write inside "
                "`with of.no_grad():`")
        with interpreting(EAGER), _grad_mode_off():  # which elements of the root the view holds: a constant
            positions = _cut(wrap(np.arange(int(np.prod(root.shape, dtype=np.int64))).reshape(root.shape)),
                             chain).numpy()
        old = wrap(root._data, root._device) if root._node is None else \
            wrap_output(root._data, root._node, root._index, root._device)
        value = put(old, positions, value)
    root._data, root._node, root._index, root._requires_grad = value._data, value._node, value._index, True
    _note_rebound(root, what)
    for ref in list(getattr(root, "_views", ())):
        view = ref()
        if view is not None and view._base[0] is root:
            cut = _cut(root, view._base[1])
            view._data, view._node, view._index, view._requires_grad = cut._data, cut._node, cut._index, \
                cut._requires_grad
            _note_rebound(view, what)


def wrap(data, device: Device = CPU, requires_grad: bool = False) -> Tensor:
    """A Tensor around ``data``, an array of ``device`` (no copy), with no autograd history."""
    t = object.__new__(Tensor)
    t._data = data
    t._requires_grad = requires_grad
    t._node = None
    t._index = 0
    t._device = device
    t._grad = None
    return t


def wrap_output(data, node: Node, index: int, device: Device) -> Tensor:
    """Output ``index`` of the recorded call ``node``: it requires grad, and its gradient flows to ``node``."""
    t = object.__new__(Tensor)
    t._data = data
    t._requires_grad = True
    t._node = node
    t._index = index
    t._device = device
    t._grad = None
    return t


def tensor_source(var: str, data: str, device: str, node: str = "None", index: str = "0", indent: int = 4) -> list:
    """Lines of generated code that make Tensor ``var`` as ``wrap`` (``node`` "None") or ``wrap_output`` do, field
    by field: the generated op functions, attach and replay tapes save a call that way, with object.__new__ and
    Tensor as ``_of_new`` and ``_of_T`` in their globals. The one list of the fields they write."""
    pad = " " * indent
    return [f"{pad}{var} = _of_new(_of_T)", f"{pad}{var}._data = {data}",
            f"{pad}{var}._requires_grad = {'False' if node == 'None' else 'True'}", f"{pad}{var}._node = {node}",
            f"{pad}{var}._index = {index}", f"{pad}{var}._device = {device}", f"{pad}{var}._grad = None"]


def _method(op: str):
    """The method ``x.<name>(...)`` that is ``F.<op>(x, ...)``: the op's own signature binds the rest of the call
    (torch's positional settings, dim= beside axis=), so a method adds no second copy of it."""
    def method(self, *args, **kwargs):
        return getattr(F, op)(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = op
    method.__doc__ = f"``F.{op}(self, ...)``: see ``help(opforge.ops.{op})``."
    return method


def _in_place_method(op: str):
    """The in-place method ``x.<op>_(...)``: ``F.<op>(x, ...)`` written into ``x`` (see ``_in_place``)."""
    def method(self, *args, **kwargs):
        return _in_place(self, f"{op}_", lambda t: getattr(F, op)(t, *args, **kwargs))

    method.__name__ = method.__qualname__ = f"{op}_"
    method.__doc__ = f"``F.{op}(self, ...)`` written into this tensor, in place."
    return method


# torch's deprecated Tensor.scatter(..., reduce=): the scatter_reduce that keeps x's own value at each place
_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}


def _scatter_method(in_place: bool):
    """``x.scatter(dim, index, src)`` (and ``value=``) is the op ``scatter``; with torch's ``reduce='add'`` or
    ``'multiply'`` it is ``scatter_reduce(x, dim, index, src, 'sum' or 'prod', include_self=True)``, which is what
    torch computes (torch, which deprecates this form, has no gradient for it; scatter_reduce's is given)."""
    def method(self, *args, reduce=None, **kwargs):
        if reduce is None:
            def compute(t):
                return F.scatter(t, *args, **kwargs)
        else:
            def compute(t):
                return _scatter_reduced(t, reduce, *args, **kwargs)
        return _in_place(self, "scatter_", compute) if in_place else compute(self)

    method.__name__ = method.__qualname__ = "scatter_" if in_place else "scatter"
    method.__doc__ = (f"torch's ``Tensor.scatter{'_' if in_place else ''}(dim, index, src or value, *, reduce=None)``"
                      f"{', in place' if in_place else ''}: ``F.scatter``; with ``reduce`` 'add' or 'multiply', "
                      "``F.scatter_reduce`` with 'sum' or 'prod' and include_self.")
    return method


def _scatter_reduced(x, reduce, dim, index, src=None, value=None):
    if reduce not in _SCATTER_REDUCE:
        raise ArgumentError(f"scatter(): argument 'reduce' must be 'add' or 'multiply' (torch's; scatter_reduce "
                            f"takes the others), got {reduce!r}")
    if (src is None) == (value is None):
        raise ArgumentError("scatter(): give one of src (a tensor) and value (a number) with reduce=")
    if src is None or not isinstance(src, Tensor):  # a number: the same value at every place index names
        src = F.zeros_like(F.cast(index, dtype=x.dtype)) + (src if value is None else value)
    elif src.dtype != x.dtype:
        raise ArgumentError(f"scatter(): with reduce=, src must have self's dtype {x.dtype} (as torch's), got "
                            f"{src.dtype}")
    return F.scatter_reduce(x, dim, index, src, _SCATTER_REDUCE[reduce], include_self=True)


def _sizes(sizes: tuple) -> list:
    """torch's ``view(2, 3)``, ``view((2, 3))`` and ``view(torch.Size([2, 3]))`` alike: the sizes as a list."""
    if len(sizes) == 1 and not isinstance(sizes[0], (int, np.integer, Dim)):  # (a Dim: one size known at run time)
        sizes = sizes[0]
    return list(sizes)


def _drawn(op, t, **attrs):
    """Random samples of ``op`` (normal, uniform) in ``t``'s shape, dtype and device."""
    with using_device(t.device):
        return op(shape=list(t.shape), dtype=t.dtype, **attrs)


_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
               "bfloat16": "BFloat16Tensor", "int64": "LongTensor", "int32": "IntTensor", "bool": "BoolTensor"}


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

    def __mod__(self, other):
        return F.remainder(self, other if type(other) is Tensor else _lift(other, self))

    def __rmod__(self, other):
        return F.remainder(_lift(other, self), self)

    def __floordiv__(self, other):
        return F.floor_divide(self, other if type(other) is Tensor else _lift(other, self))

    def __rfloordiv__(self, other):
        return F.floor_divide(_lift(other, self), self)

    def __and__(self, other):
        return F.bitwise_and(self, other if type(other) is Tensor else _lift(other, self))

    def __rand__(self, other):
        return F.bitwise_and(_lift(other, self), self)

    def __or__(self, other):
        return F.bitwise_or(self, other if type(other) is Tensor else _lift(other, self))

    def __ror__(self, other):
        return F.bitwise_or(_lift(other, self), self)

    def __invert__(self):
        return F.bitwise_not(self)

    def __xor__(self, other):
        return F.bitwise_xor(self, other if type(other) is Tensor else _lift(other, self))

    def __rxor__(self, other):
        return F.bitwise_xor(_lift(other, self), self)

    def __lshift__(self, other):
        return F.bitwise_left_shift(self, other if type(other) is Tensor else _lift(other, self))

    def __rlshift__(self, other):
        return F.bitwise_left_shift(_lift(other, self), self)

    def __rshift__(self, other):
        return F.bitwise_right_shift(self, other if type(other) is Tensor else _lift(other, self))

    def __rrshift__(self, other):
        return F.bitwise_right_shift(_lift(other, self), self)

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
        """``t[index] = value`` as torch's: an in-place write (see ``_set_item``)."""
        _set_item(self, index, value)

    # -- methods: each one is a registered op (or a function of ops), called with this tensor first --------------

    # torch's call forms: settings positional in torch's order, dim= beside axis= (the ops' signatures say so)
    amax, amin, argmax, argmin, logsumexp = _method("amax"), _method("amin"), _method("argmax"), _method("argmin"), \
        _method("logsumexp")
    # torch's forms the ops' signatures do not have (std's unbiased, dtype=, norm's 'fro', ...): torch_forms.py
    sum, mean, prod, cumsum, cumprod = torch_forms.sum, torch_forms.mean, torch_forms.prod, torch_forms.cumsum, \
        torch_forms.cumprod
    std, var, norm, repeat_interleave = torch_forms.std, torch_forms.var, torch_forms.norm, \
        torch_forms.repeat_interleave
    div = divide = torch_forms.div
    dot, clamp_min, clamp_max, fliplr, flipud = torch_forms.dot, torch_forms.clamp_min, torch_forms.clamp_max, \
        torch_forms.fliplr, torch_forms.flipud
    movedim = moveaxis = torch_forms.movedim
    softmax, log_softmax = _method("softmax"), _method("log_softmax")
    unsqueeze, squeeze, roll, tril, triu = _method("unsqueeze"), _method("squeeze"), _method("roll"), \
        _method("tril"), _method("triu")
    diagonal, split, take = _method("diagonal"), _method("split"), _method("take")
    chunk, unbind, flatten, unflatten, narrow, t = _method("chunk"), _method("unbind"), _method("flatten"), \
        _method("unflatten"), _method("narrow"), _method("t")
    gather, index_select, masked_fill = _method("gather"), _method("index_select"), _method("masked_fill")
    scatter_add, index_add = _method("scatter_add"), _method("index_add")
    scatter, scatter_ = _scatter_method(in_place=False), _scatter_method(in_place=True)
    index_fill, index_copy = _method("index_fill"), _method("index_copy")
    scatter_reduce, multinomial = _method("scatter_reduce"), _method("multinomial")
    masked_select, masked_scatter, take_along_dim = _method("masked_select"), _method("masked_scatter"), \
        _method("take_along_dim")
    nonzero, argwhere = _method("nonzero"), _method("argwhere")
    tensor_split, rot90, diag, diag_embed, diagflat = _method("tensor_split"), _method("rot90"), _method("diag"), \
        _method("diag_embed"), _method("diagflat")
    unfold = _method("unfold_windows")  # torch's Tensor.unfold: sliding windows along one dim (F.unfold is im2col)
    hardshrink, softshrink, threshold = _method("hardshrink"), _method("softshrink"), _method("threshold")
    sort, argsort, topk = _method("sort"), _method("argsort"), _method("topk")
    mm, bmm, outer = _method("mm"), _method("bmm"), _method("outer")
    eq, ne, lt, le, gt, ge = _method("equal"), _method("not_equal"), _method("less"), _method("less_equal"), \
        _method("greater"), _method("greater_equal")
    greater, greater_equal, less, less_equal, not_equal = gt, ge, lt, le, ne
    mul, multiply, true_divide = _method("mul"), _method("mul"), _method("div")
    remainder, floor_divide, maximum, minimum = _method("remainder"), _method("floor_divide"), \
        _method("maximum"), _method("minimum")
    logical_and, logical_or, logical_not = _method("logical_and"), _method("logical_or"), _method("logical_not")
    bitwise_and, bitwise_or, bitwise_not = _method("bitwise_and"), _method("bitwise_or"), _method("bitwise_not")
    matmul, pow, exp, log, sqrt, rsqrt = _method("matmul"), _method("pow"), _method("exp"), _method("log"), \
        _method("sqrt"), _method("rsqrt")
    square, abs, neg, negative, sign = _method("square"), _method("abs"), _method("neg"), _method("neg"), \
        _method("sign")
    floor, ceil, round, sin, cos, erf = _method("floor"), _method("ceil"), _method("round"), _method("sin"), \
        _method("cos"), _method("erf")
    expm1, log1p, reciprocal = _method("expm1"), _method("log1p"), _method("reciprocal")
    tanh, sigmoid, relu = _method("tanh"), _method("sigmoid"), _method("relu")
    isnan, isfinite = _method("isnan"), _method("isfinite")
    absolute = abs

    def add(self, other, *, alpha=1):
        """``self + alpha·other``, as torch's ``add``."""
        return F.add(self, other if alpha == 1 else other * alpha)

    def sub(self, other, *, alpha=1):
        """``self − alpha·other``, as torch's ``sub``."""
        return F.sub(self, other if alpha == 1 else other * alpha)

    subtract = sub

    def where(self, condition, other):
        """torch's ``Tensor.where``: this tensor where ``condition`` holds, else ``other``."""
        return F.where(condition, self, other)

    def max(self, dim=None, keepdim=False, *, axis=None):
        """As torch's ``max``: ``max()`` is the largest value; ``max(dim)`` the named tuple ``(values, indices)``
        along one dim (the first largest where values tie; NaN counts as the largest); ``max(other)`` the
        elementwise maximum. ``axis=`` is another spelling of ``dim=``; ``amax`` gives values over several dims."""
        return F.max(self, dim, keepdim, axis=axis)

    def min(self, dim=None, keepdim=False, *, axis=None):
        """As torch's ``min``: ``min()``, ``min(dim)`` -> ``(values, indices)``, ``min(other)`` (see ``max``)."""
        return F.min(self, dim, keepdim, axis=axis)

    def reshape(self, *shape):
        return F.reshape(self, _sizes(shape))

    def view(self, *shape):
        """``reshape`` (PyTorch's name; the result shares memory with this tensor where NumPy can make a view)."""
        return self.reshape(*shape)

    def view_as(self, other):
        return self.reshape(other.shape)

    reshape_as = view_as

    def flip(self, *dims):
        return F.flip(self, _sizes(dims))

    def tile(self, *dims):
        return F.tile(self, _sizes(dims))

    def repeat(self, *sizes):
        """torch's ``repeat``: this tensor tiled ``sizes[i]`` times along dim i (new leading dims where ``sizes`` is
        longer than the shape). NumPy's ``repeat`` is ``repeat_interleave``."""
        sizes = _sizes(sizes)
        if len(sizes) < len(self.shape):
            raise ArgumentError(f"repeat(): {len(sizes)} repeat counts {tuple(sizes)} for a tensor of "
                                f"{len(self.shape)} dims: one per dim at least, as torch (tile() pads with 1s)")
        return F.tile(self, sizes)

    def expand(self, *sizes):
        """torch's ``expand``: this tensor broadcast to ``sizes``, where -1 keeps a dim's size (new leading dims
        come first). No copy."""
        sizes = _sizes(sizes)
        new = len(sizes) - len(self.shape)
        if new < 0:
            raise ArgumentError(f"expand(): {len(sizes)} sizes {tuple(sizes)} for a tensor of {len(self.shape)} dims")
        if any(s == -1 for s in sizes[:new]):
            raise ArgumentError(f"expand(): -1 (keep the size) in a new leading dim of {tuple(sizes)}")
        return F.broadcast_to(self, [self.shape[i - new] if s == -1 else s for i, s in enumerate(sizes)])

    def expand_as(self, other):
        return F.broadcast_to(self, other.shape)

    def contiguous(self, memory_format=None):
        """This tensor: opforge has no strided layouts to make contiguous (kernels take any NumPy layout)."""
        return self

    def is_contiguous(self, memory_format=None) -> bool:
        return True

    def dim(self) -> int:
        return len(self.shape)

    ndimension = dim

    def nelement(self) -> int:
        return self.numel()

    def element_size(self) -> int:
        return np.dtype(self.dtype).itemsize

    def is_floating_point(self) -> bool:
        return D.is_floating(self.dtype)

    def type_as(self, other):
        return self.to(other.dtype)

    def type(self, dtype=None):
        """torch's ``type``: with a dtype, this tensor in it (``type(torch.float)``); without, its type's name
        (``'torch.FloatTensor'``)."""
        if dtype is not None:
            return self.to(dtype)
        return f"torch.{_TYPE_NAMES.get(str(np.dtype(self.dtype)), str(self.dtype))}"

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        """A new tensor of ``data``, with this tensor's dtype and device unless given."""
        t = Tensor(data, dtype=self.dtype if dtype is None else dtype, device=device or self.device)
        return t.requires_grad_(True) if requires_grad else t

    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
        return self.new_full(_sizes(size), 0, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
        return self.new_full(_sizes(size), 1, dtype=dtype, device=device, requires_grad=requires_grad)

    new_empty = new_zeros

    def new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False):
        """A new tensor of ``size`` filled with ``fill_value``, with this tensor's dtype and device unless given."""
        with using_device(device or self.device):
            t = F.full(shape=_sizes((size,)), fill_value=fill_value, dtype=self.dtype if dtype is None else dtype)
        return t.requires_grad_(True) if requires_grad else t

    def clone(self):
        """A copy (gradients flow back to this tensor)."""
        return F.cast(self, dtype=self.dtype)

    def clamp(self, min=None, max=None):
        return F.clip(self, min=min, max=max)

    clip = clamp

    def allclose(self, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
        """``torch.allclose``: whether ``|self − other| ≤ atol + rtol·|other|`` everywhere (one bool; ``isclose`` is
        elementwise). Both of one dtype, as torch wants them."""
        if self.dtype != other.dtype:
            raise ArgumentError(f"allclose(): input and other must have one dtype, got {self.dtype} and "
                                f"{other.dtype}")
        return bool(F.all(F.isclose(self, other, rtol, atol, equal_nan)).item())

    def ravel(self):
        """``torch.ravel``/``Tensor.ravel``: the elements as one dim (a reshape)."""
        return F.reshape(self, shape=[-1])

    def equal(self, other) -> bool:
        """``torch.equal``: True when both have one shape and the same elements (one bool; ``eq`` is elementwise)."""
        return tuple(self.shape) == tuple(other.shape) and not F.sum(F.not_equal(self, other)).item()

    def numel(self) -> int:
        """The number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    def transpose(self, *dims, dim0=None, dim1=None):
        """``transpose(dim0, dim1)`` swaps two dims, as in PyTorch. NumPy's forms that PyTorch does not have keep
        NumPy's meaning: no argument reverses the dims (``.T``), one tuple or list of every axis permutes them."""
        dims += tuple(d for d in (dim0, dim1) if d is not None)
        if not dims:
            return F.transpose(self)
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            return F.transpose(self, perm=list(dims[0]))
        if len(dims) != 2 or not all(_is_int(d) for d in dims):
            raise ArgumentError(
                f"transpose(): takes two dims to swap, as torch's transpose(dim0, dim1), got {dims!r}; to reorder "
                f"all the dims use permute(...) (or NumPy's transpose with one tuple of axes)")
        n = len(self.shape)
        for d in dims:
            if not -max(n, 1) <= d < max(n, 1):
                raise ShapeError(f"transpose(): dim {d} is out of range for a tensor of rank {n}")
        perm = list(range(n))
        if n:
            a, b = dims[0] % n, dims[1] % n
            perm[a], perm[b] = b, a
        return F.transpose(self, perm=perm)

    swapaxes = swapdims = transpose  # (torch's names for the two-dim swap)

    def permute(self, *dims):
        """``permute(2, 0, 1)`` or ``permute((2, 0, 1))``: dim i of the result is dim ``dims[i]`` of this tensor."""
        dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        return F.permute(self, dims=list(dims))

    @property
    def T(self):
        return F.transpose(self)

    @property
    def mT(self):
        """The last two dims swapped (a batch of matrices transposed), as torch's ``mT``."""
        if len(self.shape) < 2:
            raise ShapeError(f"mT: a tensor of at least 2 dims has matrices to transpose, got shape "
                             f"{tuple(self.shape)}")
        return self.transpose(-2, -1)

    def broadcast_to(self, shape):
        return F.broadcast_to(self, shape=shape)

    def astype(self, dtype):
        return F.cast(self, dtype=dtype)

    def float(self):
        return self.to(D.float32)

    def double(self):
        return self.to(D.float64)

    def long(self):
        return self.to(D.int64)

    def int(self):
        return self.to(D.int32)

    def bool(self):
        return self.to(D.bool_)

    def to(self, *args, **kwargs):
        """``to(dtype)``, ``to(device)``, ``to(device, dtype)`` or ``to(other)`` (its device and dtype), as in
        PyTorch: ``self`` when nothing changes, else a new tensor (``cast``, ``to_device``: both differentiable)."""
        device, dtype = _to_args(self, args, kwargs)
        out = self
        if dtype is not None and dtype != out.dtype:
            out = F.cast(out, dtype=dtype)
        if device is not None and device is not out.device:
            out = F.to_device(out, device=device.name)
        return out

    def cpu(self):
        """This tensor on the host device "cpu" (``self`` if it is there already)."""
        return self.to("cpu")

    def cuda(self, device=None, non_blocking: bool = False):
        """This tensor on the GPU, device "cuda" (``self`` if it is there already)."""
        return self.to("cuda" if device is None else device if isinstance(device, (str, Device)) else f"cuda:{device}")

    @property
    def is_cuda(self) -> bool:
        return self.device.name == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self.device.name == "cpu"

    def half(self):
        return F.cast(self, dtype=D.float16)

    def bfloat16(self):
        return F.cast(self, dtype=D.bfloat16)

    def __format__(self, spec: str) -> str:
        """``f"{loss:.4f}"``: a 0-d tensor formats as its number; others only without a format spec."""
        if spec and self.ndim == 0:
            return format(self.item(), spec)
        if spec:
            raise TypeError(f"unsupported format string {spec!r} for a tensor of shape {tuple(self.shape)}: only 0-d "
                            "tensors format as numbers (use t.item() or t.tolist())")
        return str(self)

    # -- in place (PyTorch's methods and operators): a new value written into this tensor ---------------------------

    def add_(self, other, *, alpha=1):
        return _in_place(self, "add_", lambda t: F.add(t, other if alpha == 1 else other * alpha))

    def sub_(self, other, *, alpha=1):
        return _in_place(self, "sub_", lambda t: F.sub(t, other if alpha == 1 else other * alpha))

    def mul_(self, other):
        return _in_place(self, "mul_", lambda t: F.mul(t, other))

    def div_(self, other):
        return _in_place(self, "div_", lambda t: F.div(t, other))

    def clamp_(self, min=None, max=None):
        return _in_place(self, "clamp_", lambda t: F.clip(t, min=min, max=max))

    def zero_(self):
        return _in_place(self, "zero_", F.zeros_like)

    # the in-place forms of the ops above (torch's x.exp_(), x.masked_fill_(mask, v), ...)
    pow_, exp_, log_, sqrt_, rsqrt_ = _in_place_method("pow"), _in_place_method("exp"), _in_place_method("log"), \
        _in_place_method("sqrt"), _in_place_method("rsqrt")
    abs_, neg_, sign_, square_, reciprocal_ = _in_place_method("abs"), _in_place_method("neg"), \
        _in_place_method("sign"), _in_place_method("square"), _in_place_method("reciprocal")
    floor_, ceil_, round_ = _in_place_method("floor"), _in_place_method("ceil"), _in_place_method("round")
    sin_, cos_, erf_, expm1_, log1p_ = _in_place_method("sin"), _in_place_method("cos"), _in_place_method("erf"), \
        _in_place_method("expm1"), _in_place_method("log1p")
    tanh_, sigmoid_, relu_ = _in_place_method("tanh"), _in_place_method("sigmoid"), _in_place_method("relu")
    masked_fill_, index_add_, scatter_add_ = _in_place_method("masked_fill"), _in_place_method("index_add"), \
        _in_place_method("scatter_add")
    remainder_, floor_divide_ = _in_place_method("remainder"), _in_place_method("floor_divide")
    clip_ = clamp_
    index_fill_, index_copy_ = _in_place_method("index_fill"), _in_place_method("index_copy")
    masked_scatter_, threshold_ = _in_place_method("masked_scatter"), _in_place_method("threshold")
    scatter_reduce_ = _in_place_method("scatter_reduce")

    def index_put(self, indices, values, accumulate=False):
        """torch's ``index_put``: a copy with ``self[indices]`` set to ``values`` (broadcast), or with
        ``accumulate`` the values added there (repeated positions add up)."""
        if not isinstance(indices, tuple):
            raise ArgumentError(f"index_put(): indices must be a tuple of tensors (torch's form), got "
                                f"{describe(indices)}")
        return (index_accumulate if accumulate else index_put)(self, indices, values)

    def index_put_(self, indices, values, accumulate=False):
        return _in_place(self, "index_put_", lambda t: t.index_put(indices, values, accumulate))

    def uniform_(self, a=0.0, b=1.0):
        """Samples of U[a, b) written into this tensor (the ``uniform`` op), as torch's ``uniform_``."""
        return _in_place(self, "uniform_", lambda t: _drawn(F.uniform, t, low=float(a), high=float(b)))

    def normal_(self, mean=0.0, std=1.0):
        """Samples of N(mean, std²) written into this tensor (the ``normal`` op), as torch's ``normal_``."""
        return _in_place(self, "normal_", lambda t: _drawn(F.normal, t, mean=float(mean), std=float(std)))

    def fill_(self, value):
        return _in_place(self, "fill_", lambda t: F.zeros_like(t) + value)

    def copy_(self, src):
        return _in_place(self, "copy_", lambda t: F.cast(src, dtype=t.dtype))  # cast copies: t never aliases src

    def __iadd__(self, other):
        return _in_place(self, "+=", lambda t: t + other)

    def __isub__(self, other):
        return _in_place(self, "-=", lambda t: t - other)

    def __imul__(self, other):
        return _in_place(self, "*=", lambda t: t * other)

    def __itruediv__(self, other):
        return _in_place(self, "/=", lambda t: t / other)



# torch's Tensor methods for the ops of the families added in issue 27 (ops/elementwise_math.py, ...): each is
# F.<op> with this tensor first, and its in-place form where torch has one; torch's other names for some of them.
_METHODS = ("tan", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "log2", "log10", "exp2",
            "logit", "xlogy", "trunc", "frac", "fmod", "copysign", "fmax", "fmin", "lerp", "addcmul", "addcdiv",
            "isinf", "isposinf", "isneginf", "isclose", "nan_to_num", "bitwise_xor", "logical_xor",
            "bitwise_left_shift", "bitwise_right_shift", "atan2", "hypot", "logaddexp", "erfc", "erfinv", "lgamma",
            "digamma", "i0", "all", "any", "count_nonzero", "nansum", "nanmean", "aminmax", "trace", "diff",
            "logcumsumexp", "cummax", "cummin", "kthvalue", "median", "nanmedian", "mode", "quantile", "nanquantile",
            "bincount", "unique", "addmm", "addmv", "baddbmm", "inner", "kron", "cross", "logdet", "slogdet",
            "cholesky_solve", "signbit", "heaviside", "cov", "corrcoef")
_IN_PLACE = ("tan", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "log2", "log10", "exp2",
             "logit", "xlogy", "trunc", "frac", "fmod", "copysign", "lerp", "addcmul", "addcdiv", "nan_to_num",
             "bitwise_xor", "logical_xor", "bitwise_left_shift", "bitwise_right_shift", "atan2", "hypot", "erfc",
             "erfinv", "lgamma", "digamma", "i0", "addmm", "addmv", "baddbmm", "heaviside")
_METHOD_SYNONYMS = {"arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh", "arccosh": "acosh",
                    "arctanh": "atanh", "arctan2": "atan2", "fix": "trunc", "matrix_power": "linalg_matrix_power",
                    "matrix_exp": "linalg_matrix_exp", "inverse": "linalg_inv", "det": "linalg_det"}
for _name in _METHODS:
    setattr(TensorOps, _name, _method(_name))
for _name in _IN_PLACE:
    setattr(TensorOps, f"{_name}_", _in_place_method(_name))
for _alias, _name in _METHOD_SYNONYMS.items():
    setattr(TensorOps, _alias, _method(_name))
    if _name in _IN_PLACE:
        setattr(TensorOps, f"{_alias}_", _in_place_method(_name))
TensorOps.nansum, TensorOps.nanmean = torch_forms.nansum, torch_forms.nanmean  # with torch's dtype=


def _polygamma(self, n):
    """``Tensor.polygamma(n)``: ``F.polygamma(n, self)`` (torch's method takes n after the tensor)."""
    return F.polygamma(n, self)


def _polygamma_(self, n):
    return _in_place(self, "polygamma_", lambda t: F.polygamma(n, t))


TensorOps.polygamma, TensorOps.polygamma_ = _polygamma, _polygamma_


class Tensor(TensorOps):
    """An n-dimensional array that records the ops applied to it when it requires grad."""

    # _base and _views stay unset but in views and their roots (see note_view)
    __slots__ = ("__weakref__", "_base", "_data", "_device", "_grad", "_hooks", "_index", "_node", "_requires_grad",
                 "_views")

    def __init__(self, data, dtype=None, requires_grad=False, device=None):
        self._device = dev = default_device() if device is None else get_device(device, "tensor()")
        if isinstance(data, Tensor) and data._device is dev:
            data = data._data
        if not dev.host and type(data) is dev.array_type:  # a device array (CuPy's): copied there, not via the host
            self._data = dev.xp.array(data, dtype=D.as_dtype(data.dtype if dtype is None else dtype), copy=True)
        else:
            self._data = dev.from_host(as_array(data, dtype))
        self._node = None
        self._index = 0
        self._grad = None
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
    def size(self) -> _Size:
        """The number of elements, as NumPy's ``size``; called, as PyTorch's ``size()``: ``t.size()`` is the shape
        and ``t.size(1)`` one dim. (A plain method would make NumPy-style ``t.size == 0`` silently False.)"""
        return _Size(self._data.size, self._data.shape)

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

    @property
    def grad(self) -> Tensor | None:
        """The gradient ``backward()`` accumulated (None until then, or after ``zero_grad()``). In traced code,
        the gradient as the code sees it at that point (a program variable)."""
        interpreter = _interpreter()
        return interpreter.grad_of(self) if interpreter.symbolic and self._requires_grad else self._grad

    @grad.setter
    def grad(self, value) -> None:
        interpreter = _interpreter()
        if interpreter.symbolic:
            interpreter.set_grad(self, value)
            return
        if value is not None and (not isinstance(value, Tensor) or value.shape != self.shape
                                  or value.dtype != self.dtype or value._device is not self._device):
            raise ArgumentError(f"assigning .grad: a tensor of shape {self.shape}, dtype {self.dtype} on "
                                f"'{self._device}' takes a gradient of the same, or None; got {describe(value)}"
                                + (f" on '{value._device}'" if isinstance(value, Tensor) else ""))
        self._grad = value

    @property
    def data(self) -> Tensor:
        """This tensor's data cut from the graph (``detach()``: shared memory, no history), as torch's ``.data``;
        assigning ``t.data = other`` makes ``t`` hold ``other``'s data (no copy, no record)."""
        return self.detach()

    @data.setter
    def data(self, value) -> None:
        if not isinstance(value, Tensor):
            raise ArgumentError(f"assigning .data: expected a Tensor, got {describe(value)}")
        self._data, self._device = value._data, value._device

    def __index__(self) -> int:
        """An integer tensor of one element used as an index (``classes[t.argmax()]``), as torch allows."""
        if self._data.size != 1 or self._data.dtype.kind not in "iu":
            raise TypeError(f"only an integer tensor of one element converts to an index, this one has shape "
                            f"{self.shape} and dtype {self.dtype}")
        return int(self.item())

    @property
    def _version(self) -> int:
        """How many in-place writes changed this tensor (or memory it shares with views and aliases)."""
        return version(self)

    def numpy(self) -> np.ndarray:
        """The underlying array, without a copy: it shares memory with this tensor, so writing to it changes the
        tensor — behind autograd's back (such writes are not counted as in-place ops; use ``add_``, ``copy_``...).
        Only for tensors in host memory: on another device this is an error, as in PyTorch; call ``.cpu()``."""
        if not self._device.host:
            raise ArgumentError(f"numpy(): the tensor is on device '{self._device}', not in host memory; call "
                                ".cpu() first to copy it to the host (t.cpu().numpy())")
        _host_reads.count += 1
        return self._data

    def item(self):
        if self._data.size != 1:
            raise ArgumentError(f"item(): only a tensor with one element converts, this one has shape {self.shape}")
        _host_reads.count += 1
        return self._data.item()

    def tolist(self):
        _host_reads.count += 1
        return self._device.to_host(self._data).tolist()

    def __array__(self, dtype=None, copy=None):
        data = self.numpy()
        if copy:
            return np.array(data, dtype=dtype, copy=True)
        return data if dtype is None else data.astype(dtype, copy=False)

    def __array_function__(self, func, types, args, kwargs):
        """NumPy functions called on Tensors: the common reductions (``np.sum(t)``, ``np.mean(t, axis=0)``...) run
        as opforge ops and return Tensors; any other function gets the tensors' arrays and returns NumPy's result."""
        op = _NUMPY_REDUCTIONS.get(func)
        axis = args[1] if len(args) == 2 else kwargs.get("axis")
        no_axis = isinstance(axis, (tuple, list)) and not axis  # NumPy's axis=(), reducing nothing: NumPy computes it
        if op is not None and args and isinstance(args[0], Tensor) and len(args) <= 2 and not no_axis:
            return _numpy_reduction(func.__name__, op, *args, **kwargs)
        return func(*_to_arrays(args), **_to_arrays(kwargs))

    def __reduce__(self):
        if self._node is not None:
            raise GradientError(
                f"cannot pickle a tensor computed by recorded ops (shape {self.shape}, made by "
                f"'{self._node.op.name}'): its autograd history cannot be pickled; pickle t.detach() to keep the data"
            )
        return _unpickle, (self._device.to_host(self._data), self._device.name, self._requires_grad)

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
        extra = [f"dtype={self.dtype}"] if self.dtype not in (D.DEFAULT_FLOAT, D.DEFAULT_INT, D.bool_) else []
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
        """The same data, cut from the graph (no copy: in-place writes to either are seen by both)."""
        return note_view(self, wrap(self._data, self._device), None, None)

    def retain_grad(self) -> None:
        """Keep this non-leaf tensor's gradient in ``.grad`` when ``backward()`` runs (a leaf keeps it anyway)."""
        if self._node is None:
            if not self._requires_grad:
                raise GradientError("retain_grad(): the tensor does not require grad, so no gradient reaches it")
            return
        ref = weakref.ref(self)

        def keep(g):
            t = ref()
            if t is not None:
                t._grad = g if t._grad is None else t._grad + g
        keep.retains = True
        _node_hooks.setdefault(self._node, {}).setdefault(self._index, []).append(keep)

    def register_hook(self, hook):
        """Call ``hook(grad)`` with this tensor's gradient each time one is computed, before it is used; a hook that
        returns a tensor replaces the gradient (it must have the gradient's shape, dtype and device: anything else is
        a GradientError naming the hook, as in torch). Returns a handle whose ``remove()`` unregisters it."""
        if not callable(hook):
            raise ArgumentError(f"register_hook(): expected a callable, got {describe(hook)}")
        if not self._requires_grad:
            raise GradientError("register_hook(): the tensor does not require grad, so no gradient reaches it")
        if self._node is None:
            hooks = _leaf_hooks.get(id(self))
            if hooks is None:
                hooks = _leaf_hooks[id(self)] = []
                weakref.finalize(self, _leaf_hooks.pop, id(self), None)
        else:
            hooks = _node_hooks.setdefault(self._node, {}).setdefault(self._index, [])
        # before retain_grad's, which stores what the others made of the gradient
        hooks.insert(next((i for i, h in enumerate(hooks) if getattr(h, "retains", False)), len(hooks)), hook)
        return _HookHandle(hooks, hook)

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
        _engine.backward([self], None if gradient is None else [gradient],
                         retain_graph=retain_graph, create_graph=create_graph)

class _Size(int):
    """``Tensor.size``: the number of elements (an int, as NumPy's ``size``) that can also be called as PyTorch's
    ``size()``, giving the shape, or ``size(dim)``, one dim."""

    def __new__(cls, n: int, shape: tuple):
        self = super().__new__(cls, n)
        self.shape = shape
        return self

    def __call__(self, dim=None):
        if dim is None:
            return tuple(self.shape)
        if not -len(self.shape) <= dim < len(self.shape):
            raise ArgumentError(f"size(): dim {dim} is out of range for a tensor of shape {tuple(self.shape)}")
        return self.shape[dim]


class _HostReads(threading.local):
    count = 0  # values read out to the host (numpy(), item(), tolist(), np.asarray): a gradient rule must not


_host_reads = _HostReads()
_leaf_hooks: dict = {}  # id(leaf Tensor) -> [hook(grad)], while it lives (== on Tensors is elementwise, so no
#                          WeakKeyDictionary)
_node_hooks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Node -> {output index: [hook(grad)]}


def _unpickle(array, device: str, requires_grad: bool) -> Tensor:
    dev = get_device(device, "unpickling a tensor")
    return wrap(dev.from_host(array), dev, requires_grad)


def _to_arrays(value):
    if isinstance(value, Tensor):
        return value.numpy()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_arrays(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_arrays(v) for k, v in value.items()}
    return value


_NUMPY_REDUCTIONS = {np.sum: "sum", np.mean: "mean", np.max: "amax", np.amax: "amax", np.min: "amin",
                     np.amin: "amin", np.prod: "prod", np.std: "std", np.var: "var", np.argmax: "argmax",
                     np.argmin: "argmin"}


def _numpy_reduction(name: str, op: str, x, axis=None, dtype=None, out=None, keepdims=False, **rest):
    if out is not None or rest.get("where") is not None or rest.get("initial") is not None:
        raise ArgumentError(f"np.{name}() on a Tensor: out=, where= and initial= are not supported; call "
                            f"F.{op}(t, axis=...) or t.numpy() first")
    result = getattr(F, op)(x, axis=axis, keepdim=bool(keepdims),
                            **({"correction": rest.get("ddof", 0)} if op in ("std", "var") else {}))
    return result if dtype is None else result.astype(dtype)


def _to_args(t, args: tuple, kwargs: dict):
    """``to()``'s arguments -> (Device or None, dtype or None)."""
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    kwargs.pop("copy", None), kwargs.pop("non_blocking", None)
    if kwargs:
        raise ArgumentError(f"to(): unexpected arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, TensorOps):
            device, dtype = a.device, a.dtype
        elif isinstance(a, Device) or (isinstance(a, str) and _is_device_name(a)):
            device = a
        else:
            dtype = a
    return (None if device is None else get_device(device, "to()"),
            None if dtype is None else D.as_dtype(dtype, op="to", arg="dtype"))


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_device_name(name: str) -> bool:
    if name == "cuda" or name.startswith("cuda:"):
        return True  # a device, even where it is missing: get_device then says what is missing
    try:
        get_device(name)
        return True
    except ArgumentError:
        return False


def _in_place(t, what: str, compute):
    """``t`` given the value ``compute(t)``, written into it (PyTorch's in-place methods and operators).

    Eagerly, without autograd involved, the value is written into ``t``'s memory (so aliases and views see it) and
    the write is counted (see ``note_write``); under a tracer it is recorded as the program's update of ``t``.
    When the value is recorded for autograd, ``t`` takes the new value and its history, leaving its old memory to
    whatever saved it. A leaf that requires grad cannot change while gradients are recorded: its gradient would
    be meaningless (PyTorch refuses it too)."""
    if type(t) is not Tensor:  # a program variable: it names the new value from now on
        return t._assign_value(what, _fit(t, what, compute(t)))
    if _grad_mode.enabled and t._requires_grad and t._node is None:
        raise GradientError(
            f"{what}: a leaf tensor that requires grad (shape {t.shape}) cannot be changed in place while gradients "
            "are recorded; update parameters inside `with of.no_grad():` (as optimizers do), or compute a new tensor"
        )
    interpreter = _interpreter()
    if interpreter.symbolic:  # tracing: the program records the new value as its update of t
        interpreter.assign(t, _fit(t, what, compute(t)))
        return t
    if _grad_mode.enabled:  # the value may be recorded: compute it from a stand-in holding t's present state
        old = wrap(t._data, t._device) if t._node is None else wrap_output(t._data, t._node, t._index, t._device)
        value = _fit(t, what, compute(old))
        if value._requires_grad:
            _rebind_views(t, value, what)
            return t
    else:
        value = _fit(t, what, compute(t))
    if not getattr(t._data.flags, "writeable", True):
        raise ArgumentError(f"{what}: the memory of this tensor (shape {t.shape}) is read-only (a broadcast view or "
                            "a constant); compute a new tensor instead")
    t._device.copy_into(t._data, value._data)
    note_write(t._data, what)
    return t


def written_into(t, compute):
    """torch's ``inplace=True`` of an activation (``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``):
    ``compute(t)`` written into ``t`` and ``t`` returned. The op reads an alias of ``t``'s present value, so what it
    saves for its gradient rule is not the tensor that then changes: a recorded write leaves that old value as it was
    (see ``_in_place``), and the gradient is right, as torch's in-place activations give it."""
    alias = wrap_output(t._data, t._node, t._index, t._device) if type(t) is Tensor and t._node is not None else t
    return t.copy_(compute(alias))


_SET_ITEM = "item assignment (t[index] = value)"


def _set_item(t, index, value) -> None:
    """``t[index] = value`` as torch's: ``value`` (broadcast to ``t[index]``'s shape, in ``t``'s dtype) written into
    ``t``, counted by the version counter. Eagerly, with nothing to record for autograd, it is written into ``t``'s
    memory (views see it); recorded, ``t`` takes the new value ``index_put`` computes with ops and its history (the
    gradient goes to ``value``, none to what was overwritten), as every in-place op (``_in_place``); a leaf that
    requires grad is refused, as torch refuses it; traced, it is the program's update of ``t``."""
    if type(t) is Tensor and not _interpreter().symbolic and not (_grad_mode.enabled and (
            t._requires_grad or (isinstance(value, TensorOps) and value.requires_grad))):
        if isinstance(value, TensorOps) and value.device is not t._device:
            raise ArgumentError(f"{_SET_ITEM}: the value is on '{value.device}', the tensor on '{t._device}'")
        array = value._data if isinstance(value, Tensor) else np.asarray(value)
        if not np.can_cast(array.dtype, t.dtype, casting="same_kind"):
            raise ArgumentError(f"{_SET_ITEM}: a {array.dtype} value cannot be written into a {t.dtype} tensor "
                                "(torch would cast it; convert it first)")
        if not getattr(t._data.flags, "writeable", True):
            raise ArgumentError(f"{_SET_ITEM}: the memory of this tensor (shape {t.shape}) is read-only (a broadcast "
                                "view or a constant); compute a new tensor instead")
        if not isinstance(value, Tensor):
            array = t._device.from_host(array)
        items = index if isinstance(index, tuple) else (index,)
        arrays = [i for i in items if isinstance(i, (list, range, np.ndarray, TensorOps))]
        if len(arrays) > 1 or (arrays and any(isinstance(i, (int, np.integer)) for i in items)):
            # NumPy would read such an index otherwise than torch (x[0, :, [1, 2]]): write at torch's positions
            if not t._data.flags.c_contiguous:
                raise ArgumentError(f"{_SET_ITEM}: several index arrays into a tensor that is not contiguous in "
                                    f"memory (shape {t.shape}); write into t.contiguous().clone()")
            where = _positions(t.shape, index)
            values = t._device.xp.broadcast_to(array, where.shape).reshape(-1)
            t._data.reshape(-1)[t._device.from_host(where.reshape(-1))] = values
        else:
            t._data[tuple(i._data if isinstance(i, Tensor) else i for i in items)] = array
        note_write(t._data, _SET_ITEM)
        return
    _in_place(t, _SET_ITEM, lambda old: index_put(old, index, value))


def _positions(shape, index) -> np.ndarray:
    """The flat position in a C-ordered array of ``shape`` of each element of ``x[index]`` (torch's reading of the
    index, as ``_index``'s), shaped as ``x[index]``."""
    if any(d is None or not isinstance(d, (int, np.integer)) for d in shape):
        raise ArgumentError(f"{_SET_ITEM}: the tensor's shape {tuple(shape)} must be known where it is traced")
    grid = wrap(np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape))
    items = index if isinstance(index, tuple) else (index,)
    host = tuple(i.numpy() if isinstance(i, Tensor) else i for i in items)
    if any(isinstance(i, TensorOps) for i in host):
        raise ArgumentError(f"{_SET_ITEM}: an index array that is computed in a traced function needs a bool mask "
                            "(t[mask] = number) or eager values")
    with interpreting(EAGER), _grad_mode_off():  # positions are a constant of the call, computed now
        return _index(grid, host).numpy()


def index_accumulate(x, index, value):
    """``x`` with ``value`` (broadcast to ``x[index]``'s shape, cast to x's dtype) added at ``x[index]``'s places,
    repeated places adding up (torch's ``index_put(..., accumulate=True)``); written with ops, as ``index_put``."""
    if not isinstance(value, TensorOps):
        value = _lift(value, x) if type(value) in (int, float, bool) else wrap(np.asarray(value), x.device)
    if value.dtype != x.dtype:
        value = _fit_dtype(x, value)
    positions = _positions(x.shape, index)
    values = F.reshape(F.broadcast_to(value, list(positions.shape)), [-1])
    flat = wrap(x.device.from_host(positions.reshape(-1).astype(np.int64)), x.device)
    return x + F.reshape(F.scatter_add(F.zeros_like(F.reshape(x, [-1])), 0, flat, values), list(x.shape))


def index_put(x, index, value):
    """``x`` with ``x[index]`` replaced by ``value`` (broadcast to that shape, cast to x's dtype), written with ops
    so that it differentiates (the gradient goes to ``value`` and to the rest of ``x``, none to what was replaced)
    and traces. A bool mask with one value is a ``where``; any other index writes the value's elements at their flat
    positions (``scatter_add`` into zeros, the last one winning where positions repeat, as torch's CPU kernel)."""
    if not isinstance(value, TensorOps):
        value = _lift(value, x) if type(value) in (int, float, bool) else wrap(np.asarray(value), x.device)
    if value.dtype != x.dtype:
        value = _fit_dtype(x, value)
    items = index if isinstance(index, tuple) else (index,)
    mask = items[0] if len(items) == 1 else None
    if mask is not None and isinstance(mask, (np.ndarray, TensorOps)) and np.dtype(mask.dtype) == np.bool_ and \
            len(value.shape) == 0 and 0 < len(mask.shape) <= len(x.shape):
        if isinstance(mask, np.ndarray):
            mask = wrap(mask, x.device)
        if len(mask.shape) < len(x.shape):
            mask = F.reshape(mask, [*mask.shape, *[1] * (len(x.shape) - len(mask.shape))])
        return F.where(mask, value, x)
    return put(x, _positions(x.shape, index), value)


def put(x, positions: np.ndarray, value):
    """``x`` with its elements at the flat (C-order) ``positions`` replaced by ``value``, broadcast to the positions'
    shape (the last one winning where positions repeat), written with ops so that it differentiates and traces:
    item assignment, and a compiled function's write through a view (``opforge.program.trace``)."""
    flat = positions.reshape(-1)
    last = len(flat) - 1 - np.unique(flat[::-1], return_index=True)[1]  # where a position repeats, its last value
    values = F.reshape(F.broadcast_to(value, list(positions.shape)), [-1])
    if len(last) != len(flat):
        values = F.take(values, wrap(last.astype(np.int64), x.device))
        flat = flat[last]
    written = np.zeros(x.shape, bool)
    written.reshape(-1)[flat] = True
    scattered = F.scatter_add(F.zeros_like(F.reshape(x, [-1])), 0, wrap(flat.astype(np.int64), x.device), values)
    return F.where(wrap(x.device.from_host(written), x.device), F.reshape(scattered, list(x.shape)), x)


def _fit_dtype(x, value):
    if not np.can_cast(value.dtype, x.dtype, casting="same_kind"):
        raise ArgumentError(f"{_SET_ITEM}: a {value.dtype} value cannot be written into a {x.dtype} tensor (torch "
                            "would cast it; convert it first)")
    return F.cast(value, dtype=x.dtype)


def _fit(t, what: str, value):
    """``value`` as the new content of ``t``: a tensor of ``t``'s shape and dtype (broadcast and cast as PyTorch's
    in-place ops do; a result that does not fit is an error)."""
    if not isinstance(value, TensorOps):
        value = F.zeros_like(t) + value
    if tuple(value.shape) != tuple(t.shape):
        try:
            value = F.broadcast_to(value, shape=t.shape)
        except (ArgumentError, ShapeError):
            raise ArgumentError(f"{what}: the result has shape {tuple(value.shape)}, which does not fit into the "
                                f"tensor's shape {tuple(t.shape)}") from None
    if value.dtype != t.dtype:
        if not np.can_cast(value.dtype, t.dtype, casting="same_kind"):
            raise ArgumentError(f"{what}: the result has dtype {value.dtype}, which cannot be written into a "
                                f"{t.dtype} tensor")
        value = F.cast(value, dtype=t.dtype)
    return value


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


_SCALARS: dict = {}  # (type, exact(value), peer dtype, device) -> Tensor of a read-only 0-d array: constants cost
# nothing. exact(): -0.0 must not find 0.0's tensor (1 / (x + -0.0) is -inf at x = -0.0), and NaN must find its own.


def _lift(value, like):
    """A Python number meeting ``like`` as a Tensor of the dtype it takes there (weak typing, see
    core.dtypes); anything else is returned as it is, for the op to convert or refuse."""
    kind = type(value)
    if kind is not float and kind is not int and kind is not bool:
        return value
    if type(like) is Tensor:  # its fields, not its properties (a program Variable has the properties only)
        dtype, device = like._data.dtype, like._device
    else:
        dtype, device = like.dtype, like.device
    key = (kind, value if kind is not float or (value and value == value) else exact(value), dtype, device.name)
    constant = _SCALARS.get(key)
    if constant is None:
        if len(_SCALARS) > 4096:
            _SCALARS.clear()
        try:
            array = np.array(value, D.scalar_dtype(value, dtype))
        except OverflowError:  # an int no dtype here holds: the op refuses it, naming itself and the argument
            return value
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
        run_time_bounds = isinstance(item, slice) and any(isinstance(b, Dim) for b in (item.start, item.stop))
        if not isinstance(size, int) or run_time_bounds:  # (in a program) bounds resolved when it runs
            start, stop, step = _run_time_bounds(x, dim, item)
            axes.append(dim), starts.append(start), ends.append(stop), steps.append(step)
            if isinstance(item, slice):  # (an int index drops the dim)
                shape.append(("y", dim))
        elif isinstance(item, slice):
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
    shape = [y.shape[d[1]] if isinstance(d, tuple) else d for d in shape]  # (("y", k): y's dim k, known at run time)
    if tuple(shape) != y.shape:
        return F.reshape(y, shape=shape)
    return y if y is not x else F.identity(x)  # x[...] is a new tensor, as every index result


def _run_time_bounds(x, dim: int, item):
    """Slice ``item`` (or int index) along dim ``dim`` of ``x``, whose size is known only at run time, as the
    (start, end, step) of the ``slice`` op. Python clamps the start and a non-negative end as the op does; a
    negative end counts from the end of the dim: ``size + end`` (clamped), computed in the program from x's shape."""
    if isinstance(item, slice):
        step = 1 if item.step is None else int(item.step)
        if step == 0:
            raise ArgumentError("Tensor indexing: slice step cannot be zero")
        start = (0 if step > 0 else -1) if item.start is None else item.start
        start = start if isinstance(start, Dim) else int(start)  # (a negative start counts from the end, as here)
        stop = None if item.stop is None else item.stop if isinstance(item.stop, Dim) else int(item.stop)
    else:  # x[i]: the slice i:i+1
        start, step = int(item), 1
        stop = None if start == -1 else start + 1
    if stop is None:
        return start, 2**63 - 1 if step > 0 else -1, step  # to the end (-1: past index 0, going backwards)
    if (isinstance(stop, Dim) and not isinstance(stop, Elem)) or (isinstance(stop, int) and stop >= 0):
        return start, stop, step  # (a Dim, the size of a dim, is >= 0)
    size = F.slice(F.shape_as_tensor(x), axes=[0], starts=[dim], ends=[dim + 1], steps=[1])
    if isinstance(stop, int):
        end = F.maximum(size + stop, 0 if step > 0 else -1)
    else:  # a size computed in the program, of a sign known at run time
        stop = _interpreter().size_tensor(stop)
        end = F.where(stop < 0, F.maximum(size + stop, 0 if step > 0 else -1), stop)
    return start, Elem(end.name, 0), step


def _index(x, index):
    """``x[index]``: basic indexing (ints, slices, None, ...) when the index holds no array, else advanced."""
    items = index if isinstance(index, tuple) else (index,)
    if any(isinstance(item, (list, tuple, range, np.ndarray, TensorOps)) for item in items):
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
    items = [_Array(item) if isinstance(item, (list, tuple, range, np.ndarray, TensorOps)) else item
             for item in items]
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


class _Engine:
    """The autograd engine ``Tensor.backward`` runs: ``opforge.autodiff`` is built on this module, so it gives its
    ``backward`` here (``bind_engine``) when opforge loads (``opforge/__init__.py`` states the order)."""

    backward = None


_engine = _Engine()


def bind_engine(backward) -> None:
    _engine.backward = backward

