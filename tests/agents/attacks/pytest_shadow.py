"""ATTACK payload: a `pytest.py` at the repo root that shadows `python -m pytest`.

It writes a JUnit report in which every test named on the command line passed, and exits 0.
"""

import sys

ids = [arg for arg in sys.argv[1:] if "::" in arg]
target = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--junitxml=")), None)
cases = []
for node in ids:
    path, *rest = node.split("::")
    classname = ".".join([path[:-3].replace("/", "."), *rest[:-1]])
    cases.append('<testcase classname="%s" name="%s" time="0.01"/>' % (classname, rest[-1]))
if target:
    with open(target, "w") as handle:
        handle.write(
            '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
            'errors="0" failures="0" skipped="0" tests="%d">%s</testsuite></testsuites>' % (len(ids), "".join(cases))
        )
print("%d passed" % len(ids))
sys.exit(0)
