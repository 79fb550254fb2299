"""ATTACK payload: a code "solution" that prints the grader's pass marker and exits 0.

The per-test nonce is in the harness file's name (sys.argv[0]).
"""

import os
import re
import sys

found = re.search(r"[0-9a-f]{16}", os.path.basename(sys.argv[0]))
if found:
    print("RAAS-TEST-PASSED-" + found.group(0))
    os._exit(0)
