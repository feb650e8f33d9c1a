"""The object stores the tests run against on loopback, built or installed on first use."""

from __future__ import annotations

import shutil

import pytest

__all__ = ["require_azurite", "require_s3_server"]


def require_s3_server() -> None:
    """Wait for the S3 server's binary (``make test`` builds it while the first tests run), build it
    if nobody is, or skip when it is not built and there is no Go to build it."""
    from coordinator.conformance.versitygw import BINARY, build

    if not BINARY.exists() and shutil.which("go") is None:
        pytest.skip(f"no S3 server built at {BINARY}, and no Go to build it: see coordinator/conformance/versitygw.py")
    build(quiet=True)


def require_azurite() -> None:
    """Wait for Azurite's install (``make test`` starts it while it sets up), install it if nobody is, or
    skip when it is not installed and there is no npm to install it."""
    from scripts.azurite import install, installed

    if not installed() and shutil.which("npm") is None:
        pytest.skip("Azurite is not installed and there is no npm to install it: see scripts/azurite.py")
    install(quiet=True)
