"""FedDAE: its spec, and its state and round (the gated dual-encoder VAE)."""
