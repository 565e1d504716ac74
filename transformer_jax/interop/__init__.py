"""Published checkpoints in: another implementation's weights as a run directory of this package."""
