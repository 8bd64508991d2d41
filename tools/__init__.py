"""Command-line tools that read what runs wrote (``python -m tools.plot``)."""
