"""The demo, apart from the product: DESIGN §1's order/credits story (:mod:`.story`) around an
order service with a real SQLite database (:mod:`.services`). ``txcoord demo`` runs it."""
