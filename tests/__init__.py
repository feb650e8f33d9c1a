from pathlib import Path

#: The checkout the tests run from (its jobs/, bench/, scripts/ and notebooks/ are not in the package).
REPO_ROOT = Path(__file__).resolve().parent.parent
