"""The PyTorch baseline of the small-batch benchmark: DeepFM as a PyTorch user writes it, the
same shape as models.deepfm (one concatenated table per kind with per-field row offsets, deep
rows of `embedding_dim` and 1-wide linear rows, FM over the deep rows, a ReLU DNN on
concat(embeddings, dense features), a linear term of the dense features, one global bias),
with `nn.Embedding(sparse=True)` tables trained by SparseAdam (only the batch's rows move) and
the rest by Adam, as PyTorch's documentation recommends for large embeddings."""

import numpy as np
import torch
from torch import nn


class TorchDeepFM(nn.Module):
    """DeepFM over `vocabulary_sizes` categorical fields and `num_dense` dense features;
    `forward(dense, categorical)` returns logits [B]."""

    def __init__(self, vocabulary_sizes, num_dense, embedding_dim=10, dnn_units=(400, 400, 400)):
        super().__init__()
        offsets = np.concatenate([[0], np.cumsum(vocabulary_sizes)[:-1]])
        self.register_buffer("offsets", torch.tensor(offsets, dtype=torch.int64))
        rows = int(np.sum(vocabulary_sizes))
        self.deep = nn.Embedding(rows, embedding_dim, sparse=True)
        nn.init.normal_(self.deep.weight, std=0.01)
        self.wide = nn.Embedding(rows, 1, sparse=True)
        nn.init.zeros_(self.wide.weight)
        self.dense_linear = nn.Linear(num_dense, 1, bias=False)
        layers, width = [], len(vocabulary_sizes) * embedding_dim + num_dense
        for units in dnn_units:
            layers += [nn.Linear(width, units), nn.ReLU()]
            width = units
        layers.append(nn.Linear(width, 1, bias=False))
        self.dnn = nn.Sequential(*layers)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, dense, categorical):
        ids = categorical + self.offsets
        fields = self.deep(ids)  # [B, F, d]
        linear = self.wide(ids).sum(dim=(1, 2)) + self.dense_linear(dense).squeeze(1)
        fm = 0.5 * (fields.sum(1).square() - fields.square().sum(1)).sum(1)
        deep = self.dnn(torch.cat([fields.flatten(1), dense], dim=1)).squeeze(1)
        return linear + fm + deep + self.bias


def trainer(model, learning_rate=1e-3):
    """`step(dense, categorical, labels)`: one training step (SparseAdam on the tables, Adam on
    the rest, binary cross-entropy on the logits); returns the loss tensor."""
    tables = [model.deep.weight, model.wide.weight]
    others = [p for p in model.parameters() if all(p is not t for t in tables)]
    optimizers = [torch.optim.SparseAdam(tables, lr=learning_rate),
                  torch.optim.Adam(others, lr=learning_rate)]
    loss_function = nn.BCEWithLogitsLoss()

    def step(dense, categorical, labels):
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss = loss_function(model(dense, categorical), labels)
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
        return loss

    return step
