"""The small datasets held in memory as uint8 tensors (Fashion-MNIST and its mosaics, CIFAR, synthetic), augmented in
batches on the training device."""
