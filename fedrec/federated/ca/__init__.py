"""FedCA: its spec, state and round, and the composite-aggregation server step."""
