"""ONNX export and import: ``of.onnx.export(model, path, inputs)`` and ``of.onnx.load(path)``.

Needs the ``onnx`` extra (``pip install opforge[onnx]``); ``import opforge`` does not import ``onnx`` or
``onnxruntime``: this package imports them when a function here is called. See docs/onnx.md.
"""

from .export import DEFAULT_OPSET, Graph, OnnxExportError, Value, export
from .importer import OnnxImportError, OnnxModule, load, load_module

__all__ = ["DEFAULT_OPSET", "Graph", "OnnxExportError", "OnnxImportError", "OnnxModule", "Value", "export", "load",
           "load_module"]
