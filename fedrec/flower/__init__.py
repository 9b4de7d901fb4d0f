"""fedrec on Flower: the simulator's algorithms as a ServerApp and a ClientApp.

`roles` holds what the server and a node do with each message (no Flower import), `app` the
Flower apps, `launch` the ways to start a run (Flower's simulation engine, or a SuperLink and
SuperNodes on loopback). See docs/tutorials/flower.md.
"""
