"""Runtime of the `data prep sft` stage, started by launch.py inside the job after the preflight.

Not built yet: the stage resolves, validates, dry-runs and submits, and its job stops here with a
one-line message until the runtime lands.
"""

import sys

if __name__ == "__main__":
    print("ultra3: the data prep sft runtime is not implemented in this version", flush=True)
    sys.exit(4)
