"""The examples and benchmarks keep running (no timing is asserted)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_demo_runs_and_trains():
    done = run("examples/demo.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gradients checked to order 2" in done.stdout and "held-out accuracy" in done.stdout
    assert "reloaded model" in done.stdout


def test_readme_code_runs():
    text = (ROOT / "README.md").read_text()
    code = "\n".join(re.findall(r"```python\n(.*?)```", text, re.S))
    done = run("-c", code)
    assert done.returncode == 0, done.stderr


def test_eager_overhead_bench_quick():
    done = run("bench/eager_overhead.py", "--quick")
    assert done.returncode == 0, done.stderr
    assert "| leaky_relu (requires_grad) |" in done.stdout


def test_program_vs_eager_bench_quick():
    done = run("bench/program_vs_eager.py", "--quick")
    assert done.returncode == 0, done.stderr
    assert "peak bytes of live intermediates" in done.stdout and "µs per op" in done.stdout
