"""Deep & Cross Network, v1 (Wang et al. 2017) as the CowClip paper trains it (DeepCTR's DCN with
vector cross kernels): cross network and DNN in parallel on concat(embeddings, dense features),
their outputs concatenated -> Dense(1), plus the linear part."""

import keras
from keras import ops

from models.base import CTRModel, clone_initializer, l2_or_none


@keras.saving.register_keras_serializable(package="tfscale")
class CrossNetwork(keras.layers.Layer):
    """DCN-v1 cross layers with vector kernels: x_{l+1} = x0 * (x_l . w_l) + b_l + x_l.

    keras_rs.layers.FeatureCross only has the matrix (DCN-v2) form, hence this layer.
    """

    def __init__(self, num_layers=3, kernel_initializer="glorot_normal", kernel_regularizer=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.num_layers = int(num_layers)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)

    def build(self, input_shape):
        width = input_shape[-1]
        self.kernels = [
            self.add_weight(
                shape=(width, 1),
                initializer=clone_initializer(self.kernel_initializer),
                regularizer=self.kernel_regularizer,
                name=f"kernel_{i}",
            )
            for i in range(self.num_layers)
        ]
        self.biases = [
            self.add_weight(shape=(width,), initializer="zeros", name=f"bias_{i}")
            for i in range(self.num_layers)
        ]

    def call(self, x0):
        x = x0
        for kernel, bias in zip(self.kernels, self.biases):
            x = x0 * ops.matmul(x, kernel) + bias + x
        return x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_layers": self.num_layers,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            }
        )
        return config


@keras.saving.register_keras_serializable(package="tfscale")
class DCN(CTRModel):
    """DCN (v1). Arguments are CTRModel's plus:

    Args:
        cross_layers: number of cross layers (3 in the paper); 0 leaves only the DNN, and
            `hidden_units=()` only the cross network.
        l2_cross: L2 strength on the cross kernels (the official runs use DeepCTR's 1e-5).
    """

    default_name = "dcn"

    def __init__(self, schema, cross_layers=3, l2_cross=0.0, **kwargs):
        super().__init__(schema, **kwargs)
        self.cross_layers = int(cross_layers)
        self.l2_cross = float(l2_cross)
        if not self.cross_layers and not self.hidden_units:
            raise ValueError("DCN needs cross layers or DNN layers; both are empty")
        self.cross = CrossNetwork(
            self.cross_layers,
            kernel_regularizer=l2_or_none(self.l2_cross),
            dtype=self.dtype_policy,
            name="cross",
        )
        self.dnn = self.make_dnn()
        self.logit = self.make_logit_layer("logit")

    def interaction_logits(self, embeddings, dense, training):
        x0 = self.dnn_input(embeddings, dense)
        towers = []
        if self.cross_layers:
            towers.append(self.cross(x0))
        if self.hidden_units:
            towers.append(self.dnn(x0, training=training))
        return [self.towers_logit(towers)]

    def get_config(self):
        config = super().get_config()
        config.update({"cross_layers": self.cross_layers, "l2_cross": self.l2_cross})
        return config
