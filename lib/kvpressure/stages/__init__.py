"""What each stage of the investigation produces (``results``) and its file in the run folder
(``files``: ``analysis/<stage>.json``).

This is the bottom layer of the investigation: the analysis returns its typed parts, the
stages of ``investigation`` write the results, ``investigation.record`` builds the record from
them, the report and the notebooks read them; none of them has to reach into another for the
shape of a stage's result.
"""
