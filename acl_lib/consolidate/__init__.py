"""Consolidations of the sequential endpoint: ways to win back what earlier stages lost.

    merging.py   weight merging (notebook 10): task arithmetic with uniform, grid-searched and capability-balanced
                 coefficients, TIES and DARE; each merge a run holding an HF checkpoint, scored by the pipeline's
                 evaluation runs
"""
