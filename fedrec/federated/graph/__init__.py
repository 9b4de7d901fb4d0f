"""GPFedRec and GFed-PP: their spec, state with the server's user graph, and sides."""
