"""python -m mxgemm.tools mutate [--kernel NAME] [--list] [--sample N]"""
import sys

from . import mutate

COMMANDS = {"mutate": mutate.main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python -m mxgemm.tools {{{','.join(COMMANDS)}}} [options]")
    sys.exit(COMMANDS[sys.argv[1]](sys.argv[2:]))
