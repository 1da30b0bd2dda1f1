"""``opforge.ops``: every registered op as a function — the library's and yours alike.

    from opforge import ops as F
    y = F.leaky_relu(x, alpha=0.2)

Each function is generated from the op's signature (see ``opforge.dispatch``): it has a real
``inspect.signature`` and a docstring built from the schema and the kernel's docstring. An op defined
with ``@of.op`` appears here the moment it is defined. The library's ops are defined in the family
modules of this package, each op's signature, kernel, shape rule, gradient rule and samples together.
"""

from ..core.opdef import registry as _registry


def _publish(opdef, removed: bool = False) -> None:
    if removed:
        globals().pop(opdef.name, None)
    else:
        globals()[opdef.name] = opdef.fn


_registry.listeners.append(_publish)
for _op in _registry:
    _publish(_op)

# half first: it gives every op defined after it (the library's, then yours) its half-precision kernels.
from . import half  # noqa: E402, F401, I001
from . import creation, elementwise, binary, integer, reduce, shape, linalg, loss, nn, normalization, conv, accumulate  # noqa: E402, F401
from . import optim, collective, device, pool, resize  # noqa: E402, F401
from . import embedding_bags, feature_dropout, indexing, similarity, sorting  # noqa: E402, F401
