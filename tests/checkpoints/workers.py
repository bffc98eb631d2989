"""Training processes that the kill, equivalence and signal tests start, kill and restart.

numpy DEST STEPS NBYTES SAVE_EVERY: a framework-free loop whose state is self-checking (every element of
    w equals the step); prints RESUMED/UPLOADED/DONE lines; exit 3 if a restored state is inconsistent.
keras DEST EPOCHS SAVE_FREQ OUT [--deadline D] [--sleep S]: a small deterministic Keras model with a
    dropout layer and a per-batch counter; writes final weights and the counter to OUT (.npz).
"""
import os
import sys
import time


def numpy_worker(dest, steps, nbytes, save_every):
    import numpy as np
    import colabkit
    ckpt = colabkit.Checkpoints(dest, keep=2)
    restored = ckpt.restore()
    start = 0
    w = np.zeros(int(nbytes) // 8)
    if restored is not None:
        w = restored.state["w"]
        if restored.state["step"] != restored.step or not np.all(w == restored.step):
            print(f"INCONSISTENT {restored.step}", flush=True)
            sys.exit(3)
        start = restored.step
    print(f"RESUMED {start}", flush=True)
    last_uploaded = None
    for step in range(start + 1, int(steps) + 1):
        w += 1.0
        time.sleep(0.01)
        if step % int(save_every) == 0:
            ckpt.save(step, {"w": w, "step": step})
        up = ckpt.status.last_uploaded
        if up is not None and up.step != last_uploaded:
            last_uploaded = up.step
            print(f"UPLOADED {up.step}", flush=True)
    ckpt.save(int(steps), {"w": w, "step": int(steps)}, wait=True)
    print(f"DONE {steps}", flush=True)


class _Counter:
    """Builds a Keras layer that counts the batches it was trained on (non-trainable, saved with the model)."""

    @staticmethod
    def layer_class(keras):
        class BatchCounter(keras.layers.Layer):
            def build(self, input_shape):
                self.count = self.add_weight(shape=(), initializer="zeros", trainable=False, dtype="int64",
                                             name="count")

            def call(self, x, training=False):
                if training:
                    self.count.assign_add(1)
                return x
        return BatchCounter


def build_model(keras, seed=1):
    keras.utils.set_random_seed(seed)
    counter = _Counter.layer_class(keras)()
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), counter,
                              keras.layers.Dropout(0.2), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
    return model, counter


def data(np):
    rng = np.random.RandomState(0)
    x = rng.rand(96, 8).astype("float32")
    return x, (x @ rng.rand(8, 1)).astype("float32")


def keras_worker(dest, epochs, save_freq, out, deadline=None, sleep=0.0):
    import numpy as np
    import keras
    import colabkit
    model, counter = build_model(keras)
    x, y = data(np)
    save_freq = save_freq if save_freq == "epoch" else int(save_freq)
    callbacks = [colabkit.keras.AutoResume(dest, save_freq=save_freq, deadline=deadline or None,
                                           deadline_margin="0.5s")]
    if sleep:
        callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(sleep)))
    model.fit(x, y, batch_size=8, epochs=int(epochs), shuffle=False, verbose=0, callbacks=callbacks)
    np.savez(out, *model.get_weights(), counter=int(counter.count.numpy()),
             stopped=bool(model.stop_training))
    print("DONE", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "numpy":
        numpy_worker(*args)
    else:
        kw = {}
        if "--deadline" in args:
            i = args.index("--deadline"); kw["deadline"] = args[i + 1]; del args[i:i + 2]
        if "--sleep" in args:
            i = args.index("--sleep"); kw["sleep"] = float(args[i + 1]); del args[i:i + 2]
        keras_worker(*args, **kw)
