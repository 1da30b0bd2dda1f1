"""Import: an ONNX model becomes a Program (placeholder)."""

from ..core.errors import OpforgeError


class OnnxImportError(OpforgeError, ValueError):
    """An ONNX model that cannot be loaded."""


def load(source):
    raise OnnxImportError("not yet")
