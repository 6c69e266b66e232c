"""Training criteria of the plugin."""
