"""``Executor``: prepare a program once per feed shape, then run it many times with little Python in between.

Preparing (once per distinct set of feed shapes) does the work eager mode repeats on every call:
  1. shape/dtype inference over the whole program with the feed's concrete shapes; attrs that hold run-time
     dims (``Dim``) get their sizes; a mismatch names the op and the variables;
  2. dead-code elimination (only what the fetched values need) and merging of identical pure ops (CSE; ops
     with the ``random`` trait are never merged);
  3. elementwise fusion: chains of pointwise ops (the trait ``pointwise``) become one step that makes one pass over
     memory, block by block (``opforge.program.fusion``), or one generated C loop where every member declares its
     scalar expression and a C compiler is there (``opforge.program.native``); on a device that makes generated
     kernels (CUDA), one kernel launch per group (``opforge.program.device_kernels``); with native code on, an update
     ``p − s·(a @ b)`` whose product nothing else reads is one GEMM adding into p, and a sum with such products
     among its terms adds each by a GEMM into its one buffer (``opforge.program.gemm``); softmax, log_softmax, their
     gradients, cross_entropy and cross_entropy_grad over rows are one C loop per row each. With native code on,
     results are eager's within float rounding, not its bits: libm's exp/log/tanh (a few ulp), the rows' sums in
     pairwise order rather than a BLAS dot, the GEMM steps' unrounded products and MKL's summation order where it
     is chosen (each module's docstring says what);
     ``OPFORGE_NATIVE=0`` (or ``Executor(native=False)``) keeps one kernel call per op or block: eager's bits;
  4. liveness: each intermediate is dropped right after its last reader; a kernel that takes ``out=`` writes
     into its declared ``inplace`` input when that input dies at this op (or the other input of a commutative
     op), and otherwise into a buffer of the plan's workspace;
  5. code generation: the plan becomes one straight-line Python function calling the kernels.

The workspace: a buffer a kernel wrote with ``out=`` is not freed when its variable dies but kept, by Spec, for the
next op (or run) that needs one like it. glibc returns large freed blocks to the OS and every run would fault them
in again, page by page (issue 6: ``MALLOC_TOP_PAD_`` alone halved the char-transformer's step); the workspace keeps
what the plan needs at most at once, no more. A buffer still referenced elsewhere when its variable dies (a view of
it lives on, or it was handed out) is left alone. Each run takes a workspace of its own (threads never share one),
and only the executor's last-used plan keeps its workspace between runs.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from ..core import codegen, floating_point
from ..core.errors import ArgumentError, OpforgeError, OutOfMemoryError, ShapeError, out_of_memory
from ..core.keys import exact
from ..core.opdef import registry
from ..core.spec import Dim, Elem, Spec
from ..tensor import Tensor
from . import device_kernels, gemm, native
from .desc import OpDesc, Program
from .fusion import FusedOp, broadcast_summands, escapes, fuse, in_place_inputs, overlap
from .trace import Variable

# Outputs smaller than this are not kept in the workspace: the allocator serves them from its free lists at no
# cost, and keeping them would only add a few bytecodes per op.
WORKSPACE_MIN_BYTES = 16384


class Plan:
    """One compiled specialisation of a program: its generated function and what it needs."""

    def __init__(self, fn, source: str, specs: dict, steps: int, peak_live_bytes: int, removed: dict,
                 line_ops: dict | None = None, workspace_bytes: int = 0, workspaces: list | None = None,
                 line_calls: dict | None = None):
        self.fn = fn
        self.source = source
        self.specs = specs  # variable name -> concrete Spec
        self.steps = steps
        self.peak_live_bytes = peak_live_bytes
        self.removed = removed  # ops each pass took out: {"dead", "merged", "identity", "folded", "fused": n}
        self.line_ops = line_ops or {}  # line of the generated source -> "op #i <type> -> <outputs>"
        self.line_calls = line_calls or {}  # line of the generated source -> (OpDesc, attrs) of an op's call
        self.workspace_bytes = workspace_bytes  # the most the workspace holds: its buffers at most at once
        self.workspaces = [] if workspaces is None else workspaces  # idle workspaces (runs take and give back)


def _resolve(value, specs: dict, value_of):
    """Replace each Dim (a run-time size) in an attr value by its size under the concrete ``specs``, and each Elem
    (a size computed from shapes) by its element of the value ``value_of`` computes."""
    if isinstance(value, Elem):
        return value.sign * int(np.asarray(value_of(value.var)).reshape(-1)[value.axis])
    if isinstance(value, Dim):
        return specs[value.var].shape[value.axis]
    if isinstance(value, tuple) and any(isinstance(v, Dim) for v in value):
        return tuple(_resolve(v, specs, value_of) for v in value)
    return value


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.dtype):
        return str(value)
    return exact(value)  # attrs alpha=-0.0 and alpha=0.0 are two ops, not one


class Executor:
    """Runs a program: ``exe = of.Executor(prog)``; ``exe.run(x=batch)`` -> {fetch name: array}.

    ``fetch`` names what ``run`` returns (Variables, variable names, or a dict name -> either); by default the
    program's outputs and the gradients ``append_backward`` made (as ``"<var>@GRAD"``). Persistable variables
    (parameters) live in ``exe.scope``, initialised with the arrays the program was traced with (no copy).
    """

    def __init__(self, program: Program, fetch=None, optimize: bool = True, native: bool | None = None):
        if not isinstance(program, Program):
            raise ArgumentError(f"Executor(): expected a Program, got {type(program).__name__}")
        self.program = program
        self.optimize = optimize
        self.native = native  # fused groups as native code: None follows OPFORGE_NATIVE (opforge.program.native)
        self.fetch = self._fetch_names(fetch)
        block = program.block
        self.scope = {n: program.values[n] for n, v in block.vars.items() if v.persistable}
        self.constants = {n: a for n, a in program.values.items() if not block.vars[n].persistable}
        self._plans: dict = {}
        self._warm = None  # the plan run last: the only one that keeps its workspace between runs

    def _fetch_names(self, fetch) -> dict:
        program = self.program
        if fetch is None:
            names = dict(program.outputs)
            names.update({f"{v}@GRAD": g for v, g in program.grad_names.items()})
            return names
        items = fetch.items() if isinstance(fetch, dict) else [(None, f) for f in fetch]
        names = {}
        for key, f in items:
            name = f.name if isinstance(f, Variable) else f
            if name not in program.block.vars:
                raise ArgumentError(f"Executor(): fetch {name!r} is not a variable of the program")
            names[key or name] = name
        return names

    # -- running ----------------------------------------------------------------------------------------------

    def run(self, feed: dict | None = None, **feeds) -> dict:
        feed = {**(feed or {}), **feeds}
        arrays = {}
        block = self.program.block
        for name in self.program.feeds:
            if name not in feed:
                raise ArgumentError(f"Executor.run(): missing feed {name!r} ({block.vars[name]})")
            arrays[name] = self._device_array(name, feed[name])
            if name in self.program.feed_dtypes:
                arrays[name] = self._declared(name, arrays[name])
        unknown = set(feed) - set(self.program.feeds)
        if unknown:
            raise ArgumentError(f"Executor.run(): {sorted(unknown)} are not feeds of the program "
                                f"(feeds: {self.program.feeds})")
        return self.run_arrays(arrays)

    def _declared(self, name: str, array):
        """A feed declared in a dtype narrower than its variable's (``Program.feed_dtypes``): taken in that dtype,
        or in the variable's own if every value is one of the declared dtype's (checked on the host)."""
        declared, held = self.program.feed_dtypes[name], self.program.block.vars[name].spec.dtype
        if array.dtype == declared:
            return array.astype(held)
        if array.dtype != held:
            return array  # (prepare names the mismatch)
        device = self.program.device
        host = device.to_host(array)
        fits = host.astype(declared).astype(held)
        same = (fits == host) | (np.isnan(fits) & np.isnan(host)) if held.kind == "f" else fits == host
        if not same.all():
            bad = host.reshape(-1)[np.flatnonzero(~same.reshape(-1))[0]].item()
            raise ArgumentError(f"Executor.run(): feed {name!r} is declared {declared} (held as {held}), and holds "
                                f"{bad!r}, which is not a value of {declared}; convert the data to {declared} first "
                                "(ONNX Runtime refuses a feed of another type)")
        return array

    def _device_array(self, name: str, value):
        """A feed as an array of the program's device: a Tensor's own array there, else copied from the host."""
        device = self.program.device
        if isinstance(value, Tensor):
            if value.device is not device:
                raise ArgumentError(f"Executor.run(): feed {name!r} is on device '{value.device}', the program runs "
                                    f"on '{device}'")
            return value._data
        return device.from_host(np.asarray(value))

    def run_arrays(self, arrays: dict) -> dict:
        """``run`` for callers that already hold exactly the feeds, as NumPy arrays (``of.compile``)."""
        key = tuple([(a.shape, a.dtype) for a in arrays.values()])
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self.prepare(arrays)
        if plan is not self._warm:  # feeds of another shape: the plan run before lets its workspace go
            if self._warm is not None:
                self._warm.workspaces.clear()
            self._warm = plan
        quiet = floating_point.enter()  # no NumPy floating-point warnings, as eager: one switch for the whole run
        try:
            return plan.fn(arrays, self.scope, self.constants)
        except Exception as e:
            if isinstance(e, OpforgeError):
                raise
            raise _name_failed_op(plan, e) from e
        finally:
            floating_point.leave(quiet)

    def prepare(self, feed_arrays: dict) -> Plan:
        """Build (and cache nothing: ``run`` caches) the plan for feeds of these shapes and dtypes."""
        program, block = self.program, self.program.block
        specs = {}
        for name in program.feeds:
            a, declared = feed_arrays[name], block.vars[name].spec
            given = Spec(a.shape, a.dtype)
            if not declared.matches(given):
                raise ShapeError(f"Executor.run(): feed {name!r} has {given}, the program declares {declared}")
            specs[name] = given
        for name, a in program.values.items():
            specs[name] = Spec(a.shape, a.dtype)
        ops = []
        value_of = self._shape_values(ops, specs)
        # 1. inference with concrete shapes (also over ops DCE will drop: a program must be consistent)
        for i, op in enumerate(block.ops):
            try:  # its Dims and Elems refer to earlier variables
                attrs = {k: _resolve(v, specs, value_of) for k, v in op.attrs.items()}
            except OpforgeError as e:
                raise ShapeError(f"op #{i} {op.type} -> {', '.join(op.output_names())}: {e}") from None
            ops.append((op, attrs))
            opdef = registry.get(op.type)
            if opdef.validate is not None and attrs != op.attrs:
                opdef.validate(attrs)  # the attr check skipped at trace time, now with the real sizes
            ins = [[specs[n] for n in op.inputs[p.name]] if p.is_list else
                   (specs[op.inputs[p.name][0]] if op.inputs[p.name] else None) for p in opdef.inputs]
            try:
                outs = opdef.infer_specs(ins, attrs)
            except OpforgeError as e:
                where = ", ".join(f"{n}: {specs[n]}" for n in op.input_names())
                raise ShapeError(f"op #{i} {op.type} -> {', '.join(op.output_names())} with inputs ({where}): {e}") \
                    from None
            flat = [s for o, s in zip(opdef.outputs, outs) for s in (s if o.is_list else [s])]
            for n, s in zip(op.output_names(), flat):
                specs[n] = s
        # 2. dead code and duplicates
        fetched = set(self.fetch.values()) | set(program.updates.values())  # updates are roots too
        removed = {"dead": 0, "merged": 0, "identity": 0}
        folded = {}
        if self.optimize:
            ops, removed["merged"], removed["identity"], alias = self._merge(ops, specs)
            fetched = {alias.get(n, n) for n in fetched}
            ops, removed["dead"] = self._prune(ops, fetched)
            ops, folded = self._fold(ops, specs)
            removed["folded"] = len(folded)
            ops, ones = self._times_one(ops, specs, {**self.constants, **folded}, fetched)
            alias = {k: ones.get(v, v) for k, v in alias.items()} | ones
            removed["identity"] += len(ones)
            # A folded op that read only its inputs' shapes (the seed ones_like(loss) of a backward pass) no longer
            # reads them: what computed them may be dead now (the first-order gradients under a Hessian-vector
            # product's second pass, which only their shapes seeded)
            ops, dead = self._prune(ops, fetched)
            removed["dead"] += dead
        else:
            alias = {}
        return self._generate(ops, specs, alias, removed, folded)

    def _shape_values(self, ops: list, specs: dict):
        """``value_of(name)``: the value of a variable that an attr reads as sizes (an Elem), computed as the plan is
        made from the ops in ``ops`` (those inferred so far) that lead to it. Such a value must depend on the feeds'
        shapes alone (Shape → Gather → Concat …), which a plan fixes: ops whose result depends on shapes only
        (``shape_only``) and pure ops over constants or such results are run now, once per plan."""
        values = dict(self.constants)
        device = self.program.device

        def value_of(name: str):
            if name in values:
                return values[name]
            at = next((k for k, (op, _) in enumerate(ops) if name in op.output_names()), None)
            if at is None:
                kind = "a feed" if name in self.program.feeds else "state (a parameter, a buffer)"
                raise ShapeError(f"a size is read from the values of {name!r}, which depend on the values of {kind} "
                                 f"({name!r}), not on shapes alone; a program computes the sizes it needs from "
                                 "shapes and constants only")
            op, attrs = ops[at]
            opdef = registry.get(op.type)
            if "random" in opdef.traits:
                raise ShapeError(f"a size is read from {name!r}, which op {op.type} draws at random")
            try:
                known = {n: device.xp.empty(specs[n].shape, specs[n].dtype) if "shape_only" in opdef.traits
                         else value_of(n) for n in op.input_names()}
            except ShapeError as e:
                raise ShapeError(f"{e} (through op {op.type} -> {', '.join(op.output_names())})") from None
            args = [[known[n] for n in op.inputs[p.name]] if p.is_list else
                    (known[op.inputs[p.name][0]] if op.inputs[p.name] else None) for p in opdef.inputs]
            first = next((specs[n].dtype for n in op.input_names()), None)
            kernel = opdef.kernel_for(device, () if first is None else (first,), attrs).bind(device)
            try:
                result = kernel(*args, **attrs)
            except Exception as e:  # (an integer division by zero in the sizes, say)
                if isinstance(e, OpforgeError):
                    raise
                raise ShapeError(f"computing sizes, op {op.type} -> {', '.join(op.output_names())} failed: "
                                 f"{type(e).__name__}: {e}") from None
            for n, v in zip(op.output_names(), _flattener(opdef, device)(result)):
                values[n] = v
            return values[name]

        return lambda name: device.to_host(value_of(name))

    def _fold(self, ops: list, specs: dict):
        """Constant folding: run now, once, every pure op whose inputs are all constants (not parameters,
        which change between runs), and every op whose result depends on its inputs' specs alone (``shape_only``:
        the loss's seed gradient, ones_like), given arrays of those specs."""
        values = dict(self.constants)
        device = self.program.device
        kept = []
        try:
            for op, attrs in ops:
                opdef = registry.get(op.type)
                if "shape_only" in opdef.traits and op.input_names() and all(
                        n in values or None not in specs[n].shape for n in op.input_names()):
                    # (a size the plan does not fix, such as unique's count of values, is known only when it runs)
                    known = {n: values[n] if n in values else device.xp.empty(specs[n].shape, specs[n].dtype)
                             for n in op.input_names()}
                elif "random" not in opdef.traits and op.input_names() and all(n in values for n in op.input_names()):
                    known = values
                else:
                    known = None
                if known is not None:
                    args = [[known[n] for n in op.inputs[p.name]] if p.is_list else
                            (known[op.inputs[p.name][0]] if op.inputs[p.name] else None) for p in opdef.inputs]
                    first = next(known[n] for n in op.input_names())
                    result = opdef.kernel_for(device, (first.dtype,), attrs).bind(device)(*args, **attrs)
                    for n, v in zip(op.output_names(), _flattener(opdef, device)(result)):
                        values[n] = v
                    continue
                kept.append((op, attrs))
        except MemoryError as e:  # the kernel's, or the stand-in input of a shape_only op: too large
            raise _out_of_memory(op, attrs, specs, e, "Executor (folding constants): ") from None
        except Exception as e:  # (NumPy's "array is too big" for a size past 2**63 bytes is a ValueError)
            if isinstance(e, OpforgeError):
                raise
            raise OpforgeError(f"Executor (folding constants): op {op.type} -> {', '.join(op.output_names())} "
                               f"failed: {type(e).__name__}: {e}") from None
        return kept, {n: v for n, v in values.items() if n not in self.constants}

    @staticmethod
    def _times_one(ops: list, specs: dict, constants: dict, fetched: set):
        """A product with a constant of ones that broadcasts to nothing larger is its other input (x · 1 is x, bit
        for bit, NaN and −0 included): a second backward pass seeds its gradients so, ones broadcast to each
        parameter's shape times the direction (a Hessian-vector product: six passes over the parameters' size).
        A fetched product is kept (the run would return the other input's own buffer). Returns (ops, alias)."""
        alias, kept = {}, []
        for op, attrs in ops:
            if alias:
                op = OpDesc(op.type, {k: [alias.get(n, n) for n in names] for k, names in op.inputs.items()},
                            op.outputs, op.attrs, op.role)
            if op.type == "mul" and op.output_names()[0] not in fetched:
                (x,), (y,), (out,) = op.inputs["x"], op.inputs["y"], op.output_names()
                for one, other in ((x, y), (y, x)):
                    value = constants.get(one)
                    if (value is not None and specs[other] == specs[out] and value.dtype.kind == "f"
                            and np.all(value == 1)):
                        alias[out] = other
                        break
                if out in alias:
                    continue
            kept.append((op, attrs))
        return kept, alias

    @staticmethod
    def _merge(ops: list, specs: dict):
        """Common-subexpression elimination: an op identical to an earlier pure one reuses its outputs. And a reshape
        to the shape its input has already (gradient rules flatten batch dims that a 2-D input does not have) is
        its input: it goes, and its readers read the input."""
        seen, alias, kept, merged, identities = {}, {}, [], 0, 0
        for op, attrs in ops:
            inputs = {k: [alias.get(n, n) for n in names] for k, names in op.inputs.items()}
            op = OpDesc(op.type, inputs, op.outputs, op.attrs, op.role)
            if op.type == "reshape":
                (source,), (result,) = op.input_names(), op.output_names()
                if specs[source] == specs[result]:
                    alias[result] = source
                    identities += 1
                    continue
            if "random" in registry.get(op.type).traits:
                kept.append((op, attrs))
                continue
            key = (op.type, _freeze(inputs), _freeze(attrs))
            if key in seen:
                for a, b in zip(op.output_names(), seen[key].output_names()):
                    alias[a] = b
                merged += 1
                continue
            seen[key] = op
            kept.append((op, attrs))
        return kept, merged, identities, alias

    @staticmethod
    def _prune(ops: list, needed: set):
        needed = set(needed)
        kept = []
        for op, attrs in reversed(ops):
            if any(n in needed for n in op.output_names()):
                kept.append((op, attrs))
                needed.update(op.input_names())
        kept.reverse()
        return kept, len(ops) - len(kept)

    def _generate(self, ops: list, specs: dict, alias: dict, removed: dict, folded: dict) -> Plan:
        program = self.program
        owned = set(program.feeds) | set(program.values) | set(folded)  # buffers never freed nor overwritten
        fetched = {key: alias.get(n, n) for key, n in self.fetch.items()}
        updates = {target: alias.get(n, n) for target, n in program.updates.items()}
        roots = {*fetched.values(), *updates.values()}
        kernels = [self._kernel(op, attrs, specs) for op, attrs in ops]
        host = program.device.host  # fusion and the workspace work on host (NumPy) arrays
        if self.optimize and host:
            ops, kernels = broadcast_summands(ops, kernels, specs, roots)  # add_n broadcasts: no broadcast_to step
            use_native = native.enabled() if self.native is None else self.native
            if use_native:  # a bias after a GEMM joins the native loop of the activation reading it
                ops, kernels = gemm.bias_epilogues(ops, kernels, specs, roots, program.device)
            before = len(ops)
            if use_native:  # each parameter's Adam step: one loop writing its three variables in place;
                ops, kernels = native.adam_steps(ops, kernels, specs, updates)
                ops, kernels = native.layer_norms(ops, kernels, specs)  # each a row loop
                ops, kernels = native.softmax_rows(ops, kernels, specs)  # softmax's family, cross_entropy (+ grad)
                # regions whose results are read outside them too: one loop each
                ops, kernels = native.several_results(ops, kernels, specs, roots, set(updates.values()))
            ops, kernels = fuse(ops, kernels, specs, roots)
            if use_native:  # p − s·(a @ b) as one GEMM adding into p
                ops, kernels = gemm.gemm_updates(ops, kernels, specs, roots)
                ops, kernels = gemm.gemm_sums(ops, kernels, specs, roots)  # sums of products: GEMMs with beta = 1
                ops, kernels = gemm.gemm_products(ops, kernels, specs)  # the other products, in MKL if chosen
            if use_native:  # a lone pointwise op of several passes: a loop of its own
                ops, kernels = native.single_loops(ops, kernels, specs)
                native.compile_groups([op for op, _ in ops if isinstance(op, FusedOp)])
                ops, kernels = native.unwrap_singles(ops, kernels)
            removed["fused"] = before - len(ops)
        elif self.optimize and program.device.makes_elementwise_kernels and (
                native.switched_on() if self.native is None else self.native):
            # each fused group one generated kernel of the device; the GEMM epilogues and the Adam and layer_norm
            # loops above are host code (ctypes on host memory), not run here
            before = len(ops)
            ops, kernels = device_kernels.fuse_groups(ops, kernels, specs, roots, set(updates.values()),
                                                      program.device)
            removed["fused"] = before - len(ops)
        last_use = _last_use(ops, list(roots))
        reuse = {}  # op index -> the variable whose buffer it writes its output into
        in_place = _in_place_updates(ops, kernels, specs, updates, last_use, reuse)  # first: each saves a copy
        self._plan_buffers(ops, kernels, specs, last_use, owned, reuse)
        # A dying input may still be shared by a result that lives on (a view of it, or itself: identity): then the
        # write into it waits for a look, at run time, that nothing but its variable holds its array.
        held = _held_until(ops, kernels, last_use)
        shared = {i for i, n in reuse.items() if n not in in_place and held.get(n, -1) > i}
        drops = _drops(ops, last_use, owned)
        for i, (op, _) in enumerate(ops):
            if isinstance(op, FusedOp):  # where its members write, now that its output's buffer is known
                op.prepare(reuse.get(i))
        workspace = _Workspace(ops, kernels, specs, roots, reuse, drops, enabled=host)
        source, env, line_ops, line_calls = self._emit(ops, kernels, specs, fetched, updates, in_place, reuse, drops,
                                                       folded, workspace, shared)
        fn = _compile_plan(source, env, program.name)
        peak = _peak_bytes(ops, specs, reuse, drops)
        return Plan(fn, source, specs, len(ops), peak, removed, line_ops, workspace.bytes, env["_wss"], line_calls)

    def _kernel(self, op: OpDesc, attrs: dict, specs: dict):
        """The kernel for an op of the plan: the one an eager call on the program's device would run."""
        first = next((specs[n] for n in op.input_names()), None)
        return registry.get(op.type).kernel_for(self.program.device, () if first is None else (first.dtype,), attrs)

    def _emit(self, ops, kernels, specs: dict, fetched: dict, updates: dict, in_place: dict, reuse: dict,
              drops: list, folded: dict, workspace: _Workspace, shared: set) -> tuple[str, dict, dict, dict]:
        """The plan as the source of one straight-line function ``run(feed, scope, consts)`` (after the functions
        of its fused groups) and its globals."""
        program, block, device = self.program, self.program.block, self.program.device
        slot = {}

        def var(name: str) -> str:
            if name not in slot:
                slot[name] = f"v{len(slot)}"
            return slot[name]

        env = {"_array": device.array, "_rng": device.generator, "_folded": folded, "_copy_into": device.copy_into,
               "_rc": sys.getrefcount, "_empty": device.xp.empty, "_copyto": device.xp.copyto, "_device": device,
               "_overlap": overlap, "_escapes": escapes, "_wss": []}
        pools = [f"p{k}" for k in range(len(workspace.specs))]
        for k, spec in enumerate(workspace.specs):
            env[f"_e{k}"] = _allocator(device.xp.empty, spec)
        env["_new_ws"] = lambda: [[] for _ in pools]
        line_ops = {}  # line of the source -> "op #i <type> -> <outputs>", to name a failing op
        line_calls = {}  # line of the source -> (op, attrs) of a registered op's call: its shapes, if it fails
        lines = []
        for i, (op, _) in enumerate(ops):  # the fused groups' functions come first
            if isinstance(op, FusedOp):
                fused, labels = op.source(f"k{i}", workspace.scratch.get(i, []), env)
                group = f"op #{i} {op!r}"  # (once: its text grows with the group)
                line_ops.update({len(lines) + j + 1: f"{group}: {label}" for j, label in labels.items()})
                lines += fused
        lines.append("def run(feed, scope, consts):")
        lines += [f"    {var(n)} = feed[{n!r}]" for n in program.feeds]
        used = {n for op, _ in ops for n in op.input_names()} | set(fetched.values())
        for n in program.values:
            if n in used:
                lines.append(f"    {var(n)} = {'scope' if block.vars[n].persistable else 'consts'}[{n!r}]")
        lines += [f"    {var(n)} = _folded[{n!r}]" for n in folded if n in used]
        if pools:  # this run's workspace: one list of spare buffers per Spec
            lines.append("    W = _wss.pop() if _wss else _new_ws()")
            lines.append(f"    {', '.join(pools)}, = W")
        fused_any = any(isinstance(op, FusedOp) for op, _ in ops)
        if fused_any and not pools:
            lines.append("    W = None")
        taken = {}  # variable -> the condition under which its buffer came from the workspace (when it may not)
        for i, ((op, attrs), kernel) in enumerate(zip(ops, kernels)):
            outs = op.output_names()
            opdef = None if isinstance(op, FusedOp) else registry.get(op.type)
            out = None
            if i in shared:  # (its variable, and the argument of _rc: two references when no other)
                lines.append(f"    c{i} = _rc({var(reuse[i])}) == 2 and {var(reuse[i])}.base is None")
                out = f"({var(reuse[i])} if c{i} else None)"
            elif i in reuse:
                out = var(reuse[i])
            elif i in workspace.take:
                k = workspace.take[i]
                out = f"(p{k}.pop() if p{k} else _e{k}())"
                ordered = _inputs_c_ordered(op, opdef, var)
                if ordered:  # the buffer only for C-ordered inputs; only a buffer taken goes back
                    lines.append(f"    c{i} = {ordered}")
                    out = f"({out} if c{i} else None)"
                    taken.update((n, f"c{i} and ") for n in outs)
            if opdef is None:
                env[f"k{i}"] = None  # defined by its source above
                args = [var(n) for n in op.inputs] + ["W"] + ([f"out={out}"] if out else [])
                call = f"k{i}({', '.join(args)})"
            else:
                env[f"k{i}"] = kernel.bind(device)
                args = [("[" + ", ".join(var(n) for n in op.inputs[p.name]) + "]") if p.is_list else
                        (var(op.inputs[p.name][0]) if op.inputs[p.name] else "None") for p in opdef.inputs]
                if attrs:
                    env[f"a{i}"] = attrs
                    args.append(f"**a{i}")
                if kernel.takes_rng:
                    args.append("rng=_rng()")
                if out:
                    args.append(f"out={out}")
                call = f"k{i}({', '.join(args)})"
            line_ops[len(lines) + 1] = f"op #{i} {op.type if opdef else repr(op)} -> {', '.join(outs)}"
            if opdef is not None:
                line_calls[len(lines) + 1] = (op, attrs)
            if opdef is None and len(outs) > 1:  # a native region's results
                lines.append(f"    {', '.join(var(n) for n in outs)}, = {call}")
            elif opdef is None or (len(outs) == 1 and not opdef.outputs[0].is_list):
                # a 0-d result may come back as a NumPy scalar: the device makes it an array
                lines.append(f"    {var(outs[0])} = {'_array(' + call + ')' if specs[outs[0]].shape == () else call}")
            else:
                env[f"_flatten{i}"] = _flattener(opdef, device)
                lines.append(f"    {', '.join(var(n) for n in outs)}, = _flatten{i}({call})")
            for n in drops[i]:  # their last reader ran: drop them now, keeping workspace buffers for later
                k = workspace.give.get((i, n))
                if k is not None:  # nothing else holds it (no view of it lives on): a spare buffer again
                    v = var(n)
                    lines.append(f"    if {taken.get(n, '')}_rc({v}) == 2 and {v}.base is None: p{k}.append({v})")
                lines.append(f"    del {var(n)}")
        for target, n in updates.items():
            if target not in in_place:
                lines.append(f"    _copy_into({var(target)}, {var(n)})  # the new value of a persistable variable")
        if pools:
            lines.append("    _wss.append(W)")
        result = ", ".join(f"{key!r}: {var(n)}" for key, n in fetched.items())
        lines.append(f"    return {{{result}}}")
        return "\n".join(lines) + "\n", env, line_ops, line_calls

    @staticmethod
    def _plan_buffers(ops, kernels, specs, last_use, owned, reuse: dict) -> None:
        """Adds to ``reuse`` (op index -> variable): the dying input whose buffer an op writes its output into.

        An op whose kernel takes ``out=`` writes into its declared ``inplace`` input when that input dies at
        this op (MXNet's kWriteInplace; for ``add_n`` it is the add-to request: the sum accumulates into one
        summand). Only buffers dying at the op itself are reused, so no dead buffer is ever held back and the
        peak stays what liveness alone gives.
        """
        fresh = set()  # variables written by out= kernels: their own writable memory, never a view of another
        for i, ((op, _), kernel) in enumerate(zip(ops, kernels)):
            outs = op.output_names()
            if kernel.takes_out and len(outs) == 1 and i not in reuse:
                want = specs[outs[0]]
                reads = op.input_names()
                dying = [n for n in _writable_inputs(op)  # read once here: writing it cannot clobber a read
                         if last_use.get(n) == i and n not in owned and n in fresh and specs[n] == want
                         and reads.count(n) == 1]
                if dying:
                    reuse[i] = dying[0]
            if kernel.takes_out and len(outs) == 1:
                fresh.update(outs)

    # -- introspection ------------------------------------------------------------------------------------------

    def plan(self, feed: dict | None = None, **feeds) -> Plan:
        """The prepared plan for feeds like these (prepared now if it was not yet)."""
        feed = {**(feed or {}), **feeds}
        arrays = {n: self._device_array(n, feed[n]) for n in self.program.feeds}
        key = tuple([(a.shape, a.dtype) for a in arrays.values()])
        if key not in self._plans:
            self._plans[key] = self.prepare(arrays)
        return self._plans[key]


def _last_use(ops: list, roots: list) -> dict:
    """Variable name -> index of the last op that reads it (``len(ops)`` for what the run returns or updates)."""
    last_use = {}
    for i, (op, _) in enumerate(ops):
        for n in op.input_names():
            last_use[n] = i
    for n in roots:
        last_use[n] = len(ops)
    return last_use


def _held_until(ops: list, kernels: list, last_use: dict) -> dict:
    """``last_use`` where a variable's memory is in use as long as a result that may share it: a kernel that takes
    no ``out=`` may return its input itself or a view of it (identity, reshape, transpose, slice...), so the memory
    of its inputs lives as long as its outputs. Writing a dying input's buffer while such a view lived changed the
    view."""
    held = dict(last_use)
    for i in reversed(range(len(ops))):  # (a view's own views come later: their reach is known by then)
        if not kernels[i].takes_out:
            op = ops[i][0]
            until = max((held.get(n, i) for n in op.output_names()), default=i)
            for n in op.input_names():
                held[n] = max(held.get(n, i), until)
    return held


def _in_place_updates(ops: list, kernels: list, specs: dict, updates: dict, last_use: dict, reuse: dict) -> dict:
    """A persistable variable's new value is written straight into its buffer (no copy per run) when the op
    producing it takes out= and runs after the last reader of the old value (or is that reader, through an input
    it may write into); ``reuse`` learns those writes. Returns {persistable variable: the variable computed into
    it}."""
    in_place = {}
    producer = {n: i for i, (op, _) in enumerate(ops) for n in op.output_names()}
    for target, n in updates.items():
        i = producer.get(n)
        if i is not None and getattr(ops[i][0], "writes_into", {}).get(n) == target:  # a step writing it there
            in_place[target] = n
            continue
        if (i is not None and i not in reuse and kernels[i].takes_out and len(ops[i][0].output_names()) == 1
                and last_use.get(target, -1) <= i and specs[n] == specs[target]
                and (target not in ops[i][0].input_names() or target in _writable_inputs(ops[i][0]))):
            reuse[i] = target
            in_place[target] = n
    return in_place


def _writable_inputs(op) -> list:
    """The inputs of ``op`` (a step of the plan) whose buffer its output may be written into."""
    return op.inplace_inputs if isinstance(op, FusedOp) else in_place_inputs(op)


class _Workspace:
    """Which outputs the plan allocates from the workspace (``take``: op index -> pool), which dying variables go
    back to it (``give``: (op index, variable) -> pool), the pools' Specs, and each fused group's scratch pools
    (``scratch``: op index -> pool or None, one per scratch buffer).

    A pool keeps, between uses, as many buffers of its Spec as the plan has in use at once. The workspace holds at
    most the plan's peak of live intermediates (``_peak_bytes``: outputs from their op to their last reader, a fused
    group's scratch while it runs): Specs are pooled largest first while their buffers fit in that. (Memory the
    allocator got back from a freed array is mostly kept by it too: on the MLP of bench/run.py, batch 512, the
    process's peak RSS after 20 steps is the same, 58.7 MB, with every Spec pooled as with none.)
    ``bytes``: what the workspace holds at most."""

    def __init__(self, ops, kernels, specs, roots, reuse, drops, enabled: bool):
        self.specs, self.take, self.give, self.scratch = [], {}, {}, {}
        self.bytes = 0
        if not enabled:
            return
        ids, pool_of = {}, {}  # Spec -> pool; variable -> the pool its buffer belongs to
        use = []  # per op: {pool: buffers in use while it runs}
        total = []  # per op: bytes of all intermediates live while it runs
        in_use = {}

        def pool(spec):
            if spec not in ids:
                ids[spec] = len(self.specs)
                self.specs.append(spec)
            return ids[spec]

        live = 0
        sizes = {}
        for i, ((op, _), kernel) in enumerate(zip(ops, kernels)):
            outs = op.output_names()
            if i in reuse:
                if reuse[i] in pool_of:  # written in place: the buffer lives on as the output
                    pool_of[outs[0]] = pool_of[reuse[i]]
            else:
                live += sum(_nbytes(specs[n]) for n in outs)
                if kernel.takes_out and len(outs) == 1 and outs[0] not in roots and \
                        _nbytes(specs[outs[0]]) >= WORKSPACE_MIN_BYTES:
                    self.take[i] = pool_of[outs[0]] = k = pool(specs[outs[0]])
                    in_use[k] = in_use.get(k, 0) + 1
            now = dict(in_use)
            scratch = 0
            if isinstance(op, FusedOp):
                self.scratch[i] = [pool(spec) for spec in op.scratch]
                for k in self.scratch[i]:
                    now[k] = now.get(k, 0) + 1
                scratch = op.scratch_bytes()
            use.append(now)
            total.append(live + scratch)
            for n in drops[i]:
                if n != reuse.get(i):
                    sizes[n] = _nbytes(specs[n])
                    live -= sizes[n]
                    if n in pool_of:
                        self.give[(i, n)] = k = pool_of[n]
                        in_use[k] -= 1
        # pool Specs, largest first, while their buffers fit in the plan's peak
        peak = max(total, default=0)
        cap = {k: max((u.get(k, 0) for u in use), default=0) for k in range(len(self.specs))}
        chosen, held = set(), 0
        for k in sorted(range(len(self.specs)), key=lambda k: -_nbytes(self.specs[k])):
            if held + cap[k] * _nbytes(self.specs[k]) <= peak:
                held += cap[k] * _nbytes(self.specs[k])
                chosen.add(k)
        keep = {k: n for n, k in enumerate(sorted(chosen))}  # renumbered: pools that are used
        self.take = {i: keep[k] for i, k in self.take.items() if k in keep}
        self.give = {key: keep[k] for key, k in self.give.items() if k in keep}
        self.scratch = {i: [keep.get(k) for k in ks] for i, ks in self.scratch.items()}
        self.specs = [self.specs[k] for k in sorted(chosen)]
        self.bytes = sum(cap[k] * _nbytes(self.specs[keep[k]]) for k in chosen)


def _inputs_c_ordered(op, opdef, var) -> str:
    """For an elementwise or broadcast op, the generated test that its inputs are all C-ordered ("" for others).

    A workspace buffer is C-ordered. An elementwise kernel given inputs in another order (a convolution's result is a
    batch-last view) would walk the two against each other, and force that order on every op after it: the digits
    CNN's relu, max-pool and their gradients took 3-4x their eager time. Such a call makes its output in its inputs'
    order instead. (Matmul writes C order whatever its operands' order: it keeps its buffer.) An op alone in a native
    loop (``native.single_loops``) is that op here: given inputs in another order, it runs its kernel."""
    if isinstance(op, FusedOp) and op.alone:
        op = op.members[0][0]
        opdef = registry.get(op.type)
    if opdef is None or not ("elementwise" in opdef.traits or "broadcast" in opdef.traits):
        return ""
    return " and ".join(f"{var(n)}.flags.c_contiguous" for names in op.inputs.values() for n in names)


def _nbytes(spec) -> int:
    """A buffer's size; 0 for a size the data decides (nonzero's rows, bincount's): the kernel allocates that one."""
    if None in spec.shape:
        return 0
    return math.prod(spec.shape) * spec.dtype.itemsize  # Python ints: a static size past 2**63 must not wrap


def _allocator(empty, spec):
    shape, dtype = spec.shape, spec.dtype
    return lambda: empty(shape, dtype)


def _drops(ops: list, last_use: dict, owned: set) -> list:
    """Per op: the variables to let go right after it — inputs it read last, outputs nobody reads."""
    drops = []
    for i, (op, _) in enumerate(ops):
        dying = [n for n in dict.fromkeys(op.input_names()) if last_use.get(n) == i and n not in owned]
        drops.append(dying + [n for n in op.output_names() if n not in last_use])
    return drops


def _peak_bytes(ops: list, specs: dict, reuse: dict, drops: list) -> int:
    """The most bytes of intermediates alive at once under the plan (a buffer written with out= is no new one)."""
    def nbytes(name):
        return _nbytes(specs[name])

    live = peak = 0
    for i, (op, _) in enumerate(ops):
        buffer = reuse.get(i)
        if buffer is None:
            live += sum(nbytes(n) for n in op.output_names())
        scratch = op.scratch_bytes() if isinstance(op, FusedOp) else 0  # a fused group's, while it runs
        peak = max(peak, live + scratch)
        live -= sum(nbytes(n) for n in drops[i] if n != buffer)  # a buffer written in place lives on as the output
    return peak


def _compile_plan(source: str, env: dict, name: str):
    """The plan's function, under a file name of its own that names the program (``<opforge.plan.step.3>``)."""
    return codegen.define(source, "plan", name, env, "run", unique=True)


def _name_failed_op(plan: Plan, error: Exception) -> OpforgeError:
    """A kernel raised inside the generated code: say which op of the program it was."""
    tb, line, filename = error.__traceback__, None, codegen.filename_of(plan.fn)
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    text = plan.source.splitlines()[line - 1].strip() if line else "?"
    op = plan.line_ops.get(line, "an op")
    if isinstance(error, MemoryError):
        if line in plan.line_calls:
            return _out_of_memory(*plan.line_calls[line], plan.specs, error, f"Executor.run(): {op}: ")
        return OutOfMemoryError(f"Executor.run(): {op} ran out of memory ({text}): {type(error).__name__}: {error}")
    return OpforgeError(f"Executor.run(): {op} failed ({text}): {type(error).__name__}: {error}")


def _out_of_memory(op: OpDesc, attrs: dict, specs: dict, error: MemoryError, where: str) -> OutOfMemoryError:
    """The OutOfMemoryError for a kernel of the plan, with the Specs of its inputs."""
    opdef = registry.get(op.type)
    ins = [[specs[n] for n in op.inputs[p.name]] if p.is_list else
           (specs[op.inputs[p.name][0]] if op.inputs[p.name] else None) for p in opdef.inputs]
    return out_of_memory(opdef, ins, attrs, error, where)


def _flattener(opdef, device):
    def flatten(result):
        if len(opdef.outputs) == 1:
            result = (result,)
        flat = []
        for o, v in zip(opdef.outputs, result):
            flat.extend(device.array(a) for a in (v if o.is_list else [v]))
        return flat
    return flatten
