"""``python -m kvgov.serve``: the same as ``kvgov serve``."""

from __future__ import annotations

import typer

from kvgov.cli.serve import serve


def main() -> None:
    typer.run(serve)


if __name__ == "__main__":
    main()
