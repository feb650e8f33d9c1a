"""Files shipped with the package: ``coordinator.toml``, the commented default configuration that
``txcoord init --config FILE`` writes when FILE does not exist."""
