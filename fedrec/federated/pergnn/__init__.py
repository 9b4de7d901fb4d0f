"""FedPerGNN: its options (`spec`), its model and round (`state`) and its round by side (`sides`)."""
