"""Program mode: trace to a program of op descriptions, append the backward pass, compile and run it."""

from .backward import append_backward
from .compile import CompiledFunction, compile
from .desc import Block, OpDesc, Program, VarDesc
from .executor import Executor, Plan
from .trace import Tracer, Variable, assign, live, trace, tracing_program, var_for_tensor

__all__ = ["Block", "CompiledFunction", "Executor", "OpDesc", "Plan", "Program", "Tracer", "VarDesc", "Variable",
           "append_backward", "assign", "compile", "live", "trace", "tracing_program", "var_for_tensor"]
