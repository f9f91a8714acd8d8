"""Package structure: no import cycles inside mxgemm, and every module imports on its own."""
import ast
import subprocess
import sys
from pathlib import Path

import mxgemm

PKG = Path(mxgemm.__file__).resolve().parent


def _modules() -> dict:
    """module name -> path of every mxgemm module."""
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path, modules: dict) -> set:
    """mxgemm modules ``name`` imports anywhere in its body (function-level imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for a in node.names:   # `from pkg import mod` imports the module pkg.mod
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def test_no_import_cycles():
    modules = _modules()
    graph = {n: _imports(n, p, modules) for n, p in modules.items()}
    assert graph["mxgemm"] and graph["mxgemm.ops._op"]   # the scan sees imports at all
    state, cycles = {}, []

    def visit(n, stack):
        state[n] = "open"
        for m in sorted(graph[n]):
            if state.get(m) == "open":
                cycles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m, stack + [m])
        state[n] = "done"

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_every_module_imports_in_a_fresh_interpreter():
    """One fresh process per module (forked after importing torch and numpy, so mxgemm itself is
    imported from scratch each time)."""
    code = (
        "import importlib, os, sys, traceback\n"
        "import numpy, torch\n"
        "bad = []\n"
        "for name in sys.argv[1:]:\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        try:\n"
        "            importlib.import_module(name)\n"
        "        except BaseException:\n"
        "            traceback.print_exc()\n"
        "            os._exit(1)\n"
        "        os._exit(0)\n"
        "    if os.waitpid(pid, 0)[1]:\n"
        "        bad.append(name)\n"
        "print('FAILED', bad)\n")
    p = subprocess.run([sys.executable, "-c", code, *_modules()], capture_output=True, text=True)
    assert "FAILED []" in p.stdout, p.stdout + p.stderr[-4000:]


def test_the_emulator_loads_without_torch():
    """The emulator is numpy: importing it neither imports torch nor registers the ops."""
    import subprocess
    import sys
    code = "import sys, mxgemm.emu; print('torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr[-2000:]


def test_the_runtime_does_not_import_the_tools():
    """Ops, launcher, build, emulator and numerics never import the developer tools or the op
    specs (which exist for tools and tests); only the command line, the timing model and the
    tools themselves do."""
    modules = _modules()
    tool_side = ("mxgemm.tools", "mxgemm.specs", "mxgemm.timing", "mxgemm.__main__")
    for name, path in modules.items():
        if name.startswith(tool_side):
            continue
        bad = {m for m in _imports(name, path, modules) if m.startswith(tool_side[:2])}
        assert not bad, f"{name} imports {sorted(bad)}"


def test_the_ops_load_without_the_emulator():
    """Planning needs the chip's facts, not the emulator: importing the ops must not load it."""
    code = "import sys, mxgemm.ops; print('mxgemm.emu' in sys.modules or 'mxgemm.asm_facts' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr[-2000:]
