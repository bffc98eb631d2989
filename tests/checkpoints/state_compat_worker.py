"""Runs that write and read checkpoints with whichever colabkit is first on PYTHONPATH: the working tree's, or
an earlier commit's (test_state_compat.py and test_keras_state_compat.py extract one from git history).

python state_compat_worker.py '{"kind": ..., "dest": ..., "out": ...}'

store   Checkpoints.save of STORE_STATE at step 7 (epoch 1, batch 2)
torch   a PyTorch AutoResume loop over every RNG (Python, NumPy, torch, a DataLoader generator) whose ar.state holds
        every kind the PyTorch adapter tags; "crash_at": [epoch, batch] exits (no save) once the last periodic
        checkpoint is committed; otherwise the run ends and its final state goes to OUT (.npz) and stdout
keras   Checkpoints.save of a tf.Variable and a tf.Module; then a Keras fit with AutoResume and EarlyStopping

Each prints "COLABKIT <path of the colabkit it imported>" first and "RESULT <json>" last.
"""
import hashlib
import json
import os
import sys


def store_state(np):
    """What the store-level run saves: every kind of value Checkpoints.save takes without a framework."""
    return {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "small": np.array([-1, 2, 127], dtype=np.int8),
        "flags": np.array([True, False]),
        "text": np.array(["a", "bc"]),
        "zero_d": np.array(3.5),
        "scalars": {"f": np.float64(0.25), "i": np.int64(-5), "b": np.bool_(True), "f32": np.float32(1.5)},
        "nested": {"list": [1, (2, 3), {"a": np.ones(2)}, [None, "x"]], "inf": float("inf"), "empty": {},
                   "big": 2 ** 62, "unicode": "état"},
        "epoch": 1,
    }


def describe(value):
    """A JSON-able description of a restored value that keeps its type (a tuple is not a list, a dtype is not
    its name), for comparing what two processes hold."""
    import numpy as np
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        values = torch.view_as_real(t) if t.is_complex() else t
        return ["tensor", str(t.dtype), list(t.shape), values.float().flatten().tolist()]
    if torch is not None and isinstance(value, (torch.dtype, torch.device)):
        return [type(value).__name__, str(value)]
    if isinstance(value, np.ndarray):
        return ["ndarray", str(value.dtype), list(value.shape), value.flatten().tolist()]
    if isinstance(value, dict):
        return ["dict", [[describe(k), describe(v)] for k, v in value.items()]]
    if isinstance(value, tuple):
        return ["tuple", [describe(v) for v in value]]
    if isinstance(value, list):
        return ["list", [describe(v) for v in value]]
    if value is None or isinstance(value, (bool, int, float, str)):
        return [type(value).__name__, value if not isinstance(value, float) or value == value else "nan"]
    return ["other", type(value).__name__, repr(value)]


def digest(state_dict) -> dict:
    """Each tensor of a (nested) state dict by its path: sha256 of its bytes."""
    out = {}

    def visit(value, path):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            out[path] = [str(t.dtype), hashlib.sha256(t.view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()]
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(v, f"{path}/{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                visit(v, f"{path}[{i}]")
        else:
            out[path] = repr(value)

    visit(state_dict, "")
    return out


def torch_user_state(torch, np):
    """ar.state values of every kind the PyTorch adapter tags, and some it leaves to the store."""
    return {
        "pair": (1, 2.5, "x", None),
        "nested_tuples": [((1, 2), (3,)), ()],
        "dtype": torch.bfloat16,
        "dtypes": [torch.float16, torch.int8, torch.bool, torch.complex64],
        "device": torch.device("cpu"),
        "other_keys": {0: "zero", 1.5: "one and a half", None: "none", True: "true", "s": "string"},
        "reserved_key": {"__colabkit_torch__": "not a tag", "__colabkit_array__": "nor this"},
        "bf16": torch.arange(5, dtype=torch.bfloat16) / 3,
        "f16": torch.tensor([0.5, -2.0], dtype=torch.float16),
        "i64": torch.tensor([[1, -2], [3, 2 ** 40]]),
        "flags": torch.tensor([True, False]),
        "c64": torch.tensor([1 + 2j], dtype=torch.complex64),
        "array": np.arange(4, dtype=np.int16),
        "steps": 0,
    }


def torch_run(spec):
    import random

    import numpy as np
    import torch

    import colabkit
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(24, 4, generator=torch.Generator().manual_seed(1)))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True,
                                         generator=torch.Generator().manual_seed(5))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.99))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    ar = colabkit.torch.AutoResume(spec["dest"], model=model, opt=opt, sched=sched, save_freq=3, deadline=None,
                                   verbose=0)
    if ar.restored is None:
        ar.state.update(torch_user_state(torch, np))
    seen = []
    for epoch in ar.epochs(3):
        for (x,) in ar.batches(loader):
            noise = torch.randn(4) * 0.1 + float(np.random.uniform(-0.05, 0.05)) + random.random() * 0.01
            opt.zero_grad()
            model(x + noise).square().mean().backward()
            opt.step()
            ar.state["steps"] += 1
            seen.append([epoch, ar.batch, hashlib.sha256(x.numpy().tobytes()).hexdigest()[:16]])
            if [epoch, ar.batch] == spec.get("crash_at"):
                assert ar.checkpoints.wait(120)
                os._exit(3)
        sched.step()
    ar.close()
    restored = None if ar.restored is None else [ar.restored.step, ar.restored.epoch, ar.restored.batch]
    return {"restored": restored, "step": ar.step, "seen": seen, "user": describe(ar.state),
            "objects": {"model": digest(model.state_dict()), "opt": digest(opt.state_dict()),
                        "sched": digest(sched.state_dict())}}


def keras_run(spec):
    import random

    import keras
    import numpy as np
    import tensorflow as tf

    import colabkit
    scale = 1.0 if spec.get("write") else 0.0   # a resumed run's objects start elsewhere: restored in place
    variable = tf.Variable([1.0 * scale, 2.0 * scale, 3.0 * scale])
    module = tf.Module()
    module.w = tf.Variable(tf.reshape(tf.range(6, dtype=tf.float32), (2, 3)) * scale)
    if spec.get("write"):
        with colabkit.Checkpoints(spec["dest"] + "-store") as ckpt:
            ckpt.save(4, {"v": variable, "gen": module, "epoch": 1, "w": np.ones(2)}, wait=True)
    keras.utils.set_random_seed(1)
    random.seed(3)
    np.random.seed(4)
    x = np.random.RandomState(0).rand(48, 4).astype("float32")
    y = (x.sum(1, keepdims=True) > 2).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dropout(0.2),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    probe = {}

    class Probe(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if not probe:   # the RNGs as the first batch finds them (AutoResume has set them by now)
                probe["python"] = hashlib.sha256(repr(random.getstate()).encode()).hexdigest()
                probe["numpy"] = hashlib.sha256(np.random.get_state()[1].tobytes()).hexdigest()

    auto = colabkit.keras.AutoResume(spec["dest"], deadline=None, verbose=0)
    early = keras.callbacks.EarlyStopping(monitor="loss", patience=5)
    model.fit(x, y, batch_size=8, epochs=spec["epochs"], shuffle=False, verbose=0, callbacks=[auto, early, Probe()])
    result = {"restored": None if auto.restored is None else [auto.restored.step, auto.restored.epoch],
              "weights": [hashlib.sha256(np.ascontiguousarray(w).tobytes()).hexdigest() for w in model.get_weights()],
              "early_wait": int(early.wait), "probe": probe,
              "rng_now": {"python": hashlib.sha256(repr(random.getstate()).encode()).hexdigest(),
                          "numpy": hashlib.sha256(np.random.get_state()[1].tobytes()).hexdigest()}}
    if not spec.get("write"):
        restored = colabkit.Checkpoints(spec["dest"] + "-store").restore(into={"v": variable, "gen": module})
        result["store"] = {"step": restored.step, "v": variable.numpy().tolist(), "w": module.w.numpy().tolist(),
                           "rest": describe({k: v for k, v in restored.state.items() if k not in ("v", "gen")})}
    return result


def main(spec):
    import colabkit
    print(f"COLABKIT {os.path.dirname(colabkit.__file__)}", flush=True)
    if spec["kind"] == "store":
        import numpy as np
        with colabkit.Checkpoints(spec["dest"]) as ckpt:
            ckpt.save(7, store_state(np), epoch=1, batch=2, wait=True)
        result = {}
    elif spec["kind"] == "torch":
        result = torch_run(spec)
    else:
        result = keras_run(spec)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
