"""Generated cases (rule 9): random notebooks built from printable recipes, run in a
real shell, and the product held to its invariants in each."""
