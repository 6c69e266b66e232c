"""Learning-rate schedulers of the plugin."""
