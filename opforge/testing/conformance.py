"""``check_op``: the conformance checks every registered op goes through — the library's and yours.

For each sample call the op declares (``@op.samples``, or defaults from its traits) it checks that
  * the inferred output Specs equal the kernel's real outputs (and stay consistent when the leading
    dim is unknown),
  * the float32, float16 and bfloat16 forward passes agree with the float64 one, to their precision (TOLERANCES),
  * analytic gradients match numeric ones (``gradcheck``), and second derivatives too where the op
    is twice differentiable (``gradgradcheck``),
  * every SBP signature the op has (``@op.sbp``, and those its traits give) computes, on simulated ranks, the
    blocks of what the op computes on whole values (``_check_sbp``),
and it makes wrong calls that must fail with errors naming the op and the argument: a missing argument,
a string for a tensor, a disallowed dtype, an attr of the wrong type, an unknown keyword, an input of
the wrong rank (where the op refuses it), and attr values the op's own ``@op.check`` refuses.
``check_all`` runs it on many ops and returns every report without raising.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..core import dtypes as D
from ..core.devices import default_device, get_device, using_device
from ..core.errors import ArgumentError, GradientError, OpforgeError, ShapeError
from ..core.opdef import OpDef, Sample, registry
from ..core.spec import Spec
from ..tensor import Tensor, wrap
from .gradcheck import _host, gradcheck, gradgradcheck


class ConformanceError(AssertionError):
    """An op failed a conformance check; the message lists every failure."""


# A narrower float vs float64 forward: |y − y64| ≤ atol·scale + rtol·|y64|, where scale is the largest magnitude
# among the float64 inputs and outputs (at least 1), so rounding the inputs to the narrow dtype may move an output
# by some rounding errors (D.EPS) of the largest value involved, no more. float32 allows ~840 and ~84 of its eps
# (1.2e-7). The half dtypes (eps 9.8e-4 for float16, 7.8e-3 for bfloat16) allow ~5: their kernels compute in
# float32 and round once (opforge.ops.half), and the library's ops stay within 0.5 eps of float16 and 0.7 eps of
# bfloat16 on their samples; a kernel that accumulated in the half dtype would not.
TOLERANCES = {D.float32: (1e-4, 1e-5), D.float16: (5e-3, 5e-3), D.bfloat16: (4e-2, 4e-2)}  # (rtol, atol)
FLOAT32_RTOL, FLOAT32_ATOL = TOLERANCES[D.float32]
NARROW = tuple(TOLERANCES)  # the dtypes each float sample also runs in, after float64


@dataclass
class OpReport:
    op: str
    samples: int = 0
    checked: list = field(default_factory=list)  # lines saying what was verified
    failures: list = field(default_factory=list)
    warnings: list = field(default_factory=list)  # eager/infer disagreements outside the samples (see strict=)
    order: int = 0  # highest derivative order verified
    errors: dict = field(default_factory=dict)  # dtype name -> worst |y − y64| / tolerance (≤ 1 passes)

    @property
    def float32_error(self) -> float:
        return self.errors.get("float32", 0.0)

    def __str__(self) -> str:
        head = f"{self.op}: {self.samples} sample(s), " + (
            "not differentiable" if self.order == 0 else f"gradients checked to order {self.order}")
        body = ([f"  ok   {c}" for c in self.checked] + [f"  warn {w}" for w in self.warnings]
                + [f"  FAIL {f}" for f in self.failures])
        return "\n".join([head, *body])


def _resolve(op) -> OpDef:
    if isinstance(op, OpDef):
        return op
    if isinstance(op, str):
        return registry.get(op)
    opdef = getattr(op, "opdef", None)
    if isinstance(opdef, OpDef):
        return opdef
    raise TypeError(f"check_op(): expected an op, its name or its function, got {op!r}")


def default_samples(opdef: OpDef, rng: np.random.Generator):
    """Samples from the traits: shapes incl. 0-d for elementwise ops, broadcasting pairs for broadcast ones."""
    if opdef.attrs and any(not p.has_default for p in opdef.attrs):
        raise ConformanceError(
            f"op '{opdef.name}' has attrs without defaults ({[p.name for p in opdef.attrs if not p.has_default]}),"
            f" so no samples can be made up for it: declare some with @{opdef.name}.samples"
        )
    if "elementwise" in opdef.traits:
        shapes = [[(2, 3)] * len(opdef.inputs), [(5,)] * len(opdef.inputs), [()] * len(opdef.inputs)]
    elif "broadcast" in opdef.traits and len(opdef.inputs) == 2:
        shapes = [[(2, 3), (2, 3)], [(2, 3), (3,)], [(), (2, 1)], [(4, 1), (1, 3)], [(), ()]]
    else:
        raise ConformanceError(
            f"op '{opdef.name}' declares no samples and its traits give none: add @{opdef.name}.samples"
        )
    for group in shapes:
        yield Sample(tuple(rng.standard_normal(s) for s in group), {})


def _to_tensor(value, dtype=None, requires_grad=False):
    """A sample's array as a tensor on the device being checked (the default device: see ``check_op``)."""
    if isinstance(value, np.ndarray):
        array = value.astype(dtype) if (dtype is not None and value.dtype.kind == "f") else value
        return _on_device(array, requires_grad and D.is_floating(array.dtype))
    return value


def _on_device(array: np.ndarray, requires_grad: bool = False) -> Tensor:
    device = default_device()
    return wrap(device.from_host(array), device, requires_grad=requires_grad)


def call_op(op, inputs, kwargs: dict):
    """The op (an ``OpDef`` or its name) called on ``inputs`` in the order of its tensor inputs, by name (an attr
    may come before an input in the op's positional order, torch's ``gather(x, dim, index)``), and ``kwargs``: how
    a sample (``Sample.of(x, index, axis=1)``) is called."""
    opdef = registry.get(op) if isinstance(op, str) else op
    return opdef.fn(**dict(zip(opdef.input_names, inputs)), **kwargs)


def _materialize(opdef: OpDef, sample: Sample, dtype=None, requires_grad=False) -> tuple:
    args = []
    for i, value in enumerate(sample.args):
        p = opdef.inputs[i] if i < len(opdef.inputs) else None
        grad_ok = requires_grad and (p is None or p.differentiable)
        if isinstance(value, list):
            args.append([_to_tensor(v, dtype, grad_ok) for v in value])
        else:
            args.append(_to_tensor(value, dtype, grad_ok))
    kwargs = {k: _to_tensor(v, dtype, requires_grad) for k, v in sample.kwargs.items()}
    return tuple(args), kwargs


def _specs(opdef: OpDef, args, kwargs) -> tuple[list, dict]:
    values = dict(zip(opdef.input_names, args)) | {k: v for k, v in kwargs.items() if k in opdef.input_names}
    specs = []
    for p in opdef.inputs:
        v = values.get(p.name)
        if isinstance(v, list):
            specs.append([Spec(t.shape, t.dtype) for t in v])
        else:
            specs.append(None if v is None else Spec(v.shape, v.dtype))
    attrs = {p.name: kwargs.get(p.name, p.default) for p in opdef.attrs}
    from ..core.schema import check_attr

    attrs = {p.name: check_attr(p, attrs[p.name], opdef.name) for p in opdef.attrs}
    return specs, attrs


def _flat(result) -> list:
    items = list(result) if isinstance(result, tuple) else [result]
    return [t for item in items for t in (item if isinstance(item, list) else [item])]


def _flat_specs(inferred) -> list:
    return [s for item in inferred for s in (item if isinstance(item, (list, tuple))
                                             and not isinstance(item, Spec) else [item])]


def _compare_specs(opdef: OpDef, inferred, actual: list, report: OpReport, tag: str) -> bool:
    """Inferred Specs against the kernel's real outputs; one failure line for the first mismatch."""
    inferred_flat = _flat_specs(inferred)
    if len(inferred_flat) != len(actual):
        report.failures.append(f"{tag}: infer gives {len(inferred_flat)} outputs, the kernel {len(actual)}")
        return False
    data_shaped = "data_shaped" in opdef.traits  # its None dims are the sizes the data decides
    for name, s, t in zip(opdef.output_names * len(actual), inferred_flat, actual):
        shape = tuple(n if d is None and data_shaped else d for d, n in zip(s.shape, t.shape))
        if len(s.shape) != t.ndim or shape != t.shape or s.dtype != t.dtype:
            report.failures.append(f"{tag}: output '{name}' inferred {s}, kernel gave {Spec(t.shape, t.dtype)}")
            return False
    return True


@contextmanager
def _seeded(opdef: OpDef, seed: int):
    """For a ``random`` op: the same draws in every call made inside (the caller's generator is put back)."""
    if "random" not in opdef.traits:
        yield
        return
    # A stream of its own: seeded like the samples, the draws would equal the sample values themselves.
    device = default_device()
    with device.drawing_from(device.new_generator([seed, 0x5EED])):
        yield


def _check_inference(opdef: OpDef, args, kwargs, report: OpReport, tag: str) -> list:
    """Check inferred Specs against one call's outputs, and return those outputs (flat)."""
    specs, attrs = _specs(opdef, args, kwargs)
    inferred = opdef.infer_specs(specs, attrs)
    actual = _flat(call_op(opdef, args, kwargs))
    if not _compare_specs(opdef, inferred, actual, report, tag):
        return actual
    # The same call with the leading dim of each input unknown must infer something compatible.
    unknown = [[Spec((None, *x.shape[1:]), x.dtype) if x.shape else x for x in s] if isinstance(s, list) else
               (Spec((None, *s.shape[1:]), s.dtype) if s is not None and s.shape else s) for s in specs]
    try:
        partial = opdef.infer_specs(unknown, attrs)
    except OpforgeError:
        return actual  # some ops need every dim to infer (reshape to a fixed shape, say): that is allowed
    for s, t in zip(_flat_specs(partial), actual):
        if not Spec(t.shape, t.dtype).matches(s) and s.shape is not None:
            report.failures.append(f"{tag}: with the leading dim unknown, infer gives {s}, "
                                   f"which the real output {Spec(t.shape, t.dtype)} does not fit")
    return actual


def _float_arrays(sample: Sample) -> list:
    values = [*sample.args, *sample.kwargs.values()]
    flat = [v for value in values for v in (value if isinstance(value, list) else [value])]
    return [v for v in flat if isinstance(v, np.ndarray) and v.dtype.kind == "f"]


def _check_precision(opdef: OpDef, sample: Sample, out64: list, out: list, dtype, report: OpReport,
                     tag: str) -> None:
    """The float outputs of the call in a narrower ``dtype`` must agree with the float64 call's (TOLERANCES)."""
    rtol, atol = TOLERANCES[dtype]
    magnitudes = [np.abs(a[np.isfinite(a)]).max(initial=0.0) for a in _float_arrays(sample)]
    magnitudes += [np.abs(_host(y)[np.isfinite(_host(y))]).max(initial=0.0) for y in out64
                   if D.is_floating(y.dtype)]
    scale = max([1.0, *map(float, magnitudes)])
    for k, (a, b) in enumerate(zip(out64, out)):
        if not D.is_floating(a.dtype) or not D.is_floating(b.dtype) or a.shape != b.shape:
            continue  # exact dtypes and shapes are the inference check's business
        y64, y = _host(a), _host(b).astype(np.float64)
        same = (y64 == y) | (np.isnan(y64) & np.isnan(y))  # equal infinities and NaNs agree
        err = np.where(same, 0.0, np.abs(y64 - y))
        err = np.where(np.isnan(err), np.inf, err)
        tol = atol * scale + rtol * np.abs(np.nan_to_num(y64, posinf=0.0, neginf=0.0))
        ratio = err / tol
        worst = float(ratio.max(initial=0.0))
        report.errors[str(dtype)] = max(report.errors.get(str(dtype), 0.0), worst)
        if worst > 1:
            i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
            name = opdef.output_names[k] if k < len(opdef.output_names) else f"#{k}"
            report.failures.append(
                f"{tag}: output '{name}' in {dtype} differs from float64 at index {tuple(map(int, i))}: "
                f"{y[i]:.8g} vs {y64[i]:.8g} (tolerance {tol[i]:.3g} = {atol:g}·{scale:.3g} + "
                f"{rtol:g}·|y|); does the kernel compute in a narrower type, or promote?")


def _accepts(opdef: OpDef, sample: Sample, dtype) -> bool:
    """Whether every input that gets a float array in ``sample`` accepts ``dtype``."""
    for p, value in zip(opdef.inputs, sample.args):
        arrays = value if isinstance(value, list) else [value]
        if p.dtypes is not None and dtype not in p.dtypes and any(
                isinstance(a, np.ndarray) and a.dtype.kind == "f" for a in arrays):
            return False
    return True


def _check_program(opdef: OpDef, sample: Sample, report: OpReport, tag: str) -> None:
    """The op traced into a program (its gradient appended) gives what eager mode gives, in float64."""
    from ..autodiff import grad
    from ..program import Executor, append_backward, trace

    args, kwargs = _materialize(opdef, sample, np.float64)
    slots = [[f"a{i}_{j}" for j in range(len(a))] if isinstance(a, list) else
             (f"a{i}" if isinstance(a, Tensor) else None) for i, a in enumerate(args)]
    feeds = {}
    for a, slot in zip(args, slots):
        for t, name in zip(a if isinstance(a, list) else [a], slot if isinstance(slot, list) else [slot]):
            if name is not None:
                feeds[name] = t
    rng = np.random.default_rng(3)
    eager_out = [t for t in _flat(call_op(opdef, args, kwargs))]
    cotangents = [rng.standard_normal(t.shape) if t.dtype == np.float64 else None for t in eager_out]
    wrt = [n for n, t in feeds.items() if t.dtype == np.float64 and _differentiable_slot(opdef, n)]
    want_grads = "no_grad" not in opdef.traits and opdef.grad_rule is not None and wrt and \
        any(c is not None for c in cotangents)

    def rebuild(values):
        return [[values[n] for n in slot] if isinstance(slot, list) else (values[slot] if slot else a)
                for a, slot in zip(args, slots)]

    def fn(**variables):
        outs = _flat(call_op(opdef, rebuild(variables), kwargs))
        result = {f"out{k}": o for k, o in enumerate(outs)}
        if want_grads:
            terms = [F.sum(o * _on_device(c)) for o, c in zip(outs, cotangents) if c is not None]
            result["loss"] = terms[0] if len(terms) == 1 else F.add_n(terms)
        return result

    from .. import ops as F

    program = trace(fn, **{n: Spec(t.shape, t.dtype) for n, t in feeds.items()})
    fetch = {k: v for k, v in program.outputs.items()}
    if want_grads:
        grads = append_backward(program, program.outputs["loss"], wrt=wrt)  # keyed "<input>@GRAD"
        fetch.update({f"d{key.removesuffix('@GRAD')}": g for key, g in grads.items()})
    got = Executor(program, fetch=fetch).run(feeds)
    got = {k: program.device.to_host(v) for k, v in got.items()}
    for k, t in enumerate(eager_out):
        if not np.allclose(got[f"out{k}"], _host(t), rtol=1e-10, atol=1e-12, equal_nan=True):
            report.failures.append(f"{tag}: program output {k} differs from eager")
            return
    if want_grads:
        leaves = {n: wrap(t._data, t.device, requires_grad=True) for n, t in feeds.items() if n in wrt}
        values = {n: leaves.get(n, t) for n, t in feeds.items()}
        outs = _flat(call_op(opdef, rebuild(values), kwargs))
        pairs = [(o, _on_device(c)) for o, c in zip(outs, cotangents) if c is not None and o.requires_grad]
        if not pairs:
            return
        eager_grads = grad([o for o, _ in pairs], list(leaves.values()), grad_outputs=[c for _, c in pairs],
                           allow_unused=True)
        for n, g in zip(leaves, eager_grads):
            expected = np.zeros(feeds[n].shape) if g is None else _host(g)
            if f"d{n}" in got and not np.allclose(got[f"d{n}"], expected, rtol=1e-9, atol=1e-12, equal_nan=True):
                report.failures.append(f"{tag}: program gradient of input {n} differs from eager")
                return


def _differentiable_slot(opdef: OpDef, name: str) -> bool:
    index = int(name[1:].split("_")[0])
    return index >= len(opdef.inputs) or opdef.inputs[index].differentiable


def _check_gradients(opdef: OpDef, sample: Sample, report: OpReport, tag: str, seed: int = 0) -> None:
    args, kwargs = _materialize(opdef, sample, np.float64, requires_grad=True)
    names = list(opdef.input_names[:len(args)])
    flat_inputs, labels = [], []
    for name, a in zip(names, args):
        if isinstance(a, list):
            flat_inputs += a
            labels += [f"{name}[{k}]" for k in range(len(a))]
        else:
            flat_inputs.append(a)
            labels.append(name)

    def call(*flat):  # a random op draws the same numbers at every point the numeric check evaluates
        it = iter(flat)
        rebuilt = [[next(it) for _ in a] if isinstance(a, list) else next(it) for a in args]
        with _seeded(opdef, seed):
            return call_op(opdef, rebuilt, kwargs)

    if not any(isinstance(t, Tensor) and t.requires_grad for t in flat_inputs):
        return
    narrow = [t.dtype for t in _flat(call(*flat_inputs)) if D.is_floating(t.dtype) and t.dtype != np.float64]
    if narrow:  # central differences need float64 outputs to be exact enough
        report.checked.append(f"{tag}: gradients not checked numerically, the output is {narrow[0]}")
        return
    try:
        gradcheck(call, flat_inputs, names=labels, name=opdef.name)
    except (AssertionError, OpforgeError) as e:
        report.failures.append(f"{tag}: first derivatives\n{e}")
        return
    report.order = max(report.order, 1)
    try:
        gradgradcheck(call, flat_inputs, names=labels, name=opdef.name)
    except GradientError as e:
        if "has no gradient rule" not in str(e):
            report.failures.append(f"{tag}: second derivatives\n{e}")
        else:
            report.checked.append(f"{tag}: not twice differentiable ({str(e).split(',')[0]})")
        return
    except (AssertionError, OpforgeError) as e:
        report.failures.append(f"{tag}: second derivatives\n{e}")
        return
    report.order = max(report.order, 2)


def _expect_error(report: OpReport, what: str, call, *must_mention: str) -> None:
    try:
        call()
    except (TypeError, ValueError, LookupError) as e:
        text = str(e)
        missing = [m for m in must_mention if m not in text]
        if missing:
            report.failures.append(f"wrong call ({what}) raised {type(e).__name__} without naming "
                                   f"{missing}: {text}")
        return
    report.failures.append(f"wrong call ({what}) did not raise")


SBP_RANKS = (2, 3)  # the simulated meshes: each signature is checked on every one its sample splits evenly on


def _check_sbp(opdef: OpDef, sample: Sample, rng: np.random.Generator, checked: dict, report: OpReport,
               tag: str) -> None:
    """Every SBP signature of the op, checked numerically on simulated ranks in one process (no communicator: the
    op itself holds no collective). The sample's float64 inputs are laid out as the signature says — cut into
    blocks (``S(k)``), given whole to every rank (``B``), or as random parts that add up (``P``) or average
    (``P("mean")``) to them — the op runs once per rank, with the attrs the signature gives for the blocks, and the
    ranks' outputs put together (``S(k)``: concatenated; ``B``: each must be the whole; ``P``: summed or averaged)
    must be the op's output on the whole inputs. A ``Decomposition`` (ops that compute the op, each with checked
    signatures of its own) must compute the op on whole values. ``checked`` collects, per signature, whether some
    sample checked it."""
    from ..core.sbp import B, normalized, on_rank, signatures

    args, kwargs = _materialize(opdef, sample, np.float64)
    specs, attrs = _specs(opdef, args, kwargs)
    values = dict(zip(opdef.input_names, args)) | {k: v for k, v in kwargs.items() if k in opdef.input_names}
    given = {k: v for k, v in kwargs.items() if k not in opdef.input_names}
    whole = [_host(t) for t in _flat(call_op(opdef, args, kwargs))]
    for ranks in SBP_RANKS:
        try:
            found = signatures(opdef, specs, attrs, ranks)
        except Exception as e:
            report.failures.append(f"{tag}: the SBP rule raised {type(e).__name__}: {e}")
            return
        for ins, outs, local, via in found:
            name = f"{tuple(ins)} -> {'its decomposition' if via else tuple(outs)}".replace("'", "")
            if via is not None:  # ops with signatures of their own: on whole values, it must compute the op
                result = via(*[values.get(p.name) for p in opdef.inputs], **attrs)
                problem = _put_together(whole, [[_host(t) for t in _flat(result)]], (B,), 1, normalized)
                if problem is not None:
                    report.failures.append(f"{tag}: SBP decomposition {via.__name__} on whole values: {problem}")
                    return
                checked[name] = True
                continue
            if all(lay is None or lay == B for lay in ins) and all(lay == B for lay in outs):
                continue  # every value whole: the op itself
            checked.setdefault(name, False)
            per_rank = [[] for _ in range(ranks)]
            for p, layout in zip(opdef.inputs, ins):
                value = values.get(p.name)
                tensors = value if isinstance(value, list) else [value]
                pieces = [_laid_out(t, layout, ranks, rng) for t in tensors]
                if any(piece is False for piece in pieces):
                    break  # a split that does not divide the sample's dim, or a partial integer
                for r in range(ranks):
                    rank_value = [piece[r] for piece in pieces]
                    per_rank[r].append(rank_value if isinstance(value, list) else rank_value[0])
            else:
                results = []
                for r in range(ranks):
                    inputs = [_on_device(v) if isinstance(v, np.ndarray) else
                              [_on_device(a) for a in v] if isinstance(v, list) else v for v in per_rank[r]]
                    while inputs and inputs[-1] is None:
                        inputs.pop()
                    try:
                        results.append([_host(t) for t in _flat(call_op(opdef, inputs, given | on_rank(local, r)))])
                    except OpforgeError as e:
                        report.failures.append(f"{tag}: SBP signature {name} on {ranks} ranks: rank {r}'s call "
                                               f"failed: {type(e).__name__}: {e}")
                        return
                wrong = _put_together(whole, results, outs, ranks, normalized)
                if wrong is not None:
                    report.failures.append(f"{tag}: SBP signature {name} (attrs on the blocks {local}) on {ranks} "
                                           f"simulated ranks: {wrong}")
                    return
                checked[name] = True


def _laid_out(value, layout, ranks: int, rng: np.random.Generator):
    """What each of ``ranks`` ranks holds of ``value`` (a Tensor, or None) under ``layout``: a list of arrays (or
    Nones), or False where the layout cannot hold it (an uneven split, a partial integer)."""
    if value is None or layout is None:
        return [None] * ranks
    x = _host(value)
    if layout.split:
        axis = layout.axis % max(x.ndim, 1) if x.ndim else None
        if axis is None or x.shape[axis] % ranks:
            return False
        return np.split(x, ranks, axis=axis)
    if layout.partial:
        if x.dtype.kind != "f":
            return False
        parts = [np.asarray(rng.standard_normal(x.shape)) for _ in range(ranks - 1)]
        rest = np.asarray(x - np.sum(parts, axis=0))
        parts.append(rest)
        return [np.asarray(p * ranks) for p in parts] if layout.reduce == "mean" else parts
    return [x] * ranks


def _put_together(whole: list, results: list, outs: tuple, ranks: int, normalized) -> str | None:
    """What is wrong with the ranks' outputs put together under ``outs``, against the whole outputs (None: nothing)."""
    for k, (want, layout) in enumerate(zip(whole, outs * len(whole) if len(outs) == 1 else outs)):
        blocks = [r[k] for r in results]
        if layout.split:
            try:
                axis = normalized(layout, want.ndim).axis
                got = np.concatenate(blocks, axis=axis)
            except (ArgumentError, ValueError) as e:
                return f"output {k}: the blocks do not concatenate along {layout}: {e}"
        elif layout.partial:
            if any(b.shape != want.shape for b in blocks):
                return f"output {k}: partial values of shapes {[b.shape for b in blocks]}, the whole is {want.shape}"
            got = np.sum(blocks, axis=0) / (ranks if layout.reduce == "mean" else 1)
        else:
            for r, b in enumerate(blocks):
                problem = _differs(b, want)
                if problem:
                    return f"output {k} is B, but rank {r}'s is not the whole output: {problem}"
            continue
        problem = _differs(got, want)
        if problem:
            return f"output {k}, put together from the ranks' {layout} blocks: {problem}"
    return None


def _differs(got: np.ndarray, want: np.ndarray) -> str | None:
    if got.shape != want.shape:
        return f"shape {got.shape}, the whole op gives {want.shape}"
    if want.dtype.kind != "f":
        ok = np.array_equal(got, want)
    else:
        scale = max(1.0, float(np.abs(want[np.isfinite(want)]).max(initial=0.0)))
        ok = np.allclose(got, want, rtol=1e-9, atol=1e-11 * scale, equal_nan=True)
    if ok:
        return None
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return f"differs from the whole op's output by up to {float(np.nanmax(diff)):.3g}"


def _check_wrong_calls(opdef: OpDef, sample: Sample, report: OpReport, strict: bool = False) -> None:
    args, kwargs = _materialize(opdef, sample)
    fn = opdef.fn
    name = opdef.name
    required = [p.name for p in opdef.inputs if not p.has_default]
    if required and len(args) <= len(opdef.inputs):
        given = dict(zip(opdef.input_names, args))
        left_out = required[-1]  # every other argument by keyword, the last required input missing
        _expect_error(report, "missing argument",
                      lambda: fn(**{k: v for k, v in given.items() if k != left_out}, **kwargs), name, left_out)
    if opdef.inputs and len(args) == len(opdef.inputs):
        first = opdef.inputs[0]
        _expect_error(report, "a string for a tensor", lambda: call_op(opdef, ("text", *args[1:]), kwargs), name,
                      first.name)
        for p in opdef.inputs:
            i = opdef.inputs.index(p)
            if p.dtypes is not None and not p.is_list and isinstance(args[i], Tensor):
                bad = next((d for d in D.SUPPORTED if d not in p.dtypes), None)
                if bad is not None:
                    wrong = list(args)
                    wrong[i] = _on_device(np.zeros(args[i].shape, bad))
                    _expect_error(report, f"dtype {bad} for '{p.name}'", lambda w=wrong: call_op(opdef, w, kwargs),
                                  name, p.name)
    for p in opdef.attrs:
        bad_value = 1.5 if p.type == "str" else "not-a-value"
        if p.type == "dtype":
            bad_value = "complex128"
        _expect_error(report, f"bad type for attr '{p.name}'",
                      lambda p=p, v=bad_value: call_op(opdef, args, {**kwargs, p.name: v}), name, p.name)
    _expect_error(report, "unknown keyword", lambda: call_op(opdef, args, {**kwargs, "no_such_argument": 1}), name,
                  "no_such_argument")
    _check_wrong_rank(opdef, args, kwargs, report, strict)
    _check_attr_values(opdef, args, kwargs, report)


def _kernel_failure(error: Exception) -> bool:
    """True for dispatch's fallback error: the kernel raised and no infer rule or check explained why."""
    return isinstance(error, ShapeError) and error.__cause__ is not None \
        and not isinstance(error.__cause__, OpforgeError)


def _check_wrong_rank(opdef: OpDef, args: tuple, kwargs: dict, report: OpReport, strict: bool = False) -> None:
    """Call the op with its first tensor input one dim longer and one dim shorter.

    An op may accept any rank. Where the kernel refuses the call, the infer rule must refuse it first, with
    a ShapeError/ArgumentError naming the op (errors never come from deep inside NumPy), and an infer rule
    must never crash. Where the eager call succeeds, the infer rule should agree with it: refuse it too
    (NumPy broadcasting often lets a kernel accept more than its rule), or infer the Specs the kernel gave.
    Eager calls run the kernel without the infer rule, so such a disagreement is a *warning* (a failure
    with ``strict=True``): eager and program mode would treat the call differently.
    """
    disagreements = report.failures if strict else report.warnings
    i = next((k for k, (p, a) in enumerate(zip(opdef.inputs, args)) if not p.is_list and isinstance(a, Tensor)),
             None)
    if i is None:
        return
    p, x = opdef.inputs[i], _host(args[i])
    variants = [("one more leading dim", np.stack([x, x]))]
    if x.ndim:
        variants.append(("its leading dim dropped", x[0].copy()))
    for what, array in variants:
        wrong = (*args[:i], _on_device(array), *args[i + 1:])
        tag = f"wrong rank ('{p.name}' of shape {array.shape} instead of {x.shape}, {what})"
        specs, attrs = _specs(opdef, wrong, kwargs)
        try:
            inferred, refused = opdef.infer_specs(specs, attrs), None
        except (ShapeError, ArgumentError) as e:
            inferred, refused = None, e
        except Exception as e:
            report.failures.append(f"{tag}: the infer rule crashed with {type(e).__name__}: {e}; it should raise "
                                   f"ShapeError naming the op")
            continue
        try:
            actual, failed = _flat(call_op(opdef, wrong, kwargs)), None
        except Exception as e:
            actual, failed = None, e
        if refused is None and failed is None:
            probe = OpReport(opdef.name)
            if not _compare_specs(opdef, inferred, actual, probe, tag):
                disagreements.extend(probe.failures)
        elif refused is None:
            report.failures.append(f"{tag}: the kernel fails but the infer rule accepts the shapes; it should raise "
                                   f"ShapeError naming the op. The call raised {type(failed).__name__}: {failed}")
        elif failed is None:
            disagreements.append(f"{tag}: the infer rule refuses it ({refused}) but the eager call runs the kernel "
                                 f"and returns {[t.shape for t in actual]}; the kernel should refuse it too")
        elif not isinstance(failed, (ShapeError, ArgumentError)) or opdef.name not in str(failed):
            report.failures.append(f"{tag}: raised {type(failed).__name__} without naming the op: {failed}")


_NONSENSE = "__no_such_value__"


def _check_attr_values(opdef: OpDef, args: tuple, kwargs: dict, report: OpReport) -> None:
    """Attr values of the right type that the op refuses must be refused by ``@op.check`` or the infer rule.

    Which values are wrong cannot be known in general. Two cases can: a value the op's own check function
    refuses (tried: -1 and 0 for ints; -1, 0, nan and inf for floats) must fail the call with an error naming
    the op and the argument; and a nonsense string for a str attr, where the op refuses it at all, must be
    refused with an error naming the argument or the value — not by a kernel failing on it.
    """
    _, attrs = _specs(opdef, args, kwargs)
    for p in opdef.attrs:
        if p.is_list:
            continue
        if p.type == "str":
            values = [_NONSENSE]
        elif opdef.check_fn is not None and p.type in _CHECK_CANDIDATES:
            values = [v for v in _CHECK_CANDIDATES[p.type] if _refused_by_check(opdef, attrs, p.name, v, report)]
        else:
            continue
        for value in values:
            what = f"attr {p.name}={value!r}"
            try:
                call_op(opdef, args, {**kwargs, p.name: value})
            except Exception as e:
                text = str(e)
                if _kernel_failure(e):
                    report.failures.append(f"{what}: only the kernel refused it ({text}); refuse it in @"
                                           f"{opdef.name}.check (a ValueError naming the argument) or the infer rule")
                elif not isinstance(e, OpforgeError) or opdef.name not in text or (
                        p.name not in text and str(value) not in text):
                    report.failures.append(f"{what}: raised {type(e).__name__} without naming the op and the "
                                           f"argument: {text}")
                continue
            if p.type != "str":  # a str attr may take any string (a free-form label, say)
                report.failures.append(f"{what}: the op's check refuses it, but the call did not raise")


_CHECK_CANDIDATES = {"int": [-1, 0], "float": [-1.0, 0.0, float("nan"), float("inf")]}


def _refused_by_check(opdef: OpDef, attrs: dict, name: str, value, report: OpReport) -> bool:
    try:
        opdef.check_fn(**{**attrs, name: value})
    except (ValueError, TypeError):
        return True
    except Exception as e:
        report.failures.append(f"attr {name}={value!r}: the check function raised {type(e).__name__} ({e}); "
                               f"it should raise ValueError naming the argument")
    return False


def check_op(op, *, seed: int = 0, samples=None, raise_on_failure: bool = True, strict: bool = False,
             device=None) -> OpReport:
    """Run the conformance checks on one op (an OpDef, its name, or its ``opforge.ops`` function).

    ``strict=True`` makes the report's warnings (eager calls that the infer rule would refuse or type
    differently, found by the wrong-rank probe) failures too. ``device`` (default: the default device) is where
    the sample tensors are made, the kernels run and the programs execute.
    """
    if device is not None:
        with using_device(get_device(device, "check_op()")):
            return check_op(op, seed=seed, samples=samples, raise_on_failure=raise_on_failure, strict=strict)
    opdef = _resolve(op)
    report = OpReport(opdef.name)
    rng = np.random.default_rng(seed)
    if samples is None:
        samples = list(opdef.samples_fn(rng)) if opdef.samples_fn else list(default_samples(opdef, rng))
    if not samples:
        raise ConformanceError(f"op '{opdef.name}': its samples function yielded nothing")
    report.samples = len(samples)
    differentiable = "no_grad" not in opdef.traits
    if differentiable and opdef.grad_rule is None:
        report.failures.append("the op has no gradient rule and no 'no_grad' trait")
    inference_failures = precision_failures = precision_samples = program_failures = sbp_failures = 0
    sbp_checked: dict = {}  # signature -> whether a sample checked it
    for k, sample in enumerate(samples):
        tag = f"sample {k}"
        outputs = {}
        for dtype in (D.float64, *NARROW):
            if not _accepts(opdef, sample, dtype) or (dtype != D.float64 and not _float_arrays(sample)):
                continue
            args, kwargs = _materialize(opdef, sample, dtype)
            before = len(report.failures)
            try:
                with _seeded(opdef, seed + k):
                    outputs[dtype] = _check_inference(opdef, args, kwargs, report, f"{tag} ({np.dtype(dtype)})")
            except OpforgeError as e:
                report.failures.append(f"{tag} ({np.dtype(dtype)}): {type(e).__name__}: {e}")
            inference_failures += len(report.failures) - before
        if D.float64 in outputs and _float_arrays(sample):
            before = len(report.failures)
            for dtype in NARROW:
                if dtype in outputs:
                    _check_precision(opdef, sample, outputs[D.float64], outputs[dtype], dtype, report, tag)
            precision_failures += len(report.failures) - before
            precision_samples += 1
        if differentiable and opdef.grad_rule is not None:
            _check_gradients(opdef, sample, report, tag, seed + k)
        if "random" not in opdef.traits:
            before = len(report.failures)
            try:
                _check_program(opdef, sample, report, tag)
            except OpforgeError as e:
                report.failures.append(f"{tag}: in a program: {type(e).__name__}: {e}")
            program_failures += len(report.failures) - before
            before = len(report.failures)
            try:
                _check_sbp(opdef, sample, np.random.default_rng([seed, k]), sbp_checked, report, tag)
            except OpforgeError as e:
                report.failures.append(f"{tag}: SBP signatures: {type(e).__name__}: {e}")
            sbp_failures += len(report.failures) - before
    if not inference_failures:
        report.checked.append("inferred Specs equal the kernel's outputs (float samples in float64, float32, float16 "
                              "and bfloat16)")
    if not program_failures and "random" not in opdef.traits:
        report.checked.append("traced into a program, outputs and gradients equal eager mode's")
    if precision_samples and not precision_failures:
        worst = ", ".join(f"{name} {e:.2g}" for name, e in report.errors.items())
        report.checked.append(f"float32 outputs agree with float64 ones, and float16 and bfloat16 ones too (worst "
                              f"error, as a share of the tolerance: {worst})")
    if report.order and not any("derivatives" in f for f in report.failures):
        report.checked.append(f"gradients match central differences to order {report.order}")
    if sbp_checked:
        never = [name for name, done in sbp_checked.items() if not done]
        if never and opdef.sbp_fn is not None:  # (a trait's signature may fit no sample: it is checked where it fits)
            report.failures.append(f"SBP signature(s) {never} could not be checked on any sample (none splits evenly "
                                   f"on {' or '.join(map(str, SBP_RANKS))} ranks): add a sample that does")
        elif not sbp_failures:
            report.checked.append(f"{len(sbp_checked) - len(never)} SBP signature(s) compute the blocks of the whole "
                                  f"result (simulated meshes of {' and '.join(map(str, SBP_RANKS))} ranks)")
    before = len(report.failures)
    _check_wrong_calls(opdef, samples[0], report, strict)
    if len(report.failures) == before:
        report.checked.append("wrong calls raise errors naming the op and the argument")
    if report.failures and raise_on_failure:
        raise ConformanceError(str(report))
    return report


def check_all(names=None, *, seed: int = 0, strict: bool = False, device=None) -> list[OpReport]:
    """``check_op`` on each named op (every registered op when None), in order, raising nothing.

    An op whose checks cannot even start (no samples, a samples function that crashes) gets a report
    with that failure. An unknown name is a KeyError, before anything runs.
    """
    opdefs = list(registry) if names is None else [_resolve(n) for n in names]
    reports = []
    for opdef in opdefs:
        try:
            reports.append(check_op(opdef, seed=seed, raise_on_failure=False, strict=strict, device=device))
        except Exception as e:
            reports.append(OpReport(opdef.name, failures=[f"the checks could not run: {type(e).__name__}: {e}"]))
    return reports
