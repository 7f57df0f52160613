"""Typed values of a line and the line templates, fast tier: no model, no archive."""
import pytest

from pipeline.stream.records import read_log
from pipeline.stream.templates import MASK, Miner
from pipeline.stream.values import stem, values_of
from tests.paths import SHARED

LOGHUB = SHARED / "data" / "loghub"


def kinds(text: str) -> set[tuple[str, str]]:
    return {(v.kind, v.text) for v in values_of(text)}


def test_decimals_keep_their_fraction_and_sizes_their_unit():
    found = kinds("17/06/09 20:10:46 INFO storage.MemoryStore: Block broadcast_3 stored as values in memory "
                  "(estimated size 28.0 KB, free 317.1 MB) progress 0.50")
    assert {("size", "28.0 KB"), ("size", "317.1 MB"), ("number", "0.50"), ("id", "broadcast_3")} <= found
    assert ("number", "28") not in found and ("number", "0") not in found


def test_ips_and_ports_are_whole_values():
    found = kinds("Dec 10 07:07:38 LabSZ sshd[24206]: Accepted password for fztu from 119.137.62.142 port 49116 ssh2 "
                  "blockMap updated: 10.251.73.220:50010 is added")
    assert {("ip", "119.137.62.142"), ("port", "49116"), ("addr", "10.251.73.220:50010"), ("ip", "10.251.73.220"),
            ("port", "50010"), ("user", "fztu")} <= found
    assert not {v for k, v in found if k == "number" and v in ("119", "137", "62", "142", "10", "251")}


@pytest.mark.parametrize("text, value", [
    ("081109 203615 148 INFO dfs.DataNode$PacketResponder: Received block blk_-1608999687919862906 of size 91178",
     ("id", "blk_-1608999687919862906")),
    ("01:32:20 FIR123 H FLW COND CW HIGH ALM", ("id", "FIR123")),
    ("01:32:20 FIR123 H NR FLW COND CW HIGH ALM RECOVERED", ("status", "NR")),
    ("KILLING attempt_1445144423722_0020_m_000003_0", ("id", "attempt_1445144423722_0020_m_000003_0")),
    ("Jul 24 04:20:19 combo su(pam_unix)[17283]: session closed for user cyrus", ("user", "cyrus")),
    ("authentication failure; logname= uid=0 euid=0 tty=NODEVssh ruser= rhost=61.53.154.93  user=root", ("user", "root")),
    ("Loaded C:\\Windows\\winsxs\\cbscore.dll now", ("path", "C:\\Windows\\winsxs\\cbscore.dll")),
    ("Freed 1024 kB in /var/log/app.log", ("path", "/var/log/app.log")),
    ("Freed 1024 kB in /var/log/app.log", ("size", "1024 kB")),
    ("Jun 14 15:16:01 combo sshd(pam_unix)[19939]: authentication failure", ("time", "Jun 14 15:16:01")),
    ("authentication failure; logname= uid=0 euid=0 tty=NODEVssh ruser= rhost=61.53.154.93  user=root",
     ("field:rhost", "61.53.154.93")),
    ('03-17 16:13:38.819  1702  2227 D PowerManagerService: acquire lock=233570404, flags=0x1, tag="View Lock", '
     'uid=1000', ("field:tag", "View Lock")),
    ('03-17 16:13:38.819  1702  2227 D PowerManagerService: acquire lock=233570404', ("status", "D")),
    ("2015-07-29 19:18:14,511 - INFO  [/10.10.34.11:3888:QuorumCnxManager] - Received connection request",
     ("clock", "19:18:14,511")),
    ("08:06:30 AIR001_5 H NR REACT FEED A CONC HIGH ALM", ("alarm", "H NR")),
    ("2016-09-28 04:30:31, Error CBS Failed to resolve package [HRESULT = 0x800f0805 - CBS_E_INVALID_PACKAGE]",
     ("status", "CBS_E_INVALID_PACKAGE")),
    ("SQM: Warning: Failed to upload all unsent reports. [HRESULT = 0x80004005 - E_FAIL]", ("status", "E_FAIL")),
    ("onReceive action: android.intent.action.SCREEN_OFF", ("status", "SCREEN_OFF")),
    ("attempt_1445144423722_0020_m_000007_0 TaskAttempt Transitioned from NEW to UNASSIGNED", ("status", "UNASSIGNED")),
    ("JobImpl: Default file system [hdfs://msra-sa-41:9000]", ("path", "hdfs://msra-sa-41:9000")),
    ("Extract jar:file:/D:/hadoop/yarn-common.jar!/webapps/mapreduce to C:\\Temp\\x",
     ("path", "file:/D:/hadoop/yarn-common.jar!/webapps/mapreduce")),
    ("[Sun Dec 04 04:47:44 2005] [notice] workerEnv.init() ok", ("time", "Sun Dec 04 04:47:44 2005")),
    ("[10.30 16:49:06] chrome.exe - proxy.cse.cuhk.edu.hk:5070 open through proxy", ("time", "10.30 16:49:06")),
    ("[10.30 16:49:06] chrome.exe - proxy.cse.cuhk.edu.hk:5070 open through proxy", ("path", "chrome.exe")),
    ("[10.30 16:49:06] chrome.exe - proxy.cse.cuhk.edu.hk:5070 open through proxy", ("host", "proxy.cse.cuhk.edu.hk")),
    ("reverse mapping checking getaddrinfo for ns.marryaldkfaczcz.com [173.234.31.186] failed",
     ("host", "ns.marryaldkfaczcz.com")),
    ("INFO rdd.HadoopRDD: Input split: hdfs://10.10.34.11:9000/pjhe/logs/2kSOSP.log:29168+7292",
     ("path", "hdfs://10.10.34.11:9000/pjhe/logs/2kSOSP.log")),
    ("INFO rdd.HadoopRDD: Input split: hdfs://10.10.34.11:9000/pjhe/logs/2kSOSP.log:29168+7292", ("number", "29168")),
    ("NameSystem.allocateBlock: /user/root/rand/_temporary/part-00296. blk_-66201", ("path", "/user/root/rand/_temporary/part-00296")),
    ('54.36.149.41 - - [22/Jan/2019:03:56:14 +0330] "GET /x HTTP/1.1" 404 30577 "-"',
     ("time", "22/Jan/2019:03:56:14 +0330")),                                               # an access log's time,
    ('54.36.149.41 - - [22/Jan/2019:03:56:14 +0330] "GET /x HTTP/1.1" 404 30577 "-"', ("clock", "03:56:14")),
    ('54.36.149.41 - - [22/Jan/2019:03:56:14 +0330] "GET /x HTTP/1.1" 404 30577 "-"', ("status", "404")),  # status
    ('54.36.149.41 - - [22/Jan/2019:03:56:14 +0330] "GET /x HTTP/1.1" 404 30577 "-"', ("size", "30577")),   # bytes
    ("2026-04-13 19:38:44.684 UTC [89] 00000: LOG:  connection received", ("time", "2026-04-13 19:38:44.684 UTC")),
    ("33697 node-251 action start 1076435713 1 boot (command 2110)", ("time", "1076435713")),   # epoch seconds ...
    ("- 1117838570 2005.06.03 R02-M1-N0-C:J12-U11 2005-06-03-15.42.50.675872 R02-M1-N0-C:J12-U11 RAS KERNEL INFO",
     ("time", "2005-06-03-15.42.50.675872")),                                 # ... only where no other time is
    ("Connecting to driver: spark://CoarseGrainedScheduler@10.10.34.11:48069", ("ip", "10.10.34.11")),   # a URL's
    ("Connecting to driver: spark://CoarseGrainedScheduler@10.10.34.11:48069", ("port", "48069")),       # parts
    ("Remoting started; listening on [akka.tcp://sparkExecutor@mesos-slave-07:55904]", ("host", "mesos-slave-07")),
    ("2024/02/16 06:05:22.113  2136       3728 S0   AcceptServer::HandleAccept", ("time", "2024/02/16 06:05:22.113")),
    ('2022/05/06 05:10:03 [195.3.147.60:28696] authentication for user "admin" with password "x" accepted',
     ("user", "admin")),                                                     # a quoted user name
    ('[195.3.147.60:28696] connection with client version "SSH-2.0-OpenSSH_5.9" established',
     ("field:version", "SSH-2.0-OpenSSH_5.9")),                              # a quoted value, named by the word before
    ("set: ACPI\\PNP0200\\4&E03A844&0 -> Configured [machine.inf:*PNP0200,NO_DRV_X] (ConfigFlags = 0x00000000).",
     ("field:configflags", "0x00000000")),                                  # "name = value"
    ("set: ACPI\\PNP0200\\4&E03A844&0 -> Configured [machine.inf:*PNP0200,NO_DRV_X]", ("path", "machine.inf")),
    ("2026-04-13 19:38:44.689 UTC [103] 00000: db=postgres LOG:  disconnection", ("status", "LOG")),  # PostgreSQL's
])
def test_each_kind_is_read_as_the_line_writes_it(text, value):
    assert value in kinds(text)


def test_every_value_is_exactly_the_span_it_names_on_every_loghub_line():
    for path in sorted(LOGHUB.glob("*.log")):
        for rec in read_log(path)[:400]:
            for v in values_of(rec.text):
                assert rec.text[v.start:v.end] == v.text and v.text, (path.name, rec.text, v)


def test_an_empty_field_does_not_take_the_next_one_as_its_value():
    found = kinds("authentication failure; logname= uid=0 euid=0 tty=ssh ruser= rhost=5.36.59.76  user=root")
    assert ("field:rhost", "5.36.59.76") in found and not {v for k, v in found if k in ("field:ruser", "field:logname")}


def test_the_stemmer_gives_fail_failed_and_failure_one_root():
    assert {stem(w) for w in ("fail", "failed", "Failure", "failures", "fails")} == {"fail"}
    assert "authentication".startswith(stem("authenticated"))
    assert stem("on") == "on" and stem("port") == "port"


def test_lines_of_one_message_share_a_template_and_their_parameters_are_their_tokens():
    miner = Miner()
    a, pa = miner.add("Received block blk_1 of size 91178 from /10.250.10.6")
    b, pb = miner.add("Received block blk_2 of size 67108864 from /10.251.73.220")
    c, _ = miner.add("Deleting block blk_1 file /mnt/hadoop/dfs/data/current/subdir19/blk_1")
    assert a == b != c
    assert pb == ["blk_2", "67108864", "/10.251.73.220"]
    assert miner.take_changed()[a] == f"Received block {MASK} of size {MASK} from {MASK}"
