"""``check_op``: the conformance checks every registered op goes through — the library's and yours.

For each sample call the op declares (``@op.samples``, or defaults from its traits) it checks that
  * the inferred output Specs equal the kernel's real outputs (and stay consistent when the leading
    dim is unknown),
  * analytic gradients match numeric ones (``gradcheck``), and second derivatives too where the op
    is twice differentiable (``gradgradcheck``),
and it makes wrong calls that must fail with errors naming the op and the argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core import dtypes as D
from ..core.errors import GradientError, OpforgeError
from ..core.opdef import OpDef, Sample, registry
from ..core.spec import Spec
from ..tensor import Tensor, _new
from .gradcheck import gradcheck, gradgradcheck


class ConformanceError(AssertionError):
    """An op failed a conformance check; the message lists every failure."""


@dataclass
class OpReport:
    op: str
    samples: int = 0
    checked: list = field(default_factory=list)  # lines saying what was verified
    failures: list = field(default_factory=list)
    order: int = 0  # highest derivative order verified

    def __str__(self) -> str:
        head = f"{self.op}: {self.samples} sample(s), " + (
            "not differentiable" if self.order == 0 else f"gradients checked to order {self.order}")
        body = [f"  ok   {c}" for c in self.checked] + [f"  FAIL {f}" for f in self.failures]
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
    if isinstance(value, np.ndarray):
        array = value.astype(dtype) if (dtype is not None and value.dtype.kind == "f") else value
        return _new(array, requires_grad and array.dtype.kind == "f")
    return value


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


def _check_inference(opdef: OpDef, args, kwargs, report: OpReport, tag: str) -> None:
    specs, attrs = _specs(opdef, args, kwargs)
    inferred = opdef.infer_specs(specs, attrs)
    actual = _flat(opdef.fn(*args, **kwargs))
    inferred_flat = [s for item in inferred for s in (item if isinstance(item, (list, tuple))
                                                       and not isinstance(item, Spec) else [item])]
    if len(inferred_flat) != len(actual):
        report.failures.append(f"{tag}: infer gives {len(inferred_flat)} outputs, the kernel {len(actual)}")
        return
    for name, s, t in zip(opdef.output_names * len(actual), inferred_flat, actual):
        if tuple(s.shape) != t.shape or s.dtype != t.dtype:
            report.failures.append(f"{tag}: output '{name}' inferred {s}, kernel gave {Spec(t.shape, t.dtype)}")
            return
    # The same call with the leading dim of each input unknown must infer something compatible.
    unknown = [[Spec((None, *x.shape[1:]), x.dtype) for x in s] if isinstance(s, list) else
               (Spec((None, *s.shape[1:]), s.dtype) if s is not None and s.shape else s) for s in specs]
    try:
        partial = opdef.infer_specs(unknown, attrs)
    except OpforgeError:
        return  # some ops need every dim to infer (reshape to a fixed shape, say): that is allowed
    partial_flat = [s for item in partial for s in (item if isinstance(item, (list, tuple))
                                                     and not isinstance(item, Spec) else [item])]
    for s, t in zip(partial_flat, actual):
        if not Spec(t.shape, t.dtype).matches(s) and s.shape is not None:
            report.failures.append(f"{tag}: with the leading dim unknown, infer gives {s}, "
                                   f"which the real output {Spec(t.shape, t.dtype)} does not fit")


def _check_gradients(opdef: OpDef, sample: Sample, report: OpReport, tag: str) -> None:
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

    def call(*flat):
        it = iter(flat)
        rebuilt = [[next(it) for _ in a] if isinstance(a, list) else next(it) for a in args]
        return opdef.fn(*rebuilt, **kwargs)

    if not any(isinstance(t, Tensor) and t.requires_grad for t in flat_inputs):
        return
    narrow = [t.dtype for t in _flat(call(*flat_inputs)) if t.dtype.kind == "f" and t.dtype != np.float64]
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


def _check_wrong_calls(opdef: OpDef, sample: Sample, report: OpReport) -> None:
    args, kwargs = _materialize(opdef, sample)
    fn = opdef.fn
    name = opdef.name
    if opdef.inputs and len(args) == len(opdef.inputs):
        _expect_error(report, "missing argument", lambda: fn(*args[:-1], **kwargs), name,
                      opdef.input_names[len(args) - 1])
        first = opdef.inputs[0]
        _expect_error(report, "a string for a tensor", lambda: fn("text", *args[1:], **kwargs), name, first.name)
        for p in opdef.inputs:
            i = opdef.inputs.index(p)
            if p.dtypes is not None and not p.is_list and isinstance(args[i], Tensor):
                bad = next((d for d in D.SUPPORTED if d not in p.dtypes), None)
                if bad is not None:
                    wrong = list(args)
                    wrong[i] = _new(np.zeros(args[i].shape, bad))
                    _expect_error(report, f"dtype {bad} for '{p.name}'", lambda w=wrong: fn(*w, **kwargs),
                                  name, p.name)
    for p in opdef.attrs:
        bad_value = 1.5 if p.type == "str" else "not-a-value"
        if p.type == "dtype":
            bad_value = "complex128"
        _expect_error(report, f"bad type for attr '{p.name}'",
                      lambda p=p, v=bad_value: fn(*args, **{**kwargs, p.name: v}), name, p.name)
    _expect_error(report, "unknown keyword", lambda: fn(*args, **kwargs, no_such_argument=1), name,
                  "no_such_argument")


def check_op(op, *, seed: int = 0, samples=None, raise_on_failure: bool = True) -> OpReport:
    """Run the conformance checks on one op (an OpDef, its name, or its ``opforge.ops`` function)."""
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
    inference_failures = 0
    for k, sample in enumerate(samples):
        tag = f"sample {k}"
        for dtype in (np.float64, np.float32):
            args, kwargs = _materialize(opdef, sample, dtype)
            before = len(report.failures)
            try:
                _check_inference(opdef, args, kwargs, report, f"{tag} ({np.dtype(dtype)})")
            except OpforgeError as e:
                report.failures.append(f"{tag} ({np.dtype(dtype)}): {type(e).__name__}: {e}")
            inference_failures += len(report.failures) - before
        if differentiable and opdef.grad_rule is not None:
            _check_gradients(opdef, sample, report, tag)
    if not inference_failures:
        report.checked.append("inferred Specs equal the kernel's outputs (float samples in float64 and float32)")
    if report.order and not any("derivatives" in f for f in report.failures):
        report.checked.append(f"gradients match central differences to order {report.order}")
    before = len(report.failures)
    _check_wrong_calls(opdef, samples[0], report)
    if len(report.failures) == before:
        report.checked.append("wrong calls raise errors naming the op and the argument")
    if report.failures and raise_on_failure:
        raise ConformanceError(str(report))
    return report
