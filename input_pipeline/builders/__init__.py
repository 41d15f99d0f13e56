"""podlab's TFDS builders, one module each (their registry by name: `input_pipeline.datasets`)."""
