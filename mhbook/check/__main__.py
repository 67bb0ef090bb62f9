"""``python -m mhbook.check``: list the checks, or run one on any importable function.

python -m mhbook.check                                   # the checks and their contracts
python -m mhbook.check attention my_module:my_attention  # run one; exit status 1 if it fails
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import CHECKS


def load(target: str):
    """``"package.module:name"`` (or ``"module:Class.method"``) -> the object it names."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"expected MODULE:NAME, e.g. my_module:my_attention, got {target!r}")
    sys.path.insert(0, "")  # the current folder, as `python -m` would for a script
    try:
        obj = importlib.import_module(module_name)
    except ImportError as error:
        raise SystemExit(f"cannot import {module_name!r}: {error}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SystemExit(f"{module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mhbook.check",
        description="Check your own implementation of a mechanism of the book.",
    )
    parser.add_argument("check", nargs="?", help="the check's name (no name: list them)")
    parser.add_argument("target", nargs="?", help="MODULE:NAME of your function or class")
    args = parser.parse_args(argv)
    if args.check is None:
        width = max(len(n) for n in CHECKS)
        print("Checks (python -m mhbook.check NAME MODULE:FUNCTION):")
        for name, fn in CHECKS.items():
            chapter = f"  [chapter {fn.spec.chapter[:2]}]" if fn.spec.chapter else ""
            print(f"  {name:<{width}}  {fn.spec.title}{chapter}")
        return 0
    if args.check not in CHECKS:
        known = ", ".join(CHECKS)
        print(f"no check named {args.check!r}; the checks are: {known}", file=sys.stderr)
        return 2
    fn = CHECKS[args.check]
    if args.target is None:
        print(f"{args.check}: {fn.spec.title}\n\n{fn.spec.contract.strip()}")
        if fn.spec.bugs:
            print("\nThe bugs it names:")
            for bug in fn.spec.bugs:
                print(f"  - {bug.name}")
        return 0
    result = fn(load(args.target))
    print(result.report())
    return 0 if result else 1


if __name__ == "__main__":
    sys.exit(main())
