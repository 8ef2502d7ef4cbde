"""The command line: parser.py (the grammar), commands/ (one thin module per command: build
the Workspace, make one call, hand the result to a view), views.py (tables and JSON),
console.py (the consoles and the stream rule)."""

from .main import main

__all__ = ["main"]
