"""Reproducing papers: their published figures as data, and tables of ours beside theirs."""

from __future__ import annotations

from fedrec.reproduce.papers import PaperFigure, figure, load_figures, papers
from fedrec.reproduce.table import render, summarise, to_markdown

__all__ = ["PaperFigure", "figure", "load_figures", "papers", "render", "summarise", "to_markdown"]
