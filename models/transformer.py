"""A small decoder-only transformer language model (GPT-2 shaped): token and learned position
embeddings, `num_layers` pre-LayerNorm blocks of causal self-attention and a GELU MLP, a final
LayerNorm and logits over the vocabulary (tied to the token embedding by default).

Every projection is a 2-D Dense kernel (one fused query/key/value projection per block), as in
torch's nn.Linear models: keras.layers.MultiHeadAttention's 3-D kernels (d, heads, head_dim)
would make factored optimizers such as CAME factor over (heads, head_dim) per input feature.

The model maps int tokens [B, T] (T <= sequence_length) to float32 logits [B, T, vocab_size];
train it on (tokens[:, :-1], tokens[:, 1:]) with a from-logits sparse cross-entropy.
"""

import keras
from keras import ops

from tfscale.training.train_step import TrainStepModel

_INITIALIZER_STDDEV = 0.02


def _normal():
    return keras.initializers.RandomNormal(stddev=_INITIALIZER_STDDEV)


@keras.saving.register_keras_serializable(package="tfscale")
class CausalSelfAttention(keras.layers.Layer):
    """Multi-head self-attention where position t attends to positions <= t only."""

    def __init__(self, width, num_heads, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        if width % num_heads:
            raise ValueError(f"width={width} is not a multiple of num_heads={num_heads}")
        self.width = int(width)
        self.num_heads = int(num_heads)
        self.dropout = float(dropout)
        self.qkv = keras.layers.Dense(3 * width, kernel_initializer=_normal(),
                                      dtype=self.dtype_policy, name="qkv")
        self.out = keras.layers.Dense(width, kernel_initializer=_normal(),
                                      dtype=self.dtype_policy, name="out")
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        self.qkv.build(input_shape)
        self.out.build(input_shape)

    def call(self, x, training=False):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        qkv = ops.reshape(self.qkv(x), (batch, length, 3, self.num_heads, -1))
        query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        attended = ops.dot_product_attention(query, key, value, is_causal=True)
        attended = ops.reshape(attended, (batch, length, self.width))
        return self.dropout_layer(self.out(attended), training=training)

    def get_config(self):
        config = super().get_config()
        config.update({"width": self.width, "num_heads": self.num_heads,
                       "dropout": self.dropout})
        return config


@keras.saving.register_keras_serializable(package="tfscale")
class TransformerBlock(keras.layers.Layer):
    """x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)) with a GELU hidden layer."""

    def __init__(self, width, num_heads, mlp_width, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.width = int(width)
        self.num_heads = int(num_heads)
        self.mlp_width = int(mlp_width)
        self.dropout = float(dropout)
        policy = self.dtype_policy
        self.attention_norm = keras.layers.LayerNormalization(epsilon=1e-5, dtype=policy,
                                                              name="attention_norm")
        self.attention = CausalSelfAttention(width, num_heads, dropout, dtype=policy,
                                             name="attention")
        self.mlp_norm = keras.layers.LayerNormalization(epsilon=1e-5, dtype=policy,
                                                        name="mlp_norm")
        self.mlp_in = keras.layers.Dense(mlp_width, activation="gelu",
                                         kernel_initializer=_normal(), dtype=policy,
                                         name="mlp_in")
        self.mlp_out = keras.layers.Dense(width, kernel_initializer=_normal(), dtype=policy,
                                          name="mlp_out")
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=policy)

    def build(self, input_shape):
        self.attention_norm.build(input_shape)
        self.attention.build(input_shape)
        self.mlp_norm.build(input_shape)
        self.mlp_in.build(input_shape)
        self.mlp_out.build((*input_shape[:-1], self.mlp_width))

    def call(self, x, training=False):
        x = x + self.attention(self.attention_norm(x), training=training)
        hidden = self.mlp_out(self.mlp_in(self.mlp_norm(x)))
        return x + self.dropout_layer(hidden, training=training)

    def get_config(self):
        config = super().get_config()
        config.update({"width": self.width, "num_heads": self.num_heads,
                       "mlp_width": self.mlp_width, "dropout": self.dropout})
        return config


@keras.saving.register_keras_serializable(package="tfscale")
class TransformerLM(TrainStepModel):
    """Decoder-only language model; built on construction (no data needed).

    Args:
        vocab_size: number of token ids (256 for bytes).
        sequence_length: longest input (rows of the position embedding).
        width: model width d.
        num_layers: transformer blocks.
        num_heads: attention heads (width must be a multiple).
        mlp_width: MLP hidden width (default 4 * width).
        dropout: dropout after attention and MLP.
        tie_embeddings: logits = hidden @ token_embedding^T (else a separate Dense head).
    """

    def __init__(self, vocab_size=256, sequence_length=128, width=256, num_layers=4,
                 num_heads=4, mlp_width=None, dropout=0.0, tie_embeddings=True, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.sequence_length = int(sequence_length)
        self.width = int(width)
        self.num_layers = int(num_layers)
        self.num_heads = int(num_heads)
        self.mlp_width = int(mlp_width or 4 * width)
        self.dropout = float(dropout)
        self.tie_embeddings = bool(tie_embeddings)
        policy = self.dtype_policy
        self.token_embedding = keras.layers.Embedding(
            vocab_size, width, embeddings_initializer=_normal(), dtype=policy,
            name="token_embedding")
        self.position_embedding = keras.layers.Embedding(
            sequence_length, width, embeddings_initializer=_normal(), dtype=policy,
            name="position_embedding")
        self.blocks = [
            TransformerBlock(width, num_heads, self.mlp_width, dropout, dtype=policy,
                             name=f"block_{i}")
            for i in range(num_layers)
        ]
        self.final_norm = keras.layers.LayerNormalization(epsilon=1e-5, dtype=policy,
                                                          name="final_norm")
        self.head = None if tie_embeddings else keras.layers.Dense(
            vocab_size, kernel_initializer=_normal(), dtype=policy, name="head")
        self.build()

    def build(self, input_shape=None):
        """Creates every variable (`input_shape` is ignored: the shapes follow the config)."""
        hidden_shape = (None, self.sequence_length, self.width)
        self.token_embedding.build((None, self.sequence_length))
        self.position_embedding.build((None, self.sequence_length))
        for block in self.blocks:
            block.build(hidden_shape)
        self.final_norm.build(hidden_shape)
        if self.head is not None:
            self.head.build(hidden_shape)
        self.built = True

    def call(self, tokens, training=False):
        positions = ops.arange(ops.shape(tokens)[1])
        x = self.token_embedding(tokens) + self.position_embedding(positions)[None]
        for block in self.blocks:
            x = block(x, training=training)
        x = self.final_norm(x)
        if self.head is not None:
            logits = self.head(x)
        else:
            table = ops.cast(self.token_embedding.embeddings, x.dtype)
            logits = ops.matmul(x, ops.transpose(table))
        return ops.cast(logits, "float32")

    def get_config(self):
        config = super().get_config()
        config.update({
            "vocab_size": self.vocab_size, "sequence_length": self.sequence_length,
            "width": self.width, "num_layers": self.num_layers, "num_heads": self.num_heads,
            "mlp_width": self.mlp_width, "dropout": self.dropout,
            "tie_embeddings": self.tie_embeddings,
        })
        return config
