"""``OpDef``: everything opforge knows about one op, gathered from its one definition.

An ``OpDef`` is made by ``@of.op(signature)`` (see ``opforge.core.declare``) and grows through its
decorator methods: ``@op.kernel`` (more kernels), ``@op.infer`` (shape/dtype rule), ``@op.grad``
(gradient rule), ``@op.check`` (attribute validation), ``@op.samples`` (inputs for the
conformance suite), ``@op.sbp`` (layouts across ranks) and ``@op.onnx`` (its ONNX export mapping). Its traits say
what kind of op it is (``TRAITS``). The registry maps op names to ``OpDef``s.
"""

from __future__ import annotations

import ast
import functools
import inspect
from collections import namedtuple
from typing import NamedTuple

import numpy as np

from . import dtypes as D
from .devices import Device, get_device
from .errors import ArgumentError, DispatchError, OpforgeError, SchemaError, ShapeError, describe
from .schema import Schema
from .spec import Dim, Spec, broadcast_shapes, shapes_agree

TRAITS = {
    "elementwise": "output has the shape and dtype of the first input",
    "broadcast": "inputs broadcast together; output dtype is their result type (PyTorch's promotion)",
    "same_dtype": "floating inputs must share one dtype (no silent promotion: PyTorch's matmul refuses it too)",
    "no_grad": "not differentiable: outputs never require grad, autograd skips the op",
    "random": "draws from the seeded generator; never merged with an identical op",
    "shape_only": "the output depends on the inputs' shapes and dtypes, not their values: a plan computes it once",
    "pointwise": "each output element depends only on the input elements at its position (after broadcasting), so "
                 "the kernels give the same bits on row blocks as on whole arrays: the executor may run a chain of "
                 "such ops block by block, in one pass over memory (opforge.program.fusion)",
    "data_shaped": "some output dims depend on the input values (bincount, unique): infer gives them as None, "
                   "known only when the kernel has run; the memory plan gives such outputs no pool buffer",
    "view": "the output shares the first input's memory where NumPy can make a view (a slice, a transpose, a reshape "
            "of contiguous memory), so an in-place write to one shows in the other: traced code follows it as eager "
            "code does (opforge.program.trace)",
    "commutative": "a pointwise op of two inputs that gives the same result with them swapped: its output may also "
                   "be written into the second input's buffer",
}


class Kernel(NamedTuple):
    fn: object
    device: str | None  # a device name; None: every device (the kernel takes xp, its device's array module)
    dtypes: tuple | None  # None: every dtype the op allows
    takes_out: bool  # accepts out= (a buffer to write into)
    takes_rng: bool  # accepts rng= (its device's random generator)
    takes_xp: bool  # accepts xp= (its device's array module)

    def bind(self, device):
        """The kernel as dispatch and the executor call it on ``device``: with ``xp`` filled in if it takes it and
        its default (``xp=np``, say) is not that device's module already (no partial's cost on the host)."""
        if not self.takes_xp or (self.fn.__kwdefaults__ or {}).get("xp") is device.xp:
            return self.fn
        return functools.partial(self.fn, xp=device.xp)


class GradRule(NamedTuple):
    """A gradient rule and what it asks for, worked out once from its parameter names."""

    fn: object
    params: tuple  # every parameter name, in order
    saved_inputs: tuple  # (name, input position) of forward inputs the rule needs
    saved_outputs: tuple  # (name, output position) of forward outputs the rule needs
    output_grads: tuple  # (name, output position) of incoming output gradients, "d<output>"
    spec_params: tuple  # (name, "in"|"out", position): "<name>_spec" gives a Spec, keeps no data
    attrs: tuple  # attribute names the rule takes
    wants_needs: bool  # takes needs_input_grad
    residuals: tuple = ()  # names of the op's saves the rule takes (see OpDef.saves)
    none_grads: frozenset = frozenset()  # the d<output> parameters declared "=None": None, not zeros, if unused


class Sample(NamedTuple):
    """One call of an op for the conformance suite: positional args (arrays for tensors) and attrs."""

    args: tuple
    kwargs: dict

    @classmethod
    def of(cls, *args, **kwargs) -> Sample:
        # A NumPy scalar (rng.uniform(a, b, ()) gives one) is a 0-d array here, so it becomes a tensor input.
        return cls(tuple(np.asarray(a) if isinstance(a, np.generic) else a for a in args), kwargs)


definitions = [0]  # bumped when any op gets a kernel or a gradient rule: what was derived from the old ones is stale


class OpDef:
    def __init__(self, schema: Schema, traits=(), *, inplace=None, saves=(), doc: str = "", defined_at: str = "",
                 out_device=None):
        self.name = schema.name
        self.schema = schema
        unknown = [t for t in traits if t not in TRAITS]
        if unknown:
            raise SchemaError(f"op '{self.name}': unknown trait(s) {unknown}; known traits: {sorted(TRAITS)}")
        self.traits = frozenset(traits)
        if "elementwise" in self.traits and "broadcast" in self.traits:
            raise SchemaError(f"op '{self.name}': traits 'elementwise' and 'broadcast' exclude each other")
        if "commutative" in self.traits and ("pointwise" not in self.traits or len(schema.inputs) != 2):
            raise SchemaError(f"op '{self.name}': the trait 'commutative' describes a pointwise op of two inputs")
        self.inputs = schema.inputs
        self.attrs = schema.attrs
        self.outputs = schema.outputs
        self.input_names = tuple(p.name for p in self.inputs)
        self.float_attrs = any(p.type == "float" for p in self.attrs)  # (replay keys these by their bits)
        self.output_names = tuple(o.name for o in self.outputs)
        self.inplace = dict(inplace or {})
        for out, inp in self.inplace.items():
            if out not in self.output_names or inp not in self.input_names:
                raise SchemaError(
                    f"op '{self.name}': inplace pair {out!r}: {inp!r} must map an output "
                    f"{self.output_names} to an input {self.input_names}"
                )
        clash = {"d" + o for o in self.output_names} & {p.name for p in schema.params}
        if clash:
            raise SchemaError(
                f"op '{self.name}': argument(s) {sorted(clash)} clash with the output-gradient names "
                "a gradient rule uses (d<output>); rename the argument or the output"
            )
        if ("elementwise" in self.traits or "broadcast" in self.traits) and not self.inputs:
            raise SchemaError(f"op '{self.name}': traits elementwise/broadcast need a tensor input")
        if ("elementwise" in self.traits or "broadcast" in self.traits) and (
                len(self.outputs) != 1 or self.outputs[0].is_list):
            raise SchemaError(f"op '{self.name}': traits elementwise/broadcast describe one output, and the op has "
                              f"{list(self.output_names)}; drop the trait and give the shapes with @{self.name}.infer")
        # Residuals: arrays a kernel leaves, when its call is recorded for autograd, for the gradient rule to reuse
        # (JAX's custom_vjp residuals, torch's save_for_backward). Kernels take save= (a dict to fill, or None);
        # a rule parameter of that name gets the array as a Tensor in a first-order eager backward, None elsewhere
        # (in programs, and under create_graph, where an array with no history cannot be differentiated).
        self.saves = tuple(saves)
        taken = set(self.input_names) | set(self.output_names) | {p.name for p in schema.params} | \
            {"d" + o for o in self.output_names}
        if set(self.saves) & taken or len(set(self.saves)) != len(self.saves) or "needs_input_grad" in self.saves:
            raise SchemaError(f"op '{self.name}': saves {list(self.saves)} must be new names, each once (not an "
                              f"input, output, attr or output gradient)")
        self.doc = doc
        self.defined_at = defined_at
        self.kernels: dict = {}  # (device, dtype or None) -> Kernel
        self._kernel_cache: dict = {}  # (device, dtype) -> Kernel, filled on use
        self.kernel_table: dict = {}  # device name -> dtype -> kernel function: the dispatch fast path's cache
        self.infer_fn = None
        self.grad_rule: GradRule | None = None
        self.check_fn = None
        self.samples_fn = None
        self.sbp_fn = None  # layouts the op runs under across ranks (opforge.distributed reads it)
        self.sbp_takes = frozenset()  # which of `ranks` (the number of ranks) and `batch_norm` sbp_fn names
        self.onnx_fn = None  # the ONNX export mapping (see opforge.onnx)
        self.scalar_expression = None  # a pointwise op's value at one element, for native code (see scalar())
        self.validate = None
        self._refresh_validate()
        self.out_device = out_device  # attrs -> the Device outputs live on, for an op moving data (else its inputs')
        # the named tuple of a multi-output op's results
        self.result_type = namedtuple(f"{self.name}_result", self.output_names) if len(self.outputs) > 1 else None
        # Set by the function maker (opforge.dispatch), which generates them from the schema:
        self.fn = None  # the functional API, ``opforge.ops.<name>``
        self.fast_path = False  # whether ``fn`` has a straight-line path for calls on Tensors of one device
        self.attach = None  # (inputs, attrs, kernel result) -> outputs linked to a new autograd Node
        self.rule_listeners: list = []  # called when the gradient rule changes (dispatch regenerates ``attach``)

    # -- decorator methods --------------------------------------------------------------------------------

    def kernel(self, device: str | None = None, dtypes=None):
        """Register a kernel for ``device`` and the given dtypes (default: every dtype the op allows).

        Without ``device``, a kernel that takes ``xp`` (its device's array module) serves every device, and one
        that does not is a "cpu" kernel. A kernel for a named device wins over one for every device."""
        if device is not None and (not isinstance(device, str) or not device.isidentifier()):
            raise SchemaError(f"op '{self.name}'.kernel(): device must be a device name, got {describe(device)}")
        dts = None if dtypes is None else tuple(D.as_dtype(d, op=f"{self.name}.kernel", arg="dtypes")
                                                 for d in dtypes)

        def register(fn):
            self.add_kernel(fn, device, dts)
            return fn

        return register

    def add_kernel(self, fn, device: str | None, dtypes: tuple | None) -> None:
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # a builtin or ufunc
            params = {}
        takes_xp = "xp" in params
        if device is None and not takes_xp:
            device = "cpu"
        kernel = Kernel(fn, device, dtypes, "out" in params, "rng" in params, takes_xp)
        if "random" in self.traits and not kernel.takes_rng:
            raise SchemaError(f"op '{self.name}' has the trait 'random': its kernels must take rng=")
        if self.saves and "save" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise SchemaError(f"op '{self.name}' saves {list(self.saves)} for its gradient rule: its kernels must "
                              "take save= (a dict to put them in, or None when the call is not recorded)")
        for dt in dtypes or (None,):
            self.kernels[(device, dt)] = kernel
        self._kernel_cache.clear()
        self.kernel_table.clear()
        definitions[0] += 1

    def infer(self, fn):
        """Register the shape/dtype rule: input Specs (and attrs as keywords) -> output Spec(s)."""
        try:
            inspect.signature(fn).bind(*(None for _ in self.inputs), **{p.name: None for p in self.attrs})
        except TypeError as e:
            attrs = ", ".join(p.name for p in self.attrs)
            raise SchemaError(
                f"infer rule of op '{self.name}' must take the input Specs ({', '.join(self.input_names)}) "
                f"positionally{' and the attrs (' + attrs + ') by keyword' if attrs else ''}: {e}"
            ) from None
        except ValueError:  # a builtin: trust it
            pass
        self.infer_fn = fn
        self._refresh_validate()
        return fn

    def check(self, fn):
        """Register attribute validation: called with the attrs as keywords; raise ValueError to refuse."""
        self.check_fn = fn
        self._refresh_validate()
        return fn

    def _refresh_validate(self) -> None:
        """Set ``validate``: what every call runs before its kernel (None, the common case, costs nothing)."""
        missing_infer = self.infer_fn is None and not ({"elementwise", "broadcast"} & self.traits)
        check = self.check_fn
        if not missing_infer and check is None:
            self.validate = None
            return

        def validate(attrs: dict) -> None:
            if missing_infer:
                raise SchemaError(self.missing_infer_message())
            if check is None or any(has_dim(v) for v in attrs.values()):
                return  # a size known only at run time: the executor runs the check with real sizes
            try:
                check(**attrs)
            except (ValueError, TypeError) as e:
                if isinstance(e, OpforgeError):
                    raise
                raise ArgumentError(f"{self.name}(): {e}") from None

        self.validate = validate

    def samples(self, fn):
        """Register sample inputs for the conformance suite: ``fn(rng)`` yields ``Sample``s."""
        self.samples_fn = fn
        return fn

    def sbp(self, fn):
        """Register the op's SBP signatures: the whole input Specs (and attrs as keywords; ``ranks``, the number of
        ranks, and ``batch_norm``, the mesh's choice of batch statistics, if the function names them) -> the layouts
        it can run under, each ``(input layouts, output layouts)`` or ``(input layouts, output layouts, attrs on the
        blocks)``, or a ``Decomposition``; ``opforge.distributed`` reads them and ``check_op`` checks them (see
        ``opforge.core.sbp`` and docs/distributed.md)."""
        try:
            self.sbp_takes = frozenset(inspect.signature(fn).parameters) & {"ranks", "batch_norm"}
        except (TypeError, ValueError):  # a builtin: it takes neither
            self.sbp_takes = frozenset()
        self.sbp_fn = fn
        return fn

    def onnx(self, fn):
        """Register the ONNX export mapping: ``fn(g, <inputs>, <attrs>)`` emits nodes through ``g`` (opforge.onnx)."""
        self.onnx_fn = fn
        return fn

    def scalar(self, expression: str) -> OpDef:
        """Declare a pointwise op's value at one element as a scalar expression over its inputs and attrs, in Python's
        syntax: ``tanh.scalar("tanh(x)")``, ``leaky_relu.scalar("x if x > 0 else alpha * x")``. It is written once,
        beside the NumPy kernel it describes (the suite checks the two agree on the op's samples), and the native
        backend of compiled programs generates its loops from it (``opforge.program.native``, which lists the
        functions an expression may call). Constants and attrs take the type the op computes in, as NumPy's
        Python scalars do."""
        if "pointwise" not in self.traits:
            raise SchemaError(f"op '{self.name}'.scalar(): only a pointwise op has a scalar expression")
        try:
            tree = ast.parse(expression, mode="eval")
        except SyntaxError as e:
            raise SchemaError(f"op '{self.name}'.scalar({expression!r}): {e.msg}") from None
        known = set(self.input_names) | {p.name for p in self.attrs}
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        unknown = names - known - called
        if unknown:
            raise SchemaError(f"op '{self.name}'.scalar({expression!r}): {sorted(unknown)} are neither inputs "
                              f"{list(self.input_names)} nor attrs")
        self.scalar_expression = expression
        return self

    def fusable(self, *, commutative: bool = False) -> OpDef:
        """Give the op the trait ``pointwise`` (and ``commutative`` if asked) after its definition: the same as
        naming them in ``traits=`` (see ``TRAITS``), for an op defined elsewhere."""
        traits = self.traits | {"pointwise"} | ({"commutative"} if commutative else set())
        if "commutative" in traits and len(self.inputs) != 2:
            raise SchemaError(f"op '{self.name}': the trait 'commutative' describes a pointwise op of two inputs")
        self.traits = frozenset(traits)
        return self

    def grad(self, fn):
        """Register the gradient rule. Its parameter names say what it needs (see GradRule)."""
        self.grad_rule = self._parse_rule(fn)
        definitions[0] += 1
        for listener in self.rule_listeners:  # dispatch regenerates the recording code for this rule
            listener(self)
        return fn

    def _parse_rule(self, fn) -> GradRule:
        parameters = inspect.signature(fn).parameters
        names = tuple(parameters)
        inputs = {n: i for i, n in enumerate(self.input_names)}
        outputs = {n: i for i, n in enumerate(self.output_names)}
        attrs = {p.name for p in self.attrs}
        saved_in, saved_out, douts, specs, rule_attrs, needs, residuals = [], [], [], [], [], False, []
        for n in names:
            if n in self.saves:
                residuals.append(n)
            elif n in inputs:
                saved_in.append((n, inputs[n]))
            elif n in outputs:
                saved_out.append((n, outputs[n]))
            elif n.startswith("d") and n[1:] in outputs:
                douts.append((n, outputs[n[1:]]))
            elif n in attrs:
                rule_attrs.append(n)
            elif n.endswith("_spec") and n[:-5] in inputs:
                specs.append((n, "in", inputs[n[:-5]]))
            elif n.endswith("_spec") and n[:-5] in outputs:
                specs.append((n, "out", outputs[n[:-5]]))
            elif n == "needs_input_grad":
                needs = True
            else:
                raise SchemaError(
                    f"gradient rule of op '{self.name}': parameter '{n}' is none of: inputs "
                    f"{list(inputs)}, outputs {list(outputs)}, output gradients "
                    f"{['d' + o for o in outputs]}, attrs {sorted(attrs)}, '<input>_spec', 'needs_input_grad'"
                    + (f", saves {list(self.saves)}" if self.saves else "")
                )
        # A rule that declares an output gradient "=None" handles "no gradient reached this output" itself: it gets
        # None there instead of zeros that the engine would allocate (and the kernel would read) for nothing.
        none_grads = frozenset(n for n, _ in douts if parameters[n].default is None)
        return GradRule(fn, names, tuple(saved_in), tuple(saved_out), tuple(douts), tuple(specs),
                        tuple(rule_attrs), needs, tuple(residuals), none_grads)

    # -- queries -----------------------------------------------------------------------------------------

    @property
    def differentiable(self) -> bool:
        return "no_grad" not in self.traits and self.grad_rule is not None

    def kernel_for(self, device, dtypes, attrs) -> Kernel:
        """The kernel a call runs — the one rule eager dispatch (both paths), replay and the executor follow: its
        device's kernel for the dtype of its first tensor input (``dtypes``: its tensor inputs' dtypes, in order);
        for a call with no tensor input, for the dtype its ``dtype`` attr asks for, else the default float."""
        dtype = dtypes[0] if dtypes else (attrs.get("dtype") or D.DEFAULT_FLOAT)
        return self.find_kernel(device, dtype)

    def find_kernel(self, device, dtype) -> Kernel:
        """The kernel for ``device`` (a Device or its name) and ``dtype``: the device's own, else one for every
        device, else (for a device that shares another's arrays) that device's."""
        if not isinstance(device, Device):
            device = get_device(device, f"op '{self.name}'.find_kernel()")
        key = (device.name, dtype)
        kernel = self._kernel_cache.get(key)
        if kernel is None:
            kernels = self.kernels
            for name in dict.fromkeys((device.name, None, device.kernels_of)):
                kernel = kernels.get((name, dtype)) or kernels.get((name, None))
                if kernel is not None:
                    break
            if kernel is None:
                have = sorted(f"{'every device' if d is None else d}/{t if t is not None else 'any dtype'}"
                              for d, t in self.kernels)
                raise DispatchError(
                    f"op '{self.name}' has no kernel for device '{device}' and dtype {dtype}; "
                    f"kernels exist for: {', '.join(have) or 'nothing'}"
                )
            self._kernel_cache[key] = kernel
        return kernel

    def infer_specs(self, inputs: list, attrs: dict) -> tuple:
        """Output Specs from input Specs (a list per ``Tensor[]`` input, None for a missing ``Tensor?``)."""
        for p, spec in zip(self.inputs, inputs):
            for s in spec if p.is_list else (spec,):
                if s is not None and p.dtypes is not None and s.dtype not in p.dtypes:
                    raise ArgumentError(
                        f"{self.name}(): argument '{p.name}' expected dtype "
                        f"{' or '.join(map(str, p.dtypes))}, got {s.dtype}"
                    )
        if self.infer_fn is not None:
            result = self.infer_fn(*inputs, **attrs)
        elif "elementwise" in self.traits:
            result = inputs[0]
            for p, s in zip(self.inputs[1:], inputs[1:]):
                if s is not None and not p.is_list and not shapes_agree(s.shape, result.shape):
                    raise ShapeError(f"{self.name}(): argument '{p.name}' has shape {s.shape}, but an elementwise "
                                     f"op needs the shape of '{self.inputs[0].name}', {result.shape}")
        elif "broadcast" in self.traits:
            specs = [s for s in inputs if s is not None]
            shape = broadcast_shapes(*(s.shape for s in specs), op=self.name)
            result = Spec(shape, D.result_type(*specs))
        else:
            raise SchemaError(self.missing_infer_message())
        result = tuple(result) if isinstance(result, (tuple, list)) and not isinstance(result, Spec) else (result,)
        if len(result) != len(self.outputs) or not all(
            isinstance(r, Spec) or (o.is_list and isinstance(r, (list, tuple)))
            for r, o in zip(result, self.outputs)
        ):
            raise SchemaError(
                f"infer function of op '{self.name}' must return {len(self.outputs)} Spec(s) "
                f"for outputs {list(self.output_names)}, returned {describe(result)}"
            )
        return result

    def missing_infer_message(self) -> str:
        return (
            f"op '{self.name}' (defined at {self.defined_at}) has no shape/dtype rule: give it the trait "
            "'elementwise' or 'broadcast', or register one with @{0}.infer".format(self.name)
        )

    def check_shapes(self, specs: list, attrs: dict, error: Exception) -> None:
        """After a kernel failed: let the infer rule explain the mistake, else re-raise naming the op."""
        try:
            self.infer_specs(specs, attrs)
        except (ShapeError, ArgumentError):
            raise
        except Exception:
            pass
        shapes = ", ".join(
            f"{p.name}: {[tuple(s.shape) for s in sp] if p.is_list else (None if sp is None else sp)}"
            for p, sp in zip(self.inputs, specs)
        )
        raise ShapeError(f"{self.name}(): the kernel failed on inputs ({shapes}): {error}") from error

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __get__(self, obj, owner=None):
        # A descriptor that does not bind makes an op a routine to pydoc, so help(op) shows its own signature and
        # docstring; kept as a class attribute, it is still called without self (unlike a plain function).
        return self

    def __repr__(self) -> str:
        return f"<op {self.schema}>"


def spec_of_array(array: np.ndarray) -> Spec:
    return Spec(array.shape, array.dtype)


def flat_ranges(layout: tuple) -> list:
    """Per schema slot: (first flat index, count, is a list) — a layout holds -1 for a Tensor, k for a list of k."""
    ranges, start = [], 0
    for n in layout:
        ranges.append((start, max(n, 1) if n < 0 else n, n >= 0))
        start += 1 if n < 0 else n
    return ranges


def has_dim(value) -> bool:
    """Whether an attr value holds a run-time size (a Dim, alone or in a list)."""
    return isinstance(value, Dim) or (isinstance(value, tuple) and any(isinstance(v, Dim) for v in value))


def split_by_layout(flat: list, layout: tuple) -> list:
    """Flat per-tensor values -> one value per schema slot (a list for a ``Tensor[]`` slot)."""
    out, i = [], 0
    for n in layout:
        if n < 0:
            out.append(flat[i])
            i += 1
        else:
            out.append(list(flat[i:i + n]))
            i += n
    return out


class Registry:
    """Op name -> OpDef. Listeners (the ``opforge.ops`` namespace, half-precision kernels) hear of every new or
    replaced op, and of an op again when it gets its function after it was added (``announce``): they must take
    hearing of one op twice."""

    def __init__(self):
        self.ops: dict[str, OpDef] = {}
        self.listeners: list = []
        # name -> a function of the functional API written with ops, with no schema of its own (torch's F.dropout:
        # the y of the op dropout_with_mask); opforge.ops publishes them beside the ops (core.declare.function)
        self.functions: dict = {}
        self.function_listeners: list = []

    def add_function(self, fn) -> None:
        name = fn.__name__
        if name in self.ops:
            raise SchemaError(f"function '{name}' would hide the op of that name (defined at "
                              f"{self.ops[name].defined_at}); give it another name")
        self.functions[name] = fn
        for listener in self.function_listeners:
            listener(name, fn)

    def add(self, op: OpDef, replace: bool = False) -> None:
        if op.name in self.functions:
            raise SchemaError(f"op '{op.name}' would hide the function of that name in opforge.ops "
                              f"({self.functions[op.name].__module__}); give it another name")
        old = self.ops.get(op.name)
        if old is not None and not replace:
            raise SchemaError(
                f"op '{op.name}' is already defined (at {old.defined_at}); "
                "pass replace=True to of.op(...) to redefine it"
            )
        self.ops[op.name] = op
        for listener in self.listeners:
            listener(op)

    def announce(self, op: OpDef) -> None:
        """Tell the listeners of ``op`` again: it changed in a way they publish (it got its function)."""
        for listener in self.listeners:
            listener(op)

    def remove(self, name: str) -> None:
        """Forget an op (a test's scratch op, say); ``opforge.ops`` forgets it too."""
        op = self.get(name)
        del self.ops[name]
        for listener in self.listeners:
            listener(op, removed=True)

    def get(self, name: str) -> OpDef:
        try:
            return self.ops[name]
        except KeyError:
            raise KeyError(f"no op named '{name}' is registered") from None

    def __iter__(self):
        return iter(list(self.ops.values()))

    def __contains__(self, name: str) -> bool:
        return name in self.ops

    def __len__(self) -> int:
        return len(self.ops)


registry = Registry()
