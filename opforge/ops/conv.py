"""Convolution and pooling, computed with strided views and BLAS-backed contractions (no loops over pixels)."""

from opforge import ops as F  # noqa: F401  (gradient rules compute with ops)

from ._common import D, Sample, ShapeError, Spec, np, op  # noqa: F401
