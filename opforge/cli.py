"""The ``opforge`` command (also ``python -m opforge.cli``).

    opforge docs [--check]                      regenerate docs/ops.md and opforge/ops/__init__.pyi
    opforge stubs --module mypkg.myops -o X.pyi typed stubs for the ops a module of yours defines
    opforge check [OP ...] [--module M]         run the conformance checks, print every report

Each subcommand exits with 0 on success and 1 when something is stale or fails.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path


def _import(module: str):
    """Import a user's module by name; the current directory is searched first, as ``python -m`` does."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise SystemExit(f"opforge: cannot import module '{module}': {e}") from None


def docs(args) -> int:
    from . import docgen

    root = Path(args.root).resolve() if args.root else docgen.ROOT
    files = docgen.generated(root)
    if args.check:
        stale = docgen.stale(files)
        for path, diff in stale:
            print(f"{_shown(path)} is stale: it differs from what the op registry generates:\n{diff}\n")
        if stale:
            print(f"Regenerate with: {docgen.COMMAND}" + (f" --root {args.root}" if args.root else ""))
            return 1
        print(f"up to date: {', '.join(_shown(p) for p in files)}")
        return 0
    for path, text in files.items():
        docgen.write_atomic(path, text)
        print(f"wrote {_shown(path)}")
    return 0


def stubs(args) -> int:
    from . import docgen

    module = _import(args.module)
    entries = docgen.ops_of_module(module)
    if not entries:
        print(f"opforge stubs: module '{args.module}' defines no ops (as module-level names)", file=sys.stderr)
        return 1
    text = docgen.render_stub(entries, module=args.module)
    if args.output is None:
        sys.stdout.write(text)
    else:
        docgen.write_atomic(Path(args.output), text)
        print(f"wrote {args.output}: {len(entries)} op(s) from {args.module}")
    return 0


def check(args) -> int:
    from . import docgen
    from .core.opdef import registry
    from .testing.conformance import check_all

    names = list(args.ops)
    if args.module:
        names += [op.name for _, op in docgen.ops_of_module(_import(args.module))]
    elif not names:
        names = [op.name for op in registry]
    try:
        reports = check_all(names, strict=args.strict)
    except KeyError as e:
        print(f"opforge check: {e.args[0]}", file=sys.stderr)
        return 1
    failed = [r for r in reports if r.failures]
    for r in reports:
        if r.failures or r.warnings or args.verbose:
            print(r)
    print(f"{len(reports) - len(failed)} of {len(reports)} op(s) conform"
          + (f"; failing: {', '.join(r.op for r in failed)}" if failed else ""))
    return 1 if failed else 0


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="opforge", description="Tools for opforge ops.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("docs", help="regenerate docs/ops.md and opforge/ops/__init__.pyi from the op registry")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 and say which file is stale")
    p.add_argument("--root", help="the directory holding docs/ and opforge/ (default: this checkout)")
    p.set_defaults(run=docs)

    p = sub.add_parser("stubs", help="write typed stubs (.pyi) for the ops a module defines")
    p.add_argument("--module", required=True, help="the module to import, e.g. mypkg.myops")
    p.add_argument("-o", "--output", help="the .pyi file to write (default: standard output)")
    p.set_defaults(run=stubs)

    p = sub.add_parser("check", help="run the conformance checks (check_op) and print the reports")
    p.add_argument("ops", nargs="*", help="op names (default: every registered op)")
    p.add_argument("--module", help="check the ops this module defines (imported first)")
    p.add_argument("--strict", action="store_true", help="count warnings as failures")
    p.add_argument("-v", "--verbose", action="store_true", help="print every report, not only failing ones")
    p.set_defaults(run=check)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
