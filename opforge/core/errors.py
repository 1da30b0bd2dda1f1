"""The exceptions opforge raises. Each message names the op, the argument, what was expected and what came."""


class OpforgeError(Exception):
    """Base class of every error opforge raises on purpose."""


class SchemaError(OpforgeError, ValueError):
    """An op signature string that does not parse, or an op definition that contradicts it."""


class ArgumentError(OpforgeError, TypeError):
    """A call that does not fit the op's schema: wrong type, wrong dtype, bad attribute value."""


class ShapeError(OpforgeError, ValueError):
    """Shapes that the op cannot accept (found by its infer function)."""


class DispatchError(OpforgeError, LookupError):
    """No kernel for the device and dtype a call asked for."""


class AnomalyError(OpforgeError, FloatingPointError):
    """Under ``of.detect_anomaly()``: an op's forward or backward produced NaN or infinity."""


class DivisionByZeroError(OpforgeError, ValueError, ZeroDivisionError):
    """An integer division or remainder by zero (``//``, ``%``): no integer is the answer. Also a
    ``ZeroDivisionError``, which Python's ``1 // 0`` raises (torch raises a RuntimeError saying so)."""


class OutOfMemoryError(OpforgeError, MemoryError):
    """An op's kernel could not get the memory it asked for (NumPy's MemoryError; CuPy's out-of-memory error is one
    too): raised naming the op, the shapes of its inputs and the bytes its outputs need."""


class GradientError(OpforgeError, RuntimeError):
    """Autograd cannot go on: a missing gradient rule, a rule that returned the wrong thing, a freed graph."""


def describe(value) -> str:
    """A short description of what came, for error messages: its type, and shape/dtype for arrays."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(value).__name__} of shape {tuple(shape)} and dtype {dtype}"
    try:
        text = repr(value)
    except Exception:  # an int past Python's digit limit (10**5000), an object whose repr fails
        text = f"<{type(value).__name__} that cannot be shown>"
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def out_of_memory(opdef, specs: list, attrs: dict, error: BaseException, where: str = "") -> OutOfMemoryError:
    """The ``OutOfMemoryError`` for ``error``, a MemoryError raised by the kernel of ``opdef`` called on inputs of
    ``specs`` (as its shape rule takes them) with ``attrs``: it names the op (after ``where``, the place of the call
    where that is not a plain eager call), the inputs' shapes, and what the outputs need where the shape rule can
    say (an allocation inside the kernel may have been what failed: its own message follows)."""
    def shown(params, values) -> str:  # 'x' (2, 3) float32, 'xs[0]' ...
        parts = []
        for p, v in zip(params, values):
            for i, s in enumerate(v) if p.is_list else [(None, v)]:
                if s is not None:
                    parts.append(f"'{p.name}{'' if i is None else f'[{i}]'}' {tuple(s.shape)} {s.dtype}")
        return ", ".join(parts)

    try:
        outputs = opdef.infer_specs(specs, attrs)
        need = sum(_count(s.shape) * s.dtype.itemsize for o, v in zip(opdef.outputs, outputs)
                   for s in (v if o.is_list else [v]))
        needs = f"output {shown(opdef.outputs, outputs)}: {need} bytes ({_size(need)})"
    except Exception:  # a shape rule that cannot say: the kernel's own message tells what it can
        needs = "its kernel asked for more than there is"
    return OutOfMemoryError(f"{where}{opdef.name}(): out of memory: {needs}; inputs: "
                            f"{shown(opdef.inputs, specs) or 'none'} ({type(error).__name__}: {error})")


def _count(shape) -> int:
    count = 1
    for d in shape:
        count *= int(d)  # Python ints: no overflow
    return count


def _size(nbytes: int) -> str:
    """``nbytes`` in binary units, as NumPy's message writes them (3.64 TiB)."""
    units, value = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"), float(nbytes)
    k = 0
    while value >= 1024 and k < len(units) - 1:
        value, k = value / 1024, k + 1
    return f"{nbytes} bytes" if k == 0 else f"{value:.2f} {units[k]}"
