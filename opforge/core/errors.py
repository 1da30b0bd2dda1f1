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
