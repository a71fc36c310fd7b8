"""The test suite, a package so its modules import as `tests.<name>`."""
