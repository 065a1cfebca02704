"""An exhaustive, breadth-first model check of the settlement state machine (issue 10).

``python -m tests.modelcheck --help`` for deeper bounds; docs/correctness.md for what is
explored, the invariants and the measured numbers.
"""
