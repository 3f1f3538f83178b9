#!/usr/bin/env python3
"""ctest entry: runs pytest on tests/python (argv passed through). Exit 77 (ctest skip) when pytest
or the extension is missing, unless KVBOOST_REQUIRE_ORACLES=1."""
import os
import sys

try:
    import pytest
    import kvboost  # noqa: F401
except ImportError as e:
    if os.environ.get("KVBOOST_REQUIRE_ORACLES") == "1":
        print(f"missing: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"SKIP: {e} (run scripts/install-deps.sh; build with KVBOOST_PYTHON_BINDINGS=ON)", file=sys.stderr)
    sys.exit(77)
here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", here, *sys.argv[1:]]))
