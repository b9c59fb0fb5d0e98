"""Kept for tools and habits that run ``setup.py``; all metadata lives in pyproject.toml."""

from setuptools import setup

setup()
