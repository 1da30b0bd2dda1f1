"""ONNX's own conformance harness (``onnx.backend.test``) over our importer and Executor: every node test of the ONNX
ops we import, whose types we have, and the model tests in the onnx wheel, must pass, but for the few that
``conformance.KNOWN_FAILING`` and ``KNOWN_FAILING_MODELS`` list with their reason; docs/onnx.md's table of pass
counts must be what a fresh run gives."""

from pathlib import Path

import pytest

onnx_backend_test = pytest.importorskip("onnx.backend.test")

from opforge.onnx import conformance  # noqa: E402
from opforge.onnx.backend import OpforgeBackend  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "onnx.md"
BEGIN, END = "<!-- conformance: begin -->", "<!-- conformance: end -->"

_cases = conformance.node_cases()
_run = [c.name for c in conformance.selected(_cases) if c.name not in conformance.KNOWN_FAILING]

backend_test = onnx_backend_test.BackendTest(OpforgeBackend, __name__)
_models = [name for _, name, _ in conformance.model_cases() if conformance.model_failure(name) is None]
_wanted = {f"{name}_cpu" for name in [*_run, *_models]}
_test_cases = backend_test.test_cases
for _case in _test_cases.values():  # keep only our node tests: no thousands of skipped ones in the report
    for _name in [n for n in vars(_case) if n.startswith("test_") and n not in _wanted]:
        delattr(_case, _name)
globals().update(_test_cases)  # unittest cases, one per node test: pytest collects them


def test_known_failures_still_fail_with_clear_errors():
    selected = {c.name: c for c in conformance.selected(_cases)}
    assert set(conformance.KNOWN_FAILING) <= set(selected), "KNOWN_FAILING names a test that is not run"
    for name in conformance.KNOWN_FAILING:
        status, message = conformance.run_case(selected[name])
        assert status == "fail", f"{name} passes now: take it out of KNOWN_FAILING"
        assert not message.startswith("raw"), f"{name}: {message}"


def test_known_model_failures_still_fail_with_clear_errors():
    for kind, name, directory in conformance.model_cases():
        if conformance.model_failure(name) is not None:
            status, message = conformance.run_model_case(directory)
            assert status == "fail", f"{kind}/{name} passes now: take it out of KNOWN_FAILING_MODELS"
            assert not message.startswith("raw"), f"{name}: {message}"


def test_docs_conformance_table_is_fresh():
    text = DOC.read_text()
    table = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()
    fresh = conformance.render(_cases).strip()
    assert table == fresh, "docs/onnx.md is stale: python -m opforge.onnx.conformance --write"
