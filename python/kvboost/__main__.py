"""``python -m kvboost ARGS`` runs the ``kvboost`` command-line program with ARGS."""
import os
import sys

from ._cli import cli_path


def main() -> None:
    exe = cli_path()
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
