"""Autodiff: the eager backward engine (``backward``, ``grad``); program mode adds ``append_backward``."""

from .engine import backward, grad

__all__ = ["backward", "grad"]
