"""Launcher for the Nemotron 3 Ultra training recipe."""

__version__ = "0.1.0"
