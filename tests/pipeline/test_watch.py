"""pipeline/watch.py: a wait fails for what load cannot cause (an exit, CPU burnt with nothing moving, a stall far
past any plausible wait) and never for slowness alone."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from pipeline.watch import cpu_seconds, wait_for


def test_a_watched_process_that_exits_fails_the_wait_at_once():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    with pytest.raises(TimeoutError, match="exited"):
        wait_for(lambda: False, "never", pids=[proc.pid], hang_s=60)
    proc.wait()


def test_cpu_burnt_with_nothing_moving_fails_and_moving_progress_does_not():
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with pytest.raises(TimeoutError, match="CPU seconds used and nothing moved"):
            wait_for(lambda: False, "a spinning process", pids=[spin.pid], cpu_budget_s=0.5, hang_s=600)
        ticks = iter(range(10 ** 9))
        until = cpu_seconds(spin.pid) + 1.5
        wait_for(lambda: cpu_seconds(spin.pid) > until, "progress while burning", pids=[spin.pid],
                 progress=lambda: next(ticks), cpu_budget_s=0.5, hang_s=600)    # moving: 1.5 s burnt is fine
    finally:
        spin.kill()
        spin.wait()


def test_nothing_at_all_moving_fails_only_after_the_hang_limit():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="nothing moved for 1 s"):
        wait_for(lambda: False, "an idle wait", progress=lambda: 0, hang_s=1.0, poll_s=0.05)
    assert time.monotonic() - start >= 1.0


def test_cpu_seconds_counts_the_children_of_a_process():
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'x = 0\\nfor i in range(10**7): x += i'])"
    parent = subprocess.Popen([sys.executable, "-c", code])
    peak = 0.0
    while parent.poll() is None:
        peak = max(peak, cpu_seconds(parent.pid))
        time.sleep(0.05)
    assert peak > 0.2            # the child's loop, not the parent's few milliseconds
