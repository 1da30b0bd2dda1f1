"""Autodiff: the eager backward engine (``backward``, ``grad``), anomaly detection, and the one gradient-rule
caller that program mode's ``append_backward`` shares."""

from .anomaly import detect_anomaly
from .engine import backward, grad

__all__ = ["backward", "detect_anomaly", "grad"]
