"""Which random numbers a traced TensorFlow function draws in a way no checkpoint can hold, for AutoResume's
notes at resume (the train function; tf.data's functions in tfdata.py).

TensorFlow's stateful random ops (``tf.random.normal``, ``tf.random.uniform``, ``tf.nn.dropout``...) keep their
position inside the kernel of the running process: a fresh process starts them over, and nothing can save them.
Keras's own random ops (``keras.random`` with a ``SeedGenerator``, Dropout, the random layers) are stateless ops
fed from a variable, and ``tf.random.get_global_generator()`` is a variable too: those resume exactly.
"""
from __future__ import annotations

import sys

# op type -> what a user wrote to get it
STATEFUL_RANDOM_OPS = {
    "RandomStandardNormal": "tf.random.normal", "RandomUniform": "tf.random.uniform",
    "RandomUniformInt": "tf.random.uniform", "TruncatedNormal": "tf.random.truncated_normal",
    "ParameterizedTruncatedNormal": "tf.random.truncated_normal", "RandomShuffle": "tf.random.shuffle",
    "Multinomial": "tf.random.categorical", "RandomGamma": "tf.random.gamma", "RandomPoisson": "tf.random.poisson",
    "RandomPoissonV2": "tf.random.poisson",
}
# ops that write a variable: a Keras random layer's seed generator advancing
VARIABLE_WRITES = {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"}

FIX = ("draw them with keras.random and a keras.random.SeedGenerator kept on the model (or with "
       "tf.random.get_global_generator()), which colabkit saves")


def graph_ops(graph) -> set:
    """The op types of a FuncGraph, its nested functions' included."""
    graph_def = graph.as_graph_def()
    return {n.op for n in graph_def.node} | {n.op for f in graph_def.library.function for n in f.node_def}


def stateful_random_calls(ops) -> list:
    """The TensorFlow calls behind the stateful random ops among ``ops``, sorted."""
    return sorted({STATEFUL_RANDOM_OPS[op] for op in ops if op in STATEFUL_RANDOM_OPS})


def train_function_random_calls(train_function) -> list:
    """The stateful random calls in what Keras traced for ``train_function`` (the function fit() calls, which
    holds its tf.functions in its closure); [] when nothing was traced or TensorFlow is not in use."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return []
    ops = set()
    for function in _tf_functions(train_function, tf):
        try:
            concrete = function._list_all_concrete_functions()
        except Exception:  # noqa: BLE001 - another TensorFlow's internals: nothing to say rather than a failure
            continue
        for traced in concrete:
            ops |= graph_ops(traced.graph)
    return stateful_random_calls(ops)


def _tf_functions(function, tf, depth=0) -> list:
    """The tf.functions ``function`` calls through its closure (Keras wraps them in plain functions)."""
    found = []
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:   # an empty cell
            continue
        value = getattr(value, "__wrapped__", value)
        if isinstance(value, tf.types.experimental.PolymorphicFunction):
            found.append(value)
        elif callable(value) and depth < 3:
            found += _tf_functions(value, tf, depth + 1)
    return found
