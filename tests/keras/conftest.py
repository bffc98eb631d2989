"""The store's fixtures (a Drive root in a temporary folder, the pre-codec colabkit) for the adapter's tests."""
from tests.checkpoints.conftest import ck_env, old_colabkit, run_worker  # noqa: F401
