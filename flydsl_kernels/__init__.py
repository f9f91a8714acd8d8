"""FlyDSL kernel modules, compiled ahead of time by ``mxgemm.flydsl_build``.

Each module exposes ``compile_for_build(arch, symbol, **variant)``: it builds the
``@flyc.jit`` launcher of a kernel named ``symbol`` (the registry's symbol, the one name
for it), traces it once with placeholder arguments and returns the jit function. Modules are loaded by file
path in a FlyDSL subprocess, never imported by the dispatcher itself.
"""
