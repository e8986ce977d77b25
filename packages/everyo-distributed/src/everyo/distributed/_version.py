"""The version of this distribution (Hatch reads it from here)."""

__version__ = "0.3.0"
