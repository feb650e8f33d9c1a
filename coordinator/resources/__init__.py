"""Files shipped with the package: ``coordinator.toml``, the commented default configuration that
``txcoord init --config FILE`` writes when FILE does not exist."""

__all__: list[str] = []  # its public surface is its data files, named above
