"""PersonalFR and the rating autoencoders: their spec, state, round and sides."""
