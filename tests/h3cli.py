"""Run the h3ctl CLI in a subprocess the way a user does, and check the one-line-error contract."""

import subprocess
import sys


def run(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "h3ctl", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def assert_clean_error(proc, *needles, code=2):
    """Exit `code`, exactly one line on stderr naming the problem, no traceback."""
    assert proc.returncode == code, f"exit {proc.returncode}, stderr: {proc.stderr}"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got: {proc.stderr!r}"
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert lines[0].startswith("h3ctl: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]
