"""Wide & Deep (Cheng et al. 2016) as the CowClip paper trains it (DeepCTR's WDL): linear part
(wide table + Dense(1) on the dense features) + DNN on concat(embeddings, dense features)."""

import keras

from models.base import CTRModel


@keras.saving.register_keras_serializable(package="tfscale")
class WideDeep(CTRModel):
    """Wide & Deep; arguments are CTRModel's."""

    default_name = "wide_deep"

    def __init__(self, schema, **kwargs):
        super().__init__(schema, **kwargs)
        self.dnn = self.make_dnn()
        self.dnn_logit = self.make_logit_layer("dnn_logit")

    def interaction_logits(self, embeddings, dense, training):
        deep = self.dnn(self.dnn_input(embeddings, dense), training=training)
        return [self.dnn_logit(deep)]
