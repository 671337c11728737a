"""Checkpoints of a model and its optimizer on disk (store: CheckpointStore), below both
training, which writes and resumes them, and serving, which reads a run's trained weights
(`restore_trained_weights`)."""

# Nothing here is public: training and serving import `store` themselves.
__all__ = []
