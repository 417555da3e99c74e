"""Errors a user can cause. Each message names the key or row, what was wrong, and the fix."""


class ConfigError(ValueError):
    """A configuration value is invalid."""


class DataError(ValueError):
    """Input data cannot be used."""
