"""DCN-v2 (Wang et al. 2021) as the CowClip paper trains it: a stack of cross layers
x_{l+1} = x0 * (W x_l + b) + x_l on concat(embeddings, dense features), with the DNN in parallel
(default, as DeepCTR's DCNMix) or stacked on top, plus the linear part.

The cross layers are keras_rs.layers.FeatureCross (a single expert; low rank W = U V when
`projection_dim` is set, full rank when None). The official CowClip runs use DeepCTR's CrossNetMix
instead: 4 low-rank experts with tanh in the low-rank space and a softmax gate; `num_experts > 1`
selects that form (`MixtureCross`, written here because keras_rs has no mixture of experts).
"""

import keras
import keras_rs
from keras import ops

from models.base import CTRModel, clone_initializer, l2_or_none

STRUCTURES = ("parallel", "stacked")


@keras.saving.register_keras_serializable(package="tfscale")
class MixtureCross(keras.layers.Layer):
    """One cross layer as a mixture of low-rank experts (DeepCTR's CrossNetMix, one layer of it).

    Expert e: E_e(x_l) = x0 * (U_e tanh(C_e tanh(V_e^T x_l)) + b); gate g = softmax(G x_l);
    output sum_e g_e E_e(x_l) + x_l. Unlike CrossNetMix, whose gate is shared by all layers of
    the stack, each layer has its own gate.
    """

    def __init__(self, num_experts=4, projection_dim=32, kernel_initializer="glorot_normal",
                 kernel_regularizer=None, **kwargs):
        super().__init__(**kwargs)
        self.num_experts = int(num_experts)
        self.projection_dim = int(projection_dim)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)

    def build(self, input_shape):
        width, experts, rank = input_shape[-1], self.num_experts, self.projection_dim

        def kernel(shape, name):
            return self.add_weight(
                shape=shape,
                initializer=clone_initializer(self.kernel_initializer),
                regularizer=self.kernel_regularizer,
                name=name,
            )

        self.down = kernel((experts, width, rank), "down")  # V
        self.middle = kernel((experts, rank, rank), "middle")  # C
        self.up = kernel((experts, width, rank), "up")  # U
        self.bias = self.add_weight(shape=(width,), initializer="zeros", name="bias")
        self.gate = self.add_weight(shape=(width, experts), initializer="glorot_uniform",
                                    name="gate")

    def call(self, x0, x=None):
        x = x0 if x is None else x
        low = ops.tanh(ops.einsum("bd,edr->ber", x, self.down))
        low = ops.tanh(ops.einsum("ber,esr->bes", low, self.middle))
        experts = ops.expand_dims(x0, 1) * (ops.einsum("ber,edr->bed", low, self.up) + self.bias)
        gates = ops.softmax(ops.matmul(x, self.gate), axis=-1)
        return ops.einsum("be,bed->bd", gates, experts) + x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_experts": self.num_experts,
                "projection_dim": self.projection_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            }
        )
        return config


@keras.saving.register_keras_serializable(package="tfscale")
class DCNv2(CTRModel):
    """DCN-v2. Arguments are CTRModel's plus:

    Args:
        cross_layers: number of cross layers (3 in the paper); 0 leaves only the DNN, and
            `hidden_units=()` only the cross network.
        projection_dim: rank of the cross kernels (32 in the paper); None for full rank.
        num_experts: 1 for keras_rs FeatureCross layers; > 1 for MixtureCross layers with that
            many low-rank experts (the official code uses 4; needs `projection_dim`).
        structure: "parallel" (cross and DNN side by side, concatenated -> Dense(1)) or
            "stacked" (cross network, then the DNN on its output -> Dense(1)).
        l2_cross: L2 strength on the cross kernels (the official runs use DeepCTR's 1e-5).
    """

    default_name = "dcn_v2"

    def __init__(self, schema, cross_layers=3, projection_dim=32, num_experts=1,
                 structure="parallel", l2_cross=0.0, **kwargs):
        super().__init__(schema, **kwargs)
        self.cross_layers = int(cross_layers)
        self.projection_dim = None if projection_dim is None else int(projection_dim)
        self.num_experts = int(num_experts)
        self.structure = structure
        self.l2_cross = float(l2_cross)
        if structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}, got {structure!r}")
        if not self.cross_layers and not self.hidden_units:
            raise ValueError("DCNv2 needs cross layers or DNN layers; both are empty")
        if self.num_experts < 1:
            raise ValueError(f"num_experts must be at least 1, got {num_experts}")
        if self.num_experts > 1 and self.projection_dim is None:
            raise ValueError("num_experts > 1 needs low-rank experts: set projection_dim")
        self.cross = [self._make_cross_layer(f"cross_{i}") for i in range(self.cross_layers)]
        self.dnn = self.make_dnn()
        self.logit = self.make_logit_layer("logit")

    def _make_cross_layer(self, name):
        regularizer = l2_or_none(self.l2_cross)
        if self.num_experts == 1:
            return keras_rs.layers.FeatureCross(
                projection_dim=self.projection_dim,
                kernel_initializer="glorot_normal",
                kernel_regularizer=regularizer,
                dtype=self.dtype_policy,
                name=name,
            )
        return MixtureCross(
            num_experts=self.num_experts,
            projection_dim=self.projection_dim,
            kernel_regularizer=regularizer,
            dtype=self.dtype_policy,
            name=name,
        )

    def interaction_logits(self, embeddings, dense, training):
        x0 = self.dnn_input(embeddings, dense)
        crossed = x0
        for layer in self.cross:
            crossed = layer(x0, crossed)
        if self.structure == "stacked":
            return [self.logit(self.dnn(crossed, training=training))]
        towers = []
        if self.cross_layers:
            towers.append(crossed)
        if self.hidden_units:
            towers.append(self.dnn(x0, training=training))
        return [self.towers_logit(towers)]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "cross_layers": self.cross_layers,
                "projection_dim": self.projection_dim,
                "num_experts": self.num_experts,
                "structure": self.structure,
                "l2_cross": self.l2_cross,
            }
        )
        return config
