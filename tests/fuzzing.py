"""What the fuzz tests share: how long they run, a watchdog per case, a memory ceiling, the verdict on one case,
and a mutator of JSON documents.

``OPFORGE_FUZZ=long`` runs the long version of every fuzz test (and the soak test); by default each runs a seeded
sample of its cases in a few seconds. ``OPFORGE_FUZZ_SEED`` picks another seed, to explore beyond the default.
"""

from __future__ import annotations

import contextlib
import copy
import faulthandler
import json
import os
import signal
import threading
import warnings

import numpy as np

import opforge as of
from opforge import ops as F
from opforge.core.errors import OpforgeError

_PACKAGE = os.path.dirname(of.__file__)

LONG = os.environ.get("OPFORGE_FUZZ") == "long"
SEED = int(os.environ.get("OPFORGE_FUZZ_SEED", "0"))


def count(short: int, long: int) -> int:
    return long if LONG else short


class CaseHung(BaseException):  # not an Exception: no `except Exception` inside opforge can swallow it
    """A fuzz case ran past its watchdog."""


@contextlib.contextmanager
def watchdog(seconds: float, what):
    """Interrupt the case after ``seconds``, raising CaseHung in this thread (see ``hard_deadline`` for a case
    stuck in C code, which a signal handler cannot interrupt)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def interrupt(signum, frame):
        raise CaseHung(f"case {what()} ran past its {seconds} s watchdog")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def hard_deadline(seconds: float):
    """If the whole run is not done after ``seconds`` (a case stuck in C code), faulthandler dumps every thread's
    stack and kills the process: a hang fails loudly instead of stalling the suite."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@contextlib.contextmanager
def memory_ceiling(headroom: int = 3 << 30):
    """Cap this process's address space at its current size plus ``headroom``: a case that would allocate what a
    file merely claims (or what a bad argument asks for) meets a MemoryError, never the machine's swap."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = size + headroom
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, ValueError):
        yield  # not Linux: no ceiling
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def quiet():
    """NumPy's overflow and invalid-value warnings are expected here by the thousand."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield


def verdict(call, *must_name: str):
    """Run ``call()``: None if it returned, or raised an OpforgeError whose message names each of ``must_name``,
    or a TypeError Python itself raised binding the call (unknown keyword, too many positionals: the call never
    reached opforge). Otherwise a line saying what went wrong."""
    try:
        call()
    except OpforgeError as e:
        text = str(e)
        missing = [m for m in must_name if m not in text]
        return f"{type(e).__name__} not naming {missing}: {text[:300]}" if missing else None
    except TypeError as e:
        if _raised_by_binding(e):
            return None
        return f"raw TypeError: {str(e)[:300]}{_where(e)}"
    except Exception as e:
        return f"raw {type(e).__name__}: {str(e)[:300]}{_where(e)}"
    return None


def run_case(seconds: float, what, call, *must_name: str):
    """``verdict(call, *must_name)`` under a ``watchdog``: a case that hangs is a problem too, and the run goes on."""
    try:
        with watchdog(seconds, what):
            return verdict(call, *must_name)
    except CaseHung as e:
        return str(e)


def _raised_by_binding(error: TypeError) -> bool:
    """A TypeError from binding arguments to a Python function's signature: raised in the caller's frame (the
    callee never ran), so the traceback holds the frames up to the call and none inside opforge."""
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    return not (filename.startswith(_PACKAGE) or filename.startswith("<opforge"))


def _where(error: Exception) -> str:
    tb = error.__traceback__
    frames = []
    while tb is not None:
        frames.append(f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}")
        tb = tb.tb_next
    return f"  [at {' <- '.join(reversed(frames[-3:]))}]"


# -- what the file fuzzing mutates -------------------------------------------------------------------------------

def small_program(seed=0, extra_op=False):
    """A traced model with its backward pass: parameters, a constant, a size known at run time (a Dim attr)."""
    rng = np.random.default_rng(seed)
    w = of.tensor(rng.standard_normal((3, 5)), requires_grad=True)
    b = of.tensor(rng.standard_normal(5), requires_grad=True)

    def f(x, y):
        h = F.reshape(F.tanh(x @ w + b), shape=[x.shape[0], 5]) * 0.5
        if extra_op:
            h = F.relu(h)
        return {"loss": F.cross_entropy(h, y)}

    prog = of.trace(f, x=of.Spec((None, 3), "float64"), y=of.Spec((None,), "int64"))
    of.append_backward(prog, prog.outputs["loss"])
    return prog


# -- mutating JSON documents ------------------------------------------------------------------------------------

EVIL = [None, True, False, 0, -1, 1, 3, 2**31, 2**63, 10**400, 1.5, -0.0, float("nan"), float("inf"), -1e308, "",
        "x", "ghost", "float64", "complex128", "object", "(-1,)f8", "../x.npz", [], {}, [None], [[]], [1, 2], {"a": 1},
        {"dim": ["x", 0]}, {"dim": ["ghost", 9]}, {"dim": [0]}, {"dtype": "float64"}, {"dtype": "object"},
        {"dtype": {"a": 1}}, {"list": []}, {"dict": []}, {"tensor": "a0"}, {"array": 5}, {"scalar": [1]}]


def _nodes(doc):
    """Every (container, key) pair in a JSON document, the document's own slots first."""
    out, stack = [], [doc]
    while stack:
        node = stack.pop()
        keys = list(node) if isinstance(node, dict) else range(len(node)) if isinstance(node, list) else []
        for k in keys:
            out.append((node, k))
            stack.append(node[k])
    return out


def _strings(doc) -> list:
    return sorted({v for parent, k in _nodes(doc) for v in (parent[k], k) if isinstance(v, str)})


def mutate(doc, rng: np.random.Generator, times: int):
    """A copy of ``doc`` with ``times`` random changes: values replaced by hostile ones or by other strings and
    subtrees of the document, entries deleted, duplicated, swapped, renamed, nudged, or nested very deep."""
    doc = json.loads(json.dumps(doc))  # a deep copy, faster than copy.deepcopy
    for _ in range(times):
        nodes = _nodes(doc)
        if not nodes:
            return rng.choice(np.array(EVIL, dtype=object))
        parent, key = nodes[rng.integers(len(nodes))]
        value = parent[key]
        kind = rng.integers(9)
        if kind == 0:
            parent[key] = copy.deepcopy(EVIL[rng.integers(len(EVIL))])
        elif kind == 1:
            del parent[key]
        elif kind == 2 and isinstance(parent, list):
            parent.insert(int(key), copy.deepcopy(value))
        elif kind == 3 and isinstance(parent, list) and len(parent) > 1:
            other = int(rng.integers(len(parent)))
            parent[key], parent[other] = parent[other], parent[key]
        elif kind == 4:
            strings = _strings(doc)
            if isinstance(parent, dict) and rng.integers(2):
                parent[strings[rng.integers(len(strings))]] = parent.pop(key)  # a key renamed
            else:
                parent[key] = strings[rng.integers(len(strings))]
        elif kind == 5 and isinstance(value, (int, float)) and not isinstance(value, bool):
            parent[key] = [value + 1, value - 1, -value, value * 2**40, 0][rng.integers(5)]
        elif kind == 6:
            depth = int(rng.choice([2, 50, 150, 100_000]))
            if depth > 150:  # deeper than Python's own JSON encoder goes: spliced into the text by dumps()
                parent[key] = DEEP
            else:
                for _ in range(depth):
                    value = [value]
                parent[key] = value
        elif kind == 7:
            other_parent, other_key = nodes[rng.integers(len(nodes))]
            parent[key] = copy.deepcopy(other_parent[other_key])
        else:
            parent[key] = copy.deepcopy(EVIL[rng.integers(len(EVIL))])
    return doc


DEEP = "__nested 100,000 deep__"


def dumps(doc) -> str:
    """``doc`` as JSON text, with each DEEP placeholder replaced by lists nested 100,000 deep."""
    return json.dumps(doc).replace(json.dumps(DEEP), "[" * 100_000 + "]" * 100_000)


def mutate_bytes(data: bytes, rng: np.random.Generator) -> bytes:
    """``data`` damaged: bytes flipped, a range zeroed or dropped, junk inserted, or cut short."""
    data = bytearray(data)
    if not data:
        return bytes(rng.integers(0, 256, 8, dtype=np.uint8))
    kind = rng.integers(5)
    at = int(rng.integers(len(data)))
    if kind == 0:
        for i in rng.integers(0, len(data), int(rng.integers(1, 8))):
            data[i] ^= 1 << int(rng.integers(8))
    elif kind == 1:
        data[at:at + int(rng.integers(1, 64))] = bytes(min(len(data) - at, int(rng.integers(1, 64))))
    elif kind == 2:
        del data[at:at + int(rng.integers(1, 64))]
    elif kind == 3:
        data[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8))
    else:
        del data[at:]
    return bytes(data)
