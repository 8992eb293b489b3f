"""One module per `minite` CLI verb (see minite/cli.py)."""
