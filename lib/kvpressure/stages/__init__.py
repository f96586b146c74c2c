"""What each stage of the investigation produces (``results``) and its file in the run folder
(``files``: ``analysis/<stage>.json``).

This is the bottom layer of the investigation: ``pipeline`` writes the results, ``record``
builds the record from them, notebooks read them; none of them has to reach into another for
the shape of a stage's result.
"""
