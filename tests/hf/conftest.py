"""The store's fixtures (a Drive root in a temporary folder) for the Hugging Face adapters' tests."""
from tests.checkpoints.conftest import ck_env  # noqa: F401
