"""Developer tools run before claiming a kernel done (not imported by the library).

    python -m mxgemm.devtools mutate [--kernel NAME] [--list] [--sample N]

``mutate``: the mutation harness (mxgemm.devtools.mutate, catalogue in .mutations).
"""
