"""Developer tools, not imported by the library: the performance model (``perf``), benchmarks
(``bench``), the demo (``demo``) and the mutation harness (``mutate``, catalogue in ``mutations``).

    python -m mxgemm perf | bench | demo ...
    python -m mxgemm.tools mutate [--kernel NAME] [--list] [--sample N]
"""
