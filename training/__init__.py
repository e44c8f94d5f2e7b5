"""Training the shipped pair (or a draft for any target) and writing its model cards: a floor of its own above
the SUTs (the cards' continuations are decoded by the baseline), which nothing at run time imports."""
