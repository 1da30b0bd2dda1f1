"""The SBP pass: a program for one process becomes the program each rank of a mesh runs, collectives inserted.

``ShardingTracer`` is an interpreter (see ``opforge.dispatch``): a ``Tracer`` that, before appending each op, knows
the layout of every input (``S(k)``, ``B``, ``P``; see ``sbp``), takes the op's candidate signatures, and picks the
one needing the fewest bytes moved (ties: fewer inserted ops, then the op's own order of preference), inserting the
collectives that bring each input to the layout it needs — ops of the program like any other, visible in its
text. Every value is held *locally*: a split value's Spec is the block a rank holds. What sees values as one
process would is given whole shapes: SBP rules (with the attrs as given; a signature says the attrs the op runs
with on blocks) and the traced code itself (``Variable.shape`` asks ``shape_of``).

The backward pass needs nothing of it: ``append_backward`` runs each op's gradient rule on the rank's own program,
and the inserted collectives' rules are their dual collectives, so each rank gets the gradient of the sum of all
ranks' losses with respect to what it holds. What an optimizer reads (``grad_of``) is then made the gradient of
the logical loss: a broadcast parameter's gradient is all-reduced (its ranks' copies are one value), and the
ranks' count is divided out when the loss is itself broadcast or a mean over ranks (``P("mean")``): data
parallelism's all_reduce(mean) of gradients, and tensor parallelism's gradients of sharded weights, come out of
one rule. Broadcast parameters' gradients are all-reduced a few at a time, flattened into one buffer per group
(DistributedDataParallel's buckets, in the program).

Two ways in:
* ``shard(program, mesh, feeds, params)``: a pass over a traced program for one process (whole shapes): feeds
  and parameters are cut to this rank's blocks, its forward ops replayed through the interpreter, its backward
  requests answered again on the sharded forward, its updates kept.
* ``of.compile`` of a step called under ``with mesh:`` (or calling a DistributedDataParallel model, outside one):
  the step is traced with this interpreter from the start (with the rank's own batch: feeds are ``S(0)`` unless
  the mesh says otherwise; parameters are whole tensors, read in blocks where the mesh says so).
"""

from __future__ import annotations

import contextvars
import functools
import math
import zlib

import numpy as np

from .. import ops as F
from ..core.errors import ArgumentError, OpforgeError, ShapeError, describe
from ..core.interpreters import interpreting
from ..core.opdef import registry
from ..core.sbp import BATCH_NORM, B, Layout, S, as_layout, block_spec, normalized, on_rank, signatures, whole_spec
from ..core.spec import Dim, Elem, Spec, undim
from ..dispatch import coerce_inputs
from ..program.backward import append_backward
from ..program.compile import _rebuild, trace_context_keys, traced_function_wrappers
from ..program.desc import Program
from ..program.trace import Tracer, Variable, _input_name, constant_name, tracing_program, var_for_tensor
from ..tensor import Tensor
from .comm import Communicator, current_communicator, using_communicator

COLLECTIVES = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"})
UNKNOWN_DIM = 1024  # an unknown dim (a batch of any size) counts as this many when comparing costs


class Mesh:
    """The ranks of a communicator along one axis (the world's, after ``of.distributed.init()``), with the layouts
    of the values a compiled step reads: ``feeds`` (by argument name; ``S(0)`` if not given: each rank passes its
    block of the batch) and ``params`` (Tensor -> layout; ``B`` if not given). Parameters are given *whole*, the same
    on every rank, as one process holds them (``shard()`` takes them so too): a split layout says the program
    computes with this rank's block of it, and the update is of the whole tensor (a trace whose parameters differ
    between ranks is refused). ``with mesh:`` makes collectives use its communicator and makes ``of.compile`` shard
    what it traces.

    ``batch_norm``: the statistics batch normalisation takes over a split batch in training: ``"sync"`` (the
    default), those of the whole batch, as one process (two all-reduces of a channel-sized vector); ``"local"``,
    each rank's rows alone, as PyTorch's DistributedDataParallel (no collective; the running statistics are the
    mean of the ranks'). ``DistributedDataParallel`` compiles under a ``"local"`` mesh, as it runs eagerly.

    ``shape``: the ranks laid out as an n-D grid (``(2, 2)``: data × tensor on 4 ranks), rank r at the row-major
    coordinates of r; ``mesh.axes[k]`` is the 1-D mesh of axis k (the ranks whose other coordinates are this rank's,
    over a communicator of their own: making an n-D mesh is collective, every rank makes it), and its collectives
    say ``group=k``. ``shard()`` takes a layout per axis
    (OneFlow's nd-SBP); its program runs under ``with mesh:``, which gives each axis's collectives their group."""

    def __init__(self, comm: Communicator | None = None, feeds: dict | None = None, params: dict | None = None,
                 batch_norm: str = "sync", shape: tuple | None = None, group: int | None = None):
        self.comm = current_communicator() if comm is None else comm
        self.feeds = {k: as_layout(v, f"Mesh(): feed {k!r}") for k, v in (feeds or {}).items()}
        self.params = _param_layouts(params, "Mesh()")
        if batch_norm not in BATCH_NORM:
            raise ArgumentError(f"Mesh(): batch_norm must be one of {BATCH_NORM}, got {describe(batch_norm)}")
        self.batch_norm = batch_norm
        self.group = group  # this mesh is axis `group` of an n-D mesh: its collectives say so
        self.shape = (self.comm.size,) if shape is None else tuple(shape)
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in self.shape) \
                or math.prod(self.shape) != self.comm.size:
            raise ArgumentError(f"Mesh(): shape {self.shape} must be positive ints whose product is the "
                                f"communicator's {self.comm.size} ranks")
        self.axes = [self] if len(self.shape) == 1 else self._split_axes()

    def _split_axes(self) -> list:
        """One 1-D mesh per axis, over the group of ranks that differ only along it (MPI_Comm_split per axis)."""
        where = np.unravel_index(self.comm.rank, self.shape)
        axes = []
        for k in range(len(self.shape)):
            others = [int(c) for j, c in enumerate(where) if j != k]
            color = int(np.ravel_multi_index(others, [d for j, d in enumerate(self.shape) if j != k])) if others else 0
            axes.append(Mesh(self.comm.split(color, int(where[k])), batch_norm=self.batch_norm, group=k))
        return axes

    @property
    def groups(self) -> tuple | None:
        """The communicators of an n-D mesh's axes (None for a 1-D mesh: its collectives use ``comm``)."""
        return tuple(axis.comm for axis in self.axes) if len(self.shape) > 1 else None

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def rank(self) -> int:
        return self.comm.rank

    def __enter__(self) -> Mesh:
        self._using = using_communicator(self.comm, self.groups)
        self._using.__enter__()
        self._token = _mesh.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _mesh.reset(self._token)
        self._using.__exit__(*exc)

    def __repr__(self) -> str:
        shape = "" if len(self.shape) == 1 else f" as {'x'.join(map(str, self.shape))}"
        return f"Mesh({self.size} ranks{shape}, this is rank {self.rank})"

    def key(self) -> tuple:
        """What a program traced under this mesh depends on: the communicator and the layouts (a new Mesh of the
        same communicator and layouts, as ``with Mesh():`` in a loop makes, finds the same compiled program)."""
        return (id(self.comm), tuple(sorted((k, str(v)) for k, v in self.feeds.items())),
                tuple(sorted((str(k), str(v)) for k, v in self.params.items())), self.batch_norm, self.shape)


_mesh = contextvars.ContextVar("opforge.mesh", default=None)


def current_mesh() -> Mesh | None:
    return _mesh.get()


def _param_layouts(params, who: str, nd: bool = False) -> dict:
    """{id(Tensor) or variable name: Layout} (the layouts as given, with ``nd``: a tuple per n-D mesh)."""
    out = {}
    for key, value in (params or {}).items():
        if not isinstance(key, (Tensor, str)):
            raise ArgumentError(f"{who}: parameter layouts are keyed by Tensor or variable name, got {describe(key)}")
        out[id(key) if isinstance(key, Tensor) else key] = value if nd else as_layout(value, f"{who}: parameter layout")
    return out


class ShardingTracer(Tracer):
    """A Tracer that gives every value a layout and inserts the collectives each op's signature needs."""

    def __init__(self, program: Program, mesh: Mesh, params: dict | None = None, scatter_grads=frozenset()):
        super().__init__(program)
        self.mesh = mesh
        self.params = dict(mesh.params) | dict(params or {})  # id(Tensor) or var name -> Layout
        self.scatter_grads = scatter_grads  # broadcast values whose gradient is reduce-scattered (ZeRO-2): S(0)
        self.layouts: dict = {}  # variable name -> Layout
        self._converted: dict = {}  # (variable, Layout) -> variable holding it in that layout
        self._reduced: dict = {}  # local gradient variable -> the logical loss's gradient
        self._final: set = set()  # gradient variables that are already the logical loss's
        self._read_as: dict = {}  # variable of a whole tensor -> the split layout ops read it in
        program.layouts = self.layouts  # kept with the program: what each variable is across the ranks

    # -- the interpreter --------------------------------------------------------------------------------------

    def apply(self, op, inputs: tuple, attrs: dict):
        if op.name in COLLECTIVES and (attrs.get("group") is None or attrs.get("group") == self.mesh.group):
            # (one over another axis of an n-D mesh, which an earlier pass inserted, has layouts over this one)
            raise ArgumentError(f"{op.name}(): a program being sharded holds no collectives of its own: the SBP pass "
                                "inserts them (write the program for one process)")
        if op.validate is not None:
            op.validate(attrs)
        names = self._input_names(op, inputs)
        chosen = self._choose(op, names, attrs)
        attrs = chosen[2]  # as the op runs on the blocks
        converted = [[self._convert(n, want) for n in slot] if isinstance(slot, list) else
                     (None if slot is None else self._convert(slot, want))
                     for slot, want in zip(names, chosen[0])]
        args = [[Variable(self.program, n) for n in slot] if isinstance(slot, list) else
                (None if slot is None else Variable(self.program, slot)) for slot in converted]
        if chosen[3] is not None:  # a Decomposition: its ops, each with layouts of its own, compute the op
            return chosen[3](*args, **attrs)
        result = super().apply(op, tuple(args), attrs)
        outs = result if len(op.outputs) > 1 else (result,)
        for o, value, layout in zip(op.outputs, outs, chosen[1]):
            for v in value if o.is_list else [value]:
                self.layouts[v.name] = normalized(layout, len(v.spec.shape))
        return result

    def live(self, tensor: Tensor) -> Variable:
        return Variable(self.program, self._var_of(tensor, state=True))

    def assign(self, target: Tensor, value) -> None:
        name = self._var_of(target, state=not target.requires_grad)
        if isinstance(value, Variable):
            value = Variable(self.program, self._convert(value.name, self.layouts[name]))
        super().assign(target, value)

    def grad_of(self, param: Tensor):
        g = super().grad_of(param)
        return None if g is None else Variable(self.program, self.logical_grad(self._var_of(param), g.name))

    def gradients(self, loss, wrt: list) -> dict:
        """``loss.backward()``'s gradients, made the logical loss's (broadcast parameters' all-reduced in
        buckets) before they are added to the ``.grad`` each tensor has: ``.grad`` after a step is what one
        process would have, whether an optimizer reads it or not."""
        local = super().gradients(loss, wrt)
        self._reduce_together(local.items())
        return {w: self.logical_grad(w, g) for w, g in local.items()}

    def backward(self, loss) -> None:
        super().backward(loss)
        for name, g in self.state.grads.items():  # sums of logical gradients (and .grad brought in) are logical
            if g is not None:
                self._final.add(g)
                self.layouts.setdefault(g, self.layouts.get(name, B))

    def _grad(self, name: str):
        g = super()._grad(name)
        if g is not None and self.state.grad_feeds.get(name) == g:  # the .grad a run starts from: the logical one
            self._final.add(g)
            self.layouts.setdefault(g, self.layouts.get(name, B))
        return g

    def set_grad(self, param: Tensor, grad) -> None:
        if grad is not None:
            self._final.add(grad.name)
        super().set_grad(param, grad)

    def differentiate(self, outputs, inputs, grad_outputs, allow_unused: bool):
        grads = super().differentiate(outputs, inputs, grad_outputs, allow_unused)
        inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        return tuple(None if g is None else
                     Variable(self.program, self.logical_grad(self._var_of(t) if isinstance(t, Tensor) else t.name,
                                                              g.name)) for t, g in zip(inputs, grads))

    # -- layouts of what comes in ------------------------------------------------------------------------------

    def _var_of(self, tensor: Tensor, state: bool = False) -> str:
        """The variable of an eager tensor the program reads. A tensor is whole on every rank (``B``), as it is
        eagerly; one given a split layout (``Mesh(params={w: S(0)})``) is read by ops as this rank's block of it
        (a slice, whose gradient is the block's): the program computes with blocks, and updates the whole."""
        name = var_for_tensor(self.program, tensor, state=state)
        if name not in self.layouts:
            layout = normalized(self.params.get(id(tensor), self.params.get(name, B)), tensor.ndim)
            self.layouts[name] = B
            if layout.partial:
                raise ArgumentError(f"Mesh(params=...): {name!r} cannot be read as a partial value ({layout})")
            if layout.split:
                d, n = tensor.shape[layout.axis], self.mesh.size
                if d % n:
                    raise ShapeError(f"Mesh(params=...): {name!r} of shape {tuple(tensor.shape)} does not split into "
                                     f"{n} equal blocks along axis {layout.axis}")
                self._read_as[name] = layout
        return name

    def _read(self, name: str) -> str:
        """Variable ``name`` as ops read it: this rank's block of a tensor given a split layout, else itself."""
        want = self._read_as.get(name)
        return name if want is None else self._convert(name, want)

    def _input_names(self, op, inputs: tuple) -> list:
        """Each input as a variable name (lists for ``Tensor[]``): eager Tensors become parameters or state,
        Python numbers and arrays constants (broadcast)."""
        def take(arg, value):
            if isinstance(value, Tensor):
                return self._read(self._var_of(value))
            return self._broadcast_unless_known(_input_name(self.program, op, arg, value))

        def lift(arg, array):
            return self._broadcast_unless_known(constant_name(self.program, array))

        return coerce_inputs(op, inputs, take, lift)

    def _broadcast_unless_known(self, name: str) -> str:
        self.layouts.setdefault(name, B)
        return name

    # -- choosing a signature --------------------------------------------------------------------------------

    def _choose(self, op, names: list, attrs: dict) -> tuple:
        """The signature to run ``op`` under: ``(input layouts, output layouts, attrs on the blocks, via)``, where
        ``via`` is None or the function (of a ``Decomposition``) that computes the op from its inputs. Rules see
        whole Specs and the attrs as given (a one-process view); each candidate is checked against the op's shape
        rule: the blocks it would compute must be the blocks of the whole result."""
        def each(slot, fn):
            return [fn(n) for n in slot] if isinstance(slot, list) else (None if slot is None else fn(slot))

        ranks = self.mesh.size
        specs = [each(slot, self._spec) for slot in names]
        wholes = [each(slot, self._whole_spec) for slot in names]
        plain = {k: undim(v) for k, v in attrs.items()}
        whole_out = op.infer_specs(wholes, plain)  # what one process computes
        best, best_key = None, None
        found = signatures(op, wholes, plain, ranks, self.mesh.batch_norm)
        for index, (ins, outs, local, via) in enumerate(found):
            local = on_rank(local, self.mesh.rank)
            if len(ins) != len(names) or (via is None and len(outs) != len(op.outputs)):
                raise ArgumentError(f"op '{op.name}': an SBP signature must give {len(names)} input layout(s) and "
                                    f"{len(op.outputs)} output layout(s), got {ins} -> {outs}")
            cost, moves, after = 0.0, 0, []
            for slot, spec, want in zip(names, specs, ins):
                if slot is None:
                    after.append(None)
                    continue
                plans = [self._plan(n, want) for n in (slot if isinstance(slot, list) else [slot])]
                if any(p is None for p in plans):
                    break
                cost += sum(p[0] for p in plans)
                moves += sum(p[1] for p in plans)
                pairs = zip(slot, spec) if isinstance(slot, list) else [(slot, spec)]
                local_specs = [self._converted_spec(n, s, want) for n, s in pairs]
                after.append(local_specs if isinstance(slot, list) else local_specs[0])
            else:
                run_attrs = attrs | {k: _keep_dims(attrs.get(k), v) for k, v in local.items()}
                if via is None and not self._fits(op, after, {k: undim(v) for k, v in run_attrs.items()}, whole_out,
                                                  outs):
                    continue
                key = (cost, moves, index)
                if best_key is None or key < best_key:
                    best, best_key = (ins, outs, run_attrs, via), key
        if best is None:
            shown = ", ".join(f"{n}: {self.layouts.get(n)} {self._spec(n)}" for slot in names if slot is not None
                              for n in (slot if isinstance(slot, list) else [slot]))
            raise ShapeError(f"{op.name}(): no SBP signature fits inputs ({shown}) on {self.mesh.size} ranks")
        return best

    def _fits(self, op, blocks: list, attrs: dict, whole_out: tuple, outs: tuple) -> bool:
        """Whether the op, given these blocks and attrs, computes on each rank the block (under ``outs``) of what
        one process computes: its shape rule must accept them and give those blocks' Specs."""
        try:
            got = op.infer_specs(blocks, attrs)
        except OpforgeError:
            return False
        for o, spec, want, layout in zip(op.outputs, got, whole_out, outs):
            pairs = zip(spec, want) if o.is_list else [(spec, want)]
            for s, w in pairs:
                try:
                    expected = block_spec(w, layout, self.mesh.size)
                except ArgumentError:  # a split axis the output does not have
                    return False
                if expected is None or s.dtype != w.dtype or len(s.shape) != len(w.shape) or any(
                        a is not None and b is not None and a != b for a, b in zip(s.shape, expected.shape)):
                    return False
        return True

    def _whole_spec(self, name: str) -> Spec:
        """The Spec of the whole value of variable ``name`` (its block times the ranks along a split axis)."""
        return whole_spec(self._spec(name), self.layouts[name], self.mesh.size)

    def shape_of(self, variable) -> tuple:
        """The shape traced code sees: the whole value's (``x.shape[0]`` of a split batch is the whole batch), as
        the one process that the program means would see it."""
        name = variable.name
        layout = self.layouts.get(name)
        spec = self._spec(name) if layout is None else self._whole_spec(name)
        return tuple(Dim(name, i) if d is None else d for i, d in enumerate(spec.shape))

    def _spec(self, name: str) -> Spec:
        return self.program.block.vars[name].spec

    def _converted_spec(self, name: str, spec: Spec, want: Layout) -> Spec:
        have, n = self.layouts[name], self.mesh.size
        shape = list(spec.shape)
        if want is None or have == want:
            return spec
        if have.split:
            shape[have.axis] = None if shape[have.axis] is None else shape[have.axis] * n
        if want.split:
            want = normalized(want, len(shape))
            shape[want.axis] = None if shape[want.axis] is None else shape[want.axis] // n
        return Spec(tuple(shape), spec.dtype)

    def _plan(self, name: str, want: Layout | None):
        """(bytes each rank sends, ops inserted) to bring variable ``name`` to layout ``want``; None if it cannot."""
        have, spec, n = self.layouts[name], self._spec(name), self.mesh.size
        if want is None or have == want:
            return (0.0, 0)
        ndim = len(spec.shape)
        try:
            want = normalized(want, ndim)
        except ArgumentError:
            return None
        if have == want:
            return (0.0, 0)
        size = math.prod(UNKNOWN_DIM if d is None else d for d in spec.shape) * spec.dtype.itemsize

        def splits(axis):  # a block per rank along axis
            d = spec.shape[axis]
            return d is not None and d % n == 0

        if have.split and want == B:
            return (size * (n - 1), 1)
        if have.split and want.split:
            return (size * (n - 1) / n, 1) if splits(want.axis) else None
        if have.partial and want == B:
            return (2 * size * (n - 1) / n, 1)
        if have.partial and want.split:
            return (size * (n - 1) / n, 1) if splits(want.axis) else None
        if have == B and want.split:
            return (0.0, 1) if splits(want.axis) else None
        if have == B and want.partial:
            return (0.0, 1) if spec.dtype.kind == "f" else None
        # the rest goes through B: S -> P, P(sum) <-> P(mean)
        first = self._plan(name, B)
        return None if first is None else (first[0], first[1] + 1)

    # -- inserting the collectives ------------------------------------------------------------------------------

    def _convert(self, name: str, want: Layout | None) -> str:
        have = self.layouts[name]
        if want is None:
            return name
        want = normalized(want, len(self._spec(name).shape))
        if have == want:
            return name
        key = (name, want)
        if key in self._converted:
            return self._converted[key]
        v, n, rank, g = Variable(self.program, name), self.mesh.size, self.mesh.rank, self.mesh.group
        with interpreting(Tracer(self.program)):  # the inserted ops have no signature to choose
            if have.split and want == B:
                out = F.all_gather(v, axis=have.axis, group=g)
            elif have.split and want.split:
                out = F.all_to_all(v, split_axis=want.axis, concat_axis=have.axis, group=g)
            elif have.partial and want == B:
                out = F.all_reduce(v, op=have.reduce, group=g)
            elif have.partial and want.split:
                out = F.reduce_scatter(v, axis=want.axis, op=have.reduce, group=g)
            elif have == B and want.split:
                block = self._spec(name).shape[want.axis] // n
                out = F.slice(v, axes=[want.axis], starts=[rank * block], ends=[(rank + 1) * block], steps=[1])
            elif have == B and want.partial:
                # partial sums: rank 0 holds the value, the others zeros; partial means: every rank holds it
                out = F.scale(v, scale=1.0 if rank == 0 or want.reduce == "mean" else 0.0)
            else:
                out = None
        if out is None:
            out_name = self._convert(self._convert(name, B), want)
        else:
            out_name = out.name
            self.layouts[out_name] = want
        self._converted[key] = out_name
        return out_name

    def _reduce_together(self, grads, bucket_bytes: int = 1 << 22) -> None:
        """All-reduce the local gradients ``grads`` ((variable, its gradient) pairs) of broadcast parameters a few at
        a time, each group flattened into one buffer (as DistributedDataParallel's buckets): fewer, larger
        collectives. The sums are the same, bit for bit, as one all-reduce per gradient."""
        block = self.program.block
        pending = [(w, g) for w, g in grads
                   if g not in self._final and g not in self._reduced and self.layouts.get(w, B) == B
                   and w not in self.scatter_grads and None not in block.vars[g].spec.shape]
        groups: dict = {}
        for w, g in pending:
            spec = block.vars[g].spec
            bucket = groups.setdefault(spec.dtype, [[]])
            size = sum(math.prod(block.vars[n].spec.shape) for _, n in bucket[-1]) * spec.dtype.itemsize
            if bucket[-1] and size + math.prod(spec.shape) * spec.dtype.itemsize > bucket_bytes:
                bucket.append([])
            bucket[-1].append((w, g))
        op = "mean" if self._loss_counted_by_every_rank() else "sum"
        for bucket in (b for buckets in groups.values() for b in buckets if len(b) > 1):
            specs = [block.vars[g].spec for _, g in bucket]
            with interpreting(Tracer(self.program)):
                flat = F.concat([F.reshape(Variable(self.program, g), shape=[-1]) for _, g in bucket], axis=0)
                reduced = F.all_reduce(flat, op=op, group=self.mesh.group)
                parts = F.split(reduced, sections=[math.prod(s.shape) for s in specs], axis=0)
                for (_, g), part, spec in zip(bucket, parts, specs):
                    out = F.reshape(part, shape=list(spec.shape))
                    self.layouts[out.name] = B
                    self._reduced[g] = out.name
                    self._final.add(out.name)

    def _loss_counted_by_every_rank(self) -> bool:
        """Whether the last loss differentiated was counted by every rank: broadcast, or a mean over ranks."""
        counted = self.layouts.get(self.program.backward_requests[-1][0], B)
        return counted == B or (counted.partial and counted.reduce == "mean")

    def logical_grad(self, wrt: str, local: str) -> str:
        """The gradient of the logical loss w.r.t. variable ``wrt``, from its gradient ``local`` on this rank's
        program (that of the sum of every rank's loss)."""
        if local in self._final:
            return local
        if local in self._reduced:
            return self._reduced[local]
        mean = self._loss_counted_by_every_rank()
        layout = self.layouts.get(wrt, B)
        if layout.partial:
            raise ArgumentError(f"gradient of {wrt!r}: a partial value ({layout}) has no gradient of its own")
        v = Variable(self.program, local)
        with interpreting(Tracer(self.program)):
            if layout == B and wrt in self.scatter_grads:  # ZeRO-2: each rank gets the block it updates
                out, layout = F.reduce_scatter(v, axis=0, op="mean" if mean else "sum", group=self.mesh.group), S(0)
            elif layout == B:  # one value, used by every rank: the ranks' gradients add up
                out = F.all_reduce(v, op="mean" if mean else "sum", group=self.mesh.group)
            elif mean and self.mesh.size > 1:
                out = F.scale(v, scale=1.0 / self.mesh.size)
            else:
                out = v
        self.layouts[out.name] = layout
        self._reduced[local] = out.name
        self._final.add(out.name)
        return out.name


def _keep_dims(given, local):
    """A signature's attr for the blocks, with the run-time sizes (``Dim``s) of the attr as given kept where the
    rule, which saw them as None, left None: a Dim is resolved on each rank from the block it holds."""
    if isinstance(given, (list, tuple)) and isinstance(local, (list, tuple)) and len(given) == len(local):
        return type(local)(g if v is None and isinstance(g, Dim) else v for g, v in zip(given, local))
    return given if local is None and isinstance(given, Dim) else local


# -- of.compile under a mesh -------------------------------------------------------------------------------------

def _traced_under_mesh(fn):
    """What ``of.compile`` traces: ``fn`` itself, or, under ``with mesh:``, ``fn`` run by a ShardingTracer."""
    mesh = current_mesh()
    if mesh is None:
        return fn
    if len(mesh.shape) > 1:
        raise ArgumentError(f"of.compile under an n-D mesh {mesh.shape}: trace the step for one process and "
                            "shard() it with a layout per axis (its program then runs under `with mesh:`)")

    @functools.wraps(fn)
    def sharded(*args, **kwargs):  # called as of.compile binds the call (positionally, by keyword, *args)
        program = tracing_program()
        tracer = ShardingTracer(program, mesh)
        for name in program.feeds:
            tracer.layouts[name] = normalized(mesh.feeds.get(name, _default_feed(program, name)),
                                              len(program.block.vars[name].spec.shape))
        with interpreting(tracer):
            result = fn(*args, **kwargs)
        _same_on_every_rank(program, tracer)

        def whole(path, value):  # a partial result (a loss: each rank's part) is of no use: results come whole
            if type(value) is Variable and tracer.layouts.get(value.name, B).partial:
                return Variable(program, tracer._convert(value.name, B))
            return value  # a split result is this rank's block, as the feeds are

        return _rebuild(result, "out", whole, Variable)

    return sharded


def _same_on_every_rank(program: Program, tracer: ShardingTracer) -> None:
    """Refuse a trace whose parameters differ between ranks. Tensors are given whole, the same on every rank, as one
    process holds them (``Mesh(params=...)`` says which to compute with in blocks): a rank's block given instead, or
    replicas started from other values, would silently train another model. One all-gather of a checksum per
    parameter, when a step is traced."""
    mesh = tracer.mesh
    names = [name for t, name in program._tensor_vars.values() if t.requires_grad or name in tracer._read_as]
    if mesh.size == 1 or not names:
        return
    device = program.device
    mine = np.array([[zlib.crc32(np.ascontiguousarray(device.to_host(program.values[n])).tobytes()) for n in names]],
                    dtype=np.int64)
    everyone = mesh.comm.all_gather(mine, 0)
    differ = [(n, tracer._read_as.get(n)) for k, n in enumerate(names) if (everyone[:, k] != mine[0, k]).any()]
    if differ:
        shown = ", ".join(f"{n!r}" + (f" (read as {layout})" if layout else "") for n, layout in differ[:6])
        raise ArgumentError(
            f"Mesh: parameter(s) {shown} differ between the ranks. A tensor is given whole and the same on every "
            "rank, as one process holds it (Mesh(params=...) says how the program splits it: each rank computes "
            "with its block and the update is of the whole): pass the whole tensor, not a rank's block, and start "
            "every rank from the same values (DistributedDataParallel does; or seed every rank alike)")


def _default_feed(program: Program, name: str) -> Layout:
    return S(0) if program.block.vars[name].spec.shape else B


traced_function_wrappers.append(_traced_under_mesh)
trace_context_keys.append(lambda: None if current_mesh() is None else current_mesh().key())


# -- the pass --------------------------------------------------------------------------------------------------

def shard(program: Program, mesh: Mesh, feeds: dict | None = None, params: dict | None = None,
          zero: int = 0) -> Program:
    """The program this rank of ``mesh`` runs, for a program traced for one process.

    ``feeds`` maps feed names to layouts (``B`` if not given): a split feed's Spec becomes the block a rank is
    fed. ``params`` maps parameters (Tensors or variable names) to layouts (``B`` if not given): a split
    parameter's value becomes this rank's block (a copy: the sharded program updates its own). Forward ops are
    replayed with signatures chosen and collectives inserted; each ``append_backward`` the program had is done
    again on the sharded forward, and what read a gradient reads the logical loss's gradient. The result's
    ``layouts`` maps each variable to its layout.

    ``zero`` shards what data parallelism repeats on every rank (ZeRO's stages), for each trained parameter given no
    layout whose first dim splits evenly: 1, its optimizer state (each rank keeps and updates its block of it, then
    the parameter's new value is all-gathered); 2, its gradient too (reduce-scattered: each rank gets the block it
    updates, instead of all-reducing the whole); 3, the parameter itself (``S(0)``, FSDP: all-gathered where an op
    needs it whole, its gradient reduce-scattered as that all-gather's dual).

    On an n-D mesh (``Mesh(shape=(2, 2))``) each layout is a tuple, one per axis (OneFlow's nd-SBP: ``(S(0), B)``,
    the batch split along the data axis and whole along the tensor axis; ``(B, S(0))``, a weight split along the
    tensor axis). The pass runs once per axis, the last axis first, each on the program the one before made, with
    that axis's layouts and group: the rules of axis k see the blocks the later axes left (hierarchical, as
    OneFlow's), and the collectives a pass inserted are ops of the program with layouts over the axes after it. So
    the data axis's gradient all-reduce is of the tensor axis's blocks (Megatron's order). ``zero`` applies to the
    first axis (data). The result's ``nd_layouts`` gives each value's layout per axis; run it under ``with mesh:``.
    """
    if not isinstance(program, Program):
        raise ArgumentError(f"shard(): expected a Program, got {describe(program)}")
    if not isinstance(mesh, Mesh):
        raise ArgumentError(f"shard(): expected a Mesh, got {describe(mesh)}")
    if zero not in (0, 1, 2, 3):
        raise ArgumentError(f"shard(): zero is a ZeRO stage, 0 to 3, got {describe(zero)}")
    if len(mesh.shape) == 1:
        with using_communicator(mesh.comm):  # the shape rules of collectives ask for the group's size
            return _Replay(program, mesh, feeds or {}, _param_layouts(params, "shard()"), zero).run()
    ndim = len(mesh.shape)
    feeds = {k: _per_axis(v, ndim, f"shard(): feed {k!r}") for k, v in (feeds or {}).items()}
    params = {k: _per_axis(v, ndim, "shard(): parameter layout") for k, v in _param_layouts(params, "shard()",
                                                                                                nd=True).items()}
    nd: dict = {}
    with using_communicator(mesh.comm, mesh.groups):
        for k, axis in reversed(list(enumerate(mesh.axes))):
            replay = _Replay(program, axis, {n: v[k] for n, v in feeds.items()}, {n: v[k] for n, v in params.items()},
                             zero if k == 0 else 0)
            program = replay.run()
            nd = {replay.names.get(n, n): v for n, v in nd.items()}  # what this pass replayed under new names
            for name, layout in program.layouts.items():
                nd.setdefault(name, [B] * ndim)[k] = layout
    program.nd_layouts = {n: tuple(v) for n, v in nd.items() if n in program.block.vars}
    program.mesh_groups = mesh.groups
    return program


def _per_axis(value, ndim: int, who: str) -> tuple:
    """A layout per axis of an n-D mesh."""
    if not isinstance(value, (tuple, list)) or len(value) != ndim:
        raise ArgumentError(f"{who}: on an n-D mesh of {ndim} axes, give a layout per axis, as a tuple "
                            f"((S(0), B): split along the first axis, whole along the second), got {describe(value)}")
    return tuple(as_layout(v, who) for v in value)


class _Replay:
    def __init__(self, old: Program, mesh: Mesh, feeds: dict, params: dict, zero: int = 0):
        self.old, self.mesh = old, mesh
        self.new = Program(old.device, name=old.name)
        by_name = {name: params[id(t)] for t, name in old._tensor_vars.values() if id(t) in params}
        self.params = {k: v for k, v in params.items() if isinstance(k, str)} | by_name
        self.feeds = {k: as_layout(v, f"shard(): feed {k!r}") for k, v in feeds.items()}
        unknown = (set(self.feeds) - set(old.feeds)) | {k for k in self.params if k not in old.block.vars}
        if unknown:
            raise ArgumentError(f"shard(): {sorted(unknown)} are not feeds or variables of the program")
        zeroed = self._zeroed(zero)
        if zero >= 3:  # FSDP: the parameters themselves
            self.params |= {n: S(0) for n in zeroed}
        self._state_follows_its_parameter({n: S(0) for n in zeroed} if zero else {})
        self.tracer = ShardingTracer(self.new, mesh, self.params, frozenset(zeroed) if zero == 2 else frozenset())
        self.names: dict = {}  # old variable -> new variable

    def _zeroed(self, zero: int) -> list:
        """The parameters ZeRO shards: trained (some backward request differentiates them), updated by the
        program, given no layout, and with a first dim that splits evenly among the ranks."""
        if not zero or self.mesh.size == 1:
            return []
        old, n = self.old, self.mesh.size
        trained = {w for request in old.backward_requests for w in request[1]}
        return [w for w in sorted(trained) if w in old.updates and w in old.values and w not in self.params
                and old.block.vars[w].spec.shape and (old.block.vars[w].spec.shape[0] or 1) % n == 0]

    def _state_follows_its_parameter(self, updated_in: dict) -> None:
        """Optimizer state (a momentum buffer, Adam's moments) takes its parameter's layout, unless given one: a
        persistable value of the parameter's shape that the program updates with an op reading the parameter. So
        each rank keeps and updates its block of it (the update ops run on blocks), as of its parameter.
        ``updated_in``: parameters kept whole whose update runs on blocks all the same (ZeRO): their state takes
        that layout."""
        block, old = self.old.block, self.old
        for op in block.ops:
            names = op.input_names()
            split = [(n, self.params[n]) for n in names if n in self.params and self.params[n].split]
            split += [(n, updated_in[n]) for n in names if n in updated_in]
            if not split:
                continue
            shape = block.vars[split[0][0]].spec.shape
            for n in names:
                if n not in self.params and n not in updated_in and n in old.updates and n in old.values \
                        and block.vars[n].spec.shape == shape:
                    self.params[n] = split[0][1]

    def run(self) -> Program:
        old, new = self.old, self.new
        for name in old.feeds:
            self._declare(name, self.feeds.get(name, B), value=None)
            new.feeds.append(name)
        for name, value in old.values.items():
            self._declare(name, self.params.get(name, B), value)
        new._tensor_vars = dict(old._tensor_vars)
        new._counter = old._counter
        requests = iter(old.backward_requests)
        ops, i = old.block.ops, 0
        with interpreting(self.tracer):
            while i < len(ops):
                if ops[i].role == "backward":
                    self._backward(next(requests, None))
                    while i < len(ops) and ops[i].role == "backward":
                        i += 1
                    continue
                self._replay(ops[i])
                i += 1
            for target, value in old.updates.items():
                v = self._convert(self._new(value), self.tracer.layouts[target])
                new.updates[target] = v
            # a partial value is of no use to whoever fetches it: outputs are reduced (split ones stay split)
            new.outputs = {k: self._whole(self._new(n)) for k, n in old.outputs.items()}
        new.grad_names = {w: self.names[g] for w, g in old.grad_names.items() if g in self.names}
        return new

    def _whole(self, name: str) -> str:
        return self._convert(name, B) if self.tracer.layouts[name].partial else name

    def _convert(self, name: str, layout: Layout) -> str:
        return self.tracer._convert(name, layout)

    def _declare(self, name: str, layout: Layout, value) -> None:
        vd = self.old.block.vars[name]
        layout = normalized(layout, len(vd.spec.shape))
        n, rank = self.mesh.size, self.mesh.rank
        shape = list(vd.spec.shape)
        if layout.split:
            d = shape[layout.axis]
            if d is not None and d % n:
                raise ShapeError(f"shard(): {name!r} {vd.spec} does not split into {n} equal blocks along axis "
                                 f"{layout.axis}")
            shape[layout.axis] = None if d is None else d // n
            if value is not None:
                block = d // n
                index = [slice(None)] * len(shape)
                index[layout.axis] = slice(rank * block, (rank + 1) * block)
                value = np.array(value[tuple(index)], copy=True)  # the sharded program's own block
        elif layout.partial:
            raise ArgumentError(f"shard(): {name!r} cannot start as a partial value ({layout})")
        self.new.add_var(name, Spec(tuple(shape), vd.spec.dtype), persistable=vd.persistable,
                         stop_gradient=vd.stop_gradient)
        if value is not None:
            self.new.values[name] = value
        self.names[name] = name
        self.tracer.layouts[name] = layout

    def _new(self, name: str) -> str:
        try:
            return self.names[name]
        except KeyError:
            raise ArgumentError(f"shard(): variable {name!r} is read after the backward pass but is none of the "
                                "gradients it made (the pass redoes the backward pass on the sharded forward)") \
                from None

    def _attr(self, value):
        if isinstance(value, Elem):  # (each rank would compute it from the shapes of its blocks)
            raise ArgumentError(f"shard(): an attr holds a size computed from the values of {value.var!r} (a shape "
                                "computed at run time); sharded programs take sizes from shapes only")
        if isinstance(value, Dim):
            return Dim(self._new(value.var), value.axis)
        if isinstance(value, tuple):
            return tuple(self._attr(v) for v in value)
        return value

    def _replay(self, op) -> None:
        opdef = registry.get(op.type)
        inputs = []
        for p in opdef.inputs:
            names = [Variable(self.new, self._new(n)) for n in op.inputs[p.name]]
            inputs.append(names if p.is_list else (names[0] if names else None))
        attrs = {k: self._attr(v) for k, v in op.attrs.items()}
        result = self.tracer.apply(opdef, tuple(inputs), attrs)
        outs = list(result) if len(opdef.outputs) > 1 else [result]
        flat = [v for o, value in zip(opdef.outputs, outs) for v in (value if o.is_list else [value])]
        for old_name, v in zip(op.output_names(), flat):
            self.names[old_name] = v.name
            self.new.block.vars[v.name].stop_gradient = self.old.block.vars[old_name].stop_gradient

    def _backward(self, request) -> None:
        if request is None:
            raise ArgumentError("shard(): the program holds backward ops that no append_backward request made")
        loss, wrt, blocked, made = request
        wanted = [self._new(n) for n in wrt]
        grads = append_backward(self.new, self._new(loss), wrt=wanted, no_grad=[self._new(n) for n in blocked])
        by_wrt = {w: g for w, g in self.old.grad_names.items()} | made  # (what an optimizer read may be forgotten)
        self.tracer._reduce_together([(w, g.name) for w in wanted if (g := grads.get(f"{w}@GRAD")) is not None])
        for w_old, w in zip(wrt, wanted):
            g = grads.get(f"{w}@GRAD")  # append_backward names gradients as Executor.run returns them
            if g is None:
                continue
            logical = self.tracer.logical_grad(w, g.name)
            old_grad = by_wrt.get(w_old)
            if old_grad is not None:
                self.names[old_grad] = logical


def whole_values(program: Program, comm: Communicator | None = None) -> dict:
    """{variable: its whole value} for every persistable value of ``program`` — a program ``shard()`` made, whose
    split values (parameters, their optimizer state) are this rank's blocks: those are all-gathered (every rank of
    ``comm``, the current communicator by default, must call it). What to checkpoint after training a sharded
    program: ``of.distributed.save(of.distributed.whole_values(sharded), path)``."""
    if not isinstance(program, Program):
        raise ArgumentError(f"whole_values(): expected a Program, got {describe(program)}")
    comm = current_communicator() if comm is None else comm
    groups = getattr(program, "mesh_groups", None)  # an n-D mesh's: gathered axis by axis, the last first
    layouts = getattr(program, "nd_layouts", None) if groups else None
    if layouts is None:
        groups, layouts = [comm], {k: (v,) for k, v in getattr(program, "layouts", {}).items()}
    device, out = program.device, {}
    for name, value in program.values.items():
        vd = program.block.vars[name]
        if not vd.persistable:
            continue
        value = np.array(device.to_host(value), copy=True)
        for group, layout in zip(groups, layouts.get(name, (B,) * len(groups))):  # (the passes ran last axis first)
            if layout.split:
                value = group.all_gather(value, layout.axis)
        out[name] = value
    return out


__all__ = ["Mesh", "ShardingTracer", "current_mesh", "shard", "whole_values"]
