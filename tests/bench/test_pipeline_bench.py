"""`pipeline-bench`, one real run: the serial engine and the actor pipeline replay the same log with token trees,
adaptive block length and line-end blocks all on, and write the same assessments; the draft ran ahead."""
import json
import sys

from tests import procs
from tests.paths import ROOT


def test_pipelined_trees_with_adaptive_length_and_line_ends_equal_the_serial_engine(default_gguf):
    out = procs.run([sys.executable, str(ROOT / "run.py"), "pipeline-bench", "--policies", "combined",
                     "--max-lines", "20", "--repeats", "1", "--log", str(ROOT / "data" / "tep_demo.csv"), "--json"],
                    check=True)
    combined = json.loads(out.stdout)["combined"]
    assert combined["identical"], combined              # the same assessment text on both sides
    pipelined = combined["pipelined"]
    assert pipelined["assessments"] == 2
    assert pipelined["ahead_share"] > 0                 # verify passes whose block the draft ran ahead on
    assert 0 <= pipelined["stale_share"] < 1
