"""Columns (pipeline/stream/columns.py): a positional row's cells named by its log's header or its format's layout,
and what a column's name stands for. References: the W3C Extended Log File Format (WD-logfile-960323), Zeek's
http.log, the NCSA combined format (Apache httpd's mod_log_config)."""
from __future__ import annotations

from pipeline.stream.archive import Archive
from pipeline.stream.columns import cells, header_of, meaning
from pipeline.stream.evidence import lines as lines_of
from pipeline.stream.archive import open_reader
from pipeline.stream.values import stem

W3C_HEADER = ("#Fields: date time s-ip cs-method cs-uri-stem cs-uri-query s-port cs-username c-ip cs(User-Agent) "
              "cs(Referer) sc-status sc-substatus sc-win32-status sc-bytes cs-bytes time-taken")
W3C_ROW = ("2015-01-13 22:30:31 100.79.192.81 GET /store/ - 80 - 183.60.244.30 Mozilla/5.0+(Macintosh) - 404 0 2 "
           "1405 244 407")
ZEEK_HEADER = "#fields\tts\tuid\tid.orig_h\tid.orig_p\tid.resp_h\tid.resp_p\tmethod\thost\tresponse_body_len"
ZEEK_ROW = "1320279566.831619\tCJxSUgkInyKSHiju1\t192.168.2.76\t52030\t72.21.211.173\t80\tGET\t(empty)\t2300"
NCSA_ROW = ('31.56.96.51 - - [22/Jan/2019:03:56:16 +0330] "GET /image/60844/productModel/200x200 HTTP/1.1" 200 5667 '
            '"https://www.zanbil.ir/m/filter/b113" "Mozilla/5.0 (Linux; Android 6.0)"')


def named(text, header):
    return {v.kind[4:]: v.text for v in cells(text, header)}


def test_a_w3c_row_is_named_by_its_fields_header_each_cell_a_span_of_the_row():
    row = named(W3C_ROW, header_of(W3C_HEADER))
    assert row["c-ip"] == "183.60.244.30" and row["s-port"] == "80" and row["cs-bytes"] == "244"
    assert row["sc-win32-status"] == "2" and row["time-taken"] == "407"
    assert all(W3C_ROW[v.start:v.end] == v.text for v in cells(W3C_ROW, header_of(W3C_HEADER)))


def test_empty_cells_are_no_values():
    assert "cs-uri-query" not in named(W3C_ROW, header_of(W3C_HEADER))          # "-"
    assert "host" not in named(ZEEK_ROW, header_of(ZEEK_HEADER))                 # Zeek's "(empty)"


def test_a_zeek_row_is_split_at_tabs_under_its_fields_header():
    row = named(ZEEK_ROW, header_of(ZEEK_HEADER))
    assert row["id.orig_p"] == "52030" and row["id.resp_h"] == "72.21.211.173" and row["uid"] == "CJxSUgkInyKSHiju1"


def test_a_row_of_another_width_than_its_header_gets_no_names():
    assert cells(W3C_ROW + " 12", header_of(W3C_HEADER)) == []
    assert cells("Jun 14 15:16:01 combo sshd: x", header_of(ZEEK_HEADER)) == []


def test_header_and_comment_lines_are_no_rows():
    assert header_of("#Software: Microsoft Internet Information Services 8.5") is None
    assert cells(W3C_HEADER, header_of(W3C_HEADER)) == [] and cells("#close\t2017", header_of(ZEEK_HEADER)) == []


def test_an_ncsa_access_line_is_named_by_the_combined_layout_without_a_header():
    row = named(NCSA_ROW, None)
    assert row == {"client": "31.56.96.51", "time": "22/Jan/2019:03:56:16 +0330", "method": "GET",
                   "path": "/image/60844/productModel/200x200", "protocol": "HTTP/1.1", "status": "200",
                   "bytes": "5667", "referrer": "https://www.zanbil.ir/m/filter/b113",
                   "user-agent": "Mozilla/5.0 (Linux; Android 6.0)"}
    assert named("Jun 14 15:16:01 combo sshd(pam_unix)[19939]: check pass; user unknown", None) == {}


def test_a_columns_name_stands_for_the_words_its_format_defines():
    assert {stem("source"), stem("port")} <= meaning("id.orig_p")               # Zeek: the originator's port
    assert {stem("server"), stem("ip")} <= meaning("id.resp_h")
    assert {stem("client"), stem("bytes")} <= meaning("cs-bytes") and stem("client") not in meaning("sc-bytes")
    assert stem("agent") in meaning("cs(User-Agent)") and stem("user") not in meaning("user_agent")
    assert stem("status") in meaning("sc-status") and stem("status") not in meaning("sc-substatus")


def test_the_archive_names_rows_by_the_newest_header_even_after_it_is_reopened(tmp_path):
    path = tmp_path / "a.sqlite"
    with Archive(path) as archive:
        archive.add(0, "", W3C_HEADER)
        archive.add(1, "", W3C_ROW)
    with Archive(path) as archive:                # a restart: the header is read back from the archive
        archive.add(2, "", W3C_ROW.replace("183.60.244.30", "10.0.0.9"))
    con = open_reader(path)
    try:
        rows = lines_of(con, [2, 3])
    finally:
        con.close()
    assert [next(v.text for v in ln.cells if v.kind == "col:c-ip") for ln in rows] == ["183.60.244.30", "10.0.0.9"]


EVIL = "#Fields: " + " ".join(f"evil{i}" for i in range(17))           # as wide as W3C_ROW: it would name its cells


def ips(path, seqs):
    con = open_reader(path)
    try:
        return [next((v.text for v in ln.cells if v.kind == "col:c-ip"), None) for ln in lines_of(con, seqs)]
    finally:
        con.close()


def test_a_lone_fields_line_among_rows_renames_no_row_after_it(tmp_path):
    """Finding 12 of issue 55: any "#Fields:" line renamed the columns of the rows after it (a line in the stream)."""
    path = tmp_path / "a.sqlite"
    with Archive(path) as archive:
        for i, text in enumerate(["#Software: Microsoft Internet Information Services 8.5", W3C_HEADER, W3C_ROW, EVIL,
                                  W3C_ROW, "#fields\tts\tuid", "a\tb"]):
            archive.add(10 + i, "", text)
        archive.flush()
        assert archive.stats["headers_refused"] == 2
    assert ips(path, [3, 5]) == ["183.60.244.30", "183.60.244.30"]
    with Archive(path) as archive:                # reopened: the header in force is still the block's, not EVIL
        archive.add(17, "", W3C_ROW)
    assert ips(path, [8]) == ["183.60.244.30"]


def test_a_header_block_names_the_rows_after_it_a_w3c_restart_and_a_zeek_head_included(tmp_path):
    renamed = W3C_HEADER.replace("c-ip", "client-addr")
    zeek = ["#separator \\x09", "#set_separator\t,", "#path\thttp", ZEEK_HEADER, ZEEK_ROW]
    path = tmp_path / "a.sqlite"
    with Archive(path) as archive:
        for i, text in enumerate([W3C_HEADER, W3C_ROW, "#Version: 1.0", "#Date: 2015-01-14 00:00:00", renamed,
                                  W3C_ROW, *zeek]):
            archive.add(i, "", text)                                   # the first line of its source: taken
    con = open_reader(path)
    try:
        rows = lines_of(con, [2, 6, 11])
    finally:
        con.close()
    assert {v.kind for v in rows[0].cells} >= {"col:c-ip"} and {v.kind for v in rows[1].cells} >= {"col:client-addr"}
    assert {v.kind: v.text for v in rows[2].cells}["col:id.orig_p"] == "52030"
