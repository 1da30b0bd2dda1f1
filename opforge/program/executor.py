"""``Executor``: prepare a program once per feed shape, then run it many times with little Python in between.

Preparing (once per distinct set of feed shapes) does the work eager mode repeats on every call:
  1. shape/dtype inference over the whole program with the feed's concrete shapes; attrs that hold run-time
     dims (``Dim``) get their sizes; a mismatch names the op and the variables;
  2. dead-code elimination (only what the fetched values need) and merging of identical pure ops (CSE; ops
     with the ``random`` trait are never merged);
  3. liveness: each intermediate is dropped right after its last reader; a kernel that takes ``out=`` writes
     into a dead buffer of the same shape and dtype, or into its declared ``inplace`` input when that input
     dies at this op;
  4. code generation: the plan becomes one straight-line Python function calling the kernels.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, OpforgeError, ShapeError
from ..core.opdef import registry
from ..core.random import generator
from ..core.spec import Dim, Spec
from .desc import OpDesc, Program
from .trace import Variable


class Plan:
    """One compiled specialisation of a program: its generated function and what it needs."""

    def __init__(self, fn, source: str, specs: dict, steps: int, peak_live_bytes: int, removed: dict,
                 line_ops: dict | None = None):
        self.fn = fn
        self.source = source
        self.specs = specs  # variable name -> concrete Spec
        self.steps = steps
        self.peak_live_bytes = peak_live_bytes
        self.removed = removed  # {"dead": n, "merged": n}
        self.line_ops = line_ops or {}  # line of the generated source -> "op #i <type> -> <outputs>"


def _resolve(value, specs: dict):
    """Replace each Dim (a run-time size) in an attr value by its size under the concrete ``specs``."""
    if isinstance(value, Dim):
        return specs[value.var].shape[value.axis]
    if isinstance(value, tuple) and any(isinstance(v, Dim) for v in value):
        return tuple(_resolve(v, specs) for v in value)
    return value


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.dtype):
        return str(value)
    return value


class Executor:
    """Runs a program: ``exe = of.Executor(prog)``; ``exe.run(x=batch)`` -> {fetch name: array}.

    ``fetch`` names what ``run`` returns (Variables, variable names, or a dict name -> either); by default the
    program's outputs and the gradients ``append_backward`` made (as ``"<var>@GRAD"``). Persistable variables
    (parameters) live in ``exe.scope``, initialised with the arrays the program was traced with (no copy).
    """

    def __init__(self, program: Program, fetch=None, optimize: bool = True):
        if not isinstance(program, Program):
            raise ArgumentError(f"Executor(): expected a Program, got {type(program).__name__}")
        self.program = program
        self.optimize = optimize
        self.fetch = self._fetch_names(fetch)
        block = program.block
        self.scope = {n: program.values[n] for n, v in block.vars.items() if v.persistable}
        self.constants = {n: a for n, a in program.values.items() if not block.vars[n].persistable}
        self._plans: dict = {}

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
            value = feed[name]
            array = value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else value
            arrays[name] = np.asarray(array)
        unknown = set(feed) - set(self.program.feeds)
        if unknown:
            raise ArgumentError(f"Executor.run(): {sorted(unknown)} are not feeds of the program "
                                f"(feeds: {self.program.feeds})")
        return self.run_arrays(arrays)

    def run_arrays(self, arrays: dict) -> dict:
        """``run`` for callers that already hold exactly the feeds, as NumPy arrays (``of.compile``)."""
        key = tuple([(a.shape, a.dtype) for a in arrays.values()])
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self.prepare(arrays)
        try:
            return plan.fn(arrays, self.scope, self.constants)
        except Exception as e:
            if isinstance(e, OpforgeError):
                raise
            raise _name_failed_op(plan, e) from e

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
        # 1. inference with concrete shapes (also over ops DCE will drop: a program must be consistent)
        for i, op in enumerate(block.ops):
            attrs = {k: _resolve(v, specs) for k, v in op.attrs.items()}  # its Dims refer to earlier variables
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
        removed = {"dead": 0, "merged": 0}
        folded = {}
        if self.optimize:
            ops, removed["merged"], alias = self._merge(ops)
            fetched = {alias.get(n, n) for n in fetched}
            ops, removed["dead"] = self._prune(ops, fetched)
            ops, folded = self._fold(ops)
            removed["folded"] = len(folded)
        else:
            alias = {}
        return self._generate(ops, specs, alias, removed, folded)

    def _fold(self, ops: list):
        """Constant folding: run now, once, every pure op whose inputs are all constants (not parameters,
        which change between runs)."""
        values = dict(self.constants)
        kept = []
        for op, attrs in ops:
            opdef = registry.get(op.type)
            if "random" not in opdef.traits and op.input_names() and all(n in values for n in op.input_names()):
                args = [[values[n] for n in op.inputs[p.name]] if p.is_list else
                        (values[op.inputs[p.name][0]] if op.inputs[p.name] else None) for p in opdef.inputs]
                first = next(values[n] for n in op.input_names())
                result = opdef.find_kernel("cpu", first.dtype).fn(*args, **attrs)
                for n, v in zip(op.output_names(), _flattener(opdef)(result)):
                    values[n] = v
                continue
            kept.append((op, attrs))
        return kept, {n: v for n, v in values.items() if n not in self.constants}

    @staticmethod
    def _merge(ops: list):
        """Common-subexpression elimination: an op identical to an earlier pure one reuses its outputs."""
        seen, alias, kept, merged = {}, {}, [], 0
        for op, attrs in ops:
            inputs = {k: [alias.get(n, n) for n in names] for k, names in op.inputs.items()}
            op = OpDesc(op.type, inputs, op.outputs, op.attrs, op.role)
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
        return kept, merged, alias

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
        program, block = self.program, self.program.block
        owned = set(program.feeds) | set(program.values) | set(folded)  # buffers never freed nor overwritten
        fetched = {key: alias.get(n, n) for key, n in self.fetch.items()}
        updates = {target: alias.get(n, n) for target, n in program.updates.items()}
        last_use = {}
        for i, (op, _) in enumerate(ops):
            for n in op.input_names():
                last_use[n] = i
        for n in [*fetched.values(), *updates.values()]:
            last_use[n] = len(ops)
        kernels = []
        for op, attrs in ops:
            first = next((specs[n] for n in op.input_names()), None)
            dtype = first.dtype if first is not None else (attrs.get("dtype") or np.dtype("float32"))
            kernels.append(registry.get(op.type).find_kernel("cpu", dtype))
        reuse = self._plan_buffers(ops, kernels, specs, last_use, owned)
        # A persistable variable's new value is written straight into its buffer (no copy per run) when the
        # op producing it takes out= and runs after the last reader of the old value; otherwise it is copied.
        in_place = {}
        producer = {n: i for i, (op, _) in enumerate(ops) for n in op.output_names()}
        for target, n in updates.items():
            i = producer.get(n)
            if (i is not None and i not in reuse and kernels[i].takes_out and len(ops[i][0].output_names()) == 1
                    and last_use.get(target, -1) <= i and specs[n] == specs[target]):
                reuse[i] = target
                in_place[target] = n

        slot = {}

        def var(name: str) -> str:
            if name not in slot:
                slot[name] = f"v{len(slot)}"
            return slot[name]

        def nbytes(name):
            s = specs[name]
            return int(np.prod(s.shape, dtype=np.int64)) * s.dtype.itemsize

        env = {"_asarray": np.asarray, "_rng": generator, "_folded": folded}
        line_ops = {}
        lines = ["def run(feed, scope, consts):"]
        for n in program.feeds:
            lines.append(f"    {var(n)} = feed[{n!r}]")
        used = {n for op, _ in ops for n in op.input_names()} | set(fetched.values())
        for n in program.values:
            if n in used:
                source = "scope" if block.vars[n].persistable else "consts"
                lines.append(f"    {var(n)} = {source}[{n!r}]")
        for n in folded:
            if n in used:
                lines.append(f"    {var(n)} = _folded[{n!r}]")
        live_bytes = peak = 0
        for i, ((op, attrs), kernel) in enumerate(zip(ops, kernels)):
            opdef = registry.get(op.type)
            env[f"k{i}"] = kernel.fn
            args = []
            for p in opdef.inputs:
                names = op.inputs[p.name]
                args.append("[" + ", ".join(var(n) for n in names) + "]" if p.is_list else
                            (var(names[0]) if names else "None"))
            if attrs:
                env[f"a{i}"] = attrs
                args.append(f"**a{i}")
            if kernel.takes_rng:
                args.append("rng=_rng()")
            outs = op.output_names()
            buffer = reuse.get(i)
            if buffer is not None:
                args.append(f"out={var(buffer)}")
            call = f"k{i}({', '.join(args)})"
            line_ops[len(lines) + 1] = f"op #{i} {op.type} -> {', '.join(outs)}"
            if len(outs) == 1 and not opdef.outputs[0].is_list:
                lines.append(f"    {var(outs[0])} = {'_asarray(' + call + ')' if specs[outs[0]].shape == () else call}")
            else:
                env[f"_flatten{i}"] = _flattener(opdef)
                lines.append(f"    {', '.join(var(n) for n in outs)}, = _flatten{i}({call})")
            if buffer is None:
                live_bytes += sum(nbytes(n) for n in outs)  # a new allocation
            peak = max(peak, live_bytes)
            for n in dict.fromkeys(op.input_names()):
                if last_use.get(n) == i and n not in owned:
                    if n != buffer:  # (a buffer written in place lives on as the output: only its name goes)
                        live_bytes -= nbytes(n)
                    lines.append(f"    del {var(n)}")  # its last reader ran: drop it now
            for n in outs:
                if n not in last_use:  # an output nobody reads (another output of a multi-output op)
                    live_bytes -= nbytes(n)
                    lines.append(f"    del {var(n)}")
        for target, n in updates.items():
            if target not in in_place:
                env["_copyto"] = np.copyto
                lines.append(f"    _copyto({var(target)}, {var(n)})  # the new value of a persistable variable")
        result = ", ".join(f"{key!r}: {var(n)}" for key, n in fetched.items())
        lines.append(f"    return {{{result}}}")
        source = "\n".join(lines) + "\n"
        exec(compile(source, "<opforge.program>", "exec"), env)
        return Plan(env["run"], source, specs, len(ops), peak, removed, line_ops)

    @staticmethod
    @staticmethod
    def _plan_buffers(ops, kernels, specs, last_use, owned) -> dict:
        """Op index -> the dying input whose buffer that op writes its output into (``out=``).

        An op whose kernel takes ``out=`` writes into its declared ``inplace`` input when that input dies at
        this op (MXNet's kWriteInplace; for ``add_n`` it is the add-to request: the sum accumulates into one
        summand). Only buffers dying at the op itself are reused, so no dead buffer is ever held back and the
        peak stays what liveness alone gives.
        """
        reuse = {}
        fresh = set()  # variables written by out= kernels: their own writable memory, never a view of another
        for i, ((op, _), kernel) in enumerate(zip(ops, kernels)):
            outs = op.output_names()
            if kernel.takes_out and len(outs) == 1:
                want = specs[outs[0]]
                opdef = registry.get(op.type)
                for inp in opdef.inplace.values():
                    reads = op.input_names()
                    dying = [n for n in op.inputs.get(inp, [])  # read once here: writing it cannot clobber a read
                             if last_use.get(n) == i and n not in owned and n in fresh and specs[n] == want
                             and reads.count(n) == 1]
                    if dying:
                        reuse[i] = dying[0]
                        break
                fresh.update(outs)
        return reuse

    # -- introspection ------------------------------------------------------------------------------------------

    def plan(self, feed: dict | None = None, **feeds) -> Plan:
        """The prepared plan for feeds like these (prepared now if it was not yet)."""
        feed = {**(feed or {}), **feeds}
        arrays = {n: np.asarray(feed[n]) for n in self.program.feeds}
        key = tuple([(a.shape, a.dtype) for a in arrays.values()])
        if key not in self._plans:
            self._plans[key] = self.prepare(arrays)
        return self._plans[key]


def _name_failed_op(plan: Plan, error: Exception) -> OpforgeError:
    """A kernel raised inside the generated code: say which op of the program it was."""
    tb, line = error.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<opforge.program>":
            line = tb.tb_lineno
        tb = tb.tb_next
    text = plan.source.splitlines()[line - 1].strip() if line else "?"
    op = plan.line_ops.get(line, "an op")
    return OpforgeError(f"Executor.run(): {op} failed ({text}): {type(error).__name__}: {error}")


def _flattener(opdef):
    def flatten(result):
        if len(opdef.outputs) == 1:
            result = (result,)
        flat = []
        for o, v in zip(opdef.outputs, result):
            flat.extend(np.asarray(a) for a in (v if o.is_list else [v]))
        return flat
    return flatten
