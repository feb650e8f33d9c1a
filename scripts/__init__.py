"""Tools run from the checkout's root: ``python scripts/s3_server.py build`` (standard library only, so
``make test`` runs it before the virtualenv exists) and ``python -m scripts.cluster``."""
