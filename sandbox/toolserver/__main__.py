"""Entry point: `python3 -m toolserver --socket ... --workspace ...`."""

from .server import main

main()
