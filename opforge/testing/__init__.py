"""Checks for ops: numeric gradient checks and the per-op conformance suite."""

from .conformance import ConformanceError, OpReport, call_op, check_all, check_op, default_samples
from .devices import compare_with_cpu
from .gradcheck import GradcheckError, GradcheckResult, gradcheck, gradgradcheck

__all__ = ["ConformanceError", "GradcheckError", "GradcheckResult", "OpReport", "call_op", "check_all", "check_op",
           "compare_with_cpu", "default_samples",
           "gradcheck", "gradgradcheck"]
