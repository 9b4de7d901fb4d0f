"""A cohort's lockstep steps replayed from CUDA graphs, one graph a shape of step.

On a GPU a step of the item family is some fifty small kernels (gathers, a score, a loss, its
gradients, the updates, a scatter-add), each microseconds long, each launched from Python, so
the device idles between them (docs/scale.md: kernels busy 2-5% of a round). A CUDA graph
launches a captured step's kernels back to back from one call. A graph fixes its tensors'
shapes and addresses, so:

* the tensors a step changes (the clients' parameters, the cohort's item rows) are copied into
  a workspace whose tensors outlive the chunk (`StepGraphs.stage`), and copied out after;
* a step of ``n`` active clients runs at a bucket of clients (`bucket`: the next of 2^k and
  3 * 2^(k-1), at most 1.5 n), the ones beyond ``n`` padded: their slots index a zero row past
  the chunk's rows and have zero weight (mask 0), so their gradients are exactly zero and the
  steps leave them as they were (x - 0 = x); their item steps are set to zero as well, so a
  diverged client's NaN x 0 never reaches the zero row the others' padded slots read;
* a captured graph is kept for its (bucket, batch width, the state's rates) and replayed in
  every later chunk and round; the workspace grows to twice its size (or a quarter more than
  asked), and a growth drops the graphs (their addresses are gone);
* a step that cannot be captured (an error from PyTorch) says so once, and the state's steps
  then run padded but uncaptured.

Without capture (``capture=False``) the same padded steps run eagerly: the CPU's tests check
the padding against the plain steps with it, where no graph can be captured.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

#: run the padded steps on the CPU too, without capture (a test's switch: `FamilyState._step_graphs`)
PAD_ON_CPU = False

#: a step's inputs: the slots' rows (n, B) int64, their labels and their mask (n, B) float
StepInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def bucket(n: int) -> int:
    """The padded client count a step of ``n`` active clients runs at: the least of 2^k and
    3 * 2^(k-1) that is at least ``n`` (so at most 1.5 n, and two shapes an octave)."""
    if n <= 2:
        return max(n, 1)
    k = (n - 1).bit_length()  # 2^(k-1) < n <= 2^k
    three = 3 << (k - 2)
    return three if three >= n else 1 << k


class _Graph:
    """One captured step: its static inputs and, when captured, the CUDA graph."""

    def __init__(self, inputs: StepInputs, graph: Any) -> None:
        self.inputs = inputs
        self.graph = graph


class StepGraphs:
    """The workspace and the captured steps of one state (see the module's docstring)."""

    def __init__(self, capture: bool) -> None:
        self.capture = capture
        self.space: dict[str, torch.Tensor] = {}
        self.graphs: dict[Hashable, _Graph] = {}
        self.pool: Any = None
        self.stream: Any = None  # the side stream of the captures
        self.loss: torch.Tensor | None = None
        self.live: torch.Tensor | None = None  # a 0/1 weight a staged row (`run`)
        self.clients = 0  # the chunk's clients and rows, as staged
        self.rows = 0

    def stage(self, name: str, t: torch.Tensor, spare: int = 0) -> torch.Tensor:
        """Copy ``t`` into the workspace tensor ``name`` (rows past it zeroed) and return the
        whole workspace tensor; ``spare``: rows it must hold beyond ``t``'s (a padded bucket,
        the zero row)."""
        need = t.shape[0] + spare
        w = self.space.get(name)
        if w is None or w.shape[0] < need or w.shape[1:] != t.shape[1:] or w.dtype != t.dtype or w.device != t.device:
            grown = 2 * w.shape[0] if w is not None and w.shape[1:] == t.shape[1:] else 0
            w = torch.zeros((max(need + need // 4, grown), *t.shape[1:]), dtype=t.dtype, device=t.device)
            self.space[name] = w
            self.graphs.clear()  # captured against the old addresses
            self.pool = None  # a pool whose graphs are all gone cannot take another (PyTorch 2.11)
        w[: t.shape[0]].copy_(t)
        w[t.shape[0]:].zero_()
        return w

    def begin(self, c: int, params: dict[str, torch.Tensor], rows: torch.Tensor
              ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Stage a chunk's ``c`` clients' parameters ``(c, ...)`` and item rows ``(R, width)``;
        return the workspace's tensors to step."""
        spare = bucket(max(c, 1)) - c
        staged = {k: self.stage(f"param:{k}", v, spare) for k, v in params.items()}
        w_rows = self.stage("rows", rows, 1)  # row R is the padded slots' zero row
        if self.loss is None or self.loss.device != rows.device:
            self.loss = torch.zeros((), dtype=torch.float64, device=rows.device)
        self.loss.zero_()
        self.clients, self.rows = c, rows.shape[0]
        self.live = None
        return staged, w_rows

    def end(self, staged: dict[str, torch.Tensor], w_rows: torch.Tensor
            ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """The chunk's parameters and rows copied out of the workspace, and its summed loss."""
        assert self.loss is not None
        params = {k: v[: self.clients].clone() for k, v in staged.items()}
        return params, w_rows[: self.rows].clone(), self.loss.clone()

    def run(self, steps: Sequence[StepInputs], step: Callable[[StepInputs], torch.Tensor], key: Hashable,
            live: tuple[torch.Tensor, Sequence[int]] | None = None) -> None:
        """Run ``steps`` in order through ``step`` (one lockstep step on the staged tensors,
        returning its loss), each at its bucket of clients, adding the losses to `loss`.
        ``live``: a staged weight a row, and the number of rows of each step's active clients
        (they come first), set to 1 on those rows and 0 on the others before the step."""
        assert self.loss is not None
        self.live, live_ends = live if live is not None else (None, None)
        live_end = -1
        for t, (idx, y, m) in enumerate(steps):
            n, width = idx.shape
            nb = bucket(n)
            g, made = self._graph((nb, width, key), nb, width, idx, y, step)
            if made:  # a capture (even a failed one) left no row live
                live_end = -1
            s_idx, s_y, s_m = g.inputs
            s_idx[:n].copy_(idx)
            s_y[:n].copy_(y)
            s_m[:n].copy_(m)
            if n < nb:
                s_idx[n:].fill_(self.rows)
                s_y[n:].zero_()
                s_m[n:].zero_()
            if live_ends is not None and self.live is not None and live_ends[t] != live_end:
                live_end = live_ends[t]
                self.live[:live_end].fill_(1)
                self.live[live_end:].zero_()
            if g.graph is not None:
                g.graph.replay()
            else:
                self.loss += step(g.inputs)

    def _graph(self, key: Hashable, nb: int, width: int, idx: torch.Tensor, y: torch.Tensor,
               step: Callable[[StepInputs], torch.Tensor]) -> tuple[_Graph, bool]:
        """The step's graph for ``key``, and whether it was made now."""
        g = self.graphs.get(key)
        if g is not None:
            return g, False
        inputs = (torch.full((nb, width), self.rows, dtype=idx.dtype, device=idx.device),
                  torch.zeros((nb, width), dtype=y.dtype, device=y.device),
                  torch.zeros((nb, width), dtype=y.dtype, device=y.device))
        graph = None
        if self.capture:
            try:
                graph = self._capture(inputs, step)
            except RuntimeError as e:  # a step the device cannot capture: it runs as it is
                warnings.warn(f"the steps run uncaptured: a CUDA graph of one could not be made ({e})",
                              RuntimeWarning, stacklevel=2)
                self.capture = False
        g = self.graphs[key] = _Graph(inputs, graph)
        return g, True

    def _capture(self, inputs: StepInputs, step: Callable[[StepInputs], torch.Tensor]) -> Any:
        """Capture ``step`` on ``inputs`` on a side stream, after two eager runs there
        (PyTorch's rule for capturing autograd): the inputs are every slot padded, so those runs
        change nothing (their gradients are zero and their scatter lands on the zero row) and
        no row is live. `torch.cuda.graph` would also collect Python's garbage and empty the
        allocator's cache at each capture (tens of milliseconds, a few dozen captures a run);
        the graphs here keep nothing of theirs alive between replays (the step's loss is added
        to `loss`, outside their pool), so they share one pool and capture without those."""
        assert self.loss is not None
        if self.live is not None:
            self.live.zero_()
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        self.stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.stream):
            for _ in range(2):
                step(inputs)
            graph.capture_begin(pool=self.pool)
            try:
                loss = step(inputs)
                self.loss.add_(loss)
                del loss
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(self.stream)
        return graph
