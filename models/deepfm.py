"""DeepFM (Guo et al. 2017) as the CowClip paper trains it (DeepCTR's form): linear part + FM
second-order term over the field embeddings + DNN on concat(embeddings, dense features), the
three logits summed."""

import keras
from keras import ops

from models.base import CTRModel


@keras.saving.register_keras_serializable(package="tfscale")
class FactorizationMachine(keras.layers.Layer):
    """FM second-order term sum_{i<j} <e_i, e_j> of field embeddings [B, n_fields, dim] -> [B, 1],
    by the sum-square trick 0.5 * sum_d((sum_f e)^2 - sum_f e^2). Computes in float32 by default:
    the difference of two large sums loses too much in half precision."""

    def __init__(self, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)

    def call(self, embeddings):
        square_of_sum = ops.square(ops.sum(embeddings, axis=1))
        sum_of_squares = ops.sum(ops.square(embeddings), axis=1)
        return 0.5 * ops.sum(square_of_sum - sum_of_squares, axis=1, keepdims=True)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 1)


@keras.saving.register_keras_serializable(package="tfscale")
class DeepFM(CTRModel):
    """DeepFM; arguments are CTRModel's (`use_wide=False` drops the first-order part)."""

    default_name = "deepfm"

    def __init__(self, schema, **kwargs):
        super().__init__(schema, **kwargs)
        self.fm = FactorizationMachine(name="fm")
        self.dnn = self.make_dnn()
        self.dnn_logit = self.make_logit_layer("dnn_logit")

    def interaction_logits(self, embeddings, dense, training):
        deep = self.dnn(self.dnn_input(embeddings, dense), training=training)
        return [self.fm(embeddings), self.dnn_logit(deep)]
