"""A tiny search script for the tests: an MLP on scikit-learn's digits, two hyperparameters."""


from tensorfleet.models.datasets import load_digits

from tensorfleet.compat.keras import keras2

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


def build_model(hp):
    model = tf_keras.Sequential([
        tf_keras.layers.Dense(hp.Choice("units", [8, 32]), activation="relu", input_shape=(64,)),
        tf_keras.layers.Dense(10),
    ])
    model.compile(optimizer=tf_keras.optimizers.Adam(hp.Choice("learning_rate", [1e-3, 1e-2])),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def data():
    split = load_digits(flat=True)
    return split.x_train, split.y_train, split.x_test, split.y_test
