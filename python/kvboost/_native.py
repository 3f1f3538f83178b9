# The compiled extension: kvboost/_kvboost*.so in an installed wheel, or <build>/python/_kvboost*.so
# on PYTHONPATH in a build tree (tests).
try:
    from . import _kvboost as _C  # noqa: F401
except ImportError:  # pragma: no cover - build tree
    import _kvboost as _C  # noqa: F401
