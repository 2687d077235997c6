"""zones: spectral shape of transformer weights, layer importance and zone-aware depth pruning."""
__version__ = "0.1.0"
