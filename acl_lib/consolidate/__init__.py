"""Consolidations of the sequential endpoint: ways to win back what earlier stages lost.

    merging.py   weight merging (notebook 10): task arithmetic with uniform, grid-searched and capability-balanced
                 coefficients, TIES and DARE; each merge a run holding an HF checkpoint, scored by the pipeline's
                 evaluation runs
    sdft.py      self-distilled fine-tuning (notebook 09): the oracles' filtered rollouts (reward, protocol,
                 near-duplicates) as an HF dataset, mixed and ordered, SFT'd into seq_final (and the base), the
                 ablations of mixture and order, and the update-direction check; runs scored like every stage
"""
