"""Neural-network ops: softmax and log_softmax, losses, normalisation, dropout, embedding, attention."""

from opforge import ops as F  # noqa: F401  (gradient rules compute with ops)

from ._common import D, Sample, ShapeError, Spec, np, op  # noqa: F401
