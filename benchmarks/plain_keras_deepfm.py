"""The throughput baseline: a DeepFM written the plain Keras 3 way (one `Embedding` layer per
field for the deep and the linear part, functional API), the same shape as models.deepfm, to be
trained with Adam and `model.fit` on in-memory numpy arrays."""

import keras
from keras import ops


def plain_keras_deepfm(schema, embedding_dim=10, dnn_units=(400, 400, 400)):
    """A compiled-ready functional DeepFM over `schema` with per-field embedding layers."""
    dense_in = keras.Input((schema.num_dense,), name="dense_features")
    categorical_in = keras.Input((schema.num_categorical,), dtype="int64", name="categorical_ids")

    deep, wide = [], []
    for f, (name, rows) in enumerate(zip(schema.categorical_names, schema.vocabulary_sizes)):
        ids = categorical_in[:, f]
        deep.append(keras.layers.Embedding(rows, embedding_dim, name=f"deep_{name}")(ids))
        wide.append(keras.layers.Embedding(rows, 1, embeddings_initializer="zeros",
                                           name=f"wide_{name}")(ids))
    fields = ops.stack(deep, axis=1)  # [B, F, d]

    linear = ops.sum(ops.concatenate(wide, axis=1), axis=1, keepdims=True)
    if schema.num_dense:
        linear = linear + keras.layers.Dense(1, use_bias=False)(dense_in)
    fm = 0.5 * ops.sum(ops.square(ops.sum(fields, axis=1)) - ops.sum(ops.square(fields), axis=1),
                       axis=1, keepdims=True)
    x = ops.concatenate([ops.reshape(fields, (-1, schema.num_categorical * embedding_dim)), dense_in],
                        axis=1)
    for units in dnn_units:
        x = keras.layers.Dense(units, activation="relu")(x)
    dnn = keras.layers.Dense(1, use_bias=False)(x)
    logit = keras.layers.Add()([linear, fm, dnn])
    output = keras.layers.Activation("sigmoid")(logit)
    return keras.Model({"dense": dense_in, "categorical": categorical_in}, output,
                       name="plain_keras_deepfm")
