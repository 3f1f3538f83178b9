import os
import shutil

from ._errors import EngineError


def cli_path() -> str:
    """The ``kvboost`` binary: $KVBOOST_CLI, the one bundled in the wheel (kvboost/bin/), the one
    beside the extension in a build tree (<build>/python/_kvboost*.so -> <build>/kvboost), or PATH."""
    env = os.environ.get("KVBOOST_CLI")
    if env:
        return env
    from ._native import _C

    here = os.path.dirname(os.path.abspath(_C.__file__))
    for cand in (os.path.join(here, "bin", "kvboost"), os.path.join(os.path.dirname(here), "kvboost")):
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    found = shutil.which("kvboost")
    if found:
        return found
    raise EngineError("the kvboost binary is not bundled here (" + here + ") nor on PATH; set KVBOOST_CLI")
