"""What the reference CTR models share: `CTRModel` (the base class owning the schema, the field
embeddings, the optional linear part and the float32 output), the DNN tower, the prediction head,
and the FeatureSchema <-> config round trip.

A model maps a batch `{"dense": float32 [B, n_dense], "categorical": int [B, n_fields]}` (see
tfscale.data.schema) to click probabilities float32 [B, 1]. Layers compute in the dtype policy;
the embedding tables, the logit sum and the sigmoid stay float32.
"""

import keras
from keras import ops

from tfscale.data.schema import FeatureSchema
from tfscale.embedding.field_embedding import FieldEmbedding
from tfscale.training.train_step import TrainStepModel


def schema_to_config(schema):
    """A FeatureSchema as a JSON-able dict of lists."""
    return {
        "dense_names": list(schema.dense_names),
        "categorical_names": list(schema.categorical_names),
        "vocabulary_sizes": [int(s) for s in schema.vocabulary_sizes],
    }


def schema_from_config(config):
    """The FeatureSchema saved by `schema_to_config` (a FeatureSchema passes through)."""
    if isinstance(config, FeatureSchema):
        return config
    return FeatureSchema(
        dense_names=tuple(config["dense_names"]),
        categorical_names=tuple(config["categorical_names"]),
        vocabulary_sizes=tuple(int(s) for s in config["vocabulary_sizes"]),
    )


def clone_initializer(initializer):
    """A fresh copy of `initializer`: an unseeded Keras initializer draws the same values on every
    call, so each weight needs its own copy (which picks a new seed)."""
    return initializer.__class__.from_config(initializer.get_config())


def l2_or_none(strength):
    """`keras.regularizers.L2(strength)`, or None for 0."""
    return keras.regularizers.L2(strength) if strength else None


@keras.saving.register_keras_serializable(package="tfscale")
class DNN(keras.layers.Layer):
    """Fully connected tower: per layer Dense -> [BatchNormalization] -> activation -> [Dropout]
    (DeepCTR's order), glorot-normal kernels."""

    def __init__(self, hidden_units, activation="relu", dropout=0.0, batch_norm=False, **kwargs):
        super().__init__(**kwargs)
        self.hidden_units = tuple(int(u) for u in hidden_units)
        self.activation = activation
        self.dropout = float(dropout)
        self.batch_norm = bool(batch_norm)
        self.dense_layers = [
            keras.layers.Dense(
                units,
                kernel_initializer="glorot_normal",
                dtype=self.dtype_policy,
                name=f"dense_{i}",
            )
            for i, units in enumerate(self.hidden_units)
        ]
        self.norm_layers = [
            keras.layers.BatchNormalization(dtype=self.dtype_policy, name=f"batch_norm_{i}")
            for i in range(len(self.hidden_units) if self.batch_norm else 0)
        ]
        self.activation_layer = keras.layers.Activation(activation, dtype=self.dtype_policy)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        width = input_shape[-1]
        for i, dense in enumerate(self.dense_layers):
            dense.build((None, width))
            width = dense.units
            if self.batch_norm:
                self.norm_layers[i].build((None, width))

    def call(self, x, training=False):
        for i, dense in enumerate(self.dense_layers):
            x = dense(x)
            if self.batch_norm:
                x = self.norm_layers[i](x, training=training)
            x = self.activation_layer(x)
            if self.dropout:
                x = self.dropout_layer(x, training=training)
        return x

    def compute_output_shape(self, input_shape):
        width = self.hidden_units[-1] if self.hidden_units else input_shape[-1]
        return (*input_shape[:-1], width)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_units": list(self.hidden_units),
                "activation": self.activation,
                "dropout": self.dropout,
                "batch_norm": self.batch_norm,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="tfscale")
class PredictionHead(keras.layers.Layer):
    """Sums a list of logits [B, 1], adds one global bias and applies the sigmoid, in float32."""

    def __init__(self, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)

    def build(self, input_shape=None):
        self.bias = self.add_weight(shape=(1,), initializer="zeros", name="bias")

    def call(self, logits):
        logit = ops.sum(ops.stack([ops.cast(t, "float32") for t in logits]), axis=0)
        return ops.sigmoid(logit + self.bias)

    def compute_output_shape(self, input_shape):
        return (input_shape[0][0], 1)


class CTRModel(TrainStepModel):
    """Base of the reference models: embeds the categorical fields, adds the linear (wide) part
    and turns the sum of logits into a float32 probability [B, 1].

    Subclasses create their layers in `__init__` and return their logits from
    `interaction_logits`. `build()` needs no data, and `from_config` returns a built model.

    Args:
        schema: the FeatureSchema of the batches.
        embedding_dim: width of the deep embedding rows.
        hidden_units: DNN widths.
        activation, dropout, batch_norm: the DNN's activation, dropout rate and batch norm.
        embeddings_initializer: deep table initializer (default RandomNormal(stddev=0.01)).
        l2_embedding: L2 strength on the whole deep table.
        l2_wide: L2 strength on the whole wide table.
        l2_linear: L2 strength on the dense features' linear kernel.
            (With CowClip, which owns the tables' L2 so their gradients stay row-sparse, give
            l2_embedding = l2_wide = 0 and only l2_linear.)
        use_wide: include the linear part (wide table + Dense(1) on the dense features).
        check_ids: assert in the graph that every id lies in its field's rows.
        deduplicate_ids: look up each unique id of a batch once (tfscale.embedding.dedup); the
            same outputs and summed gradients, with one gradient row per unique id instead of per
            occurrence.
        embedding_sharding: FieldEmbedding's `sharding`: "replicated" (every rank holds the
            whole tables), "row" (each Horovod rank holds 1/P of every table's rows:
            tfscale.embedding.row_sharding), "dynamic" (rows given to ids as they arrive:
            tfscale.embedding.dynamic), or a TableStrategy.
        table_dtype: FieldEmbedding's `table_dtype`: "float32", or "bfloat16" / "float16"
            (half the bytes a row, written back with stochastic rounding by a tfscale
            row-sparse optimizer: tfscale.embedding.table_dtypes).
        name: default `default_name` (the registry key), made unique in the process.
    """

    default_name = "ctr_model"

    def __init__(
        self,
        schema,
        embedding_dim=10,
        hidden_units=(400, 400, 400),
        activation="relu",
        dropout=0.0,
        batch_norm=False,
        embeddings_initializer=None,
        l2_embedding=0.0,
        l2_wide=0.0,
        l2_linear=0.0,
        use_wide=True,
        check_ids=True,
        deduplicate_ids=True,
        embedding_sharding="replicated",
        table_dtype="float32",
        **kwargs,
    ):
        if kwargs.get("name") is None:
            uid = keras.backend.get_uid(self.default_name)
            kwargs["name"] = self.default_name if uid == 1 else f"{self.default_name}_{uid - 1}"
        super().__init__(**kwargs)
        self.schema = schema_from_config(schema)
        self.embedding_dim = int(embedding_dim)
        self.hidden_units = tuple(int(u) for u in hidden_units)
        self.activation = activation
        self.dropout = float(dropout)
        self.batch_norm = bool(batch_norm)
        self.l2_embedding = float(l2_embedding)
        self.l2_wide = float(l2_wide)
        self.l2_linear = float(l2_linear)
        self.use_wide = bool(use_wide)
        self.check_ids = bool(check_ids)
        self.deduplicate_ids = bool(deduplicate_ids)
        self.embedding_sharding = embedding_sharding

        self.field_embedding = FieldEmbedding(
            self.schema.vocabulary_sizes,
            embedding_dim=self.embedding_dim,
            use_wide=self.use_wide,
            embeddings_initializer=embeddings_initializer,
            embeddings_regularizer=l2_or_none(self.l2_embedding),
            wide_regularizer=l2_or_none(self.l2_wide),
            check_ids=self.check_ids,
            deduplicate=self.deduplicate_ids,
            sharding=self.embedding_sharding,
            table_dtype=table_dtype,
            dtype=self.dtype_policy,
            name="field_embedding",
        )
        self.dense_linear = None
        if self.use_wide and self.schema.num_dense:
            self.dense_linear = keras.layers.Dense(
                1,
                use_bias=False,
                kernel_initializer="glorot_normal",
                kernel_regularizer=l2_or_none(self.l2_linear),
                dtype=self.dtype_policy,
                name="dense_linear",
            )
        self.head = PredictionHead(name="prediction")

    def make_dnn(self, name="dnn"):
        """The DNN tower configured by this model's arguments."""
        return DNN(
            self.hidden_units,
            activation=self.activation,
            dropout=self.dropout,
            batch_norm=self.batch_norm,
            dtype=self.dtype_policy,
            name=name,
        )

    def make_logit_layer(self, name):
        """Dense(1) without bias (the global bias is the prediction head's), as DeepCTR."""
        return keras.layers.Dense(
            1,
            use_bias=False,
            kernel_initializer="glorot_normal",
            dtype=self.dtype_policy,
            name=name,
        )

    def towers_logit(self, towers):
        """`self.logit` (made by make_logit_layer) of the concatenated outputs of parallel
        towers (e.g. a cross network and the DNN)."""
        return self.logit(towers[0] if len(towers) == 1 else ops.concatenate(towers, axis=-1))

    def dnn_input(self, embeddings, dense):
        """concat(flattened embeddings [B, n_fields * dim], dense features [B, n_dense])."""
        flat = ops.reshape(embeddings, (-1, self.schema.num_categorical * self.embedding_dim))
        return flat if dense is None else ops.concatenate([flat, dense], axis=-1)

    def build(self, input_shape=None):
        """Create every variable by a symbolic pass over a batch of the schema's shape: a model
        is built from its schema alone, with no data (`input_shape` is ignored)."""
        self.call(
            {
                "dense": keras.KerasTensor((None, self.schema.num_dense), dtype="float32"),
                "categorical": keras.KerasTensor((None, self.schema.num_categorical), dtype="int64"),
            }
        )

    def interaction_logits(self, embeddings, dense, training):
        """The subclass's logits, a list of [B, 1], from embeddings [B, n_fields, dim] and the
        dense features [B, n_dense] (None when the schema has none), in the compute dtype."""
        raise NotImplementedError

    def call(self, features, training=False):
        dense = None
        if self.schema.num_dense:
            dense = ops.cast(features["dense"], self.compute_dtype)
        logits = []
        if self.use_wide:
            embeddings, wide_logit = self.field_embedding(features["categorical"])
            logits.append(wide_logit)
            if self.dense_linear is not None:
                logits.append(self.dense_linear(dense))
        else:
            embeddings = self.field_embedding(features["categorical"])
        logits.extend(self.interaction_logits(embeddings, dense, training))
        return self.head(logits)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "schema": schema_to_config(self.schema),
                "embedding_dim": self.embedding_dim,
                "hidden_units": list(self.hidden_units),
                "activation": self.activation,
                "dropout": self.dropout,
                "batch_norm": self.batch_norm,
                "embeddings_initializer": keras.initializers.serialize(
                    self.field_embedding.embeddings_initializer
                ),
                "l2_embedding": self.l2_embedding,
                "l2_wide": self.l2_wide,
                "l2_linear": self.l2_linear,
                "use_wide": self.use_wide,
                "check_ids": self.check_ids,
                "deduplicate_ids": self.deduplicate_ids,
                "embedding_sharding": self.field_embedding.strategy.get_config(),
                "table_dtype": self.field_embedding.table_dtype,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["schema"] = schema_from_config(config["schema"])
        config["embeddings_initializer"] = keras.initializers.deserialize(
            config["embeddings_initializer"]
        )
        model = cls(**config)
        model.build()
        return model
