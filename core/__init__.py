"""tunedeck's product logic: everything that runs without a terminal. Never imports Textual or Rich."""

__version__ = "0.1.0"
