"""The parts a federated round is made of, beneath the methods that use them: a cohort's keyed
draws and lockstep layout (on the host or the device), uploads and their encodings, pseudo-item
padding, optimiser steps, rows keyed by (client, item), and the round split by side for a
deployment (`sides`). Nothing here knows a method."""
