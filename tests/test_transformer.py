"""models.transformer.TransformerLM: output shape, causality, config round trip, and that it
learns."""

import keras
import numpy as np

from models.transformer import TransformerLM

SMALL = dict(vocab_size=32, sequence_length=16, width=32, num_layers=2, num_heads=4)


def test_logits_shape_and_dtype():
    model = TransformerLM(**SMALL)
    logits = model(np.zeros((3, 10), "int32"))
    assert tuple(logits.shape) == (3, 10, 32)
    assert logits.dtype == "float32"


def test_future_tokens_do_not_change_earlier_logits():
    keras.utils.set_random_seed(0)
    model = TransformerLM(**SMALL)
    tokens = np.random.default_rng(0).integers(0, 32, (2, 16))
    changed = tokens.copy()
    changed[:, 9:] = (changed[:, 9:] + 1) % 32
    before, after = model(tokens).numpy(), model(changed).numpy()
    np.testing.assert_allclose(before[:, :9], after[:, :9], rtol=1e-5, atol=1e-6)
    assert not np.allclose(before[:, 9:], after[:, 9:], atol=1e-3)


def test_config_round_trip():
    model = TransformerLM(**SMALL, tie_embeddings=False, dropout=0.1)
    clone = TransformerLM.from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    assert [tuple(v.shape) for v in clone.weights] == [tuple(v.shape) for v in model.weights]


def test_loss_decreases():
    keras.utils.set_random_seed(0)
    model = TransformerLM(**SMALL)
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # A learnable sequence: each token is the previous one plus 3 (mod 32).
    starts = np.random.default_rng(0).integers(0, 32, (64, 1))
    tokens = (starts + 3 * np.arange(17)) % 32
    history = model.fit(tokens[:, :-1], tokens[:, 1:], batch_size=16, epochs=10, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0]
