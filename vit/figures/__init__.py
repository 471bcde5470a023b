"""Analysis and figures of a model: tensors in, numbers and pictures out. Depends on the model only."""
