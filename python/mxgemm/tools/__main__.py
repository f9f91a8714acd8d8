"""python -m mxgemm.tools {mutate,asm} ... (mutate: the mutation harness; asm: assembly snapshots)"""
import sys

from . import asm_snapshot, mutate

COMMANDS = {"mutate": mutate.main, "asm": asm_snapshot.main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python -m mxgemm.tools {{{','.join(COMMANDS)}}} [options]")
    sys.exit(COMMANDS[sys.argv[1]](sys.argv[2:]))
