"""Tasks: what a training run trains, on which batches, with which loss and evaluation."""
