"""FedCIA and its parameter-averaging baselines: their spec, state and round, the similarity server step, the stacked clients' models, and sides."""
