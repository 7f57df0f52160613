"""`pipeline-bench`, one real run: the serial engine and the actor pipeline replay the same log with token trees,
adaptive block length and line-end blocks all on, and write the same assessments; the draft ran ahead. A profile with
the draft on the NPU is refused before anything opens it (its serial side would hold the NPU while the pipelined
side's draft actor opens it)."""
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


def test_a_comparison_that_would_open_the_npu_twice_is_refused(tmp_path):
    from bench import pipeline_vs_serial
    profile = tmp_path / "npu.toml"
    profile.write_text('[board]\nnpu = "rknpu2"\n\n[draft]\nkind = "hybrid"\nbackend = "rknn"\n')
    report = pipeline_vs_serial.run_compare(str(profile), "unused.csv", policies=("fixed",))
    assert report.exit_code == 2
    assert report.line == ("ringspec: pipeline-bench: 2 processes would open the NPU at once (the serial side (this "
                           "process), the pipelined side's draft actor): one process may hold the NPU, and a second "
                           "one crashes it; compare the two with a profile whose draft.backend = \"onnx\"")
