"""``opforge.ops``: every registered op as a function — the library's and yours alike.

    from opforge import ops as F
    y = F.leaky_relu(x, alpha=0.2)

Each function is generated from the op's signature (see ``opforge.dispatch``): it has a real
``inspect.signature`` and a docstring built from the schema and the kernel's docstring; ``F.<op>.source`` shows the
code a call runs. An op defined with ``@of.op`` appears here the moment it is defined. A few functions are written
with ops and have no schema of their own (torch's ``F.dropout``, the ``y`` of ``dropout_with_mask``): their family
module publishes them here too (``core.declare.function``). The library's ops are
defined in the family modules of this package, each op's signature, kernel, shape rule, gradient rule and samples
together; they import core alone, and this namespace (which gradient rules call as ``F``) imports nothing else
either: ``opforge/__init__.py`` loads the families, in the order it states.
"""

from ..core.opdef import registry as _registry


def _publish(opdef, removed: bool = False) -> None:
    # (no module __getattr__ here: a module with one does not get Python's fast attribute load, and F.<op> is read
    # on every operator and in every gradient rule)
    if removed or opdef.fn is None:  # an op declared before it had a function: announced again once it has one
        globals().pop(opdef.name, None)
    else:
        globals()[opdef.name] = opdef.fn


def _publish_function(name: str, fn) -> None:  # a function written with ops (core.declare.function)
    globals()[name] = fn


_registry.listeners.append(_publish)
for _op in _registry:
    _publish(_op)
_registry.function_listeners.append(_publish_function)
for _name, _fn in _registry.functions.items():
    _publish_function(_name, _fn)
