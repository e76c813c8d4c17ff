"""What to run: budgets, the shortest training, and which cells an adaptive sweep measures next."""
