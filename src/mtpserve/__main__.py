"""``python -m mtpserve ...``: the ``mtpserve`` command (cli.py) without its console script."""

import sys

from mtpserve.cli import main

if __name__ == "__main__":
    sys.exit(main())
