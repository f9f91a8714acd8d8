"""FlyDSL kernel modules, compiled ahead of time by ``mxgemm.flydsl_build``.

Each module exposes ``compile_for_build(arch, **variant)`` (builds the ``@flyc.jit``
launcher, traces it once with placeholder arguments and returns the jit function) and
``kernel_symbol(**variant)`` (the kernel's symbol in the .s). Modules are loaded by file
path in a FlyDSL subprocess, never imported by the dispatcher itself.
"""
