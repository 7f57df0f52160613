"""A log directory is one stream: its files in natural order, parsed as the first file's format."""
import pytest

from pipeline.stream.records import log_files, read_log


def test_a_directory_reads_as_one_stream_in_natural_order(tmp_path):
    for n in (10, 2, 1):
        (tmp_path / f"alarms_{n}.csv").write_text(f",timestamp,tag,type,description\n0,00:00:0{n % 10},T{n},H,HIGH\n")
    (tmp_path / ".hidden.csv").write_text("junk\n")
    assert [p.name for p in log_files(tmp_path)] == ["alarms_1.csv", "alarms_2.csv", "alarms_10.csv"]
    assert [r.text.split()[1] for r in read_log(tmp_path)] == ["T1", "T2", "T10"]


def test_an_empty_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="holds no log files"):
        read_log(tmp_path)
