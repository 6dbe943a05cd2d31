"""keras_transformer."""
