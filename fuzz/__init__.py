"""Fuzz tokstream against an independent model: ``python -m fuzz.run --seconds 600``.

``model`` (what a call, a state or a token file must give), ``strategies`` (what hypothesis
draws), ``checks`` (one example against the model) and ``run`` (the timed runner).
"""
