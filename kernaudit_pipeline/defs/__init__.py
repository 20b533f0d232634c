"""Dagster definitions: thin wrappers that call the library."""
