"""What a cell is (its identity, label and settings) and whether it can run."""
