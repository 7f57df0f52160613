"""The cited reader (issue 47), fast tier: routes, lookups copied from the lines they cite, computed aggregates, and
the reply contract on the HTTP and zmq faces, over real archives and a front on stand-ins (no model)."""
from __future__ import annotations

import http.client
import json

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import config
from pipeline.messages import Question
from pipeline.serve.auth import Keys
from pipeline.serve.cited import Choice, Reply, chosen, read
from pipeline.serve.front import Front
from pipeline.serve.http_api import serve_http
from pipeline.serve.route import route
from pipeline.serve.zmq_api import ZmqFront, ask
from pipeline.stream.archive import Archive
from pipeline.stream.records import read_log
from tests.paths import SHARED
from tests.pipeline.serve.test_operators import Asks, WordTokenizer

TEP_LOG = SHARED / "data" / "tep_alarms" / "filter" / "text_alarms_filter_1.csv"
SSH = ["Dec 10 06:55:48 LabSZ sshd[24200]: Failed password for invalid user webmaster from 173.234.31.186 port 38926 "
       "ssh2",
       "Dec 10 07:07:38 LabSZ sshd[24206]: Accepted password for fztu from 119.137.62.142 port 49116 ssh2",
       "Dec 10 07:08:38 LabSZ sshd[24207]: Failed password for root from 119.137.62.142 port 22 ssh2",
       "Dec 10 07:09:01 LabSZ sshd[24208]: pam_unix(sshd:auth): authentication failure; rhost=5.6.7.8 user=root",
       "17/06/09 20:10:46 INFO storage.MemoryStore: Block broadcast_3 stored as values in memory (estimated size "
       "28.0 KB, free 317.1 MB)",
       "081109 204005 35 INFO dfs.FSNamesystem: BLOCK* NameSystem.addStoredBlock: blockMap updated: "
       "10.251.73.220:50010 is added to blk_-1608999687919862906 size 67108864"]


def archive_of(path, lines, times=None) -> str:
    with Archive(path) as archive:
        for i, text in enumerate(lines):
            archive.add(i, times[i] if times else "", text)
    return str(path)


@pytest.fixture
def ssh(tmp_path):
    return archive_of(tmp_path / "ssh.sqlite", SSH)


def supported(reply: Reply) -> bool:
    """No answer without a citation: a lookup's answer is a span of a line it cites."""
    return reply.answer is None or any(reply.answer in c.text for c in reply.citations)


# -- routing ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("question, kind, op", [
    ("what port did user webmaster fail on?", "lookup", "span"),
    ("how many kB did broadcast_3 free?", "lookup", "span"),
    ("which node served block blk_-1608999687919862906?", "lookup", "span"),
    ("how many times did FIR123 go HIGH?", "aggregate", "count"),
    ("how many lines mention blk_7128370237687728475", "aggregate", "count"),
    ("When did PIR108 last go HH?", "aggregate", "last"),
    ("when did FIR123 first recover?", "aggregate", "first"),
    ("which user failed most often?", "aggregate", "most"),
    ("which ports did 119.137.62.142 connect from?", "aggregate", "distinct"),
    ("What is the plant doing?", "other", ""),
    ("Which uid acquired wake lock 166121161?", "lookup", "span"),            # a number of 3+ digits is a key
    ("Which pid logged the WindowManager line at 03-17 16:13:39.069?", "lookup", "span"),    # so is a time
    ("What did process 12 do?", "other", ""),                                 # ... not a number of 2
    ("Which file pattern did SQM queue for upload?", "lookup", "span"),      # no value named: its words find the line
    ("Which tag has raised the most alarms?", "aggregate", "most"),
    ("How many lines report HRESULT 0x80004005?", "aggregate", "count"),
])
def test_a_question_is_routed_by_its_own_values_and_words(question, kind, op):
    r = route(question)
    assert (r.kind, r.op) == (kind, op)


def test_the_noun_after_which_is_the_one_asked_and_verbs_of_holding_are_not_words_to_find_lines_by():
    r = route("su[9558] opened a session: which account?")
    assert (r.type_noun, r.want[-1]) == ("account", "user")
    assert route("How many lines report HRESULT 0x80004005?").roots == ("hresult",)
    assert "report" in route("How many SCREEN_ON broadcasts has the report receiver got?").roots
    assert route("How many SCREEN_ON broadcasts has the report receiver got?").keys == ("SCREEN_ON",)  # a code


@pytest.mark.parametrize("question, alarm", [
    ("Which tags have gone HIGH HIGH or LOW LOW?", "HH|LL"), ("Count the alarm lines of type LL.", "LL"),
    ("How many L alarms have been raised so far?", "L"), ("how many low memory warnings?", ""),
    ("How many times did FIR123 go HIGH?", "H")])
def test_an_alarm_type_is_asked_with_a_tag_or_in_the_alarm_s_own_words(question, alarm):
    assert route(question).alarm == alarm


# -- lookups: copy, cite or abstain ----------------------------------------------------------------------------------
def test_without_a_span_of_the_kind_asked_the_value_after_the_word_naming_it_or_the_models_choice(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        "2005-06-13-17.51.29.224900 R16-M0-N8-C:J02-U11 RAS KERNEL FATAL instruction address: 0x00004ed8",
        "20171223-22:15:34:723|Step_StandReportReceiver|30002312|onReceive action: android.intent.action.SCREEN_OFF",
        "2016-09-28 04:30:31, Info CBS SQM: Warning: Failed to upload. [HRESULT = 0x80004005 - E_FAIL]"])
    assert read(path, "Which instruction address is in the message of 2005-06-13-17.51.29.224900?").answer == \
        "0x00004ed8"                                          # asked an address, the line has no ip: after "address:"
    assert read(path, "Which screen action did the receiver get at 20171223-22:15:34:723?").answer == "SCREEN_OFF"
    after_value = read(path, "Which error name goes with HRESULT 0x80004005?")   # only after the value named: a
    assert isinstance(after_value, Choice) and "E_FAIL" in after_value.options   # guess, so the model chooses


def test_the_line_whose_span_the_question_s_words_name_beats_a_newer_one(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        "18:01:56 RMContainerAllocator: Assigned container container_1445_01_000002 to attempt_1445_m_000000_0",
        "18:01:57 [ContainerLauncher #0] org.apache.hadoop.v2.launcher.ContainerLauncherImpl: Launching "
        "attempt_1445_m_000000_0",
        "19:21:39 - WARN [RecvWorker:1889:QuorumCnxManager$RecvWorker@762] - Connection broken for id 1889, my id = 1"])
    reply = read(path, "What container id did attempt_1445_m_000000_0 get?")
    assert (reply.answer, reply.citations[0].seq) == ("container_1445_01_000002", 1)
    assert read(path, "For which id was the connection broken at 19:21:39?").answer == "1889"


def test_a_lookup_naming_no_value_stands_on_a_line_holding_every_word_of_it(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        r"04:30:31, Info CBS SQM: Queued 0 file(s) for upload with pattern: C:\Windows\sqm\*_all.sqm, flags: 0x6",
        r"04:30:32, Info CBS SQM: Failed to start upload with file pattern: C:\Windows\sqm\*_std.sqm, flags: 0x2"])
    assert read(path, "Which file pattern did SQM queue for upload?").answer == r"C:\Windows\sqm\*_all.sqm"
    assert read(path, "Which file pattern did SQM fail to start uploading?").answer == r"C:\Windows\sqm\*_std.sqm"
    assert read(path, "Which file did SQM delete for upload?") is None          # no line says "delete": the model's


def test_a_field_the_question_names_is_the_value_the_line_writes_after_it(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        '03-17 16:13:38.819  1702  2227 D PowerManagerService: acquire lock=233570404, flags=0x1, tag="View Lock", uid=1000',
        '03-17 16:13:39.819  1702  2227 D PowerManagerService: acquire lock=166121161, flags=0x1, tag="Other", uid=1001'])
    reply = read(path, "What tag did wake lock 233570404 have?")
    assert (reply.answer, [c.seq for c in reply.citations]) == ("View Lock", [1])
    assert read(path, "Wake lock 166121161 was acquired by which uid?").answer == "1001"
    assert read(path, "Which uid acquired wake lock 191063410?").answer is None       # no line holds that lock


def test_a_time_of_day_names_the_line_stamped_with_it_and_of_two_type_nouns_the_second_is_wanted(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        "2015-07-29 19:18:14,511 - INFO  [/10.10.34.11:3888:QuorumCnxManager] - Received connection request "
        "/10.10.34.12:47838",
        "2015-07-29 19:18:15,000 - INFO  [/10.10.34.11:3888:QuorumCnxManager] - Received connection request "
        "/10.10.34.13:47839"])
    reply = read(path, "Which source port did the connection request received at 19:18:14,511 use?")
    assert (reply.answer, [c.seq for c in reply.citations]) == ("47838", [1])


def test_a_lookup_copies_its_answer_from_the_line_it_cites(ssh):
    reply = read(ssh, "what port did user webmaster fail on?")
    assert reply.answer == "38926" and [c.seq for c in reply.citations] == [1]
    cited = reply.citations[0]
    assert cited.text == SSH[0] and " port 38926 " in cited.text and cited.time == "Dec 10 06:55:48"
    assert reply.text.startswith("port 38926, from line #1 at Dec 10 06:55:48: ")


def test_every_identifier_the_question_names_filters_the_lines(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", ["10:00:01 conn job_7 from 10.0.0.1 port 1111",
                                              "10:00:02 conn job_8 from 10.0.0.1 port 2222",
                                              "10:00:03 conn job_7 from 10.0.0.2 port 3333"])
    reply = read(path, "what port did job_7 use from 10.0.0.1?")
    assert reply.answer == "1111" and [c.seq for c in reply.citations] == [1]


def test_not_found_when_no_line_holds_the_identifier_and_the_nearest_lines_are_not_citations(ssh):
    reply = read(ssh, "what port did user nobody fail on?")
    assert reply.answer is None and reply.citations == () and reply.text.startswith("not found")
    assert reply.nearest


def test_lines_of_one_rank_with_different_values_are_each_cited_newest_first(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", ["10:00:01 job_7 listening on port 1111",
                                              "10:00:02 job_7 listening on port 2222",
                                              "10:00:03 job_7 listening on port 3333"])
    reply = read(path, "which port is job_7 listening on?")
    assert reply.answer == "3333" and [c.seq for c in reply.citations] == [3, 2, 1]
    assert "other lines say otherwise, newest first: 2222 on line #2" in reply.text


def test_the_newest_line_is_a_candidate_however_recent(ssh):
    assert read(ssh, "what port did user root fail on?").citations[0].seq == 3     # the last port-bearing root line


def test_the_words_before_a_span_pick_it_among_several_of_its_kind(ssh):
    assert read(ssh, "how much memory did broadcast_3 have free?").answer == "317.1 MB"
    assert read(ssh, "what was the estimated size of broadcast_3?").answer == "28.0 KB"


def test_to_names_a_destination_and_from_a_source(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        "2022/05/06 04:53:57 [190.2.139.67:58629] [channel 106] direct TCP/IP forwarding from 127.0.0.1:22 to "
        "142.93.136.142:80 requested"])
    assert read(path, "Which destination port did channel 106 of 190.2.139.67:58629 request?").answer == "80"
    assert read(path, "Which source port did channel 106 of 190.2.139.67:58629 forward from?").answer == "22"


def test_a_field_is_named_by_its_whole_name_or_a_root_of_three_letters_in_it(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        '2022/05/06 05:40:30 [186.78.209.242:47338] authentication for user "pi" with password "raspberry9" accepted'])
    assert read(path, "When did someone first log in as pi?").answer == "2022/05/06 05:40:30"   # "as": no "password"
    assert read(path, "Which password did 186.78.209.242:47338 log in with?").answer == "raspberry9"


def test_spans_the_words_cannot_tell_apart_go_to_the_model_as_closed_options(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", ["10:00:01 job_7 moved 10 kB and 20 kB"])
    choice = read(path, "how many kB did job_7 have?")
    assert isinstance(choice, Choice) and choice.options == ("10 kB", "20 kB")
    picked = chosen(choice, "20 kB\n")
    assert picked.answer == "20 kB" and picked.citations[0].seq == 1 and supported(picked)
    assert chosen(choice, "30 kB").answer is None                 # cut short: nothing the line does not hold


def test_a_line_with_no_span_of_the_kind_asked_offers_the_model_every_span_it_holds_but_the_named_ones(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        "33697 node-251 action start 1076435713 1 clusterAddMember  (command 2110)",
        "33698 node-252 action start 1076435799 1 boot  (command 2111)"])
    choice = read(path, "Which job did node-251 run?")                  # no id but the one named, no word "job"
    assert isinstance(choice, Choice) and choice.line.seq == 1
    assert choice.options == ("33697", "1", "2110")             # in line order; not node-251 (named), not its time
    assert chosen(choice, "2110").answer == "2110" and supported(chosen(choice, "2110"))
    assert read(path, "Which job did node-999 run?").answer is None          # no line: not found, no choice


def test_a_duration_asked_in_its_unit_is_the_number_the_line_writes_with_that_unit(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        "Jul  1 11:48:43 host kernel[0]: PM response took 1938 ms (54, powerd) after 2 tries",
        "Jul  1 11:48:44 host kernel[0]: PM response took 12 s (55, powerd)"])
    r = route("At Jul  1 11:48:43 the kernel timed a PM response: how many ms?")
    assert (r.kind, r.want, r.unit) == ("lookup", ("number",), "ms")       # a duration, not a count
    assert read(path, "At Jul  1 11:48:43 the kernel timed a PM response: how many ms?").answer == "1938"
    assert read(path, "At Jul  1 11:48:44, how many seconds did the PM response take?").answer == "12"


def test_the_answers_a_question_offers_pick_the_lines_word_among_them(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        "Jul  1 11:55:14 host kernel[0]: AirPort: Link Down on en0. Reason 8 (Disassociated).",
        "Jul  1 11:55:20 host kernel[0]: AirPort: Link Up on en0",
        "1120 node-129 action start 1079069377 1 boot (command 2602)"])
    assert read(path, "At Jul  1 11:55:14, did the AirPort link on en0 go Up or Down?").answer == "Down"
    assert read(path, "Which action (boot, wait, halt, ...) did node-129 begin for command 2602?").answer == "boot"
    assert route("On which interfaces has AirPort reported a link going up or down?").alternatives == ()   # a list


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ann", "bob", "cy", "dee"]), st.integers(1, 65535),
                          st.sampled_from(["Failed", "Accepted"])), min_size=1, max_size=12),
       st.sampled_from(["ann", "bob", "cy", "dee", "eve"]))
def test_every_answer_is_a_span_of_a_line_it_cites_and_the_newest_such_line_answers(tmp_path_factory, rows, who):
    lines = [f"10:{i // 60:02d}:{i % 60:02d} sshd[{100 + i}]: {word} password for {name} from 10.1.{i}.9 port {port}"
             for i, (name, port, word) in enumerate(rows)]
    path = archive_of(tmp_path_factory.mktemp("p") / "a.sqlite", lines)
    reply = read(path, f"what port did user {who} fail on?")
    assert supported(reply)
    theirs = [i for i, (name, _, word) in enumerate(rows) if name == who]
    if not theirs:
        assert reply.answer is None
        return
    failed = [i for i in theirs if rows[i][2] == "Failed"]
    newest = max(failed or theirs)                              # the most question words, then the newest
    assert reply.citations[0].seq == newest + 1 and reply.answer == str(rows[newest][1])


# -- aggregates: computed, with their scope --------------------------------------------------------------------------
def test_a_count_is_the_number_of_lines_with_the_tag_and_alarm_type_asked(tmp_path):
    records = read_log(TEP_LOG)
    path = archive_of(tmp_path / "tep.sqlite", [r.text for r in records], [r.time for r in records])
    expected = sum(1 for r in records if r.text.split()[1:3] == ["FIR123", "H"] and " NR " not in r.text)
    reply = read(path, "How many times did FIR123 go HIGH?")
    assert expected > 1 and reply.answer == str(expected)
    assert reply.text.startswith(f"{expected} times since line #1 ({records[0].time})")
    assert all("FIR123 H " in c.text and " NR " not in c.text for c in reply.citations)


def test_the_stemmer_lets_fail_count_failed_and_failure_lines(ssh):
    reply = read(ssh, "how many times did root fail?")
    assert reply.answer == "2" and {c.seq for c in reply.citations} == {3, 4}


def test_first_and_last_cite_the_oldest_and_newest_matching_line(tmp_path):
    records = read_log(TEP_LOG)
    path = archive_of(tmp_path / "tep.sqlite", [r.text for r in records], [r.time for r in records])
    fir = [i for i, r in enumerate(records) if r.text.split()[1:3] == ["FIR123", "H"] and " NR " not in r.text]
    last, first = read(path, "When did FIR123 last go HIGH?"), read(path, "When did FIR123 first go HIGH?")
    assert last.citations[0].seq == fir[-1] + 1 and last.answer == records[fir[-1]].text.split()[0]
    assert first.citations[0].seq == fir[0] + 1 and supported(first) and supported(last)


def test_most_frequent_and_distinct_values_are_computed(ssh):
    assert read(ssh, "which user failed most often?").answer == "root"
    assert read(ssh, "which ports did 119.137.62.142 connect from?").answer == "22, 49116"


def test_every_value_a_list_of_distinct_values_names_is_in_a_line_it_cites(tmp_path):
    lines = [f"10:00:{i:02d} TIR{100 + i} H TEMP HIGH ALM" for i in range(40)]           # 40 tags, more than 8
    reply = read(archive_of(tmp_path / "a.sqlite", lines), "which tags went high?")
    listed = reply.answer.split(", ")
    assert len(listed) == 40 and all(any(v in c.text for c in reply.citations) for v in listed)


def test_a_count_counts_the_lines_whose_word_parts_name_the_subject(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        "22:15:29:633|Step_StandReportReceiver|30002312|onReceive action: android.intent.action.SCREEN_ON",
        "22:15:29:635|Step_LSC|30002312|processHandleBroadcastAction action:android.intent.action.SCREEN_ON",
        "22:15:35:096|Step_StandReportReceiver|30002312|onReceive action: android.intent.action.SCREEN_ON",
        "22:15:35:097|Step_StandReportReceiver|30002312|onReceive action: android.intent.action.SCREEN_OFF"])
    reply = read(path, "How many SCREEN_ON broadcasts has the report receiver got?")
    assert reply.answer == "2" and {c.seq for c in reply.citations} == {1, 3}


def test_an_alarm_type_named_without_a_tag_selects_the_lines_and_unknown_words_leave_the_most_frequent_tag(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", ["01:00:00 FIR123 L FLW LOW ALM", "01:00:10 LIR110 LL LVL LOW ALM",
                                              "01:00:20 FIR123 L NR FLW LOW ALM RECOVERED",
                                              "01:00:30 PIR108 HH PRS HIGH ALM", "01:00:40 FIR123 L FLW LOW ALM"])
    assert read(path, "Count the alarm lines of type LL.").answer == "1"
    assert set(read(path, "Which tags have gone HIGH HIGH or LOW LOW?").answer.split(", ")) == {"LIR110", "PIR108"}
    assert read(path, "Which tag has raised the most alarms?").answer == "FIR123"      # the log writes ALM


def test_a_short_number_named_with_its_noun_is_a_key_the_line_writes_after_that_noun(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        "04:51:08 jk2_init() Found child 9 in scoreboard slot 8", "04:51:09 jk2_init() Found child 8 in scoreboard slot 9",
        "04:51:10 jk2_init() Found child 7 in scoreboard slot 9", "04:51:11 mod_jk child workerEnv in error state 9"])
    reply = read(path, "How many times has a child been found in scoreboard slot 9?")
    assert reply.answer == "2" and {c.seq for c in reply.citations} == {2, 3}
    assert read(path, "When was a child first found in slot 8?").answer == "04:51:08"
    assert route("What did process 12 do?").kind == "other"          # a noun naming a key asks nothing by itself


def test_a_quoted_phrase_is_held_as_written_and_a_value_after_besides_is_never_the_answer(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", [
        "[10.30 16:49:06] chrome.exe - proxy.cse.cuhk.edu.hk:5070 open through proxy proxy.cse.cuhk.edu.hk:5070 HTTPS",
        "[10.30 16:49:07] svchost.exe - proxy.cse.cuhk.edu.hk:5070 open through proxy proxy.cse.cuhk.edu.hk:5070 HTTPS",
        "[10.30 16:49:08] chrome.exe - proxy.cse.cuhk.edu.hk:5070 open through proxy proxy.cse.cuhk.edu.hk:5070 HTTPS",
        "[10.30 16:49:09] Dropbox.exe - proxy.cse.cuhk.edu.hk:5070 open through proxy proxy.cse.cuhk.edu.hk:5070 HTTPS",
        "[10.30 16:49:10] Dropbox.exe - proxy.cse.cuhk.edu.hk:5070 close, 2437 bytes (2.37 KB) sent, 344 bytes received",
        "081109 203615 148 INFO dfs.DataNode$DataXceiver: 10.251.35.1:50010 Served block blk_1 to /10.251.122.38",
        "081109 203616 149 INFO dfs.DataNode$DataXceiver: 10.251.35.1:50010 Serving block blk_2 to /10.251.122.39"])
    assert read(path, "How many 'Served block' lines have the DataXceivers written?").answer == "1"
    assert set(read(path, "Besides chrome.exe, which programs have gone through the proxy?").answer.split(", ")) == \
        {"svchost.exe", "Dropbox.exe"}
    assert read(path, "How many bytes did Dropbox.exe send over the connection it closed at 10.30 16:49:10?").answer \
        == "2437"                                  # asked in bytes: the number of "2437 bytes", not "(2.37 KB)"


def test_most_frequent_and_distinct_values_are_spans_of_the_lines_they_cite(tmp_path):
    lines = [f"20:10:{i:02d} INFO executor.Executor: Running task {i}.0 in stage {s}.0 (TID {i})"
             for i, s in enumerate([0, 0, 1, 0, 2])]
    path = archive_of(tmp_path / "a.sqlite", lines)
    most = read(path, "Which stage has had the most tasks run here?")
    assert most.answer == "0.0" and supported(most)
    listed = read(path, "Which stages have had tasks run so far?")
    assert set(listed.answer.split(", ")) == {"0.0", "1.0", "2.0"}
    assert all(any(v in c.text for c in listed.citations) for v in listed.answer.split(", "))


def test_a_count_of_a_value_no_line_holds_is_not_found_and_an_aggregate_of_unknown_words_is_the_models(ssh):
    zero = read(ssh, "how many times did user zed fail?")
    assert zero.answer is None and zero.citations == () and zero.text.startswith("not found: no line since line #1")
    assert read(ssh, "how many alarms are active now?") is None


# -- the reply contract ----------------------------------------------------------------------------------------------
def front_on(archive: str, **serve) -> Front:
    """A real `Front` over a real archive, on stand-ins: spans of one token per word, a channel taking everything."""
    front = Front(config.parse({"serve": serve}), WordTokenizer(), [("", Asks(), archive)])
    front.framing.span = lambda tok, system, messages, retrieved=(): np.ones(
        len(" ".join([*retrieved, messages[-1]["content"]]).split()), np.int32)
    return front


def sent_of(front: Front) -> list[dict]:
    """What the front sent its (stand-in) owner."""
    return front.views[""].asks.sent


def contract(meta: dict) -> None:
    assert set(meta) >= {"answer", "route", "citations"}
    assert meta["route"] in ("lookup", "aggregate", "other")
    assert meta["answer"] is None or isinstance(meta["answer"], str)
    for c in meta["citations"]:
        assert set(c) == {"seq", "time", "text"} and isinstance(c["seq"], int) and isinstance(c["time"], str)


def post(port: int, body: dict):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn.getresponse()


def test_a_direct_answer_has_the_reply_shape_of_a_model_answer_on_http_whole_and_streamed(ssh):
    front = front_on(ssh)
    server = serve_http(front, "127.0.0.1", 0, Keys())
    try:
        port = server.server_address[1]
        said = [{"role": "user", "content": "what port did user webmaster fail on?"}]
        whole = json.loads(post(port, {"messages": said}).read())
        contract(whole["ringspec"])
        assert whole["ringspec"]["answer"] == "38926" and whole["ringspec"]["route"] == "lookup"
        assert whole["ringspec"]["model_call"] is False                  # the archive answered alone
        assert whole["ringspec"]["citations"] == [{"seq": 1, "time": "Dec 10 06:55:48", "text": SSH[0]}]
        text = whole["choices"][0]["message"]["content"]
        assert text.startswith("port 38926, from line #1") and whole["choices"][0]["finish_reason"] == "stop"
        events = [line[6:] for line in post(port, {"messages": said, "stream": True}).read().decode().split("\n")
                  if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert len(chunks) > 3 and "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == text
        assert chunks[-1]["ringspec"] == {**whole["ringspec"], **{k: chunks[-1]["ringspec"][k] for k in
                                                                   ("frame_ms", "ttft_ms", "total_ms")}}
    finally:
        server.shutdown()
        server.server_close()
    assert sent_of(front) == []                                     # nothing queued on the owner
    journal = front.take_direct()                                   # ... and both answers go to the journal
    assert [(name, r["kind"], r["answer"], r["model_call"]) for name, r in journal] == [("", "answer", "38926", False)] * 2
    assert journal[0][1]["citations"] == whole["ringspec"]["citations"] and front.take_direct() == []


def test_a_direct_answer_has_the_same_fields_over_zmq(ssh, tmp_path):
    front = front_on(ssh)
    endpoint = f"ipc://{tmp_path}/ask.sock"
    z = ZmqFront(front, endpoint)
    try:
        got = ask(endpoint, "How many times did root fail?", timeout_s=30)
    finally:
        z.close()
    contract(got["ringspec"])
    assert (got["ringspec"]["answer"], got["ringspec"]["route"], got["ringspec"]["model_call"]) == \
        ("2", "aggregate", False)
    assert got["text"].startswith("2 times since line #1")


def test_a_choice_goes_to_the_owner_under_an_options_rule_and_the_reader_free_sends_every_question(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", ["10:00:01 job_7 moved 10 kB and 20 kB"])
    front = front_on(path)
    front.ask("ann", messages=[{"role": "user", "content": "how many kB did job_7 have?"}])
    (sent,) = sent_of(front)
    assert sent["kind"] == Question.kind and sent["rule"]["options"] == ["10 kB", "20 kB"]
    free = front_on(path, reader="free")
    answer = free.ask("ann", messages=[{"role": "user", "content": "how many kB did job_7 have?"}])
    (sent,) = sent_of(free)
    assert sent["rule"] is None and answer.route == "other" and answer.citations[0]["seq"] == 1


def test_a_choice_too_long_to_ask_drops_its_line_then_is_answered_undecided_never_refused(tmp_path):
    """A long line (a Zeek record) makes the choice's prompt longer than serve.max_prompt_tokens: the options are asked
    without the line; options that alone do not fit get a reply citing the line, answer null (no HTTP 400)."""
    filler = " ".join(f"field{i}" for i in range(40))
    path = archive_of(tmp_path / "a.sqlite", [f"10:00:01 job_7 moved 10 kB and 20 kB {filler}",
                                              "10:00:02 job_8 moved " + " ".join(f"{i} kB" for i in range(1, 13))])
    front = front_on(path, max_prompt_tokens=24)
    front.ask("ann", messages=[{"role": "user", "content": "how many kB did job_7 have?"}])
    (sent,) = sent_of(front)
    assert sent["rule"]["options"] == ["10 kB", "20 kB"]
    answer = front.ask("ann", messages=[{"role": "user", "content": "how many kB did job_8 have?"}])
    assert len(sent_of(front)) == 1 and answer.finished                  # nothing more sent: answered here
    assert answer.citations[0]["seq"] == 2 and answer.text.startswith("not decided between 1 kB, 2 kB")


def test_serve_reader_is_cited_or_free():
    assert config.parse({}).serve.reader == "cited"
    with pytest.raises(config.ConfigError, match="serve.reader"):
        config.parse({"serve": {"reader": "fancy"}})


def test_the_question_message_carries_a_rule_through_its_encoding():
    from pipeline.messages import decode, send

    class Wire:
        def send(self, header, arrays, timeout=None):
            self.header, self.arrays = msgpack.unpackb(msgpack.packb(header), raw=False), arrays
            return 1
    q = Question(id="q1", client="c", max_tokens=4, deadline_s=1.0, rule={"kind": "options", "options": ["a"]},
                 ids=np.zeros(2, np.int32))
    wire = Wire()
    send(wire, q)
    assert decode(wire).rule == q.rule


# -- positional rows: the cell the header names -----------------------------------------------------------------------
W3C = ["#Software: Microsoft Internet Information Services 8.5",
       "#Fields: date time s-ip cs-method cs-uri-stem cs-uri-query s-port cs-username c-ip cs(User-Agent) "
       "cs(Referer) sc-status sc-substatus sc-win32-status sc-bytes cs-bytes time-taken",
       "2015-01-13 22:30:30 100.79.192.81 GET /iwebshop/ - 80 - 183.60.244.30 Mozilla/5.0 - 404 0 2 1405 246 282",
       "2015-01-13 22:30:31 100.79.192.81 GET /store/ - 80 - 183.60.244.30 Mozilla/5.0 - 404 0 2 1405 244 407",
       "2015-01-13 22:30:33 100.79.192.81 GET /robots.txt - 80 - 157.55.39.146 bingbot - 200 0 0 1020 170 31"]
ZEEK = ["#separator \\x09",
        "#fields\tts\tuid\tid.orig_h\tid.orig_p\tid.resp_h\tid.resp_p\tmethod\thost\tresponse_body_len\tstatus_code"
        "\tresp_mime_types",
        "1320279566.452687\tCwFs1P2UcUdlSxD2La\t192.168.2.76\t52026\t132.235.215.119\t80\tGET\twww.reddit.com\t109712"
        "\t200\ttext/html",
        "1320279566.831619\tCJxSUgkInyKSHiju1\t192.168.2.76\t52030\t72.21.211.173\t80\tGET\te.thumbs.redditmedia.com"
        "\t2300\t200\timage/jpeg",
        "1320279567.012345\tCaP2LpLGvsmX7yJO\t192.168.2.76\t52031\t72.21.211.173\t80\tGET\te.thumbs.redditmedia.com"
        "\t0\t304\timage/jpeg"]


@pytest.mark.parametrize("log, question, answer", [
    (W3C, "How many bytes did the client send for /store/?", "244"),
    (W3C, "How many bytes did the server send for /store/?", "1405"),
    (W3C, "Which client asked for /store/?", "183.60.244.30"),
    (W3C, "What status did IIS return for /robots.txt?", "200"),
    (W3C, "What time-taken did IIS log for /store/?", "407"),
    (W3C, "When was /store/ requested?", "2015-01-13 22:30:31"),        # the line's time, not its date cell
    (ZEEK, "Which source port did connection CJxSUgkInyKSHiju1 use?", "52030"),
    (ZEEK, "Connection CwFs1P2UcUdlSxD2La: what was the responder's IP?", "132.235.215.119"),
    (ZEEK, "What is the uid of the request logged at 1320279566.831619?", "CJxSUgkInyKSHiju1"),
    (ZEEK, "How big was the response body on connection CwFs1P2UcUdlSxD2La?", "109712"),
    (ZEEK, "Which MIME type is downloaded most often?", "image/jpeg"),     # over the rows, not the "#fields" line
])
def test_a_positional_rows_answer_is_the_cell_its_header_names_with_the_words_asked(tmp_path, log, question, answer):
    reply = read(archive_of(tmp_path / "rows.sqlite", log), question)
    assert isinstance(reply, Reply) and reply.answer == answer, reply
    assert supported(reply) and not any(c.text.startswith("#") for c in reply.citations)

