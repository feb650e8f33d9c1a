"""The demo, apart from the product: the order/credits story of docs/design.md#the-problem (:mod:`.story`) around an
order service with a real SQLite database (:mod:`.services`). ``txcoord demo`` runs it."""

__all__: list[str] = []  # its public surface is its modules, named above
