"""Tools run from the checkout's root: ``python -m scripts.azurite install`` (standard library only, with
txcoord's own :mod:`coordinator.conformance.loopback`, so ``make test`` runs it before the virtualenv exists) and
``python -m scripts.cluster``."""
