"""Serving a trained model: every line of a file scored in order (prediction) and the SavedModel
that scores raw lines with TensorFlow alone (export)."""
