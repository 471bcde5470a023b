"""The small datasets held in memory as uint8 tensors (Fashion-MNIST, CIFAR, synthetic), augmented in batches on the
training device."""
