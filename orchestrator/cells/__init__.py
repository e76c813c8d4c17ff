"""What a cell is (its identity, label and settings), its row in every table of cells, and whether it can run."""
