"""The benchmark cases, one module per group. Each module names its FRAMEWORKS, its reference columns and either
``variants(framework, quick)`` (timed callables) or ``measure(framework, quick)`` (memory). Nothing heavy is imported
here: a worker process imports only the one group it runs, so that memory figures stay clean."""

# group id -> module name, in report order (the numbering, then folded-in extras)
GROUPS = {
    "per_op": "per_op",
    "chain": "chain",
    "mlp": "mlp",
    "cnn": "cnn",
    "hvp": "hvp",
    "memory": "memory",
    "conv_softmax": "conv_softmax_ops",
    "fusion": "fusion",
    "workspace": "workspace",
    "transformer": "transformer",
    "rnn": "rnn",
}

# framework id -> how the report names it
FRAMEWORK_NAMES = {
    "numpy": "NumPy by hand",
    "floor": "NumPy matmuls only (floor)",
    "opforge": "opforge eager",
    "opforge.compiled": "opforge compiled",
    "torch": "PyTorch eager",
    "torch.compile": "torch.compile",
    "jax": "JAX eager",
    "jax.jit": "jax.jit",
}

# framework id -> the packages its worker needs (a framework whose packages are missing is skipped, not failed)
PACKAGES = {
    "numpy": ["numpy"],
    "floor": ["numpy"],
    "opforge": ["opforge"],
    "opforge.compiled": ["opforge"],
    "torch": ["torch"],
    "torch.compile": ["torch"],
    "jax": ["jax", "jaxlib"],
    "jax.jit": ["jax", "jaxlib"],
}

ALL_FRAMEWORKS = ("numpy", "opforge", "opforge.compiled", "torch", "torch.compile", "jax", "jax.jit")
