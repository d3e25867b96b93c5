"""A Keras 3 migratable job whose step updates state outside the optimizer: BatchNormalization's moving statistics
and Dropout's seed generator, each observable exactly in the checkpoint (the seed generator's state as ``seeds/0``).

The first input feature is 1.0 in every example, so every batch's mean of it is 1.0 and its variance 0.0, whatever
the batch: after n updates of momentum m from Keras' start (mean 0, variance 1) the moving mean of that feature is
1 - m**n and its moving variance m**n, in whatever order the steps ran. Dropout advances its seed generator's state
by [0, 1] once per training step."""

from __future__ import annotations

EXAMPLES = 96
MOMENTUM = 0.95
SEED = 7


def build_model():
    import keras

    model = keras.Sequential([keras.Input((64,)), keras.layers.BatchNormalization(momentum=MOMENTUM),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.25, seed=SEED),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data():
    from tensorfleet.models.datasets import load_digits

    split = load_digits()
    x = split.x_train[:EXAMPLES].reshape(EXAMPLES, -1).copy()
    x[:, 0] = 1.0
    return x, split.y_train[:EXAMPLES]
