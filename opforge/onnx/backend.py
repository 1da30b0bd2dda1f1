"""An ``onnx.backend.base.Backend`` over the importer and the Executor: what ONNX's own conformance harness
(``onnx.backend.test.BackendTest``) runs. Imports ``onnx``: load it only where onnx is installed."""

from __future__ import annotations

import numpy as np
import onnx.backend.base as base

from ..program.executor import Executor
from .importer import NeedsConstant, load
from .types import HELD, LOW_FLOATS, NARROW, value_kind


def _held(v: np.ndarray) -> np.ndarray:
    """A value of a type opforge holds in a wider one (types.HELD) as that one; others as they are."""
    if v.dtype in NARROW.values():
        return v.astype(np.int64)
    return v.astype(np.float32) if v.dtype in LOW_FLOATS.values() else v


class OpforgeRep(base.BackendRep):
    """A loaded model, ready to run: ``rep.run([x, ...])`` or ``rep.run({"x": x})`` -> outputs in graph order.

    Our ops take axes, shapes and pads as attributes. A model that feeds them as graph inputs is loaded again for
    each distinct value of those inputs, bound as constants (``load(model, bind=...)``)."""

    def __init__(self, model, program=None):
        self.model = model
        self.inputs = [vi.name for vi in model.graph.input if vi.name not in {t.name for t in model.graph.initializer}]
        self.program = program
        self.executor = Executor(program) if program is not None else None
        self._bound: dict = {}
        self.needed: set = set()  # graph inputs the importer needs as constants
        self.narrow = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.output
                       if vi.type.tensor_type.elem_type in HELD}
        self.outputs = [vi.name for vi in model.graph.output]
        self.kinds = {vi.name: value_kind(vi.type) for vi in model.graph.output}

    def run(self, inputs, **kwargs):
        feed = dict(inputs) if isinstance(inputs, dict) else dict(zip(self.inputs, inputs))
        # narrow integers (uint8, int8, int4, ...) and low-precision floats (float8, float4): held as int64 or
        # float32 (types.HELD), given back in their type
        # (sequences and optionals, lists and None, the importer takes bound: types.Seq)
        sequences = {k: v for k, v in feed.items() if v is None or isinstance(v, list)}
        feed = {k: _held(np.asarray(v)) for k, v in feed.items() if k not in sequences}
        executor = self.executor
        if executor is None:
            # integer inputs (axes, shapes, pads, indices), scalars (a ratio, a pad value) and the inputs the
            # importer asked for (Resize's scales): constants here
            while True:
                bind = {k: np.asarray(v) for k, v in feed.items()
                        if np.asarray(v).dtype.kind in "iub" or np.asarray(v).size <= 1 or k in self.needed}
                key = tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in sorted(bind.items()))
                key += tuple((k, None if v is None else tuple((a.dtype.str, a.shape, a.tobytes()) for a in v))
                             for k, v in sorted(sequences.items()))
                bind |= sequences
                executor = self._bound.get(key)
                if executor is not None:
                    break
                try:
                    executor = self._bound[key] = Executor(load(self.model, bind=bind))
                    break
                except NeedsConstant as e:
                    if e.input_name not in feed or e.input_name in self.needed:
                        raise
                    self.needed.add(e.input_name)
            feed = {k: v for k, v in feed.items() if k in executor.program.feeds}
        with np.errstate(all="ignore"):  # ONNX's semantics: log(0) is -inf, 0/0 NaN, without a warning
            out = executor.run(feed)
        return tuple(self._output(name, out) for name in self.outputs)

    def _output(self, name: str, out: dict):
        """Graph output ``name`` from the program's outputs: a sequence from its elements' (``name[k]``), an
        optional None when the program has none, a value of a narrow type in that type."""
        kind = self.kinds[name]
        if kind == "tensor" or (kind == "optional" and name in out):
            return out[name].astype(HELD[self.narrow[name]]) if name in self.narrow else out[name]
        elements = [out[f"{name}[{k}]"] for k in range(len(out)) if f"{name}[{k}]" in out]
        return None if kind == "optional" and not elements else elements


class OpforgeBackend(base.Backend):
    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        try:
            return OpforgeRep(model, load(model))
        except NeedsConstant as e:
            if e.input_name not in {vi.name for vi in model.graph.input}:
                raise
            rep = OpforgeRep(model)  # loaded at run time, with its integer inputs bound
            rep.needed.add(e.input_name)
            return rep

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"  # the CUDA device of issue 7 is not in this branch
