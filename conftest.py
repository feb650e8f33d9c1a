"""The fixtures every test of the checkout uses (``tests/`` and ``bench/tests/``) are in :mod:`support.fixtures`."""

pytest_plugins = ["support.fixtures"]
