"""Puzzle formats (Sudoku, Maze, ARC-AGI): parsing, generators, encodings and augmentations.

`IGNORE_LABEL_ID` is the label of positions the loss skips (the reference's -100), shared by every
puzzle encoding here and by the TRM loss (experiments/trm/losses.py).
"""

IGNORE_LABEL_ID = -100
