"""`fedrec bench`: a cached, resumable grid of runs (`grid`) and its leaderboards (`leaderboard`)."""

from fedrec.bench.grid import (
    Cell,
    Grid,
    board_cells,
    cell_results,
    load_grid,
    missing_cells,
    run_grid,
    stale_cells,
)
from fedrec.bench.leaderboard import Board, boards, to_markdown, write

__all__ = [
    "Board", "Cell", "Grid", "board_cells", "boards", "cell_results", "load_grid", "missing_cells", "run_grid",
    "stale_cells", "to_markdown", "write",
]
