"""Keras' own tests of `keras.callbacks.BackupAndRestore`, run against `colabkit.keras.AutoResume`.

The source of ``keras/src/callbacks/backup_and_restore_test.py`` is read from the installed Keras, every
``callbacks.BackupAndRestore`` in it becomes AutoResume, and its test methods run as they are, except for
the statements listed in ``CHANGES`` below, each with its reason. A statement listed there that the file no
longer holds fails the test that lists it, so the list is looked at again whenever Keras changes the file; a
statement not listed runs unchanged.

Keras' tests interrupt fit() with an exception inside ``try:`` and assert in the ``except`` branch; an
``else: self.fail(...)`` is added to each such ``try`` so that a fit() that did not raise fails the test
instead of skipping its assertions.
"""
import ast
import importlib.util
import inspect
import textwrap
import unittest
import warnings
from pathlib import Path

import pytest

keras = pytest.importorskip("keras")
import colabkit  # noqa: E402
import colabkit.keras  # noqa: E402

KERAS_TEST = Path(importlib.util.find_spec("keras.src.callbacks.backup_and_restore_test").origin)

_PRIVATE = "reads a private attribute of BackupAndRestore (AutoResume keeps no such attribute)"
_FILES = ("names a file of BackupAndRestore's own layout (latest.weights.h5, training_metadata.json, .bkp); "
          "AutoResume's checkpoints are folders with a manifest, and its fallback to the previous valid "
          "checkpoint when the newest is damaged is tested in tests/checkpoints/test_store.py and "
          "test_never_lose.py")

# (test method, the statement as written in Keras' file, what is done with it, why)
CHANGES = [
    ("test_best_case_step", "self.assertEqual(cbk._current_epoch, 0)", "skip", _PRIVATE),
    ("test_best_case_step", "self.assertEqual(cbk._last_batch_seen, 1)", "skip", _PRIVATE),
    ("test_best_case_step", "self.assertEqual(cbk._current_epoch, 5)", "skip", _PRIVATE),
    ("test_best_case_step", "self.assertEqual(int(model.layers[0].counter.value), 17)",
     "self.assertEqual(int(model.layers[0].counter.value), 15)",
     "AutoResume resumes a mid-epoch checkpoint at its batch (the documented superset): after the save at "
     "the first batch of epoch 0 (counter 1), the resumed fit() trains the 2 batches left in epoch 0 and "
     "4 epochs of 3, 15 batches in all, as an uninterrupted run; BackupAndRestore restarts epoch 0 from its "
     "first batch, training 2 batches twice (17)"),
    ("test_best_case_epoch", "self.assertEqual(cbk._current_epoch, 2)", "skip", _PRIVATE),
    ("test_best_case_epoch", "self.assertEqual(cbk._current_epoch, 5)", "skip", _PRIVATE),
    ("test_backup_corrupted", "self.assertEqual(cbk._current_epoch, 2)", "skip", _PRIVATE),
    ("test_backup_corrupted", "self.assertEqual(cbk._current_epoch, 5)", "skip", _PRIVATE),
    ("test_backup_corrupted", "self.assertTrue(file_utils.exists(cbk._weights_path))", "skip", _FILES),
    ("test_backup_corrupted", "self.assertTrue(file_utils.exists(cbk._training_metadata_path))", "skip", _FILES),
    ("test_backup_corrupted", "self.assertTrue(file_utils.exists(cbk._prev_weights_path))", "skip", _FILES),
    ("test_backup_corrupted", "self.assertTrue(file_utils.exists(cbk._prev_training_metadata_path))", "skip",
     _FILES),
    ("test_backup_corrupted", "with file_utils.File(cbk._weights_path, 'w') as f:\n    f.write('0')", "skip",
     _FILES),
]

# AutoResume keeps its checkpoints after training by default (README: a finished run can still be inspected or
# continued); Keras' tests expect BackupAndRestore's default, delete_checkpoint=True, when they pass none.
DEFAULT_DIFFERENCES = {"delete_checkpoint": True}


def _auto_resume(*args, **kwargs):
    for name, value in DEFAULT_DIFFERENCES.items():
        kwargs.setdefault(name, value)
    return colabkit.keras.AutoResume(*args, **kwargs)


def _normalized(source: str) -> str:
    return ast.unparse(ast.parse(textwrap.dedent(source)))


class _Rewrite(ast.NodeTransformer):
    """BackupAndRestore -> AutoResume, the statements in CHANGES, and ``else: self.fail`` after each try."""

    def __init__(self):
        self.method = None
        self.wanted = {(m, _normalized(code)): (action, why) for m, code, action, why in CHANGES}
        self.applied = set()

    def visit_FunctionDef(self, node):
        self.method = node.name
        self.generic_visit(node)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if node.attr == "BackupAndRestore" and isinstance(node.value, ast.Name) and node.value.id == "callbacks":
            return ast.copy_location(ast.Name(id="_auto_resume", ctx=node.ctx), node)
        return node

    def generic_visit(self, node):
        for field, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, field, [self._statement(s) for s in value])
        return super().generic_visit(node)

    def _statement(self, stmt):
        key = (self.method, ast.unparse(stmt))
        if key not in self.wanted:
            return stmt
        self.applied.add(key)
        action, _ = self.wanted[key]
        replacement = ast.parse("pass" if action == "skip" else action).body[0]
        return ast.copy_location(replacement, stmt)

    def visit_Try(self, node):
        self.generic_visit(node)
        if not node.orelse and any(isinstance(h.type, ast.Name) and h.type.id == "RuntimeError"
                                   for h in node.handlers):
            node.orelse = ast.parse("self.fail('fit() was not interrupted: the assertions would not run')").body
        return node


def _load_keras_tests():
    tree = ast.parse(KERAS_TEST.read_text())
    rewrite = _Rewrite()
    tree = ast.fix_missing_locations(rewrite.visit(tree))
    namespace = {"__name__": "keras_backup_and_restore_test_on_autoresume", "_auto_resume": _auto_resume}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)   # Keras' conftest declares its marks
        exec(compile(tree, str(KERAS_TEST), "exec"), namespace)
    return namespace["BackupAndRestoreCallbackTest"], rewrite


# not a module attribute of its own: pytest would collect the TestCase as it stands, without the checks below
SUITE = dict(zip(("tests", "rewrite"), _load_keras_tests()))
REWRITE = SUITE["rewrite"]
METHODS = sorted(name for name in vars(SUITE["tests"]) if name.startswith("test_"))


@pytest.mark.parametrize("method", METHODS)
def test_keras_backup_and_restore_test_passes_with_autoresume(method, ck_env):
    missing = [code for m, code, _, _ in CHANGES
               if m == method and (m, _normalized(code)) not in REWRITE.applied]
    assert not missing, f"Keras' {KERAS_TEST.name} no longer holds these statements of {method}: {missing}"
    result = unittest.TestResult()
    SUITE["tests"](method).run(result)
    problems = [text for _, text in result.errors + result.failures]
    assert result.testsRun == 1 and not problems and not result.skipped, "\n".join(problems) or result.skipped


def test_every_change_to_keras_tests_names_a_method_of_the_file():
    assert {m for m, *_ in CHANGES} <= set(METHODS)


def test_autoresume_accepts_every_argument_of_backup_and_restore():
    """Same names, the same positions for those Keras takes positionally, the same defaults (but the one
    README names); fails when Keras adds an argument."""
    keras_params = list(inspect.signature(keras.callbacks.BackupAndRestore).parameters.values())
    ours = inspect.signature(colabkit.keras.AutoResume).parameters
    positional = [p for p in ours.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    for i, param in enumerate(keras_params):
        assert param.name in ours, f"AutoResume does not take BackupAndRestore's `{param.name}`"
        if param.kind is param.POSITIONAL_OR_KEYWORD:
            # position 0 is called `directory` here; `backup_dir` is accepted as a keyword too
            expected = "directory" if param.name == "backup_dir" else param.name
            assert positional[i].name == expected, (i, param.name, positional[i].name)
        if param.default is not param.empty and param.name not in DEFAULT_DIFFERENCES:
            assert ours[param.name].default == param.default, param.name
    for name, keras_default in DEFAULT_DIFFERENCES.items():
        assert ours[name].default != keras_default, f"{name}: drop DEFAULT_DIFFERENCES' entry"
    assert "delete_checkpoint=False" in (Path(__file__).parents[2] / "README.md").read_text()
