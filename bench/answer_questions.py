"""Operators' questions over the shared logs, with gold answers computed from the raw log: `bench --task answers`' sets.

Owns the question sets in bench/questions/*.json and the script that writes them (`python -m bench.answer_questions`):
its own reading of each log (the 7 loghub logs line by line, TEP alarm CSVs row by row, rendered the way the stream
shows a row), its own regexes per log format, seeded choices, the development / held-out split, and the fresh split:
five more loghub logs vendored in bench/data, written by someone who never read the reader, every question of them
`fresh`; the fresh2 split is four more vendored the same way (HPC, Mac, OpenStack, Thunderbird), every question of them
`fresh2`; the fresh3 split is four logs of other kinds vendored the same way (a web shop's access log, an IIS W3C
log and a Zeek http.log from lnav's test data, a PostgreSQL log from quellog's), every question of them `fresh3`;
the fresh4 split is four more kinds vendored the same way (a Siemens WinCC S7 channel log, a TeamViewer log and a
Windows setupapi device-install log from plaso's test data, an sshesame SSH honeypot log from crowdsec's hub), every
question of them `fresh4`; the fresh5 split is two more kinds vendored the same way (a MongoDB mongod log from mtools'
test data, a Kafka broker server.log from Elastic's examples), every question of them `fresh5`.
Never imports the reader, the server or the project's parsers (a test only checks that its line numbers and
texts are the stream's); never runs a model.

Line n (1-based) of a log is its n-th line (a CSV: its n-th data row, the header excluded): the archive seq of that
line when the stream starts at line 1. A question asked after `ask_after` lines has its gold computed over
lines[:ask_after]; the gold also holds over lines[:n] for every n up to `stable_through` (at least ask_after +
MIN_SLACK: no line in that stretch changes it, nor adds a gold line), so a server that has read a few lines more by the
time it answers is judged by the same gold; the harness leaves out (as late) a reply given after more lines than that.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import random
import re
import string
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
FRESH = "bench/data/"      # a log path starting so lies in the checkout (bench/data/README.md), any other under DATA
QUESTIONS_DIR = Path(__file__).resolve().parent / "questions"
SEED = 47
SLACK = 80                 # stable_through is looked for up to ask_after + SLACK
MIN_SLACK = 20             # ... and must be at least ask_after + MIN_SLACK (5 s of stream at 4 lines/s)
MIN_ASK, MAX_ASK = 24, 200     # questions are asked after 24..200 lines: about 50 s of stream at 4 lines/s
HELDOUT_PERCENT = 60
QUOTA = {"lookup": 12, "count": 6, "first": 1, "last": 1, "most_frequent": 1, "which": 1, "not_found": 2}
FRESH_QUOTA = {**QUOTA, "lookup": 14, "first": 2, "last": 2}    # a fresh(2-5) log's set stands alone: a few more each
TIME_GROUPS = ("t", "clock", "when")    # the groups that hold a time in the patterns below
WHICH_MAX = 6              # a "which" question lists at most this many distinct values

EXACT = {
    "span": "kinds port, ip, size, path, id, user, status, node, time, first, last, most_frequent: the answer, "
            "stripped of surrounding whitespace, equals the gold exactly as written in the line (case and every "
            "character kept: '28.0' is not '28', '0x800f080d' not '0x800F080D'; a time is the line's timestamp field "
            "as written, e.g. 'Jun 15 12:12:34', '2015-07-29 19:22:20,143'; a TEP row's clock 'HH:MM:SS')",
    "count": "the answer, stripped, is a decimal integer equal to the gold",
    "which": "the answer split at commas gives, each stripped, the same set of values as the gold (order free)",
    "not_found": "the answer is null",
}


@dataclass(frozen=True)
class Question:
    id: str
    log: str                     # path under ../shared/data, e.g. "loghub/Linux_2k.log", or FRESH... (`log_path`)
    format: str                  # plain | csv (what `serve --format` is given)
    ask_after: int               # asked once the stream has ingested this many lines; gold over lines[:ask_after]
    text: str
    route: str                   # lookup | aggregate | not_found
    kind: str                    # port ip size path id user status node time | count first last most_frequent which
    gold: str | None             # None: not in the log
    gold_lines: tuple[int, ...]  # lines holding the gold (a lookup: every agreeing line, newest last; count: all)
    stable_through: int          # the gold (and gold_lines) is the same over lines[:n], ask_after <= n <= this
    split: str                   # dev | heldout | fresh | fresh2 | ... | fresh7
    absent: str | None = None    # not_found: the identifier in the text that occurs in no line of the log


@dataclass(frozen=True)
class Lookup:
    """A value read off one line: `pattern` names it (group `value`) and the line (its other groups, every one of
    them in each template)."""
    kind: str
    pattern: str
    templates: tuple[str, ...]


@dataclass(frozen=True)
class Tally:
    """Lines of one event (`pattern`, its groups naming the subject): how many, the first and the last one's time."""
    pattern: str
    count: tuple[str, ...]
    first: tuple[str, ...]
    last: tuple[str, ...]


@dataclass(frozen=True)
class Values:
    """Values of one kind (`pattern`'s group `value`): the most frequent one, and which distinct ones."""
    pattern: str
    most: tuple[str, ...]
    which: tuple[str, ...]


@dataclass(frozen=True)
class LogSpec:
    path: str                    # under DATA, or FRESH... in the checkout (`log_path`)
    fmt: str
    time: str                    # the line's timestamp field (a regex, no groups)
    lookups: tuple[Lookup, ...]
    tallies: tuple[Tally, ...]
    values: tuple[Values, ...]
    split: str | None = None     # every question's split (fresh, fresh2, ..., fresh7); None: dev or heldout by
                                 # a hash (`split_of`)


IP = r"\d+\.\d+\.\d+\.\d+"
TEP_TYPE = r"(?:HH|LL|H|L)"
SPECS = (
    LogSpec("loghub/Linux_2k.log", "plain", r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d", (
        Lookup("ip", rf"ftpd\[(?P<pid>\d+)\]: connection from (?P<value>{IP}) ", (
            "Which IP address did ftpd process {pid} accept a connection from?",
            "ftpd[{pid}] logged a connection - from what IP?",
            "What was the client IP of the FTP connection handled by pid {pid}?")),
        Lookup("ip", rf"sshd\(pam_unix\)\[(?P<pid>\d+)\]: authentication failure;.* rhost=(?P<value>{IP})\b", (
            "Which IP did the failed ssh login of process {pid} come from?",
            "sshd pid {pid} reported an authentication failure: from which address?")),
        Lookup("node", r"sshd\(pam_unix\)\[(?P<pid>\d+)\]: authentication failure;.* rhost=(?P<value>(?=[\w.-]*[a-z])"
                       r"[\w.-]+)", (
            "Which remote host did sshd process {pid} see failing authentication?",
            "What host name is the rhost of the ssh authentication failure of pid {pid}?")),
        Lookup("user", r"sshd\(pam_unix\)\[(?P<pid>\d+)\]: authentication failure;.* user=(?P<value>\w+)", (
            "Which user name did sshd process {pid} fail to authenticate?",
            "The ssh authentication failure logged by pid {pid}: for which user?")),
        Lookup("user", r"su\(pam_unix\)\[(?P<pid>\d+)\]: session opened for user (?P<value>\w+)", (
            "Which user did su process {pid} open a session for?",
            "su[{pid}] opened a session: which account?")),
        Lookup("time", r"^(?P<value>{T}) combo ftpd\[(?P<pid>\d+)\]: connection from", (
            "When did ftpd process {pid} log its connection?",
            "At what time was the FTP connection of pid {pid} logged?")),
        Lookup("time", r"^(?P<value>{T}) combo su\(pam_unix\)\[(?P<pid>\d+)\]: session closed for user (?P<user>\w+)", (
            "When was the su session {pid} of user {user} closed?",
            "At what time did su[{pid}] close the session of {user}?")),
        Lookup("id", rf"ftpd\[(?P<value>\d+)\]: connection from (?P<ip>{IP}) .* at (?P<when>\w{{3}} \w{{3}} +\d+ "
                     r"\d\d:\d\d:\d\d \d{4})", (
            "Which ftpd process id handled the connection from {ip} at {when}?",
            "What pid did ftpd log for the connection of {ip} at {when}?")),
    ), (
        Tally(r"authentication failure;.* rhost=(?P<host>\S+)", (
            "How many ssh authentication failures came from {host}?",
            "Count the failed logins from rhost {host}."), (
            "When did {host} first fail to authenticate over ssh?",), (
            "When was the latest authentication failure from {host}?",)),
        Tally(rf"ftpd\[\d+\]: connection from (?P<ip>{IP}) ", (
            "How many FTP connections came from {ip}?",
            "How many times did {ip} connect to ftpd?"), (
            "When did {ip} first connect to the FTP server?",), (
            "When did {ip} last open an FTP connection?",)),
        Tally(r"check pass; user unknown", (
            "How many 'check pass; user unknown' lines are there so far?",
            "How often has sshd logged check pass with an unknown user?"), (
            "When was the first 'check pass; user unknown'?",), (
            "When did sshd last log 'check pass; user unknown'?",)),
        Tally(r"session opened for user (?P<user>\w+)", (
            "How many sessions were opened for user {user}?",
            "How many times has a session been opened for {user}?"), (
            "When was a session first opened for {user}?",), (
            "When was the last session opened for {user}?",)),
    ), (
        Values(rf"connection from (?P<value>{IP}) ", (
            "Which IP address connected to ftpd most often?",), (
            "Which distinct IPs have connected to ftpd?",)),
        Values(r"session opened for user (?P<value>\w+)", (
            "Which user had the most sessions opened?",), (
            "Which users have had sessions opened?",)),
    )),
    LogSpec("loghub/BGL_2k.log", "plain", r"\d{4}-\d\d-\d\d-\d\d\.\d\d\.\d\d\.\d{6}", (
        Lookup("node", r" (?P<value>R\d\d-M\d-N\w-[CI]:J\d\d-U\d\d) RAS KERNEL INFO generating core\.(?P<core>\d+)$", (
            "Which node generated core.{core}?",
            "On which node was core.{core} generated?")),
        Lookup("time", r"(?P<value>{T}) \S+ RAS KERNEL INFO generating core\.(?P<core>\d+)$", (
            "When was core.{core} generated?",
            "At what time did the kernel generate core.{core}?")),
        Lookup("status", r"(?P<t>{T}) \S+ RAS (?P<comp>\w+) (?P<value>[A-Z]+) ", (
            "What severity level is the RAS {comp} message at {t}?",
            "At {t}, what level did the {comp} component report?")),
        Lookup("id", r"(?P<t>{T}) \S+ RAS KERNEL FATAL instruction address: (?P<value>0x[0-9a-f]+)", (
            "What instruction address was reported at {t}?",
            "Which instruction address is in the fatal kernel message of {t}?")),
        Lookup("ip", rf"(?P<t>{{T}}) \S+ RAS APP FATAL ciod: .*socket to (?P<value>{IP}):\d+", (
            "Which IP address did the ciod control stream socket point to at {t}?",)),
        Lookup("port", rf"(?P<t>{{T}}) \S+ RAS APP FATAL ciod: .*socket to {IP}:(?P<value>\d+)", (
            "Which port was the ciod CioStream socket on at {t}?",)),
        Lookup("time", r"(?P<value>{T}) (?P<node>\S+) RAS KERNEL FATAL data storage interrupt", (
            "When did node {node} have a data storage interrupt?",
            "At what time did {node} report a data storage interrupt?")),
    ), (
        Tally(r"(?P<node>R\d\d-M\d-N\w-[CI]:J\d\d-U\d\d) RAS KERNEL FATAL data TLB error interrupt", (
            "How many data TLB error interrupts has node {node} had?",
            "How often did {node} report a data TLB error interrupt?"), (
            "When did {node} first have a data TLB error interrupt?",), (
            "When was the last data TLB error interrupt on {node}?",)),
        Tally(r"RAS KERNEL FATAL ", (
            "How many FATAL kernel messages have been logged so far?",
            "How many lines are FATAL RAS KERNEL events?"), (
            "When was the first fatal kernel event?",), (
            "When was the last FATAL kernel message?",)),
        Tally(r"instruction cache parity error corrected", (
            "How many instruction cache parity errors were corrected so far?",), (
            "When was the first instruction cache parity error corrected?",), (
            "When was an instruction cache parity error last corrected?",)),
        Tally(r"(?P<node>R\d\d-M\d-N\w-[CI]:J\d\d-U\d\d) RAS KERNEL INFO generating core\.", (
            "How many core files has node {node} generated?",), (
            "When did {node} first generate a core file?",), (
            "When did {node} last generate a core?",)),
    ), (
        Values(r"\.\d{6} (?P<value>R\d\d-M\d-N\w-[CI]:J\d\d-U\d\d) RAS KERNEL FATAL", (
            "Which node has logged the most fatal kernel events?",), (
            "Which nodes have reported fatal kernel events?",)),
        Values(r" RAS \w+ (?P<value>[A-Z]+) ", (
            "Which severity level appears most often?",), (
            "Which severity levels have appeared so far?",)),
    )),
    LogSpec("loghub/Zookeeper_2k.log", "plain", r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", (
        Lookup("port", rf"^\S+ (?P<clock>\d\d:\d\d:\d\d,\d{{3}}) .*Received connection request /{IP}:(?P<value>\d+)", (
            "Which source port did the connection request received at {clock} use?",
            "The connection request logged at {clock}: from which port?")),
        Lookup("ip", rf"Received connection request /(?P<value>{IP}):(?P<port>\d+)", (
            "Which host sent the connection request from port {port}?",
            "From which IP address did the connection request with source port {port} come?")),
        Lookup("time", rf"^(?P<value>{{T}}) .*Received connection request /(?P<ip>{IP}):(?P<port>\d+)", (
            "When was the connection request from {ip}:{port} received?",
            "At what time did {ip} connect from port {port}?")),
        Lookup("status", r"^\S+ (?P<clock>\d\d:\d\d:\d\d,\d{3}) - (?P<value>[A-Z]+) +\[", (
            "What log level was the message at {clock}?",
            "Which level was logged at {clock}?")),
        Lookup("id", r"^\S+ (?P<clock>\d\d:\d\d:\d\d,\d{3}) .*Connection broken for id (?P<value>\d+),", (
            "For which id was the connection broken at {clock}?",)),
    ), (
        Tally(rf"Received connection request /(?P<ip>{IP}):", (
            "How many connection requests came from {ip}?",
            "How many times did {ip} request a connection?"), (
            "When did {ip} first request a connection?",), (
            "When did {ip} last request a connection?",)),
        Tally(r"Interrupting SendWorker", (
            "How many times was a SendWorker interrupted?",
            "How many 'Interrupting SendWorker' warnings so far?"), (
            "When was a SendWorker first interrupted?",), (
            "When was the last 'Interrupting SendWorker'?",)),
        Tally(r"Send worker leaving thread", (
            "How many 'Send worker leaving thread' warnings have there been?",), (
            "When did a send worker first leave its thread?",), (
            "When did a send worker last leave its thread?",)),
        Tally(r"Notification time out: (?P<ms>\d+)", (
            "How many notification time outs of {ms} were logged?",), (
            "When was the first notification time out of {ms}?",), (
            "When was the last notification time out of {ms}?",)),
        Tally(r" - WARN  \[", (
            "How many WARN lines have been logged?",
            "How many warnings are in the log so far?"), (
            "When was the first WARN line?",), (
            "When was the latest warning logged?",)),
    ), (
        Values(rf"Received connection request /(?P<value>{IP}):", (
            "Which IP address sent the most connection requests?",), (
            "Which IP addresses have requested connections?",)),
        Values(r" - (?P<value>[A-Z]+) +\[", (
            "Which log level is most common so far?",), (
            "Which log levels have appeared?",)),
    )),
    LogSpec("loghub/Hadoop_2k.log", "plain", r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", (
        Lookup("id", r"Assigned container (?P<value>container_\w+) to (?P<attempt>attempt_\w+)", (
            "Which container was assigned to {attempt}?",
            "What container id did {attempt} get?")),
        Lookup("id", r"Assigned container (?P<container>container_\w+) to (?P<value>attempt_\w+)", (
            "Which task attempt was container {container} assigned to?",)),
        Lookup("port", r"Shuffle port returned by ContainerManager for (?P<attempt>attempt_\w+) : (?P<value>\d+)", (
            "What shuffle port was returned for {attempt}?",
            "Which port did the ContainerManager return for {attempt}?")),
        Lookup("node", r"TaskAttempt: \[(?P<attempt>attempt_\w+)\] using containerId: \[container_\w+ on NM: "
                       r"\[(?P<value>[\w.-]+):\d+\]", (
            "On which node manager host did {attempt} get its container?",
            "Which NM host did {attempt} use?")),
        Lookup("port", r"using containerId: \[(?P<container>container_\w+) on NM: \[[\w.-]+:(?P<value>\d+)\]", (
            "What NM port was container {container} on?",)),
        Lookup("path", r"Default file system \[(?P<value>hdfs://[^\]]+)\]", (
            "What is the default file system?",
            "Which hdfs address is the default file system?")),
        Lookup("path", r"Extract jar:(?P<value>file:\S+) to", (
            "Which jar file was extracted for the web app?",)),
        Lookup("size", r"reduceResourceRequest:<memory:(?P<value>\d+), vCores", (
            "How much memory does a reduce resource request ask for?",)),
        Lookup("size", r"^\S+ (?P<clock>\d\d:\d\d:\d\d,\d{3}) .*Progress of TaskAttempt (?P<attempt>attempt_\w+) is : "
                       r"(?P<value>[\d.]+)", (
            "What progress did {attempt} report at {clock}?",)),
        Lookup("time", r"^(?P<value>{T}) .* (?P<task>task_\w+) Task Transitioned from SCHEDULED to RUNNING", (
            "When did {task} start running?",
            "At what time did {task} move from SCHEDULED to RUNNING?")),
        Lookup("status", r"(?P<attempt>attempt_\w+) TaskAttempt Transitioned from (?P<state>[A-Z_]+) to "
                         r"(?P<value>[A-Z_]+)", (
            "What state did {attempt} move to from {state}?",
            "After {state}, which state did {attempt} transition to?")),
        Lookup("port", r"IPC Server listener on (?P<value>\d+): starting", (
            "Which port is the IPC Server listener on?",)),
    ), (
        Tally(r"(?P<attempt>attempt_\w+) TaskAttempt Transitioned", (
            "How many state transitions has {attempt} gone through?",), (
            "When did {attempt} first change state?",), (
            "When did {attempt} last change state?",)),
        Tally(r"Reduce slow start threshold not met", (
            "How many times was the reduce slow start threshold not met?",
            "How many 'Reduce slow start threshold not met' lines so far?"), (
            "When was the reduce slow start threshold first not met?",), (
            "When was the reduce slow start threshold last reported not met?",)),
        Tally(r"Resolved (?P<host>[\w.-]+) to /default-rack", (
            "How many times was {host} resolved to /default-rack?",), (
            "When was {host} first resolved to the default rack?",), (
            "When was {host} last resolved to /default-rack?",)),
        Tally(r"Recalculating schedule, headroom", (
            "How many schedule recalculations have been logged?",), (
            "When was the schedule first recalculated?",), (
            "When was the schedule last recalculated?",)),
    ), (
        Values(r"Resolved (?P<value>[\w.-]+) to /default-rack", (
            "Which host was resolved to the default rack most often?",), (
            "Which hosts have been resolved to /default-rack?",)),
        Values(r"TaskAttempt Transitioned from [A-Z_]+ to (?P<value>[A-Z_]+)", (
            "Which state do task attempts transition to most often?",), (
            "Which states have task attempts transitioned to?",)),
    )),
    LogSpec("loghub/Windows_2k.log", "plain", r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", (
        Lookup("id", r"^\S+ (?P<clock>\d\d:\d\d:\d\d), .*Session: (?P<value>\d+_\d+) initialized", (
            "Which CBS session was initialized at {clock}?",
            "What session id did the client initialize at {clock}?")),
        Lookup("time", r"^(?P<value>{T}), .*Session: (?P<session>\d+_\d+) initialized by client", (
            "When was session {session} initialized?",
            "At what time did CBS initialize session {session}?")),
        Lookup("path", r"SQM: Queued \d+ file\(s\) for upload with pattern: (?P<value>\S+), flags", (
            "Which file pattern did SQM queue for upload?",)),
        Lookup("path", r"Failed to start upload with file pattern: (?P<value>\S+), flags", (
            "Which file pattern did SQM fail to start uploading?",)),
        Lookup("path", r"Loaded Servicing Stack v(?P<ver>[\d.]+) with Core: (?P<value>\S+)", (
            "Where is the core DLL of servicing stack v{ver}?",)),
        Lookup("status", r"HRESULT = (?P<code>0x[0-9a-f]+) - (?P<value>\w+)\]", (
            "What does HRESULT {code} stand for in this log?",
            "Which error name goes with HRESULT {code}?")),
        Lookup("id", r"Created NT transaction \(seq (?P<seq>\d+)\) result 0x[0-9a-f]+, handle @(?P<value>0x[0-9a-f]+)", (
            "Which handle did NT transaction seq {seq} get?",)),
        Lookup("size", r"SQM: Cleaning up report files older than (?P<value>\d+ days)", (
            "How old must report files be before SQM cleans them up?",)),
        Lookup("id", r"WcpInitialize \(wcp\.dll version (?P<value>[\d.]+)\)", (
            "Which wcp.dll version was initialized?",)),
    ), (
        Tally(r"Warning: Unrecognized packageExtended attribute", (
            "How many 'Unrecognized packageExtended attribute' warnings so far?",
            "How often has CBS warned about an unrecognized packageExtended attribute?"), (
            "When was the first unrecognized packageExtended attribute warning?",), (
            "When was the last 'Unrecognized packageExtended attribute' warning?",)),
        Tally(r"Session: \d+_\d+ initialized by client (?P<client>\w+)", (
            "How many sessions has {client} initialized?",), (
            "When did {client} first initialize a session?",), (
            "When did {client} last initialize a session?",)),
        Tally(r"HRESULT = (?P<code>0x[0-9a-f]+) ", (
            "How many lines report HRESULT {code}?",
            "How many times has HRESULT {code} been logged?"), (
            "When was HRESULT {code} first logged?",), (
            "When was HRESULT {code} last reported?",)),
        Tally(r"CBS    SQM: ", (
            "How many SQM lines has CBS written?",), (
            "When did CBS write its first SQM line?",), (
            "When was the last SQM line?",)),
        Tally(r"TrustedInstaller", (
            "How many lines mention TrustedInstaller?",), (
            "When was TrustedInstaller first mentioned?",), (
            "When was TrustedInstaller last mentioned?",)),
        Tally(r"Failed to get next element", (
            "How many 'Failed to get next element' errors so far?",), (
            "When did CBS first fail to get the next element?",), (
            "When did CBS last fail to get the next element?",)),
    ), (
        Values(r"HRESULT = 0x[0-9a-f]+ - (?P<value>\w+)\]", (
            "Which HRESULT error name appears most often?",), (
            "Which HRESULT error names have been reported?",)),
        Values(r"^\S+ \S+, Info +(?P<value>[A-Z]+) ", (
            "Which component has logged the most lines?",), (
            "Which components have logged lines so far?",)),
    )),
    LogSpec("loghub/HealthApp_2k.log", "plain", r"\d{8}-\d{1,2}:\d{1,2}:\d{1,2}:\d{1,3}", (
        Lookup("size", r"^(?P<t>{T})\|Step_ExtSDM\|\d+\|calculateCaloriesWithCache totalCalories=(?P<value>\d+)", (
            "What totalCalories value was computed at {t}?",
            "How many total calories did Step_ExtSDM report at {t}?")),
        Lookup("size", r"^(?P<t>{T})\|Step_LSC\|\d+\|onStandStepChanged (?P<value>\d+)", (
            "What was the stand step count at {t}?",
            "Which step count did onStandStepChanged report at {t}?")),
        Lookup("time", r"^(?P<value>{T})\|Step_LSC\|\d+\|onStandStepChanged (?P<steps>\d+)$", (
            "When did the stand step count change to {steps}?",
            "At what time did onStandStepChanged report {steps}?")),
        Lookup("time", r"^(?P<value>{T})\|Step_ExtSDM\|\d+\|calculateCaloriesWithCache totalCalories=(?P<cal>\d+)$", (
            "When was totalCalories={cal} calculated?",)),
        Lookup("id", r"^(?P<t>{T})\|(?P<comp>Step_\w+)\|(?P<value>\d+)\|", (
            "Which process id did {comp} log at {t}?",)),
        Lookup("status", r"^(?P<t>{T})\|Step_StandReportReceiver\|\d+\|onReceive action: android\.intent\.action\."
                         r"(?P<value>\w+)", (
            "Which screen action did the report receiver get at {t}?",)),
        Lookup("size", r"^(?P<t>{T})\|Step_SPUtils\|\d+\|setTodayTotalDetailSteps=(?P<value>[\d#]+)$", (
            "What did setTodayTotalDetailSteps store at {t}?",)),
    ), (
        Tally(r"\|onStandStepChanged \d+", (
            "How many times has onStandStepChanged fired?",
            "How many stand step changes have been logged?"), (
            "When was the first onStandStepChanged?",), (
            "When did the stand step count last change?",)),
        Tally(r"calculateAltitudeWithCache totalAltitude=(?P<alt>\d+)$", (
            "How many times was totalAltitude={alt} computed?",), (
            "When was totalAltitude={alt} first computed?",), (
            "When was totalAltitude={alt} last computed?",)),
        Tally(r"\|REPORT : ", (
            "How many REPORT lines has Step_StandReportReceiver written?",), (
            "When was the first REPORT line?",), (
            "When was the latest REPORT?",)),
        Tally(r"onReceive action: android\.intent\.action\.(?P<act>\w+)", (
            "How many {act} broadcasts has the report receiver got?",), (
            "When did the report receiver first get {act}?",), (
            "When did the report receiver last get {act}?",)),
        Tally(r"flush sensor data", (
            "How many times was sensor data flushed?",), (
            "When was sensor data first flushed?",), (
            "When was sensor data last flushed?",)),
        Tally(r"calculateCaloriesWithCache", (
            "How many calorie calculations have been logged?",), (
            "When were calories first calculated?",), (
            "When were calories last calculated?",)),
    ), (
        Values(r"totalAltitude=(?P<value>\d+)$", (
            "Which totalAltitude value is reported most often?",), (
            "Which totalAltitude values have been reported?",)),
        Values(r"^[^|]+\|(?P<value>Step_\w+)\|", (
            "Which component logs the most lines?",), (
            "Which components have written lines so far?",)),
    )),
    LogSpec("loghub/Android_2k.log", "plain", r"\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", (
        Lookup("id", r"acquire lock=(?P<lock>\d+), flags=0x\w+, tag=\"[^\"]*\", name=[\w.]+, ws=\w+, uid=(?P<value>\d+)", (
            "Which uid acquired wake lock {lock}?",
            "Wake lock {lock} was acquired by which uid?")),
        Lookup("id", r"acquire lock=(?P<lock>\d+), .* pid=(?P<value>\d+)$", (
            "Which pid acquired wake lock {lock}?",)),
        Lookup("status", r"acquire lock=(?P<lock>\d+), flags=0x\w+, tag=\"(?P<value>[^\"]+)\"", (
            "What tag did wake lock {lock} have?",)),
        Lookup("time", r"^(?P<value>{T}) .*acquire lock=(?P<lock>\d+),", (
            "When was wake lock {lock} acquired?",
            "At what time did PowerManagerService acquire lock {lock}?")),
        Lookup("size", r"^(?P<t>{T}) .*updateClipping isOverlap:\w+, getTopPadding=[\d.]+, Translation=(?P<value>-?[\d.]+)", (
            "What Translation did updateClipping report at {t}?",
            "Which Translation value is in the updateClipping line of {t}?")),
        Lookup("id", r"^(?P<t>{T}) +(?P<value>\d+) +\d+ [VDIWEF] (?P<tag>\w+):", (
            "Which pid logged the {tag} line at {t}?",)),
        Lookup("status", r"^(?P<t>{T}) +\d+ +\d+ (?P<value>[VDIWEF]) (?P<tag>\w+):", (
            "What log level did {tag} use at {t}?",)),
        Lookup("path", r"^(?P<t>{T}) .*Destroying surface Surface\(name=(?P<value>[\w./]+)\)", (
            "Which surface was destroyed at {t}?",)),
        Lookup("size", r"^(?P<t>{T}) .*userActivityNoUpdateLocked: eventTime=(?P<value>\d+),", (
            "What eventTime did userActivityNoUpdateLocked log at {t}?",)),
    ), (
        Tally(r"updateDimmedActivatedHideSensitive overlap:(?P<ov>true|false)", (
            "How many times did updateDimmedActivatedHideSensitive report overlap:{ov}?",), (
            "When did updateDimmedActivatedHideSensitive first report overlap:{ov}?",), (
            "When did updateDimmedActivatedHideSensitive last say overlap:{ov}?",)),
        Tally(r" [VDIWEF] (?P<tag>\w+):", (
            "How many lines has {tag} logged?",
            "How many {tag} lines are there so far?"), (
            "When did {tag} first log a line?",), (
            "When did {tag} last log anything?",)),
        Tally(r"PhoneStatusBar: suspendAutohide", (
            "How many times did PhoneStatusBar suspend autohide?",), (
            "When did PhoneStatusBar first suspend autohide?",), (
            "When did PhoneStatusBar last call suspendAutohide?",)),
    ), (
        Values(r"^\S+ \S+ +\d+ +\d+ (?P<value>[VDIWEF]) ", (
            "Which log level is most common?",), (
            "Which log levels appear so far?",)),
        Values(r"^\S+ \S+ +(?P<value>\d+) +\d+ [VDIWEF] ", (
            "Which process id has logged the most lines?",), (
            "Which process ids have logged lines?",)),
    )),
) + tuple(
    LogSpec(path, "csv", r"\d\d:\d\d:\d\d", (
        Lookup("time", rf"^(?P<value>{{T}}) (?P<tag>\w+) (?P<typ>{TEP_TYPE}) (?!NR )(?P<desc>.+)$", (
            "At what time did {tag} raise {desc} ({typ})?",
            "When was the {typ} alarm '{desc}' on {tag} raised?")),
        Lookup("status", rf"^(?P<clock>\d\d:\d\d:\d\d) (?P<tag>\w+) (?P<value>{TEP_TYPE}(?: NR)?) ", (
            "What alarm type did {tag} show at {clock}?",
            "At {clock}, which alarm state was logged for {tag}?")),
        Lookup("id", rf"^(?P<clock>\d\d:\d\d:\d\d) (?P<value>\w+) {TEP_TYPE}(?: NR)? (?P<desc>.+)$", (
            "Which tag logged '{desc}' at {clock}?",
            "What is the tag of the {desc} line at {clock}?")),
    ), (
        Tally(rf"^\S+ (?P<tag>\w+) {TEP_TYPE} ", (
            "How many alarms has {tag} raised so far?",
            "How many times did {tag} go into alarm?"), (
            "When did {tag} first go into alarm?",), (
            "When did {tag} last raise an alarm?",
            "What time was the latest alarm on {tag}?")),
        Tally(rf"^\S+ (?P<tag>\w+) {TEP_TYPE} NR ", (
            "How many times has {tag} returned to normal?",
            "How many recoveries (NR) were logged for {tag}?"), (
            "When did {tag} first recover?",), (
            "When did {tag} last return to normal?",)),
        Tally(r"^\S+ \w+ (?P<typ>HH|LL|H|L) (?!NR )", (
            "How many {typ} alarms have been raised so far?",
            "Count the alarm lines of type {typ}."), (
            "When was the first {typ} alarm?",), (
            "When was the most recent {typ} alarm?",)),
    ), (
        Values(rf"^\S+ (?P<value>\w+) {TEP_TYPE} (?!NR )", (
            "Which tag has raised the most alarms?",
            "What tag alarms most often?"), (
            "Which tags have raised an alarm so far?",
            "List the tags that have alarmed.")),
        Values(r"^\S+ (?P<value>\w+) (?:HH|LL) (?!NR )", (
            "Which tag has the most HIGH HIGH or LOW LOW alarms?",), (
            "Which tags have gone HIGH HIGH or LOW LOW?",)),
    ))
    for path in ("tep_alarms/filter/text_alarms_filter_3.csv", "tep_alarms/filter/text_alarms_filter_5.csv",
                 "tep_alarms/deadband/text_alarms_deadband_3.csv"))

# The fresh split: five loghub logs vendored in bench/data (bench/data/README.md) that no other set, nor the reader's
# developers, have used; every question over them is `fresh`, none dev or held-out.
SSH_PID = r"sshd\[(?P<pid>\d+)\]"
BLK = r"blk_-?\d+"
SPECS += (
    LogSpec(FRESH + "loghub/OpenSSH_2k.log", "plain", r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d", (
        Lookup("port", rf"{SSH_PID}: Failed password for .* from {IP} port (?P<value>\d+) ssh2", (
            "Which client port did the failed password attempt of sshd[{pid}] come from?",
            "sshd process {pid} rejected a password: what was the source port?",
            "What remote port shows up in the failed password line of pid {pid}?")),
        Lookup("ip", rf"{SSH_PID}: Invalid user .+ from (?P<value>{IP})$", (
            "Which address was behind the invalid user attempt handled by sshd[{pid}]?",
            "sshd[{pid}] logged an invalid user: from which IP?")),
        Lookup("ip", rf"{SSH_PID}: Connection closed by (?P<value>{IP}) \[preauth\]", (
            "Which client closed its connection before authenticating in sshd process {pid}?",
            "Whose connection did sshd[{pid}] see closed during preauth?")),
        Lookup("user", rf"{SSH_PID}: Invalid user +(?P<value>\S+) from", (
            "Which non-existent account name did sshd[{pid}] get asked for?",
            "What user name did the invalid login in sshd process {pid} try?",
            "sshd[{pid}] reported an invalid user: which name?")),
        Lookup("user", rf"{SSH_PID}: Failed password for (?P<value>\w+) from (?P<ip>{IP}) ", (
            "sshd[{pid}] rejected a password from {ip}: for which account?",
            "For which real user did sshd process {pid} turn down the password sent by {ip}?")),
        Lookup("node", rf"{SSH_PID}: pam_unix\(sshd:auth\): authentication failure;.* rhost=(?P<value>(?=[\w.-]*[a-z])"
                       r"[\w.-]+)", (
            "Which remote host name did pam_unix record for the failed authentication of sshd[{pid}]?",
            "The authentication failure of pid {pid} names an rhost: which host?")),
        Lookup("node", rf"reverse mapping checking getaddrinfo for (?P<value>\S+) \[(?P<ip>{IP})\] failed", (
            "What host name does {ip} reverse-map to?",
            "Which name did the reverse lookup of {ip} give before sshd flagged a possible break-in?")),
        Lookup("time", rf"^(?P<value>{{T}}) \S+ {SSH_PID}: Did not receive identification string from (?P<ip>{IP})$", (
            "When did {ip} connect to sshd[{pid}] without sending an identification string?",
            "At what time did sshd process {pid} give up waiting for an identification string from {ip}?")),
        Lookup("time", rf"^(?P<value>{{T}}) \S+ {SSH_PID}: Invalid user +(?P<user>\S+) from", (
            "When did sshd[{pid}] see the unknown user {user}?",
            "At what time was the invalid user {user} reported by pid {pid}?")),
        Lookup("id", rf"sshd\[(?P<value>\d+)\]: Failed password for invalid user +(?P<user>\S+) from (?P<ip>{IP}) port "
                     r"(?P<port>\d+) ssh2", (
            "Which sshd pid rejected the password of invalid user {user} from {ip} port {port}?",
            "What process id handled the failed login of {user} coming from {ip}:{port}?")),
        Lookup("id", rf"sshd\[(?P<value>\d+)\]: Failed password for (?P<user>\w+) from (?P<ip>{IP}) port (?P<port>\d+) "
                     r"ssh2", (
            "Which sshd process logged the failed {user} password from {ip} port {port}?",)),
        Lookup("status", rf"{SSH_PID}: (?:error: )?Received disconnect from {IP}: (?P<value>\d+): ", (
            "What disconnect reason code did sshd[{pid}] receive?",
            "Which reason code came with the disconnect seen by sshd process {pid}?")),
    ), (
        Tally(r"pam_unix\(sshd:auth\): authentication failure;.* rhost=(?P<host>\S+)", (
            "How many pam_unix authentication failures has {host} caused so far?",
            "Count the sshd authentication failures with rhost {host}."), (
            "When did {host} fail its first ssh authentication?",
            "What time was the earliest authentication failure from {host}?"), (
            "When did {host} last fail to authenticate?",
            "What is the time of the most recent authentication failure from {host}?")),
        Tally(rf": Invalid user .+ from (?P<ip>{IP})$", (
            "How many invalid user attempts have come from {ip}?",
            "How often did {ip} try a user name that does not exist?"), (
            "When did {ip} first try an invalid user?",), (
            "When did {ip} last try a non-existent account?",)),
        Tally(rf"Received disconnect from (?P<ip>{IP}): 11: Bye Bye", (
            "How many 'Bye Bye' disconnects has {ip} sent?",), (
            "When did {ip} first disconnect with Bye Bye?",), (
            "When was the latest Bye Bye disconnect from {ip}?",)),
        Tally(r"pam_unix\(sshd:auth\): check pass; user unknown", (
            "How many 'check pass; user unknown' messages so far?",
            "How many times has pam_unix checked a password for an unknown user?"), (
            "When was the first 'check pass; user unknown'?",), (
            "When did pam_unix last log 'check pass; user unknown'?",)),
        Tally(r"POSSIBLE BREAK-IN ATTEMPT", (
            "How many possible break-in attempts has sshd flagged?",
            "How many POSSIBLE BREAK-IN ATTEMPT warnings are there?"), (
            "When was the first possible break-in attempt flagged?",), (
            "When did sshd last warn of a possible break-in?",)),
        Tally(rf"Did not receive identification string from (?P<ip>{IP})", (
            "How many times did {ip} connect without an identification string?",), (
            "When did {ip} first connect without identifying itself?",), (
            "When did {ip} last fail to send an identification string?",)),
    ), (
        Values(r": Invalid user +(?P<value>\S+) from", (
            "Which invalid user name has been tried most often?",
            "What is the most common non-existent account attackers try?"), (
            "Which invalid user names have been tried so far?",)),
        Values(rf"\]: Failed password for (?:invalid user )?\S+ from (?P<value>{IP}) ", (
            "Which IP address has the most failed passwords?",), (
            "Which addresses have failed a password so far?",
            "List the IPs with failed password attempts.")),
        Values(rf"\]: Failed password for (?P<value>\w+) from {IP} ", (
            "Which real account gets the most failed passwords?",), (
            "Which existing accounts have had failed passwords?",)),
    ), split="fresh"),
    LogSpec(FRESH + "loghub/HDFS_2k.log", "plain", r"\d{6} \d{6}", (
        Lookup("size", rf"Received block (?P<blk>{BLK}) of size (?P<value>\d+) from", (
            "What size was {blk} when the PacketResponder received it?",
            "How many bytes did the received block {blk} have?")),
        Lookup("size", rf"addStoredBlock: blockMap updated: \S+ is added to (?P<blk>{BLK}) size (?P<value>\d+)", (
            "Which size did the NameSystem record when {blk} was added to the blockMap?",
            "addStoredBlock for {blk}: what size?")),
        Lookup("ip", rf"Received block (?P<blk>{BLK}) of size \d+ from /(?P<value>{IP})", (
            "Which host sent block {blk}?",
            "From which address was {blk} received?")),
        Lookup("ip", rf"Got exception while serving (?P<blk>{BLK}) to /(?P<value>{IP}):", (
            "To which client was {blk} being served when the exception happened?",
            "Serving {blk} failed: who was the reader?")),
        Lookup("node", rf"blockMap updated: (?P<value>{IP}:\d+) is added to (?P<blk>{BLK}) ", (
            "Which datanode was {blk} added to?",
            "On which datanode (ip:port) did the blockMap place {blk}?")),
        Lookup("node", rf"(?P<value>{IP}:\d+):Got exception while serving (?P<blk>{BLK}) ", (
            "Which datanode hit an exception while serving {blk}?",)),
        Lookup("port", rf"Receiving block (?P<blk>{BLK}) src: /{IP}:(?P<value>\d+) dest", (
            "What source port was {blk} coming from when the DataXceiver started receiving it?",
            "Receiving {blk}: on which src port?")),
        Lookup("path", rf"allocateBlock: /\S+/(?P<value>part-\d+)\. (?P<blk>{BLK})$", (
            "Which part file was {blk} allocated for?",
            "NameSystem.allocateBlock gave out {blk}: for which part-file?")),
        Lookup("path", rf"Deleting block (?P<blk>{BLK}) file (?P<value>\S+)$", (
            "Which file on disk held {blk} when it was deleted?",)),
        Lookup("id", rf"allocateBlock: (?P<path>/\S+)\. (?P<value>{BLK})$", (
            "Which block was allocated for {path}?",
            "What block id did the NameSystem allocate to {path}?")),
        Lookup("id", rf"Receiving block (?P<value>{BLK}) src: /(?P<ip>{IP}):(?P<port>\d+) dest", (
            "Which block was being received from {ip}:{port}?",)),
        Lookup("id", rf"PacketResponder (?P<value>\d+) for block (?P<blk>{BLK}) terminating", (
            "Which PacketResponder number terminated for {blk}?",
            "Which PacketResponder shut down after handling {blk}?")),
        Lookup("status", r"^(?P<t>{T}) \d+ (?P<value>[A-Z]+) (?P<comp>dfs\.[\w$]+):", (
            "What level was the {comp} message at {t}?",
            "At {t}, which log level did {comp} use?")),
        Lookup("time", rf"^(?P<value>{{T}}) .*Verification succeeded for (?P<blk>{BLK})$", (
            "When did the DataBlockScanner verify {blk}?",
            "At what time did verification succeed for {blk}?")),
        Lookup("time", rf"^(?P<value>{{T}}) .*Got exception while serving (?P<blk>{BLK}) to", (
            "When did serving {blk} fail with an exception?",)),
    ), (
        Tally(r"Got exception while serving", (
            "How many 'Got exception while serving' warnings so far?",
            "How many times has a DataXceiver failed to serve a block?"), (
            "When was the first exception while serving a block?",), (
            "When did a DataXceiver last get an exception while serving?",)),
        Tally(r"Verification succeeded for", (
            "How many block verifications have succeeded?",), (
            "When did the first block verification succeed?",), (
            "When did a block verification last succeed?",)),
        Tally(r" Served block ", (
            "How many 'Served block' lines have the DataXceivers written?",
            "How many blocks were served successfully so far?"), (
            "When was a block first served?",), (
            "When was a block last served?",)),
        Tally(r"allocateBlock: /user/root/(?P<job>\w+)/", (
            "How many blocks have been allocated under /user/root/{job}?",), (
            "When was the first block allocated under /user/root/{job}?",), (
            "When was a block last allocated under /user/root/{job}?",)),
        Tally(r"\d+ [A-Z]+ (?P<comp>dfs\.(?:DataBlockScanner|FSDataset)):", (
            "How many lines has {comp} written?",), (
            "When did {comp} log its first line?",), (
            "When did {comp} last log?",)),
        Tally(rf"(?P<node>{IP}:\d+):Got exception while serving", (
            "How many exceptions has datanode {node} hit while serving blocks?",), (
            "When did {node} first fail to serve a block?",), (
            "When did {node} last fail to serve a block?",)),
    ), (
        Values(r"^\S+ \S+ \d+ (?P<value>[A-Z]+) ", (
            "Which log level is the most common?",), (
            "Which log levels have appeared?",)),
        Values(r"allocateBlock: /user/root/(?P<value>\w+)/", (
            "Under which /user/root directory have the most blocks been allocated?",), (
            "Which /user/root output directories have had blocks allocated?",)),
        Values(r"^\S+ \S+ \d+ [A-Z]+ (?P<value>dfs\.[\w$]+):", (
            "Which HDFS component has logged the most lines?",), (
            "Which dfs components have written lines so far?",)),
    ), split="fresh"),
    LogSpec(FRESH + "loghub/Spark_2k.log", "plain", r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d", (
        Lookup("port", r"Successfully started service '(?P<svc>[^']+)' on port (?P<value>\d+)\.", (
            "Which port did the service '{svc}' start on?",
            "On what port is '{svc}' listening?")),
        Lookup("port", rf"Connecting to driver: spark://CoarseGrainedScheduler@{IP}:(?P<value>\d+)", (
            "What port is the driver's CoarseGrainedScheduler on?",
            "Which port did the executor backend connect to the driver on?")),
        Lookup("ip", rf"Connecting to driver: spark://CoarseGrainedScheduler@(?P<value>{IP}):", (
            "What is the IP address of the Spark driver?",
            "Which host address did the executor connect to as its driver?")),
        Lookup("ip", rf"Input split: hdfs://(?P<value>{IP}):\d+/", (
            "Which namenode IP do the input splits come from?",)),
        Lookup("node", r"Starting executor ID (?P<id>\d+) on host (?P<value>[\w.-]+)", (
            "On which host did executor {id} start?",
            "Executor ID {id} runs on which machine?")),
        Lookup("user", r"/usercache/(?P<value>\w+)/appcache/", (
            "Whose usercache holds the block manager's local directory?",
            "Which user does the application's local directory belong to?")),
        Lookup("user", r"Changing modify acls to: (?P<value>[\w,]+)$", (
            "Which users were given modify ACLs?",)),
        Lookup("size", r"Block (?P<block>\w+) stored as (?:bytes|values) in memory \(estimated size "
                       r"(?P<value>[\d.]+ [KMG]?B),", (
            "What was the estimated size of {block} in memory?",
            "How big was {block} when the MemoryStore stored it?",
            "MemoryStore put {block} in memory: what estimated size?")),
        Lookup("size", r"Finished task [\d.]+ in stage [\d.]+ \(TID (?P<tid>\d+)\)\. (?P<value>\d+) bytes result", (
            "How many bytes of result did TID {tid} send to the driver?",
            "What result size did task TID {tid} report when it finished?")),
        Lookup("path", r"Input split: (?P<value>hdfs://\S+):(?P<range>\d+\+\d+)$", (
            "Which file does the input split {range} come from?",)),
        Lookup("id", r"Running task (?P<task>[\d.]+) in stage (?P<stage>[\d.]+) \(TID (?P<value>\d+)\)", (
            "What TID did task {task} of stage {stage} run as?",
            "Task {task} in stage {stage}: which TID?")),
        Lookup("time", r"^(?P<value>{T}) .*Running task [\d.]+ in stage [\d.]+ \(TID (?P<tid>\d+)\)", (
            "When did TID {tid} start running?",
            "At what time did the executor begin running TID {tid}?")),
        Lookup("time", r"^(?P<value>{T}) .*Started reading broadcast variable (?P<var>\d+)$", (
            "When did the executor start reading broadcast variable {var}?",)),
    ), (
        Tally(r"Found block (?P<rdd>rdd_\d+_\d+) locally", (
            "How many times was {rdd} found locally?",
            "How often has the BlockManager found {rdd} on this executor?"), (
            "When was {rdd} first found locally?",), (
            "When was {rdd} last found locally?",)),
        Tally(r"Finished task [\d.]+ in stage (?P<stage>[\d.]+) ", (
            "How many tasks of stage {stage} have finished?",
            "Count the finished tasks in stage {stage}."), (
            "When did the first task of stage {stage} finish?",), (
            "When did the last task of stage {stage} finish?",)),
        Tally(r"Configuration\.deprecation: ", (
            "How many configuration deprecation notices have been logged?",), (
            "When was the first deprecated configuration key reported?",), (
            "When was a deprecated configuration key last reported?",)),
        Tally(r"Partition (?P<rdd>rdd_\d+_\d+) not found, computing it", (
            "How many times did the CacheManager have to compute {rdd}?",), (
            "When was {rdd} first missing from the cache?",), (
            "When was {rdd} last computed because it was not cached?",)),
        Tally(r"Started reading broadcast variable", (
            "How many broadcast variables has the executor started reading?",), (
            "When did the executor first read a broadcast variable?",), (
            "When did it last start reading a broadcast variable?",)),
    ), (
        Values(r"Running task [\d.]+ in stage (?P<value>[\d.]+) ", (
            "Which stage has had the most tasks run here?",), (
            "Which stages have had tasks run so far?",)),
        Values(r"INFO (?P<value>[\w.]+): ", (
            "Which logger has written the most lines?",), (
            "Which loggers have written lines so far?",)),
        Values(r"Found block (?P<value>rdd_\d+_\d+) locally", (
            "Which RDD block has been found locally most often?",), (
            "Which RDD blocks have been found locally?",)),
    ), split="fresh"),
    LogSpec(FRESH + "loghub/Proxifier_2k.log", "plain", r"\d\d\.\d\d \d\d:\d\d:\d\d", (
        Lookup("size", r"^\[(?P<t>{T})\] (?P<app>\S+)(?: \*64)? - \S+ close, (?P<value>\d+) bytes", (
            "How many bytes did {app} send over the connection it closed at {t}?",
            "At {t}, {app} closed a connection: how many bytes had it sent?")),
        Lookup("id", r"^\[(?P<t>{T})\] (?P<value>\S+)(?: \*64)? - \S+ close, .* lifetime (?P<life>\d\d:\d\d)$", (
            "Which program closed a connection at {t} after a lifetime of {life}?",
            "At {t}, whose connection ended after {life}?")),
        Lookup("time", r"^\[(?P<value>{T})\] (?P<app>\S+)(?: \*64)? - \S+ close, (?P<sent>\d+) bytes", (
            "When did {app} close the connection that had sent {sent} bytes?",
            "At what time did the {app} connection with {sent} bytes sent close?")),
        Lookup("port", r"\] (?P<app>\S+)(?: \*64)? - (?P<host>[\w.-]+):(?P<value>\d+) (?:close|open|error)", (
            "Which port did {app} reach {host} on?",
            "{app} talked to {host}: on what port?")),
        Lookup("node", r"^\[(?P<t>{T})\] (?P<app>\S+) - \S+ open through proxy (?P<value>[\w.-]+):\d+ ", (
            "Which proxy server did {app} open its connection through at {t}?",
            "At {t}, {app} opened a connection: through which proxy host?")),
        Lookup("status", r"^\[(?P<t>{T})\] (?P<app>\S+) - \S+ open through proxy \S+ (?P<value>[A-Z0-9]+)$", (
            "Which proxy protocol did {app} use for the connection it opened at {t}?",)),
        Lookup("ip", rf"\] (?P<app>\S+) - (?P<value>{IP}):\d+ open through proxy", (
            "Which IP address did {app} open a connection to?",
            "What was the destination IP of {app}'s proxied connection?")),
        Lookup("size", r"^\[(?P<t>{T})\] (?P<app>\S+)(?: \*64)? - \S+ close, .* sent, (?P<value>\d+) bytes", (
            "How many bytes did {app} receive on the connection closed at {t}?",
            "The connection {app} closed at {t}: bytes received?")),
        Lookup("time", r"^\[(?P<value>{T})\] (?P<app>\S+)(?: \*64)? - \S+ close, .* lifetime (?P<life>\d\d:\d\d)$", (
            "When did {app} close a connection that had lasted {life}?",
            "At what time did a {app} connection end after a lifetime of {life}?")),
    ), (
        Tally(r"\] (?P<app>\S+)(?: \*64)? - \S+ close, ", (
            "How many connections has {app} closed?",
            "How many close lines are there for {app}?"), (
            "When did {app} first close a connection?",), (
            "When did {app} last close a connection?",)),
        Tally(r"close, 0 bytes sent, 0 bytes received", (
            "How many connections closed without sending or receiving a byte?",
            "How many empty connections (0 bytes each way) have been closed?"), (
            "When did the first empty connection close?",), (
            "When was the latest connection closed with 0 bytes sent and received?",)),
        Tally(r"lifetime (?P<life>\d\d:\d\d)$", (
            "How many connections closed after a lifetime of exactly {life}?",), (
            "When did a connection with a lifetime of {life} first close?",), (
            "When did the latest connection with a lifetime of {life} close?",)),
        Tally(r"lifetime (?!00:)\d\d:\d\d$", (
            "How many connections have lasted a minute or more?",
            "How many proxied connections stayed open for at least a minute?"), (
            "When did the first connection of a minute or longer close?",), (
            "When did a connection lasting a minute or more last close?",)),
    ), (
        Values(r"\] (?P<value>(?!chrome\.exe )\S+)(?: \*64)? - ", (
            "Apart from chrome.exe, which program has used the proxy the most?",), (
            "Besides chrome.exe, which programs have gone through the proxy so far?",)),
        Values(r"lifetime (?P<value>(?!00:)\d\d:\d\d)$", (
            "Among connections lasting a minute or more, which lifetime is the most common?",), (
            "Which lifetimes of a minute or more have connections had?",)),
    ), split="fresh"),
    LogSpec(FRESH + "loghub/Apache_2k.log", "plain", r"[A-Z][a-z]{2} [A-Z][a-z]{2} \d\d \d\d:\d\d:\d\d \d{4}", (
        Lookup("id", r"jk2_init\(\) Found child (?P<child>\d+) in scoreboard slot (?P<value>\d+)", (
            "In which scoreboard slot was child {child} found?",
            "jk2_init found child {child}: which slot?")),
        Lookup("id", r"^\[(?P<t>{T})\] \[notice\] jk2_init\(\) Found child (?P<value>\d+) in scoreboard slot "
                     r"(?P<slot>\d+)", (
            "Which child process was found in scoreboard slot {slot} at {t}?",
            "At {t}, jk2_init found which child in slot {slot}?")),
        Lookup("time", r"^\[(?P<value>{T})\] \[notice\] jk2_init\(\) Found child (?P<child>\d+) in", (
            "When was child {child} found in the scoreboard?",
            "At what time did jk2_init report child {child}?")),
        Lookup("status", r"^\[(?P<t>{T})\] \[(?P<value>[a-z]+)\] ", (
            "What severity did httpd log at {t}?",
            "Which log level are the entries of {t}?")),
        Lookup("status", r"^\[(?P<t>{T})\] \[error\] mod_jk child workerEnv in error state (?P<value>\d+)$", (
            "Which error state did mod_jk's workerEnv report at {t}?",
            "At {t}, which error state did mod_jk report for its workerEnv child?")),
        Lookup("path", r"workerEnv\.init\(\) ok (?P<value>\S+)$", (
            "Which properties file does workerEnv.init() load?",
            "What workers configuration file did mod_jk initialise from?")),
        Lookup("path", rf"\[client (?P<ip>{IP})\] Directory index forbidden by rule: (?P<value>\S+)$", (
            "Which directory's index was {ip} forbidden to list?",)),
        Lookup("ip", rf"^\[(?P<t>{{T}})\] \[error\] \[client (?P<value>{IP})\]", (
            "Which client got the error at {t}?",
            "At {t}, which client address was refused?")),
        Lookup("time", rf"^\[(?P<value>{{T}})\] \[error\] \[client (?P<ip>{IP})\]", (
            "When was {ip} refused the directory index?",
            "At what time did the client {ip} hit a forbidden directory index?")),
    ), (
        Tally(r"jk2_init\(\) Found child \d+ in scoreboard slot (?P<slot>\d+)", (
            "How many times has a child been found in scoreboard slot {slot}?",
            "How many jk2_init reports name scoreboard slot {slot}?"), (
            "When was a child first found in slot {slot}?",), (
            "When was a child last found in slot {slot}?",)),
        Tally(r"mod_jk child workerEnv in error state (?P<state>\d+)$", (
            "How many times has workerEnv been in error state {state}?",
            "Count the mod_jk error state {state} messages."), (
            "When did workerEnv first report error state {state}?",), (
            "When did workerEnv last report error state {state}?",)),
        Tally(r"workerEnv\.init\(\) ok ", (
            "How many times has workerEnv.init() succeeded?",), (
            "When did workerEnv.init() first succeed?",), (
            "When did workerEnv.init() last succeed?",)),
        Tally(r"\] \[error\] ", (
            "How many error lines has httpd written?",
            "How many [error] entries so far?"), (
            "When was the first [error] entry?",), (
            "When was the latest [error] logged?",)),
        Tally(r"Directory index forbidden by rule", (
            "How many directory index requests were forbidden?",), (
            "When was a directory index first forbidden?",), (
            "When was a directory index last forbidden?",)),
    ), (
        Values(r"mod_jk child workerEnv in error state (?P<value>\d+)$", (
            "Which workerEnv error state is reported most often?",), (
            "Which error states has workerEnv been in?",)),
        Values(r"in scoreboard slot (?P<value>\d+)$", (
            "Which scoreboard slot do children turn up in most often?",), (
            "Which scoreboard slots have children been found in?",)),
        Values(r"in scoreboard slot (?P<value>1[1-9]|[2-9]\d)$", (
            "Of the slots above 10, which one has jk2_init found children in most often?",), (
            "Which scoreboard slots above 10 have had children found in them?",)),
        Values(r"^\[[^]]+\] \[(?P<value>[a-z]+)\] ", (
            "Which severity is the most common?",), (
            "Which severities have been logged?",)),
    ), split="fresh"),
)

# The fresh2 split: four more loghub logs vendored in bench/data (bench/data/README.md), written like the fresh ones
# without reading the reader; every question over them is `fresh2`, none dev, held-out or fresh.
HPC_T = r"(?<= )1\d{9}(?= -?\d )"      # HPC: the event's epoch seconds, the field after the state
HPC_ACT = r"^\d+ (?P<node>node-\d+) action start"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
REQ = rf"req-{UUID}"
TB_HEAD = r"^- \d+ \d{4}\.\d\d\.\d\d (?P<node>\S+) "        # Thunderbird: alert flag, epoch, date, the node
TB_WHO = TB_HEAD.replace("(?P<node>", "(?P<value>")            # ... the node as the value asked for
SPECS += (
    LogSpec(FRESH + "loghub/HPC_2k.log", "plain", HPC_T, (
        Lookup("node", r"^(?P<logid>\d+) (?P<value>node-\d+) action start ", (
            "Which node logged action-start event {logid}?",
            "Event {logid} started an action: on which node?")),
        Lookup("id", rf"{HPC_ACT} \S+ \S+ (?P<action>\w+) +\(command (?P<value>\d+)\)$", (
            "Which command number was the {action} action on {node} part of?",
            "{node} started a {action}: under which command?")),
        Lookup("status", rf"{HPC_ACT} \S+ \S+ (?P<value>\w+) +\(command (?P<cmd>\d+)\)$", (
            "What action did command {cmd} start on {node}?",
            "Which action (boot, wait, halt, ...) did {node} begin for command {cmd}?")),
        Lookup("time", rf"{HPC_ACT} (?P<value>{{T}}) \S+ (?P<action>\w+) +\(command (?P<cmd>\d+)\)$", (
            "When did {node} start the {action} of command {cmd}?",
            "At what time did command {cmd} start {action} on {node}?")),
        Lookup("node", r"^\d+ (?P<cmd>\d+) \w+_cmd new \S+ \S+ Targeting domains:(?P<value>node-D\d) and nodes:", (
            "Which domain did command {cmd} target?",
            "Command {cmd} was created: for which node domain?")),
        Lookup("id", r"^\d+ (?P<cmd>\d+) boot_cmd new \S+ \S+ Targeting .* child of command (?P<value>\d+)$", (
            "Which command is boot command {cmd} a child of?",
            "What parent command spawned boot command {cmd}?")),
        Lookup("time", r"^\d+ (?P<cmd>\d+) boot_cmd success (?P<value>{T}) ", (
            "When did boot command {cmd} complete successfully?",
            "At what time did command {cmd} report success?")),
        Lookup("size", r"^\d+ (?P<node>node-\d+) node psu \S+ \S+ psu failure\\ ambient=(?P<value>\d+)$", (
            "What ambient temperature came with the psu failure on {node}?",
            "The power supply of {node} failed: at what ambient reading?")),
        Lookup("size", r"^(?P<logid>\d+) \S+ switch_module temphigh \S+ \S+ Temperature \((?P<value>\d+C)\)", (
            "What temperature did switch event {logid} report?",)),
        Lookup("id", r"^(?P<logid>\d+) node-D\d clusterfilesystem clusterfilesystem\.no_server \S+ \S+ .* domain "
                     r"(?P<value>storage\d+)$", (
            "Which ServerFileSystem domain had no server in event {logid}?",
            "Event {logid} says a domain has no server: which one?")),
        Lookup("node", r"^\d+ (?P<value>node-D\d) clusterfilesystem clusterfilesystem\.no_server .* domain "
                       r"(?P<dom>storage\d+)$", (
            "Which node domain reported that {dom} had no server?",)),
        Lookup("ip", rf"NIFF: node (?P<node>node-\d+) detected a failed network connection on network "
                     rf"(?P<value>{IP}) ", (
            "On which network did {node} detect a failed connection?",
            "{node} reported a NIFF failure: which network address?")),
        Lookup("time", r"^\d+ (?P<node>node-\d+) unix\.hw net\.niff\.down (?P<value>{T}) ", (
            "When did {node} detect a failed network connection?",)),
        Lookup("id", r"^\d+ (?P<node>node-\d+) unix\.hw state_change\.unavailable .*\(HWID=(?P<value>\d+)\)$", (
            "What HWID did the component that went unavailable on {node} have?",
            "Which hardware id became unavailable on {node}?")),
        Lookup("time", r"^\d+ (?P<node>node-\d+) unix\.hw state_change\.unavailable (?P<value>{T}) "
                       r".*\(HWID=(?P<hwid>\d+)\)$", (
            "When did component HWID={hwid} on {node} become unavailable?",)),
        Lookup("size", r"^(?P<logid>\d+) \S+ switch_module fan \S+ \S+ Fan speeds \( \d+ \d+ \d+ (?P<value>\d+) ", (
            "What speed did the fourth fan report in fan event {logid}?",)),
    ), (
        Tally(rf"{HPC_ACT} ", (
            "How many actions has {node} started?",
            "How many action-start events are there for {node}?"), (
            "When did {node} first start an action?",), (
            "When did {node} last start an action?",)),
        Tally(r" action start \S+ \S+ (?P<action>\w+) +\(command", (
            "How many {action} actions have been started?",
            "Count the action-start events of kind {action}."), (
            "When was the first {action} action started?",), (
            "When was a {action} action last started?",)),
        Tally(r"\(command (?P<cmd>\d+)\)$", (
            "On how many nodes did command {cmd} start an action?",), (
            "When did command {cmd} first start an action?",), (
            "When did command {cmd} last start an action on a node?",)),
        Tally(r" boot_cmd success ", (
            "How many boot commands have completed successfully?",), (
            "When did a boot command first complete successfully?",), (
            "When did a boot command last report success?",)),
        Tally(r" node psu .* psu failure", (
            "How many psu failures have been reported?",
            "How many power supply failures are in the log so far?"), (
            "When was the first psu failure?",), (
            "When was the latest psu failure?",)),
        Tally(r"There is no server for ServerFileSystem domain (?P<dom>storage\d+)$", (
            "How many times was {dom} reported as having no server?",), (
            "When was {dom} first reported without a server?",), (
            "When was {dom} last reported without a server?",)),
        Tally(r"is in the unavailable state", (
            "How many component state changes to unavailable have been logged?",), (
            "When did a component first become unavailable?",), (
            "When did a component last become unavailable?",)),
        Tally(r"Temperature \(\d+C\) exceeds warning threshold", (
            "How many switch temperature warnings have there been?",), (
            "When did a switch temperature first exceed the warning threshold?",), (
            "When did a switch temperature last exceed the warning threshold?",)),
    ), (
        Values(r" action start \S+ \S+ (?P<value>\w+) +\(command", (
            "Which action have nodes started most often?",), (
            "Which kinds of actions have nodes started?",)),
        Values(r"psu failure\\ ambient=(?P<value>\d+)$", (
            "Which ambient reading shows up most in psu failures?",), (
            "Which ambient readings have psu failures reported?",)),
        Values(r"^\d+ \d+ (?P<value>\w+_cmd) new ", (
            "Which kind of command has been created most often?",), (
            "Which kinds of commands have been created?",)),
    ), split="fresh2"),
    LogSpec(FRESH + "loghub/Mac_2k.log", "plain", r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d", (
        Lookup("size", r"^(?P<t>{T}) \S+ com\.apple\.cts\[\d+\]: (?P<job>[\w.]+): scheduler_evaluate_activity told me "
                       r"to run this job; however, but the start time isn't for (?P<value>\d+) seconds", (
            "At {t}, how many seconds did com.apple.cts say were left before {job} could start?",
            "How long, in seconds, did {job} still have to wait according to com.apple.cts at {t}?")),
        Lookup("port", r"^(?P<t>{T}) \S+ kernel\[0\]: IOThunderboltSwitch<0>\(0x0\)::listenerCallback - "
                       r"Thunderbolt HPD packet for route = 0x0 port = (?P<value>\d+) ", (
            "Which Thunderbolt port did the HPD packet at {t} come from?",
            "At {t} the Thunderbolt switch saw an HPD packet: on what port?")),
        Lookup("ip", rf"(?P<app>\w+)\[\d+\]: tcp_connection_destination_perform_socket_connect (?P<conn>\d+) "
                     rf"connectx to (?P<value>{IP}):\d+", (
            "Which address did {app} connection {conn} fail to reach?",)),
        Lookup("ip", rf"^(?P<t>{{T}}) .*wl0: (?:MDNS: IPV4 Addr|setup_keepalive: Local IP): (?P<value>{IP})$", (
            "Which IPv4 address did the Wi-Fi driver report at {t}?",
            "At {t}, what IPv4 address did wl0 log?")),
        Lookup("node", r"^(?P<t>{T}) (?P<value>\S+) (?P<proc>(?!kernel\[)[A-Za-z][\w.]*)\[\d+\]", (
            "Which host name is on the {proc} line at {t}?",
            "At {t}, under which host name did {proc} log?")),
        Lookup("id", r"^(?P<t>{T}) \S+ QQ\[\d+\]: FA\|\|Url\|\|taskID\[(?P<value>\d+)\] dealloc$", (
            "Which QQ taskID was deallocated at {t}?",)),
        Lookup("time", r"^(?P<value>{T}) \S+ QQ\[\d+\]: FA\|\|Url\|\|taskID\[(?P<task>\d+)\] dealloc$", (
            "When did QQ deallocate taskID {task}?",
            "At what time was QQ's taskID {task} deallocated?")),
        Lookup("path", r"com\.apple\.Addres\((?P<pid>\d+)\) deny(?:\(1\))? network-outbound (?P<value>/\S+)$", (
            "Which path was com.apple.Addres({pid}) denied outbound network access to?",
            "The sandbox blocked process {pid} from network-outbound: to what path?")),
        Lookup("status", r"^(?P<t>{T}) \S+ locationd\[\d+\]: Location icon should now be in state '(?P<value>\w+)'", (
            "Which state did locationd set the location icon to at {t}?",)),
        Lookup("status", r"^(?P<t>{T}) \S+ kernel\[0\]: AirPort: Link (?P<value>Up|Down) on (?P<iface>\w+)", (
            "At {t}, did the AirPort link on {iface} go Up or Down?",)),
        Lookup("size", r"^(?P<t>{T}) \S+ kernel\[0\]: PM response took (?P<value>\d+) ms", (
            "How many milliseconds did the PM response take at {t}?",
            "At {t} the kernel timed a PM response: how many ms?")),
        Lookup("id", r"^(?P<t>{T}) .*en0: BSSID changed to (?P<value>[0-9a-f:]{17})$", (
            "Which BSSID did en0 change to at {t}?",)),
        Lookup("port", r"setup_keepalive: Local port: (?P<lport>\d+), Remote port: (?P<value>\d+)", (
            "Which remote port does the keepalive from local port {lport} go to?",)),
        Lookup("status", r"^(?P<t>{T}) \S+ com\.apple\.CDScheduler\[\d+\]: Thermal pressure state: (?P<value>\d+) ", (
            "What thermal pressure state did CDScheduler report at {t}?",)),
        Lookup("id", r"^(?P<t>{T}) \S+ (?P<proc>(?!kernel\[)[A-Za-z][\w.]*)\[(?P<value>\d+)\]:", (
            "What pid did {proc} have when it logged at {t}?",)),
        Lookup("time", r"^(?P<value>{T}) .*com\.apple\.Addres\((?P<pid>\d+)\) deny", (
            "When was com.apple.Addres process {pid} denied network access?",)),
        Lookup("path", r"InternetAccountsBridge\[(?P<pid>\d+)\]: dnssd_clientstub ConnectToServer: connect\(\) failed "
                       r"path:(?P<value>\S+) ", (
            "Which socket path could InternetAccountsBridge process {pid} not connect to?",)),
        Lookup("size", r"InternetAccountsBridge\[(?P<pid>\d+)\]: dnssd_clientstub ConnectToServer: connect\(\)-> No of "
                       r"tries: (?P<value>\d+)$", (
            "How many connect tries had InternetAccountsBridge process {pid} made?",)),
        Lookup("port", r"^(?P<t>{T}) .*wl0: setup_keepalive: Local port: (?P<value>\d+), Remote port", (
            "What local port did wl0 set up a keepalive on at {t}?",)),
        Lookup("port", rf"(?P<app>\w+)\[\d+\]: tcp_connection_destination_perform_socket_connect (?P<conn>\d+) "
                       rf"connectx to {IP}:(?P<value>\d+)", (
            "What port was {app} connection {conn} trying to connect to?",)),
    ), (
        Tally(r"com\.apple\.cts\[\d+\]: (?P<job>[\w.]+): scheduler_evaluate_activity told me", (
            "How many times has com.apple.cts put off {job}?",
            "How often was {job} not yet due when com.apple.cts evaluated it?"), (
            "When did com.apple.cts first defer {job}?",), (
            "When did com.apple.cts last defer {job}?",)),
        Tally(r"Thunderbolt HPD packet for route = 0x0 port = (?P<port>\d+) ", (
            "How many Thunderbolt HPD packets have come from port {port}?",), (
            "When did port {port} first send a Thunderbolt HPD packet?",), (
            "When did port {port} last send a Thunderbolt HPD packet?",)),
        Tally(r"AirPort: Link (?P<dir>Up|Down) on (?P<iface>\w+)", (
            "How many times has the AirPort link on {iface} gone {dir}?",), (
            "When did the AirPort link on {iface} first go {dir}?",), (
            "When did the AirPort link on {iface} last go {dir}?",)),
        Tally(r"IO80211AWDLPeerManager::setAwdlAutoMode Resuming AWDL", (
            "How many times has AWDL been resumed?",), (
            "When was AWDL first resumed?",), (
            "When was AWDL last resumed?",)),
        Tally(r"Wake Reason: Wake on Scan offload", (
            "How many wakes on scan offload has the Wi-Fi chip logged?",), (
            "When was the first wake on scan offload?",), (
            "When was the latest wake on scan offload?",)),
        Tally(r"deny(?:\(1\))? network-outbound /private/var/run/mDNSResponder", (
            "How many times has the sandbox denied outbound access to mDNSResponder?",
            "How many network-outbound denials for /private/var/run/mDNSResponder so far?"), (
            "When was outbound access to mDNSResponder first denied?",), (
            "When was outbound access to mDNSResponder last denied?",)),
        Tally(r"Location icon should now be in state '(?P<state>\w+)'", (
            "How many times has locationd set the location icon to {state}?",), (
            "When did the location icon first go {state}?",), (
            "When did the location icon last go {state}?",)),
        Tally(r"Failed to composit image for descriptor", (
            "How many times has iconservicesagent failed to composit an image?",), (
            "When did iconservicesagent first fail to composit an image?",), (
            "When did iconservicesagent last fail to composit an image?",)),
    ), (
        Values(r"AirPort: Link \w+ on (?P<value>\w+)", (
            "Which interface has had the most AirPort link changes?",), (
            "On which interfaces has AirPort reported a link going up or down?",)),
        Values(r"Thunderbolt HPD packet for route = 0x0 port = (?P<value>\d+) ", (
            "Which Thunderbolt port sends the most HPD packets?",), (
            "Which Thunderbolt ports have sent HPD packets?",)),
        Values(r"Location icon should now be in state '(?P<value>\w+)'", (
            "Which location icon state has locationd set most often?",), (
            "Which states has the location icon been in?",)),
        Values(r"Thermal pressure state: (?P<value>\d+) ", (
            "Which thermal pressure state does CDScheduler report most often?",), (
            "Which thermal pressure states has CDScheduler reported?",)),
        Values(r"com\.apple\.cts\[\d+\]: (?P<value>[\w.]+): scheduler_evaluate_activity", (
            "Which job has com.apple.cts put off most often?",), (
            "Which jobs has com.apple.cts deferred so far?",)),
    ), split="fresh2"),
    LogSpec(FRESH + "loghub/OpenStack_2k.log", "plain", r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", (
        Lookup("status", rf"\[(?P<req>{REQ}) [^\]]*\] [\d.,]+ \"[A-Z]+ \S+ HTTP/1\.1\" status: (?P<value>\d+) ", (
            "What HTTP status did request {req} get?",
            "Which status code did nova-api return for {req}?")),
        Lookup("path", rf"\[(?P<req>{REQ}) - - - - -\] [\d.,]+ \"GET (?P<value>/\S+) HTTP/1\.1\"", (
            "Which metadata path did request {req} fetch?",
            "What URL path did the metadata server serve for {req}?")),
        Lookup("ip", rf"\[(?P<req>{REQ}) [^\]]*\] (?P<value>{IP}),{IP} \"", (
            "Which instance address sent metadata request {req}?",
            "From which VM IP did {req} come?")),
        Lookup("user", rf"\[(?P<req>{REQ}) (?P<value>[0-9a-f]{{32}}) [0-9a-f]{{32}} - - -\] {IP} "
                       r"\"(?P<method>POST|DELETE) ", (
            "Which user id sent the {method} request {req}?",
            "Who (user id) made {method} request {req}?")),
        Lookup("id", rf"\[instance: (?P<value>{UUID})\] Took (?P<secs>[\d.]+) seconds to spawn", (
            "Which instance took {secs} seconds to spawn on the hypervisor?",)),
        Lookup("size", rf"\[instance: (?P<inst>{UUID})\] Took (?P<value>[\d.]+) seconds to spawn", (
            "How many seconds did instance {inst} take to spawn on the hypervisor?",
            "How long was the spawn of {inst}?")),
        Lookup("time", rf"^\S+ (?P<value>{{T}}) .*\[instance: (?P<inst>{UUID})\] Instance spawned successfully", (
            "When did instance {inst} finish spawning?",
            "At what time was {inst} spawned successfully?")),
        Lookup("node", r"Auditing locally available compute resources for node (?P<value>\S+)$", (
            "Which compute node is the resource tracker auditing?",)),
        Lookup("status", rf"^\S+ (?P<t>{{T}}) .*\[instance: (?P<inst>{UUID})\] VM (?P<value>\w+) \(Lifecycle Event\)", (
            "Which lifecycle event did {inst} report at {t}?",)),
        Lookup("size", rf"\[(?P<req>{REQ}) [^\]]*\] [\d.,]+ \"[A-Z]+ \S+ HTTP/1\.1\" status: \d+ "
                       r"len: (?P<value>\d+) ", (
            "How many bytes long was the response to {req}?",
            "What response length did nova-api log for {req}?")),
        Lookup("time", rf"^\S+ (?P<value>{{T}}) .*\[instance: (?P<inst>{UUID})\] Terminating instance$", (
            "When did nova-compute start terminating {inst}?",)),
        Lookup("size", rf"\[instance: (?P<inst>{UUID})\] Attempting claim: memory (?P<value>\d+ MB),", (
            "How much memory did the claim for {inst} ask for?",)),
        Lookup("id", rf"Creating event network-vif-plugged:(?P<port>{UUID}) for instance (?P<value>{UUID})", (
            "Which instance was the network-vif-plugged event for port {port} created for?",)),
        Lookup("ip", rf"\[(?P<req>{REQ}) [^\]]*\] (?P<value>{IP}) \"(?P<method>POST|DELETE) ", (
            "Which client address sent the {method} request {req}?",)),
        Lookup("size", rf"\[instance: (?P<inst>{UUID})\] Took (?P<value>[\d.]+) seconds to build instance", (
            "How long did it take to build instance {inst}?",)),
        Lookup("size", r"^\S+ (?P<t>{T}) .*Final resource view: .* used_ram=(?P<value>\d+MB) ", (
            "How much RAM was in use in the final resource view at {t}?",)),
        Lookup("size", rf"\[(?P<req>{REQ}) [^\]]*\] [\d.,]+ \"[A-Z]+ \S+ HTTP/1\.1\" status: \d+ len: \d+ time: "
                       r"(?P<value>[\d.]+)$", (
            "How long did the server take to answer {req}?",
            "What response time did nova-api log for {req}?")),
    ), (
        Tally(rf"\[instance: (?P<inst>{UUID})\] VM \w+ \(Lifecycle Event\)", (
            "How many lifecycle events has instance {inst} had?",), (
            "When was the first lifecycle event of {inst}?",), (
            "When was the latest lifecycle event of {inst}?",)),
        Tally(r" status: (?P<code>[1-5]\d\d) len: ", (
            "How many requests have returned HTTP {code}?",
            "How many responses with status {code} so far?"), (
            "When was HTTP {code} first returned?",), (
            "When was the latest {code} response?",)),
        Tally(r"\"(?P<method>POST|DELETE) /v2/", (
            "How many {method} requests has the compute API served?",), (
            "When did the compute API first serve a {method}?",), (
            "When was the last {method} request to the compute API?",)),
        Tally(r"\] Creating image$", (
            "How many times has the libvirt driver created an image?",), (
            "When did the libvirt driver first create an image?",), (
            "When did the libvirt driver last create an image?",)),
        Tally(r"Instance destroyed successfully", (
            "How many instances have been destroyed successfully?",), (
            "When was an instance first destroyed?",), (
            "When was an instance last destroyed?",)),
        Tally(r"\] Claim successful", (
            "How many resource claims have succeeded?",), (
            "When did a claim first succeed?",), (
            "When did a claim last succeed?",)),
        Tally(r"HTTP exception thrown: No instances found for any event", (
            "How many 'No instances found for any event' exceptions have been thrown?",), (
            "When was 'No instances found for any event' first thrown?",), (
            "When was 'No instances found for any event' last thrown?",)),
        Tally(rf"\[instance: (?P<inst>{UUID})\] During sync_power_state the instance has a pending task", (
            "How many times did sync_power_state skip {inst} because of a pending task?",), (
            "When did sync_power_state first skip {inst}?",), (
            "When did sync_power_state last skip {inst}?",)),
    ), (
        Values(r"\] VM (?P<value>\w+) \(Lifecycle Event\)", (
            "Which lifecycle event is the most common?",), (
            "Which lifecycle events have instances reported?",)),
        Values(r" status: (?P<value>(?!200 )\d{3}) len: ", (
            "Apart from 200, which HTTP status is returned most often?",), (
            "Which HTTP statuses other than 200 have been returned?",)),
        Values(r"\] Took [\d.]+ seconds to (?P<value>\w+) ", (
            "Which operation has nova-compute timed most often?",), (
            "Which operations has nova-compute reported timings for?",)),
    ), split="fresh2"),
    LogSpec(FRESH + "loghub/Thunderbird_2k.log", "plain", r"[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d", (
        Lookup("ip", rf"{TB_HEAD}.* ntpd\[\d+\]: synchronized to (?P<value>{IP}), stratum", (
            "Which NTP server did {node} synchronize to?",
            "{node}'s ntpd synced with which address?")),
        Lookup("id", rf"{TB_HEAD}.* ntpd\[(?P<value>\d+)\]: synchronized to", (
            "What is the pid of ntpd on {node}?",
            "Which process id does {node}'s ntpd log under?")),
        Lookup("time", rf"{TB_HEAD}(?P<value>{{T}}) .* ntpd\[\d+\]: synchronized to (?P<ip>{IP}),", (
            "When did {node} synchronize to {ip}?",
            "At what time did {node}'s ntpd sync with {ip}?")),
        Lookup("user", r"sendmail\[\d+\]: (?P<qid>\w+): from=(?P<value>\w+), size=", (
            "Who sent sendmail message {qid}?",)),
        Lookup("path", rf"{TB_HEAD}.* crond\[\d+\]: \((?P<user>\w+)\) CMD \(run-parts (?P<value>\S+)\)$", (
            "Which directory did cron on {node} run-parts as {user}?",
            "What did crond on {node} hand to run-parts for {user}?")),
        Lookup("size", r"sendmail\[\d+\]: (?P<qid>\w+): from=\w+, size=(?P<value>\d+),", (
            "How big was mail {qid}?",
            "What size did sendmail record for message {qid}?")),
        Lookup("status", r"sendmail\[\d+\]: (?P<qid>\w+): to=.* stat=(?P<value>\w+)", (
            "What delivery status did sendmail give message {qid}?",)),
        Lookup("id", rf"{TB_HEAD}.* crond\(pam_unix\)\[(?P<value>\d+)\]: session opened for user (?P<user>\w+)", (
            "Which crond process opened a session for {user} on {node}?",)),
        Lookup("ip", rf"DHCPREQUEST for (?P<lease>{IP}) \((?P<value>{IP})\) from", (
            "Which DHCP server was the request for {lease} addressed to?",)),
        Lookup("node", rf"{TB_WHO}.* ib_sm\.x\[(?P<pid>\d+)\]:", (
            "Which host runs the InfiniBand subnet manager ib_sm.x[{pid}]?",)),
        Lookup("ip", rf"{TB_HEAD}.* dhcpd: DHCP(?P<msg>ACK|OFFER) on (?P<value>{IP}) to (?P<mac>[0-9a-f:]{{17}}) via", (
            "Which address did {node} put in its DHCP{msg} to {mac}?",)),
        Lookup("time", rf"{TB_HEAD}(?P<value>{{T}}) \S+ sendmail\[\d+\]: unable to qualify my own domain name", (
            "When did sendmail on {node} complain that it could not qualify its own domain name?",)),
        Lookup("id", rf"{TB_HEAD}.* sendmail\[\d+\]: (?P<value>\w+): from=", (
            "Which sendmail queue id did {node} give its outgoing mail?",)),
        Lookup("user", rf"{TB_HEAD}.* crond\(pam_unix\)\[(?P<pid>\d+)\]: session closed for user (?P<value>\w+)$", (
            "Whose cron session did crond({pid}) on {node} close?",
            "On {node}, crond process {pid} closed a session: for which user?")),
        Lookup("size", r"sendmail\[\d+\]: (?P<qid>\w+): to=.* delay=(?P<value>[\d:]+),", (
            "What delay did sendmail report for {qid}?",)),
        Lookup("node", rf"{TB_WHO}.* xinetd\[\d+\]: START: tftp pid=(?P<pid>\d+) ", (
            "Which admin node started tftp pid {pid}?",)),
        Lookup("ip", rf"xinetd\[\d+\]: START: tftp pid=(?P<pid>\d+) from=(?P<value>{IP})$", (
            "Which client did tftp pid {pid} serve?",)),
        Lookup("id", rf"DHCPOFFER on (?P<ip>{IP}) to (?P<value>[0-9a-f:]{{17}}) via", (
            "Which MAC address was offered {ip}?",)),
    ), (
        Tally(r"got not answer from any \[(?P<ds>Thunderbird_\w+)\] datasource", (
            "How many times has gmetad got no answer from the {ds} datasource?",
            "How often did the {ds} datasource fail to answer gmetad?"), (
            "When did {ds} first fail to answer gmetad?",), (
            "When did {ds} last fail to answer gmetad?",)),
        Tally(rf"ntpd\[\d+\]: synchronized to (?P<ip>{IP}),", (
            "How many ntpd synchronizations to {ip} have been logged?",), (
            "When did a node first synchronize to {ip}?",), (
            "When did a node last synchronize to {ip}?",)),
        Tally(r"NEW SWEEP", (
            "How many new subnet manager sweeps have started?",), (
            "When did the first new sweep start?",), (
            "When did the latest new sweep start?",)),
        Tally(r"unable to qualify my own domain name", (
            "How many times has sendmail been unable to qualify its own domain name?",), (
            "When did sendmail first fail to qualify its own domain name?",), (
            "When did sendmail last fail to qualify its own domain name?",)),
        Tally(rf"{TB_HEAD}.* dhcpd: DHCPDISCOVER ", (
            "How many DHCPDISCOVERs has {node} logged?",), (
            "When did {node} first log a DHCPDISCOVER?",), (
            "When did {node} last log a DHCPDISCOVER?",)),
        Tally(r"stat=Deferred", (
            "How many mails has sendmail deferred?",
            "How many deliveries ended with stat=Deferred?"), (
            "When was a mail first deferred?",), (
            "When was a mail last deferred?",)),
        Tally(rf"{TB_HEAD}.* crond\(pam_unix\)\[\d+\]: session closed for user", (
            "How many cron sessions have closed on {node}?",), (
            "When did a cron session first close on {node}?",), (
            "When did a cron session last close on {node}?",)),
        Tally(r"network A_net: no free leases", (
            "How many times has a DHCP server had no free leases on A_net?",), (
            "When did A_net first run out of free leases?",), (
            "When was 'no free leases' on A_net last logged?",)),
    ), (
        Values(rf"synchronized to (?P<value>{IP}),", (
            "Which NTP server do nodes synchronize to most often?",), (
            "Which NTP servers have nodes synchronized to?",)),
        Values(rf"{TB_WHO}.* dhcpd: ", (
            "Which node logs the most dhcpd messages?",), (
            "Which nodes have logged dhcpd messages?",)),
        Values(rf"{TB_WHO}.* sendmail\[\d+\]: unable to qualify", (
            "Which node complains most about an unqualified domain name?",), (
            "Which nodes' sendmail could not qualify their own domain name?",)),
        Values(r"dhcpd: (?P<value>DHCP[A-Z]+) ", (
            "Which DHCP message type is logged most often?",), (
            "Which DHCP message types have been logged?",)),
    ), split="fresh2"),
)

# The fresh3 split: four logs of kinds no other set has (a web shop's access log, an IIS W3C log, a Zeek http.log, a
# PostgreSQL server log with auto_explain plans), vendored in bench/data from lnav's and quellog's test data
# (bench/data/README.md), written like the fresh ones without reading the reader; every question over them is
# `fresh3`, none dev, held-out, fresh or fresh2.
SHOP_T = r"\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d \+0330"     # the access log's [time], without the brackets
SHOP = rf"^(?P<ip>{IP}) - - \[(?P<t>{{T}})\] "                     # client and time of an access line
W3C_T = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"                        # IIS: the date and time fields
W3C = rf"^(?P<t>{{T}}) {IP} GET (?P<stem>\S+) \S+ \d+ \S+ "        # ... then s-ip, method, uri stem, query, port, user
BRO_T = r"1\d{9}\.\d{6}"                                          # Zeek: ts, epoch seconds
BRO_UID = r"\t(?P<uid>C\w+)\t"                                    # Zeek: the connection's uid, after ts
PG_T = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC"                # PostgreSQL: log_line_prefix %m
PG_PID = r"UTC \[(?P<pid>\d+)\] \d+: "                            # ... the backend's pid and the SQLSTATE
SPECS += (
    LogSpec(FRESH + "lnav/logfile_shop_access_log.0", "plain", SHOP_T, (
        Lookup("status", r'"GET (?P<path>/product/\d+) HTTP/1\.1" (?P<value>\d{3}) ', (
            "What status code came back for GET {path}?",
            "Did {path} load? Which HTTP status did the shop answer with?")),
        Lookup("size", r'"GET (?P<path>/image/\d+/productModel/\d+x\d+) HTTP/1\.1" 200 (?P<value>\d+) ', (
            "How many bytes was the response for {path}?",
            "What response size did the shop log for {path}?")),
        Lookup("ip", rf'^(?P<value>{IP}) - - \[[^\]]+\] "GET (?P<path>/image/\d+/productModel/\d+x\d+) ', (
            "Which client downloaded the image {path}?",
            "Who (which address) fetched {path}?")),
        Lookup("time", rf'^(?P<ip>{IP}) - - \[(?P<value>{{T}})\] "GET (?P<path>/product/\d+) ', (
            "When did {ip} ask for {path}?",
            "At what time was {path} requested by {ip}?")),
        Lookup("path", SHOP + r'"POST (?P<value>/ajaxFilter/\S+) ', (
            "Which ajaxFilter URL did {ip} post to at {t}?",
            "{ip} sent a POST at {t}: to which URL?")),
        Lookup("status", SHOP + r'"HEAD \S+ HTTP/1\.1" (?P<value>\d{3}) ', (
            "What status did the HEAD request from {ip} at {t} get?",)),
        Lookup("size", SHOP + r'"POST /m/updateVariation\S* HTTP/1\.1" \d{3} (?P<value>\d+) ', (
            "How large was the updateVariation response sent to {ip} at {t}?",
            "At {t}, how many bytes did {ip} get back from /m/updateVariation?")),
        Lookup("id", SHOP + r'"GET /product/(?P<value>\d+)', (
            "Which product number did {ip} open at {t}?",)),
        Lookup("path", SHOP + r'"GET (?P<value>/static/\S+) ', (
            "Which static file did {ip} load at {t}?",
            "What file under /static was requested by {ip} at {t}?")),
        Lookup("ip", rf'^(?P<value>{IP}) - - \[(?P<t>{{T}})\] "GET \S+ HTTP/1\.1" 404 ', (
            "Which client got a 404 at {t}?",
            "At {t} somebody asked for a page that does not exist: from which IP?")),
        Lookup("status", SHOP + r'"GET \S+ HTTP/1\.1" (?P<value>30[12]) ', (
            "Was {ip} redirected with a 301 or a 302 at {t}?",)),
        Lookup("size", SHOP + r'"GET /settings/\S+ HTTP/1\.1" 200 (?P<value>\d+) ', (
            "How big was the settings response {ip} received at {t}?",)),
        Lookup("path", SHOP + r'"GET \S+ HTTP/1\.1" \d{3} \d+ "(?P<value>https?://[^"%]+)" ', (
            "Which page referred {ip} at {t}?",
            "What referrer came with the request of {ip} at {t}?")),
    ), (
        Tally(r"^(?P<ip>\d+\.\d+\.\d+\.\d+) - - ", (
            "How many requests has {ip} sent?",
            "Count the hits from {ip}."), (
            "When did {ip} first show up?",
            "What time was the earliest request from {ip}?"), (
            "When was the most recent request from {ip}?",
            "When did {ip} last hit the shop?")),
        Tally(r'HTTP/1\.1" 404 ', (
            "How many requests have ended in a 404?",
            "How many not-found responses so far?"), (
            "When was the first 404?",), (
            "When did the shop last answer 404?",)),
        Tally(r"compatible; (?P<bot>bingbot|Googlebot|AhrefsBot)/", (
            "How many requests did {bot} make?",
            "How often has {bot} crawled a page so far?"), (
            "When did {bot} first crawl the shop?",), (
            "When was {bot}'s latest request?",)),
        Tally(r'"POST /m/updateVariation', (
            "How many POSTs to /m/updateVariation have there been?",), (
            "When was /m/updateVariation first posted to?",), (
            "When was the last POST to /m/updateVariation?",)),
        Tally(r'"HEAD ', (
            "How many HEAD requests has the shop had?",), (
            "When did the first HEAD request come in?",), (
            "When was the latest HEAD request?",)),
        Tally(r'HTTP/1\.1" (?P<code>30[12]) ', (
            "How many {code} redirects were sent?",), (
            "When was a {code} first returned?",), (
            "When was a {code} last returned?",)),
    ), (
        Values(r'HTTP/1\.1" (?P<value>\d{3}) ', (
            "Which status code is most common?",), (
            "Which status codes has the shop returned?",)),
        Values(r'"(?P<value>[A-Z]+) /\S* HTTP/1\.1"', (
            "Which HTTP method do clients use most?",), (
            "Which request methods have clients used?",)),
        Values(r"\(compatible; (?P<value>\w+)/[\d.]+; \+http", (
            "Which crawler hits the shop most often?",), (
            "Which crawlers have visited so far?",)),
        Values(r"/productModel/(?P<value>\d+x\d+) ", (
            "Which product thumbnail size is requested most?",), (
            "Which product image sizes have been requested?",)),
        Values(r'HTTP/1\.1" (?P<value>(?!200)\d{3}) ', (
            "Apart from 200, which status has the shop sent most often?",), (
            "Which statuses other than 200 have come back so far?",)),
    ), split="fresh3"),
    LogSpec(FRESH + "lnav/logfile_w3c_big.0", "plain", W3C_T, (
        Lookup("ip", rf"^(?P<t>{{T}}) {IP} GET (?P<stem>\S+) \S+ \d+ \S+ (?P<value>{IP}) ", (
            "Which client requested {stem} at {t}?",
            "At {t}, who asked the IIS server for {stem}?")),
        Lookup("status", rf"^{{T}} {IP} GET (?P<stem>\S+) \S+ \d+ \S+ {IP} \S+ \S+ (?P<value>\d{{3}}) ", (
            "What status did IIS return for {stem}?",
            "Which HTTP status do requests for {stem} get?")),
        Lookup("size", W3C + r"(?:\S+ ){6}(?P<value>\d+) \d+ \d+$", (
            "How many bytes did the server send for {stem} at {t}?",
            "What was sc-bytes for the request of {stem} at {t}?")),
        Lookup("size", W3C + r"(?:\S+ ){8}(?P<value>\d+)$", (
            "How many milliseconds did the request for {stem} at {t} take?",
            "What time-taken did IIS log for {stem} at {t}?")),
        Lookup("port", rf"^(?P<t>{{T}}) {IP} GET (?P<stem>\S+) \S+ (?P<value>\d+) ", (
            "On which server port was {stem} requested at {t}?",)),
        Lookup("node", rf"^(?P<t>{{T}}) (?P<value>{IP}) GET (?P<stem>\S+) ", (
            "Which server address answered the request for {stem} at {t}?",)),
        Lookup("time", rf"^(?P<value>{{T}}) {IP} GET (?P<stem>\S+) \S+ \d+ \S+ (?P<ip>{IP}) ", (
            "When did {ip} request {stem}?",
            "At what time did {ip} fetch {stem}?")),
        Lookup("path", rf"^(?P<t>{{T}}) {IP} GET (?P<value>\S+) \S+ \d+ \S+ (?P<ip>{IP}) ", (
            "Which path did {ip} request at {t}?",
            "What URI stem did {ip} ask for at {t}?")),
        Lookup("path", rf"^(?P<t>{{T}}) {IP} GET (?P<stem>\S+) (?P<value>(?!-)\S+) ", (
            "What query string came with {stem} at {t}?",)),
        Lookup("size", W3C + r"(?:\S+ ){7}(?P<value>\d+) \d+$", (
            "How many bytes did the client send when it asked for {stem} at {t}?",)),
        Lookup("status", W3C + r"(?:\S+ ){5}(?P<value>\d+) \d+ \d+ \d+$", (
            "Which win32 status was logged for {stem} at {t}?",)),
    ), (
        Tally(rf"^{{T}} {IP} \S+ \S+ \S+ \d+ \S+ (?P<ip>{IP}) ", (
            "How many requests has {ip} sent?",
            "How many log entries are from client {ip}?"), (
            "When did {ip} first appear?",), (
            "When did {ip} last send a request?",)),
        Tally(r" 404 \d+ \d+ \d+ \d+ \d+$", (
            "How many 404 responses so far?",
            "How many requests found nothing (404)?"), (
            "When was the first 404?",), (
            "When was the latest 404 logged?",)),
        Tally(r" GET (?P<stem>/[\w-]+/) ", (
            "How many times was {stem} requested?",
            "How often has someone probed {stem}?"), (
            "When was {stem} first requested?",), (
            "When was {stem} last requested?",)),
        Tally(r"bingbot", (
            "How many requests came from bingbot?",), (
            "When did bingbot first visit?",), (
            "When did bingbot last visit?",)),
        Tally(r" GET /robots\.txt ", (
            "How many times has robots.txt been fetched?",), (
            "When was robots.txt first fetched?",), (
            "When was robots.txt last fetched?",)),
        Tally(r" 200 \d+ \d+ \d+ \d+ \d+$", (
            "How many requests succeeded with 200?",), (
            "When did a request first succeed?",), (
            "When did the last successful (200) request happen?",)),
    ), (
        Values(rf"^{{T}} {IP} \S+ \S+ \S+ \d+ \S+ (?P<value>{IP}) ", (
            "Which client sent the most requests?",), (
            "Which client addresses have made requests?",)),
        Values(r" (?P<value>[1-5]\d\d) \d+ \d+ \d+ \d+ \d+$", (
            "Which HTTP status is the most common?",), (
            "Which HTTP statuses has the server returned?",)),
        Values(r" GET (?P<value>/[\w-]+/) ", (
            "Which directory has been requested most often?",), (
            "Which directories have been requested?",)),
        Values(r"\+\(compatible;\+(?P<value>\w+)/", (
            "Which crawler has made the most requests?",), (
            "Which crawlers have visited the server?",)),
    ), split="fresh3"),
    LogSpec(FRESH + "lnav/logfile_bro_http.log.0", "plain", BRO_T, (
        Lookup("ip", BRO_UID + rf"{IP}\t\d+\t(?P<value>{IP})\t", (
            "Which server address did connection {uid} talk to?",
            "Connection {uid}: what was the responder's IP?")),
        Lookup("port", BRO_UID + rf"{IP}\t(?P<value>\d+)\t", (
            "Which source port did connection {uid} use?",
            "From which client port was connection {uid} opened?")),
        Lookup("node", BRO_UID + r"(?:[^\t]*\t){6}(?P<value>[^\t]+)\t/", (
            "Which web site was requested over connection {uid}?",
            "What Host header was sent on {uid}?")),
        Lookup("path", BRO_UID + r"(?:[^\t]*\t){7}(?P<value>/[^\t]*)\t", (
            "Which URI was fetched over connection {uid}?",
            "What path did the request on {uid} ask for?")),
        Lookup("status", BRO_UID + r"(?:[^\t]*\t){13}(?P<value>\d{3})\t", (
            "What status code did the server answer on connection {uid}?",
            "Which HTTP status came back on {uid}?")),
        Lookup("size", BRO_UID + r"(?:[^\t]*\t){12}(?P<value>\d+)\t\d{3}\t", (
            "How many response body bytes came back on {uid}?",
            "How big was the response body on connection {uid}?")),
        Lookup("time", rf"^(?P<value>{{T}})" + BRO_UID, (
            "When was the request on connection {uid} logged?",
            "At what time did Zeek log the HTTP request of {uid}?")),
        Lookup("id", BRO_UID + r".*\t(?P<value>F\w+)\t[^\t]*\t[^\t]*$", (
            "Which file id did Zeek give the response on {uid}?",)),
        Lookup("id", rf"^(?P<t>{{T}})\t(?P<value>C\w+)\t", (
            "Which connection uid is on the request logged at {t}?",
            "What is the uid of the HTTP request Zeek logged at {t}?")),
        Lookup("ip", BRO_UID + rf"(?P<value>{IP})\t", (
            "Which local host opened connection {uid}?",)),
    ), (
        Tally(r"\tGET\t(?P<host>[^\t]+)\t", (
            "How many requests went to {host}?",
            "How many GETs has {host} received?"), (
            "When was {host} first requested?",), (
            "When was {host} last requested?",)),
        Tally(r"\t304\tNot Modified\t", (
            "How many 304 Not Modified answers so far?",
            "How many responses said Not Modified?"), (
            "When was the first 304?",), (
            "When was the latest Not Modified response?",)),
        Tally(rf"\t(?P<ip>{IP})\t80\t", (
            "How many requests were sent to {ip}?",), (
            "When was {ip} first contacted?",), (
            "When was {ip} last contacted?",)),
        Tally(r"\timage/png$", (
            "How many PNG images were downloaded?",), (
            "When was the first PNG downloaded?",), (
            "When was the last PNG downloaded?",)),
        Tally(r"\tapplication/x-shockwave-flash$", (
            "How many Flash files have been downloaded?",), (
            "When was the first Flash file fetched?",), (
            "When was a Flash file last fetched?",)),
    ), (
        Values(r"\t(?P<value>[a-z]+/[\w.+-]+)$", (
            "Which MIME type is downloaded most often?",), (
            "Which MIME types have responses had?",)),
        Values(r"\t(?P<value>\d{3})\t[A-Z][\w ]+\t", (
            "Which status code is the most common?",), (
            "Which status codes have servers returned?",)),
        Values(r"\tGET\t(?P<value>[^\t]+)\t", (
            "Which host gets the most requests?",), (
            "Which hosts have been requested so far?",)),
        Values(r"\t(?P<value>(?!200)\d{3})\t[A-Z][\w ]+\t", (
            "Other than 200, which status code shows up most?",), (
            "Which status codes besides 200 have been seen?",)),
    ), split="fresh3"),
    LogSpec(FRESH + "quellog/autoexplain_stderr.log", "plain", PG_T, (
        Lookup("size", PG_PID + r"\S+ LOG:  duration: (?P<value>[\d.]+ ms)  statement: ", (
            "How long did the statement of backend {pid} take?",
            "What duration did PostgreSQL log for the statement run by process {pid}?")),
        Lookup("size", PG_PID + r".*LOG:  disconnection: session time: (?P<value>[\d:.]+) ", (
            "How long did session {pid} last?",
            "What session time was logged when backend {pid} disconnected?")),
        Lookup("time", rf"^(?P<value>{{T}}) \[(?P<pid>\d+)\] .*LOG:  connection received", (
            "When did connection {pid} arrive?",
            "At what time was the connection of backend {pid} received?")),
        Lookup("time", rf"^(?P<value>{{T}}) \[(?P<pid>\d+)\] .*LOG:  disconnection: ", (
            "When did process {pid} disconnect?",)),
        Lookup("user", PG_PID + r".*connection authorized: user=(?P<value>\w+) ", (
            "Which user did backend {pid} log in as?",
            "As which database user was session {pid} authorized?")),
        Lookup("status", PG_PID + r'.*connection authenticated: user="\w+" method=(?P<value>\w+) ', (
            "Which authentication method admitted session {pid}?",)),
        Lookup("path", PG_PID + r".*method=\w+ \((?P<value>/[^:]+):\d+\)", (
            "Which hba file authenticated connection {pid}?",)),
        Lookup("id", PG_PID + r".*pg_hba\.conf:(?P<value>\d+)\)", (
            "Which pg_hba.conf line matched connection {pid}?",)),
        Lookup("size", PG_PID + r"\S+ LOG:  duration: (?P<value>[\d.]+ ms)  plan:", (
            "What duration is on the auto_explain plan logged by backend {pid}?",)),
        Lookup("id", PG_PID + r".*statement: SELECT \* FROM users WHERE id = (?P<value>\d+);", (
            "Which user id did backend {pid} look up?",)),
        Lookup("status", PG_PID + r"db=[^,]*,user=[^,]*,app=[^,]*,client=\S+ (?P<value>[A-Z]+):  disconnection", (
            "At which level did PostgreSQL log the disconnection of backend {pid}?",)),
        Lookup("node", PG_PID + r".*disconnection: .* host=(?P<value>\S+)$", (
            "From which host did session {pid} connect?",)),
    ), (
        Tally(r"LOG:  connection received: ", (
            "How many connections have been received?",
            "How many times did a client connect?"), (
            "When was the first connection received?",), (
            "When was the latest connection received?",)),
        Tally(r"LOG:  disconnection: ", (
            "How many sessions have ended?",), (
            "When did the first session end?",), (
            "When did a session last end?",)),
        Tally(r"LOG:  duration: [\d.]+ ms  plan:", (
            "How many plans has auto_explain logged?",
            "How many execution plans are in the log so far?"), (
            "When was the first plan logged?",), (
            "When was the latest plan logged?",)),
        Tally(r"LOG:  duration: [\d.]+ ms  statement: .*JOIN orders", (
            "How many logged statements join the orders table?",), (
            "When was a join on orders first logged?",), (
            "When was a join on orders last logged?",)),
        Tally(r"application_name=(?P<app>\w+)$", (
            "How many sessions did {app} open?",), (
            "When did {app} first connect?",), (
            "When did {app} last connect?",)),
    ), (
        Values(r"LOG:  duration: [\d.]+ ms  (?P<value>plan|statement):", (
            "Which kind of duration line is the most common, plan or statement?",), (
            "Which kinds of duration lines have been logged?",)),
        Values(r"UTC \[\d+\] \d+: db=(?P<value>[^,]+),", (
            "Which database name appears most often in the line prefixes?",), (
            "Which database names have appeared in the line prefixes?",)),
        Values(r"LOG:  (?P<value>connection \w+|disconnection)", (
            "Which connection event is logged most often?",), (
            "Which connection events have been logged?",)),
    ), split="fresh3"),
)

# The fresh4 split: four logs of kinds no other set has (a Siemens WinCC SIMATIC S7 protocol suite log, a TeamViewer
# service log and a Windows setupapi device-install log from plaso's test data, an sshesame SSH honeypot log from
# crowdsec's hub tests), vendored in bench/data (bench/data/README.md), written like the fresh ones without reading the
# reader; every question over them is `fresh4`, none dev, held-out, fresh, fresh2 or fresh3.
S7_T = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"                     # S7 suite: date, time, comma, milliseconds
S7 = r"^(?P<t>{T}) "                                              # ... the time of an S7 line
TV_T = r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{3}"                   # TeamViewer: date and time with milliseconds
TV = r"^(?P<t>{T}) +\d+ +\d+ +\S+ +"                               # ... then the process id, thread id, process tag
SA_T = r"(?:\d{4}/\d\d/\d\d )?\d\d:\d\d:\d\d\.\d{3}"               # setupapi: a section's date and time, else a clock
SSH_T = r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d"                          # sshesame: date and time
SSH = rf"^(?P<t>{{T}}) \[(?P<ip>{IP}):(?P<port>\d+)\] "            # ... then the client's address and source port
SSH_PEER = rf"\[(?P<ip>{IP}):(?P<port>\d+)\] "                     # the client without the time
SPECS += (
    LogSpec(FRESH + "plaso/wincc_simatic_s7_proto_suite.log", "plain", S7_T, (
        Lookup("id", S7 + r"INFO +\| Process-ID +: (?P<value>[0-9a-f]{8})$", (
            "Which process ID did the S7 channel log at {t}?",
            "S7 log restart at {t}: what Process-ID?")),
        Lookup("time", r"^(?P<value>{T}) INFO +\| Process-ID +: (?P<pid>[0-9a-f]{8})$", (
            "When did the S7 channel with process ID {pid} start its log?",
            "At what time was Process-ID {pid} written to the S7 log?")),
        Lookup("status", S7 + r'ERROR +Cannot connect to "(?P<plc>PLC-\d+)": Errorcode (?P<value>0x[0-9A-F]{4} '
                              r'[0-9A-F]{4})!', (
            "Which error code did the failed connect to {plc} at {t} give?",
            "{plc} could not be reached at {t} - errorcode?")),
        Lookup("status", S7 + r'ERROR +Connectionerror (?P<n>\d+) "(?P<plc>PLC-\d+)": Errorcode '
                              r'(?P<value>0x[0-9A-F]{4} [0-9A-F]{4})!', (
            "What errorcode came with connection error {n} of {plc} at {t}?",
            "At {t} {plc} had connection error {n}: which error code?")),
        Lookup("node", S7 + r'ERROR +Connectionerror (?P<n>\d+) "(?P<value>PLC-\d+)"', (
            "Which PLC had connection error number {n} at {t}?",
            "Connection error {n} logged at {t} - on which PLC?")),
        Lookup("node", S7 + r'ERROR +Cannot connect to "(?P<value>PLC-\d+)": Errorcode 0x[0-9A-F]{4} '
                            r'(?P<code>[0-9A-F]{4})!', (
            "Which PLC could the S7 channel not connect to at {t} (code {code})?",)),
        Lookup("time", r'^(?P<value>{T}) ERROR +Connectionerror (?P<n>\d+) "(?P<plc>PLC-\d+)"', (
            "When did {plc} log connection error {n}?",
            "What time was connection error {n} on {plc}?")),
        Lookup("status", S7 + r'INFO +S7 channel unit "(?P<unit>[^"]+)" (?P<value>activated|deactivated)!', (
            "Was the S7 channel unit {unit} activated or deactivated at {t}?",)),
        Lookup("size", S7 + r"INFO +\| LogFileSize +: (?P<value>\d+)$", (
            "What LogFileSize did the S7 suite log at {t}?",
            "How large may an S7 log file grow, as logged at {t}?")),
        Lookup("path", S7 + r"INFO +\| LogFileName +: (?P<value>.+\.LOG)$", (
            "Which log file name did the S7 channel write at {t}?",)),
        Lookup("id", S7 + r"INFO +\| TraceFlags +: (?P<value>[0-9a-f]+)$", (
            "Which trace flags were set at {t}?",)),
        Lookup("id", S7 + r"INFO +S7DOS version: (?P<value>V[\d.]+ / \d+)$", (
            "Which S7DOS version was reported at {t}?",)),
    ), (
        Tally(r'Cannot connect to "(?P<plc>PLC-\d+)"', (
            "How many times could the channel not connect to {plc}?",
            "Count the failed connects to {plc}."), (
            "When did a connect to {plc} first fail?",), (
            "When did the last failed connect to {plc} happen?",)),
        Tally(r'Connectionerror \d+ "(?P<plc>PLC-\d+)"', (
            "How many connection errors has {plc} had?",
            "How often did {plc} report a Connectionerror?"), (
            "When was {plc}'s first connection error?",), (
            "When was {plc}'s latest connection error?",)),
        Tally(r"Errorcode (?P<code>0x[0-9A-F]{4} [0-9A-F]{4})!", (
            "How many times has errorcode {code} shown up?",
            "How many lines carry error code {code}?"), (
            "When was errorcode {code} first logged?",), (
            "When was errorcode {code} last seen?",)),
        Tally(r"INFO +Log starting \.\.\.", (
            "How many times has the S7 log been started?",), (
            "When did the S7 log first start?",), (
            "When did the S7 log last start?",)),
        Tally(r'Error in EventVariable "(?P<var>[^"]+)"', (
            "How many errors were logged for event variable {var}?",), (
            "When was the first error in {var}?",), (
            "When was the last error in {var}?",)),
        Tally(r"INFO +S7 channel DLL terminated!", (
            "How many times has the S7 channel DLL terminated?",
            "How many DLL shutdowns so far?"), (
            "When did the S7 channel DLL first terminate?",), (
            "When did the S7 channel DLL last terminate?",)),
    ), (
        Values(r"Errorcode (?P<value>0x[0-9A-F]{4} [0-9A-F]{4})!", (
            "Which error code is the most frequent?",), (
            "Which error codes have been logged?",)),
        Values(r'ERROR +(?:Cannot connect to|Connectionerror \d+) "(?P<value>PLC-\d+)"', (
            "Which PLC has the most connection problems?",), (
            "Which PLCs have had connection problems?",)),
        Values(r"^{T} (?P<value>[A-Z]+) ", (
            "Which log level shows up most in the S7 log?",), (
            "Which log levels appear in the S7 log?",)),
    ), split="fresh4"),
    LogSpec(FRESH + "plaso/TeamViewer15_Logfile.log", "plain", TV_T, (
        Lookup("id", r"Start GUI process in session (?P<session>\d+), pid (?P<value>\d+)$", (
            "Which pid did the TeamViewer GUI started in session {session} get?",
            "GUI process for session {session}: pid?")),
        Lookup("id", TV + r"IpcLoaderProcessHandlerWin: Loader process started, pid = (?P<value>\d+)$", (
            "What pid did the loader process started at {t} have?",)),
        Lookup("port", TV + r"AcceptServer::HandleAccept: new connection from 127\.0\.0\.1:(?P<value>\d+)$", (
            "From which local port came the connection TeamViewer accepted at {t}?",
            "Accepted connection at {t}: source port?")),
        Lookup("ip", TV + rf"ConnectEndpoint\(\): Connecting to endpoint (?P<value>{IP}):\d+$", (
            "Which endpoint address did TeamViewer connect to at {t}?",
            "At {t}, what IP did TeamViewer dial?")),
        Lookup("port", TV + rf"ConnectEndpoint\(\): Connecting to endpoint {IP}:(?P<value>\d+)$", (
            "Which port was the endpoint TeamViewer connected to at {t}?",)),
        Lookup("node", TV + r"CTcpConnectionBase\[\d+\]::HandleResolveSuccess\(\): Connecting to (?P<value>[\w.-]+)$", (
            "Which router host did TeamViewer connect to at {t}?",
            "Router TeamViewer resolved and connected to at {t}?")),
        Lookup("id", TV + r"TeamViewerIDTracker::UpdateMachineID: New machineID = (?P<value>\d+)$", (
            "Which machine ID did TeamViewer get at {t}?",)),
        Lookup("user", r"SessionID = (?P<session>\d+), username = (?P<value>[^,\s]+),", (
            "Which user is logged on in Windows session {session}?",
            "Session {session}: whose session is it?")),
        Lookup("status", TV + r"TeamViewer-Onlinestate changed to (?P<value>\w+)$", (
            "What did the TeamViewer online state change to at {t}?",
            "At {t}, online or offline?")),
        Lookup("size", TV + r"PrintingPrinterManager::CleanupPrinters: allocating (?P<value>\d+) bytes$", (
            "How many bytes did the printer cleanup allocate at {t}?",)),
        Lookup("path", r"^{T} +(?P<pid>\d+) +\d+ +L\d\d +Loader started with: \"(?P<value>[^\"]+)\"", (
            "Which executable did loader process {pid} start with?",
            "What exe is loader pid {pid} running?")),
        Lookup("status", TV + r"DriverInstalled: (?P<call>\w+) failed with error code (?P<value>\d+),", (
            "Which error code did {call} fail with at {t}?",)),
        Lookup("time", r"^(?P<value>{T}) +(?P<pid>\d+) +\d+ +\S+ +Logger started\.$", (
            "When did the logger of process {pid} start?",
            "What time did process {pid} start logging?")),
        Lookup("id", r"^{T} +(?P<pid>\d+) +\d+ +\S+ +MainBaseWin::ExecuteMain: MainThread-Id = (?P<value>\d+)$", (
            "Which main thread id did process {pid} report?",)),
        Lookup("id", TV + r"IpcInitConnection::Received_Control_InitIPC: Connecting process: (?P<value>\d+)$", (
            "Which process connected over IPC at {t}?",)),
    ), (
        Tally(r", Errorcode=(?P<code>\d+)$", (
            "How many times has Errorcode={code} been logged?",
            "Count the lines ending in Errorcode={code}."), (
            "When was Errorcode={code} first logged?",), (
            "When was Errorcode={code} last logged?",)),
        Tally(r"InterProcessBase::ProcessControlCommand Command (?P<cmd>\d+) not handled", (
            "How many times was IPC command {cmd} not handled?",), (
            "When was command {cmd} first left unhandled?",), (
            "When was command {cmd} last left unhandled?",)),
        Tally(r"SecureNetworkCallbackHandle created", (
            "How many secure network callback handles have been created?",), (
            "When was the first secure network callback handle created?",), (
            "When was the last secure network callback handle created?",)),
        Tally(r"SendBCommandToMaster: CC=(?P<cc>\d+) CT=(?P<ct>\d+)$", (
            "How many commands with CC={cc} CT={ct} went to the master?",), (
            "When was a CC={cc} CT={ct} command first sent to the master?",), (
            "When was a CC={cc} CT={ct} command last sent to the master?",)),
        Tally(r"Logger started\.$", (
            "How many times has the TeamViewer logger started?",
            "How many logger starts so far?"), (
            "When did the logger first start?",), (
            "When did the logger last start?",)),
        Tally(r"WorkingProxyResultHandler failed", (
            "How many times did the working-proxy check fail?",), (
            "When did the working-proxy check first fail?",), (
            "When did the working-proxy check last fail?",)),
        Tally(r"^{T} +(?P<pid>\d+) +\d+ +\S+!! ", (
            "How many error lines (!!) has process {pid} written?",), (
            "When did process {pid} log its first error?",), (
            "When did process {pid} log its latest error?",)),
    ), (
        Values(r"^{T} +(?P<value>\d+) +\d+ ", (
            "Which process id writes the most lines?",), (
            "Which process ids have written to the log?",)),
        Values(r", Errorcode=(?P<value>\d+)$", (
            "Which Errorcode is logged most often?",), (
            "Which Errorcode values have appeared?",)),
        Values(r"SendBCommandToMaster: CC=(?P<value>\d+) ", (
            "Which CC value is sent to the master most often?",), (
            "Which CC values have been sent to the master?",)),
    ), split="fresh4"),
    LogSpec(FRESH + "plaso/setupapi.setup.log", "plain", SA_T, (
        Lookup("path", r"set: (?P<dev>\S+) -> Configured(?: and started)? \[(?P<value>[\w.]+\.inf):", (
            "Which INF file configured device {dev}?",
            "{dev}: which .inf was used?")),
        Lookup("status", r"set: (?P<dev>\S+) -> (?P<value>Configured and started|Configured(?= \[)|Setting "
                         r"CONFIGFLAG_REINSTALL)", (
            "What did setup report for device {dev}?",
            "Was {dev} configured and started?")),
        Lookup("id", r"set: (?P<dev>\S+) -> .*\(ConfigFlags = (?P<value>0x[0-9a-f]{8})\)", (
            "Which ConfigFlags does {dev} have?",
            "ConfigFlags of {dev}?")),
        Lookup("time", r"\{Installing device - (?!exit\()(?P<dev>[^}]+)\} (?P<value>{T})$", (
            "When did setup start installing {dev}?",
            "At what time did the install of {dev} begin?")),
        Lookup("status", r"\{(?P<step>DIF_[A-Z_]+) - exit\((?P<value>0x[0-9a-f]{8})\)\} (?P<t>{T})$", (
            "What exit code did {step} return at {t}?",
            "{step} finished at {t}: with which exit code?")),
        Lookup("path", r"Install Device: Configuring device \((?P<value>[\w.]+\.inf):[^,]+,(?P<sec>[\w.]+)\)\. "
                       r"(?P<t>{T})$", (
            "Which INF did setup configure a device from at {t} (section {sec})?",)),
        Lookup("id", r"not referenced from \[(?P<sec>[\w.]+)\]\. Code = \d+, Line = (?P<value>\d+)$", (
            "On which INF line is the section needed by [{sec}]?",)),
        Lookup("node", r"\{Configure Driver: (?P<value>[^}]+)\}$", (
            "Which driver was configured?",)),
        Lookup("time", r"Boot Session: (?P<value>{T})\]", (
            "When did the boot session start?",)),
    ), (
        Tally(r"\{Installing device - (?!exit\()", (
            "How many device installs have started?",
            "How many devices has setup begun installing?"), (
            "When did the first device install start?",), (
            "When did the latest device install start?",)),
        Tally(r"\{(?P<step>DIF_[A-Z_]+)\} ", (
            "How many times has {step} run?",
            "Count the {step} calls."), (
            "When did {step} first run?",), (
            "When did {step} last run?",)),
        Tally(r" - exit\((?P<code>0x[0-9a-f]{8})\)\} ", (
            "How many steps exited with {code}?",), (
            "When did a step first exit with {code}?",), (
            "When did a step last exit with {code}?",)),
        Tally(r">>>  Section start ", (
            "How many setup sections have started?",), (
            "When did the first section start?",), (
            "When did the latest section start?",)),
        Tally(r"Waiting for previous device install to complete\.", (
            "How many times did an install wait for a previous one?",), (
            "When did an install first wait for a previous one?",), (
            "When did an install last wait for a previous one?",)),
    ), (
        Values(r"set: \S+ -> Configured(?: and started)? \[(?P<value>[\w.]+\.inf):", (
            "Which INF file configured the most devices?",), (
            "Which INF files have configured devices?",)),
        Values(r"\{(?P<value>DIF_[A-Z_]+)\} ", (
            "Which DIF step runs most often?",), (
            "Which DIF steps have run?",)),
        Values(r" - exit\((?P<value>0x[0-9a-f]{8})\)\} ", (
            "Which exit code is the most common?",), (
            "Which exit codes have steps returned?",)),
        Values(r"^(?:!+\s+)?(?P<value>[a-z]{3}): ", (
            "Which setupapi component writes the most lines?",), (
            "Which setupapi components have written lines?",)),
    ), split="fresh4"),
    LogSpec(FRESH + "crowdsec/sshesame.log", "plain", SSH_T, (
        Lookup("user", SSH_PEER + r'authentication for user "(?P<value>[^"]+)" with password "[^"]*" accepted', (
            "Which user name did {ip} log in with from port {port}?",
            "{ip}:{port} logged in - as which user?")),
        Lookup("ip", SSH_PEER + rf"\[channel (?P<ch>\d+)\] direct TCP/IP forwarding from \S+ to (?P<value>{IP}):\d+ ", (
            "Which address did channel {ch} of {ip}:{port} ask to forward to?",
            "Where did {ip} (port {port}) try to tunnel on channel {ch}?")),
        Lookup("port", SSH_PEER + r"\[channel (?P<ch>\d+)\] direct TCP/IP forwarding from \S+ to \S+:(?P<value>\d+) ", (
            "Which destination port did channel {ch} of {ip}:{port} request?",)),
        Lookup("port", rf"^(?P<t>{{T}}) \[(?P<ip>{IP}):(?P<value>\d+)\] connection with client version", (
            "From which source port did {ip} connect at {t}?",
            "{ip} connected at {t}: what was its port?")),
        Lookup("ip", rf"^(?P<t>{{T}}) \[(?P<value>{IP}):\d+\] authentication for user \"(?P<user>[^\"]+)\" with "
                     r'password "[^"]*" accepted', (
            "Which address logged in as {user} at {t}?",
            "Who got in as {user} at {t}?")),
        Lookup("node", SSH_PEER + r'\[channel (?P<ch>\d+)\] input: "GET \S+ HTTP/1\.\d\\r\\nHost: (?P<value>[\w.-]+)', (
            "Which host did {ip}:{port} request on channel {ch}?",
            "What Host header did {ip} (port {port}) send on channel {ch}?")),
        Lookup("path", SSH_PEER + r'\[channel (?P<ch>\d+)\] input: "GET (?P<value>/\S*) HTTP', (
            "Which path did {ip}:{port} GET on channel {ch}?",)),
        Lookup("time", rf"^(?P<value>{{T}}) \[(?P<ip>{IP}):(?P<port>\d+)\] connection closed$", (
            "When did the connection from {ip}:{port} close?",
            "What time did {ip} (port {port}) disconnect?")),
        Lookup("id", SSH_PEER + r'connection with client version "(?P<value>[^"]+)" established', (
            "Which SSH client version did {ip}:{port} announce?",
            "Client version string of {ip} on port {port}?")),
        Lookup("path", SSH_PEER + r'\[channel (?P<ch>\d+)\] command "(?P<value>[^"]+)" requested', (
            "Which command did {ip}:{port} run on channel {ch}?",)),
    ), (
        Tally(rf"\[(?P<ip>{IP}):\d+\] connection with client version", (
            "How many SSH connections has {ip} established?",
            "How many times did {ip} connect?"), (
            "When did {ip} first connect?",), (
            "When did {ip} last connect?",)),
        Tally(r'authentication for user "(?P<user>[^"]+)" with password "[^"]*" accepted', (
            "How many logins as {user} were accepted?",
            "How often did someone log in as {user}?"), (
            "When did someone first log in as {user}?",), (
            "When was the latest login as {user}?",)),
        Tally(r"direct TCP/IP forwarding from ", (
            "How many port-forwarding requests so far?",
            "How many direct TCP/IP forwards have been requested?"), (
            "When was the first forwarding request?",), (
            "When was the latest forwarding request?",)),
        Tally(r"\\r\\nHost: (?P<host>[\w.-]+)\\r\\n", (
            "How many tunnelled requests went to {host}?",), (
            "When was {host} first requested through a tunnel?",), (
            "When was {host} last requested through a tunnel?",)),
        Tally(r"\] connection closed$", (
            "How many connections have been closed?",), (
            "When was the first connection closed?",), (
            "When was the latest connection closed?",)),
        Tally(r'authentication for user "(?P<user>[^"]+)" without credentials rejected', (
            "How many credential-less attempts for {user} were rejected?",), (
            "When was {user} first tried without credentials?",), (
            "When was {user} last tried without credentials?",)),
    ), (
        Values(r'authentication for user "(?P<value>[^"]+)" with password', (
            "Which user name is tried most often?",), (
            "Which user names have attackers tried?",)),
        Values(r'client version "(?P<value>[^"]+)"', (
            "Which SSH client version is most common?",), (
            "Which SSH client versions have connected?",)),
        Values(rf"^{{T}} \[(?P<value>{IP}):\d+\]", (
            "Which address is the most active?",), (
            "Which client addresses have shown up?",)),
        Values(r"\\r\\nHost: (?P<value>[\w.-]+)\\r\\n", (
            "Which host is requested most through the tunnels?",), (
            "Which hosts have been requested through tunnels?",)),
    ), split="fresh4"),
)

# The fresh5 split: two logs of kinds no other set has (a production MongoDB 4.2 mongod log from mtools' test data, a
# Kafka broker's server.log with Java stack traces from Elastic's examples), vendored in bench/data
# (bench/data/README.md), written like the fresh ones without reading the reader; every question over them is
# `fresh5`, none of any other split.
MG_T = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+0000"            # mongod: ISO time with milliseconds and offset
MG = r"^(?P<t>{T}) [A-Z] +[A-Z]+ +"                                # ... then severity and component
KF_T = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"                    # Kafka: date, time, comma, milliseconds
KF = r"^\[(?P<t>{T})\] [A-Z]+ "                                    # ... in brackets, then the level
SPECS += (
    LogSpec(FRESH + "mtools/mongod_4.2.11.log", "plain", MG_T, (
        Lookup("ip", rf"\[listener\] connection accepted from (?P<value>{IP}):\d+ #(?P<conn>\d+) ", (
            "Which client address opened connection #{conn}?",
            "conn{conn} - accepted from which IP?",
            "What IP did mongod accept connection number {conn} from?")),
        Lookup("port", rf"\[listener\] connection accepted from {IP}:(?P<value>\d+) #(?P<conn>\d+) ", (
            "From which source port did connection #{conn} come?",
            "Client port of conn{conn}?")),
        Lookup("id", rf"\[listener\] connection accepted from (?P<ip>{IP}):(?P<port>\d+) #(?P<value>\d+) ", (
            "Which connection number did mongod give the client {ip}:{port}?",
            "{ip}:{port} connected - which conn id?")),
        Lookup("user", rf"\[conn(?P<conn>\d+)\] Successfully authenticated as principal (?P<value>[\w-]+) on ", (
            "Which principal did conn{conn} authenticate as?",
            "Who logged in on connection {conn}?",
            "conn{conn} authenticated - which user?")),
        Lookup("user", rf"Successfully authenticated as principal (?P<value>[\w-]+) on \w+ from client "
                       rf"(?P<ip>{IP}):(?P<port>\d+)$", (
            "Which user authenticated from client {ip}:{port}?",)),
        Lookup("node", rf"\[conn(?P<conn>\d+)\] Successfully authenticated as principal [\w-]+ on (?P<value>\w+) "
                       r"from", (
            "Against which database did conn{conn} authenticate?",
            "Auth database used by connection {conn}?")),
        Lookup("id", r'\[conn(?P<conn>\d+)\] received client metadata from .*driver: \{ name: "(?P<value>[^"]+)"', (
            "Which driver did conn{conn} report in its client metadata?",
            "What client driver is connection {conn} using?")),
        Lookup("id", r'\[conn(?P<conn>\d+)\] received client metadata from .*driver: \{ name: "[^"]+", version: '
                     r'"(?P<value>[^"]+)"', (
            "Which driver version did conn{conn} send?",)),
        Lookup("size", rf"\[conn(?P<conn>\d+)\] end connection {IP}:\d+ \((?P<value>\d+) connections now open\)", (
            "How many connections were open after conn{conn} ended?",
            "Open connection count logged when connection {conn} closed?")),
        Lookup("time", rf"^(?P<value>{{T}}) I +NETWORK +\[conn(?P<conn>\d+)\] end connection ", (
            "When did connection {conn} end?",
            "At what time was conn{conn} closed?")),
        Lookup("time", rf"^(?P<value>{{T}}) I +NETWORK +\[listener\] connection accepted from {IP}:\d+ "
                       r"#(?P<conn>\d+) ", (
            "When was connection #{conn} accepted?",)),
        Lookup("status", r"Replica Set Member State: (?P<value>[A-Z]+)$", (
            "What replica set member state did mongod report at start?",)),
        Lookup("port", r"\] pid=(?P<pid>\d+) port=(?P<value>\d+) ", (
            "Which port is mongod pid {pid} listening on?",)),
        Lookup("node", r"\] pid=(?P<pid>\d+) port=\d+ 64-bit host=(?P<value>\S+)$", (
            "On which host does mongod process {pid} run?",)),
    ), (
        Tally(rf"\[listener\] connection accepted from (?P<ip>{IP}):", (
            "How many connections has {ip} opened?",
            "Count the connections accepted from {ip}."), (
            "When did {ip} first connect?",), (
            "When did {ip} last connect?",)),
        Tally(r"Successfully authenticated as principal (?P<user>[\w-]+) on ", (
            "How many times has {user} authenticated?",
            "How many successful logins for principal {user}?"), (
            "When did {user} first authenticate?",), (
            "When did {user} last authenticate?",)),
        Tally(rf"\] end connection (?P<ip>{IP}):\d+ ", (
            "How many connections from {ip} have ended?",), (
            "When did a connection from {ip} first end?",), (
            "When did a connection from {ip} last end?",)),
        Tally(r'received client metadata from .*driver: \{ name: "(?P<driver>[^"]+)"', (
            "How many client metadata lines name the {driver} driver?",
            "How often has a {driver} client announced itself?"), (
            "When did a {driver} client first announce itself?",), (
            "When did a {driver} client last announce itself?",)),
    ), (
        Values(rf"\[listener\] connection accepted from (?P<value>{IP}):", (
            "Which client address opens the most connections?",), (
            "Which client addresses have connected?",)),
        Values(r"Successfully authenticated as principal (?P<value>[\w-]+) on ", (
            "Which principal authenticates most often?",), (
            "Which principals have authenticated?",)),
        Values(r'driver: \{ name: "(?P<value>[^"]+)"', (
            "Which driver shows up most in client metadata?",), (
            "Which drivers have connected?",)),
    ), split="fresh5"),
    LogSpec(FRESH + "elastic/kafka1_server_2016-12-19-20.log", "plain", KF_T, (
        Lookup("id", KF + r"Scheduling log segment (?P<value>\d+) for log (?P<log>test-\d+) for deletion\.", (
            "Which segment of {log} was scheduled for deletion at {t}?",
            "{t}: segment of {log} queued for deletion?")),
        Lookup("node", KF + r"Scheduling log segment \d+ for log (?P<value>test-\d+) for deletion\.", (
            "Which log had a segment scheduled for deletion at {t}?",)),
        Lookup("time", r"^\[(?P<value>{T})\] INFO Deleting segment (?P<seg>\d+) from log (?P<log>test-\d+)\.", (
            "When was segment {seg} deleted from {log}?",
            "At what time did Kafka delete segment {seg} of {log}?")),
        Lookup("size", KF + r"Rolled new log segment for '(?P<log>test-\d+)' in (?P<value>\d+) ms\.", (
            "How many ms did rolling the new segment of {log} take at {t}?",
            "Roll time of {log} at {t}?")),
        Lookup("path", KF + r"Deleting index (?P<value>/tmp/kafka-logs/\S+\.timeindex\.deleted) ", (
            "Which time index file was deleted at {t}?",)),
        Lookup("path", KF + r"Deleting index (?P<value>/tmp/kafka-logs/\S+/\d+\.index\.deleted) ", (
            "Which offset index file did Kafka delete at {t}?",)),
        Lookup("id", KF + r"\[ReplicaFetcherThread-0-(?P<value>\d+)\], Error in fetch ", (
            "Which broker id's fetcher thread failed to fetch at {t}?",)),
        Lookup("id", r"^\[(?P<t>{T})\] WARN \[ReplicaFetcherThread-\d+-\d+\], Error in fetch kafka\.server\."
                     r"ReplicaFetcherThread\$FetchRequest@(?P<value>[0-9a-f]+) ", (
            "Which FetchRequest object failed at {t}?",)),
        Lookup("time", r"^\[(?P<value>{T})\] INFO Truncating log (?P<log>__consumer_offsets-\d+) to offset 0\.", (
            "When was {log} truncated?",
            "At what time was log {log} truncated to offset 0?")),
        Lookup("size", r"Finished loading offsets from \[__consumer_offsets,(?P<p>\d+)\] in (?P<value>\d+) "
                       r"milliseconds\.", (
            "How many milliseconds did loading offsets from __consumer_offsets partition {p} take?",
            "Offsets load time for [__consumer_offsets,{p}]?")),
        Lookup("time", r"^\[(?P<value>{T})\] INFO \[Group Metadata Manager on Broker \d+\]: Loading offsets and "
                       r"group metadata from \[__consumer_offsets,(?P<p>\d+)\]", (
            "When did the broker start loading offsets of __consumer_offsets partition {p}?",)),
        Lookup("status", r"Expanding ISR for partition \[(?P<topic>[\w]+),(?P<p>\d+)\] from [\d,]+ to "
                         r"(?P<value>[\d,]+) ", (
            "To which replica set was the ISR of [{topic},{p}] expanded?",
            "New ISR of {topic} partition {p}?")),
        Lookup("time", r"^\[(?P<value>{T})\] INFO Partition \[(?P<topic>\w+),(?P<p>\d+)\] on broker \d+: Expanding "
                       r"ISR", (
            "When was the ISR of [{topic},{p}] expanded?",)),
        Lookup("status", r"^\[(?P<t>{T})\] (?P<value>[A-Z]+) \[ReplicaFetcherThread-(?P<thread>\d+-\d+)\], ", (
            "At what level did ReplicaFetcherThread-{thread} log at {t}?",)),
    ), (
        Tally(r"Rolled new log segment for '(?P<log>test-\d+)'", (
            "How many new segments have been rolled for {log}?",
            "Count the segment rolls of {log}."), (
            "When was a segment of {log} first rolled?",), (
            "When was a segment of {log} last rolled?",)),
        Tally(r"Scheduling log segment \d+ for log (?P<log>test-\d+) for deletion", (
            "How many segments of {log} have been scheduled for deletion?",), (
            "When was a segment of {log} first scheduled for deletion?",), (
            "When was a segment of {log} last scheduled for deletion?",)),
        Tally(r"Deleting segment \d+ from log (?P<log>test-\d+)\.", (
            "How many segments have been deleted from {log}?",
            "Count the segment deletions on {log}."), (
            "When was a segment first deleted from {log}?",), (
            "When was a segment last deleted from {log}?",)),
        Tally(r"Error in fetch ", (
            "How many fetch errors has the broker logged?",
            "How many 'Error in fetch' warnings so far?"), (
            "When was the first fetch error?",), (
            "When was the latest fetch error?",)),
        Tally(r"Expanding ISR for partition \[(?P<topic>\w+),", (
            "How many ISR expansions has topic {topic} had?",), (
            "When was an ISR of {topic} first expanded?",), (
            "When was an ISR of {topic} last expanded?",)),
        Tally(r"Truncating log __consumer_offsets-\d+ to offset 0\.", (
            "How many __consumer_offsets logs were truncated?",), (
            "When was the first __consumer_offsets log truncated?",), (
            "When was the last __consumer_offsets log truncated?",)),
    ), (
        Values(r"Rolled new log segment for '(?P<value>test-\d+)'", (
            "Which log has rolled the most segments?",), (
            "Which logs have rolled new segments?",)),
        Values(r"Scheduling log segment \d+ for log (?P<value>test-\d+) for deletion", (
            "Which log has the most segments scheduled for deletion?",), (
            "Which logs have had segments scheduled for deletion?",)),
        Values(r"^\[{T}\] (?P<value>[A-Z]+) ", (
            "Which log level is most common?",), (
            "Which log levels have appeared?",)),
        Values(r"Deleting index /tmp/kafka-logs/\S+\.(?P<value>index|timeindex)\.deleted", (
            "Which kind of index file is deleted most often?",), (
            "Which kinds of index files have been deleted?",)),
    ), split="fresh5"),
)

# The fresh6 split (issue 59): logs of kinds no other set has, vendored in bench/data, written by a helper who never
# read the reader; every question over them is `fresh6`.
# Three logs whose lines declare their own structure (bench/data/README.md): Zeek's dns and http records as JSON lines
# (a Metron sensor stub's replay of a malware capture), a Cisco ISE syslog of `Key=Value, ` pairs (RADIUS
# authentications, failures, accounting, profiling) from Apache Metron's test data, and an HDFS audit log of
# tab-separated `key=value` fields from Apache Eagle's.
ZEEK_T = r'(?<="ts":)1\d{9}\.\d+'                                    # Zeek JSON: the record's ts, epoch seconds
ZEEK_HTTP = r'^\{"http": \{"ts":[\d.]+,"uid":"(?P<uid>C\w+)",'        # ... an http record and its connection uid
ZEEK_DNS = r'"id\.resp_p":53,"proto":"udp","trans_id":\d+,'           # ... a dns query's fields before the name
ISE_T = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} [+-]\d\d:\d\d"        # ISE: the message's own date, time, ms, offset
ISE_SID = r"AcsSessionID=(?P<sid>[\w.-]+/\d+/\d+),"                   # ... an ACS session id (node/boot/counter)
ISE_MAC = r"[0-9A-Fa-f]{2}(?:[-:][0-9A-Fa-f]{2}){5}"                   # ... a station MAC as ISE writes it
HDFS_T = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"                      # HDFS audit: date, time, comma, milliseconds
HDFS_UGI = r"\tugi=(?P<user>\w+)[^\t]*\tip=/[\d.]+"                     # ... the caller's short name, then its address
SPECS += (
    LogSpec(FRESH + "metron/bro_dns_http.out", "plain", ZEEK_T, (
        Lookup("ip", ZEEK_HTTP + rf'"id\.orig_h":"{IP}","id\.orig_p":\d+,"id\.resp_h":"(?P<value>{IP})",', (
            "Which server address did HTTP connection {uid} talk to?",
            "Connection {uid}: what was the responder IP?",
            "What destination IP does Zeek log for the HTTP session {uid}?")),
        Lookup("port", ZEEK_HTTP + rf'"id\.orig_h":"{IP}","id\.orig_p":(?P<value>\d+),', (
            "Which client source port did HTTP connection {uid} use?",
            "Source port of connection {uid}?")),
        Lookup("node", ZEEK_HTTP + r'.*?"method":"\w+","host":"(?P<value>[^"]+)"', (
            "Which Host header was sent on HTTP connection {uid}?",
            "Which web host did connection {uid} ask for?")),
        Lookup("path", ZEEK_HTTP + r'.*?"trans_depth":1,"method":"\w+","host":"[^"]*","uri":"(?P<value>[^"]+)"', (
            "Which URI did the first request on connection {uid} ask for?",
            "First request of {uid}: which path?")),
        Lookup("status", ZEEK_HTTP + r'.*?"status_code":(?P<value>\d+),', (
            "What HTTP status did connection {uid} get back?",
            "Status code returned on {uid}?")),
        Lookup("size", ZEEK_HTTP + r'.*?"trans_depth":1,.*?"response_body_len":(?P<value>\d+),', (
            "How many bytes of response body did the first request on connection {uid} get?",
            "Response body length of the first request on {uid}?")),
        Lookup("time", r'^\{"http": \{"ts":(?P<value>{T}),"uid":"(?P<uid>C\w+)",.*?"trans_depth":1,', (
            "When did the first HTTP request on connection {uid} happen?",
            "Timestamp of the first request on {uid}?")),
        Lookup("id", ZEEK_HTTP + r'.*?"trans_depth":1,.*?"resp_fuids":\["(?P<value>F\w+)"\]', (
            "Which file id did Zeek assign to the first response on connection {uid}?",
            "Response fuid of the first request on {uid}?")),
        Lookup("ip", rf'"query":"(?P<query>[^"]+)",.*?"answers":\["(?P<value>{IP})"\]', (
            "Which address did {query} resolve to?",
            "DNS answer for {query}?",
            "What IP came back for the lookup of {query}?")),
        Lookup("id", r'"trans_id":(?P<value>\d+),"query":"(?P<query>[^"]+)"', (
            "What DNS transaction id was used to look up {query}?",
            "Transaction id of the query for {query}?")),
        Lookup("port", rf'"id\.orig_p":(?P<value>\d+),"id\.resp_h":"{IP}",' + ZEEK_DNS
                       + r'"query":"(?P<query>[^"]+)"', (
            "From which source port was {query} looked up?",
            "Client port of the DNS query for {query}?")),
        Lookup("time", r'^\{"dns": \{"ts":(?P<value>{T}),"uid":"(?P<uid>C\w+)",.*?"query":"(?P<query>[^"]+)"', (
            "When was the DNS query {uid} for {query} sent?",
            "At what time did Zeek log lookup {uid} of {query}?")),
    ), (
        Tally(r'^\{"http": .*?"host":"(?P<host>[^"]+)"', (
            "How many HTTP requests went to host {host}?",
            "Count the requests for {host}."), (
            "When was {host} first requested?",), (
            "When was the latest request to {host}?",)),
        Tally(r'"query":"(?P<query>[^"]+)"', (
            "How many times was {query} looked up?",
            "How many DNS queries for {query} so far?"), (
            "When was {query} first looked up?",), (
            "When was {query} last looked up?",)),
        Tally(r'"status_code":(?P<code>[45]\d\d),', (
            "How many HTTP responses had status {code}?",
            "How often did a server answer {code}?"), (
            "When did a {code} response first appear?",), (
            "When was the latest {code} response?",)),
        Tally(r'"method":"POST"', (
            "How many POST requests has Zeek seen?",
            "How many HTTP POSTs so far?"), (
            "When was the first POST request?",), (
            "When was the latest POST?",)),
        Tally(rf'^\{{"http": .*?"id\.resp_h":"(?P<ip>{IP})","id\.resp_p":80,', (
            "How many HTTP requests went to server {ip}?",), (
            "When did the first HTTP request to {ip} happen?",), (
            "When did the latest HTTP request to {ip} happen?",)),
    ), (
        Values(r'"host":"(?P<value>[^"]+)"', (
            "Which web host is requested most often?",), (
            "Which web hosts have been requested?",)),
        Values(r'"qtype_name":"(?P<value>\w+)"', (
            "Which DNS query type is most common?",), (
            "Which DNS query types have been seen?",)),
        Values(r'"resp_mime_types":\["(?P<value>application/[^"]+)"\]', (
            "Which application MIME type is served most often?",), (
            "Which application MIME types have been served?",)),
        Values(r'"query":"(?P<value>[^"]+)"', (
            "Which name is looked up most often?",), (
            "Which names have been looked up?",)),
    ), split="fresh6"),
    LogSpec(FRESH + "metron/ise_sample_output.log", "plain", ISE_T, (
        Lookup("user", r", UserName=(?P<value>[^,]+), .*?" + ISE_SID, (
            "Which user name did ISE record in session {sid}?",
            "Session {sid}: which UserName?",
            "Who was trying to authenticate in ACS session {sid}?")),
        Lookup("ip", rf", Device IP Address=(?P<value>{IP}), .*?NetworkDeviceName=(?P<dev>[^,]+),", (
            "What IP address does network device {dev} have?",
            "Which Device IP Address is logged for {dev}?")),
        Lookup("node", r"^(?=.*?, NetworkDeviceName=(?P<value>[^,]+),)(?=.*?" + ISE_SID + ")", (
            "Which network device sent the request of session {sid}?",
            "Session {sid} came through which NAS device?")),
        Lookup("status", r"(?=.*?" + ISE_SID + r")(?=.*?, FailureReason=(?P<value>\d+) )", (
            "Which failure reason code did ISE log for session {sid}?",
            "Session {sid} failed - with which reason code?")),
        Lookup("time", r"(?P<value>{T}) .*?" + ISE_SID, (
            "When was ACS session {sid} logged?",
            "At what time did ISE log session {sid}?")),
        Lookup("user", r"Passed-Authentication: Authentication succeeded, .*?, UserName=(?P<value>[^,]+), .*?"
                       rf"Calling-Station-ID=(?P<mac>{ISE_MAC}),", (
            "Which user authenticated successfully from station {mac}?",
            "Station {mac} passed authentication as which user?")),
        Lookup("ip", rf", Framed-IP-Address=(?P<value>{IP}), .*?Calling-Station-ID=(?P<mac>{ISE_MAC}),", (
            "Which Framed-IP-Address did station {mac} have?",
            "What client IP was reported for {mac}?")),
        Lookup("path", rf"Calling-Station-ID=(?P<mac>{ISE_MAC}), .*?NAS-Port-Id=(?P<value>[^,]+),", (
            "On which NAS port id was station {mac} connected?",
            "Which switch or AP port did {mac} come in on?")),
        Lookup("port", r", Device Port=(?P<value>\d+), .*?" + ISE_SID, (
            "From which UDP port did the network device send session {sid}?",
            "Device Port of session {sid}?")),
        Lookup("id", ISE_SID + r".*?, CPMSessionID=(?P<value>\w+),", (
            "Which CPM session id goes with ACS session {sid}?",
            "CPMSessionID of session {sid}?")),
        Lookup("size", r", Acct-Input-Octets=(?P<value>\d+), .*?Acct-Session-Id=(?P<acct>[^,]+), .*?"
                       r"Acct-Session-Time=(?P<secs>\d+),", (
            "How many input octets had accounting session {acct} used after {secs} seconds?",
            "Acct-Input-Octets of session {acct} at session time {secs}?")),
        Lookup("status", rf"EndpointMacAddress=(?P<mac>{ISE_MAC}), EndpointMatchedPolicy=(?P<value>[^,]+),", (
            "Which profiling policy did ISE match for endpoint {mac}?",
            "Endpoint {mac} was profiled as what?")),
        Lookup("size", r", RequestLatency=(?P<value>\d+), .*?" + ISE_SID, (
            "How many milliseconds of request latency did session {sid} have?",
            "RequestLatency of session {sid}?")),
    ), (
        Tally(r", FailureReason=(?P<code>\d+) ", (
            "How many failures with reason code {code} have been logged?",
            "How often has ISE logged failure reason {code}?"), (
            "When was failure reason {code} first logged?",), (
            "When was failure reason {code} last logged?",)),
        Tally(r", NetworkDeviceName=(?P<dev>[^,]+), ", (
            "How many events name network device {dev}?",
            "How many messages has ISE logged for NAS device {dev}?"), (
            "When did device {dev} first show up?",), (
            "When did device {dev} last show up?",)),
        Tally(r"Passed-Authentication: Authentication succeeded, .*?, UserName=(?P<user>[^,]+),", (
            "How many successful authentications has {user} had?",
            "How many times did {user} pass authentication?"), (
            "When did {user} first authenticate successfully?",), (
            "When did {user} last authenticate successfully?",)),
        Tally(r" CISE_(?P<cat>\w+) \d{10} ", (
            "How many CISE_{cat} messages have been logged?",), (
            "When was the first CISE_{cat} message?",), (
            "When was the latest CISE_{cat} message?",)),
        Tally(r"Failed-Attempt: Supplicant stopped responding to ISE", (
            "How many times did a supplicant stop responding to ISE?",
            "How many 'Supplicant stopped responding' failures so far?"), (
            "When did a supplicant first stop responding?",), (
            "When did a supplicant last stop responding?",)),
    ), (
        Values(r", UserName=(?P<value>[^,]+),", (
            "Which user name shows up most often?",), (
            "Which user names have been seen?",)),
        Values(r", NetworkDeviceName=(?P<value>[^,]+),", (
            "Which network device appears most often?",), (
            "Which network devices have sent requests?",)),
        Values(r", FailureReason=(?P<value>\d+) ", (
            "Which failure reason code is most common?",), (
            "Which failure reason codes have been logged?",)),
        Values(r"EndpointMatchedPolicy=(?P<value>[^,]+),", (
            "Which profiling policy is matched most often?",), (
            "Which profiling policies have endpoints matched?",)),
    ), split="fresh6"),
    LogSpec(FRESH + "eagle/hdfs-audit.log", "plain", HDFS_T, (
        Lookup("user", r"\tugi=(?P<value>\w+)[^\t]*\tip=/[\d.]+\tcmd=(?P<cmd>\w+)\tsrc=(?P<src>\S+)\t", (
            "Which user ran {cmd} on {src}?",
            "Who issued {cmd} against {src}?")),
        Lookup("time", r"^(?P<value>{T}) .*\tcmd=(?P<cmd>delete|create|mkdirs|rename|open|setPermission|setReplication)"
                       r"\tsrc=(?P<src>\S+)\t", (
            "When was {cmd} run on {src}?",
            "At what time did HDFS log the {cmd} of {src}?")),
        Lookup("path", r"\tcmd=rename\tsrc=(?P<src>\S+)\tdst=(?P<value>\S+)\t", (
            "Where was {src} renamed to?",
            "What was the destination of the rename of {src}?")),
        Lookup("status", r"\tcmd=(?P<cmd>mkdirs|create|rename)\tsrc=(?P<src>\S+)\tdst=\S+\t"
                         r"perm=(?P<value>\w+:\w+:[rwx-]{9})\t", (
            "Which owner and permissions did the {cmd} of {src} set?",
            "perm of the {cmd} on {src}?")),
        Lookup("status", r"allowed=(?P<value>\w+)" + HDFS_UGI + r"\tcmd=(?P<cmd>\w+)\tsrc=(?P<src>\S+)\t", (
            "Was {user}'s {cmd} on {src} allowed?",
            "Did HDFS allow the {cmd} of {src} by {user}?")),
        Lookup("id", r"\tsrc=/user/(?P<user>\w+)/\.Trash/(?P<value>\d{12})\t", (
            "Which trash checkpoint of {user} was removed?",
            "What is the name of {user}'s deleted .Trash checkpoint?")),
        Lookup("node", r"\tcmd=rename\tsrc=/apps/hbase/data/WALs/(?P<value>[\w.-]+),\d+,(?P<code>\d+)\t", (
            "Which region server host owned the WAL directory with start code {code}?",)),
        Lookup("port", r"\tcmd=rename\tsrc=/apps/hbase/data/WALs/[\w.-]+,(?P<value>\d+),(?P<code>\d+)\t", (
            "On which port did the region server with start code {code} run?",)),
        Lookup("ip", r"^(?P<t>{T}) .*\tip=/(?P<value>[\d.]+)\tcmd=(?P<cmd>\w+)\t", (
            "From which IP did the {cmd} at {t} come?",
            "Client address of the {cmd} logged at {t}?")),
        Lookup("status", r"^(?P<t>{T}) .*\tcmd=(?P<cmd>\w+)\tsrc=.*\tproto=(?P<value>\w+)$", (
            "Over which protocol was the {cmd} at {t} made?",)),
        Lookup("user", r"^(?P<t>{T}) .*\tugi=(?P<value>\w+)", (
            "Which user made the request logged at {t}?",
            "Whose request was audited at {t}?")),
    ), (
        Tally(HDFS_UGI + r"\tcmd=listStatus\t", (
            "How many directory listings has {user} made?",
            "How many listStatus calls by {user} so far?"), (
            "When did {user} first list a directory?",), (
            "When did {user} last list a directory?",)),
        Tally(HDFS_UGI + r"\tcmd=getfileinfo\t", (
            "How many getfileinfo calls has {user} made?",
            "How often did {user} stat a path?"), (
            "When did {user} first call getfileinfo?",), (
            "When did {user} last call getfileinfo?",)),
        Tally(r"\tcmd=(?P<cmd>delete|mkdirs|rename|create|open)\t", (
            "How many {cmd} operations have been audited?",
            "Count the {cmd} calls so far."), (
            "When was the first {cmd}?",), (
            "When was the latest {cmd}?",)),
        Tally(r"\tcmd=listStatus\tsrc=(?P<src>\S+)\t", (
            "How many times was {src} listed?",), (
            "When was {src} first listed?",), (
            "When was {src} last listed?",)),
    ), (
        Values(r"\tugi=(?P<value>\w+)", (
            "Which user makes the most requests?",), (
            "Which users have made requests?",)),
        Values(r"\tcmd=(?P<value>delete|create|mkdirs|rename|open)\t", (
            "Which write or open command is the most common?",), (
            "Which commands other than listings and stats have been audited?",)),
        Values(r"\tperm=(?P<value>\w+:\w+:[rwx-]{9})\t", (
            "Which owner and permission setting is logged most often?",), (
            "Which owner and permission settings have been logged?",)),
        Values(r"\tproto=(?P<value>\w+)$", (
            "Which protocol do most requests use?",), (
            "Which protocols have requests used?",)),
    ), split="fresh6"),
)

# The fresh7 split (issue 59): more kinds no other set has, written the same way by another helper; every question
# over them is `fresh7`.
# Two Zeek logs from CISA's ICSNPP parsers (their example logs, tab-separated, a #fields header naming the columns):
# DNP3 control-relay commands from a master to an outstation, and BACnet building-automation traffic.
DNP3_T = r"1\d{9}\.\d{6}"                                         # DNP3 control log: ts, epoch seconds
CROB = r"\tControl Relay Output Block\t"                          # ... the block type before the function code
DNP3_SESSION = rf"\t(?P<uid>C\w+)\t{IP}\t\d+\t{IP}\t20000{CROB}"   # ... a session's uid, master, port, outstation
BACNET_T = r"1\d{9}\.\d{6}"                                       # BACnet log: ts, epoch seconds
BAC_POLL = rf"\t{IP}\t47808\t(?P<ip>{IP})\t47808\t\w+\tCONFIRMED_REQUEST\tread_property\t"   # a read_property to ip
BAC_IAM = rf"\t(?P<ip>{IP})\t47808\t{IP}\t47808\t\w+\tUNCONFIRMED_REQUEST\ti_am\t"             # ip announcing itself
SPECS += (
    LogSpec(FRESH + "icsnpp/dnp3_control.log", "plain", DNP3_T, (
        Lookup("id", rf"^(?P<t>{{T}})\tC\w+\t{IP}\t\d+\t{IP}\t20000{CROB}OPERATE\t(?P<value>\d+)\t", (
            "Which control point did the OPERATE logged at {t} act on?",
            "The DNP3 operate command at {t}: which point index?",
            "What point number was operated at {t}?")),
        Lookup("status", rf"^(?P<t>{{T}})\tC\w+\t.*{CROB}SELECT\t\d+\t(?P<value>\w+)\t", (
            "Which trip/close code did the master select at {t}?",
            "Select at {t} - what trip-close code was requested?")),
        Lookup("status", rf"{CROB}SELECT\t(?P<idx>\d+)\t(?P<value>\w+)\t", (
            "Which trip/close code does the master send when it selects point {idx}?",
            "Point {idx} gets selected with which trip-close code?")),
        Lookup("port", DNP3_SESSION.replace(r"\t\d+\t", r"\t(?P<value>\d+)\t", 1), (
            "From which TCP source port did the master run control session {uid}?",
            "Session {uid}: which source port on the master side?",
            "What client port does DNP3 connection {uid} come from?")),
        Lookup("id", rf"^(?P<t>{{T}})\t(?P<value>C\w+)\t.*{CROB}SELECT\t", (
            "Which connection uid carried the SELECT logged at {t}?",
            "The select at {t} went over which Zeek connection?")),
        Lookup("ip", rf"\t(?P<uid>C\w+)\t(?P<value>{IP})\t\d+\t{IP}\t20000{CROB}", (
            "Which master station address sent the controls on {uid}?",
            "Who issued the commands on session {uid} - which IP?")),
        Lookup("ip", rf"\t{IP}\t(?P<port>\d+)\t(?P<value>{IP})\t20000{CROB}", (
            "Which outstation did the master address from port {port}?",
            "Commands sent from source port {port} went to which outstation IP?")),
        Lookup("time", rf"^(?P<value>{{T}})" + DNP3_SESSION + r"OPERATE\t(?P<idx>\d+)\t", (
            "When did session {uid} operate point {idx}?",
            "At what time was point {idx} operated over {uid}?")),
        Lookup("status", rf"^(?P<t>{{T}})\tC\w+\t.*{CROB}OPERATE\t\d+\t\w+\t(?P<value>\w+ \w+)\t", (
            "What operation type did the OPERATE at {t} use?",
            "Operate command at {t}: pulse on or pulse off?")),
        Lookup("size", rf"{CROB}OPERATE\t(?P<idx>\d+)\t\w+\t\w+ \w+\t\d+\t(?P<value>\d+)\t", (
            "What on-time was set in the operate for point {idx}?",
            "How long an on-time did the master give point {idx}?")),
        Lookup("status", rf"^(?P<t>{{T}})\tC\w+\t.*{CROB}RESPONSE\t(?P<idx>\d+)\t.*\t(?P<value>\w+)$", (
            "What status did the outstation return for point {idx} at {t}?",
            "The response about point {idx} at {t}: which status code?")),
    ), (
        Tally(rf"{CROB}OPERATE\t(?P<idx>\d+)\t", (
            "How many OPERATE commands has point {idx} received?",
            "Count the operates on control point {idx}.",
            "How often was point {idx} operated?"), (
            "When was point {idx} first operated?",), (
            "When was point {idx} last operated?",)),
        Tally(rf"{CROB}SELECT\t\d+\tTrip\t", (
            "How many Trip selects has the master sent?",
            "How many selects asked for a Trip?"), (
            "When was the first Trip selected?",), (
            "When was the latest Trip select?",)),
        Tally(r"\t(?P<uid>C\w+)\t.*" + CROB + r"RESPONSE\t", (
            "How many responses did the outstation send on {uid}?",
            "How many RESPONSE lines are there for session {uid}?"), (
            "When did the first response on {uid} come?",), (
            "When was the last response on {uid}?",)),
        Tally(rf"\t{IP}\t(?P<port>\d+)\t{IP}\t20000{CROB}SELECT\t", (
            "How many SELECTs came from source port {port}?",
            "How many points were selected over the connection from port {port}?"), (
            "When did port {port} send its first select?",), (
            "When did port {port} send its last select?",)),
    ), (
        Values(rf"{CROB}OPERATE\t(?P<value>\d+)\t", (
            "Which point has been operated most often?",), (
            "Which points have been operated so far?",)),
        Values(rf"{CROB}SELECT\t\d+\t(?P<value>\w+)\t", (
            "Which trip/close code is selected most?",), (
            "Which trip/close codes have been selected?",)),
        Values(r"^{T}\t(?P<value>C\w+)\t.*" + CROB + r"SELECT\t", (
            "Which session carried the most selects?",), (
            "Which sessions have issued selects?",)),
        Values(r"\t(?P<value>C\w+)\t.*" + CROB + r"SELECT\t13\t", (
            "Which session selected point 13 most often?",), (
            "Which sessions have selected point 13?",)),
    ), split="fresh7"),
    LogSpec(FRESH + "icsnpp/bacnet.log", "plain", BACNET_T, (
        Lookup("ip", rf"\t(?P<uid>C\w+)" + BAC_POLL.replace("(?P<ip>", "(?P<value>"), (
            "Which device was polled over connection {uid}?",
            "Connection {uid}: which BACnet device got the read_property requests?",
            "What address does the client read properties from on {uid}?")),
        Lookup("id", r"^(?P<t>{T})\tC\w+" + BAC_POLL.replace("(?P<ip>", "(?:") + r"(?P<value>\d+)\t", (
            "Which invoke id did the read_property request at {t} carry?",
            "Invoke ID of the request logged at {t}?")),
        Lookup("id", r"^(?P<t>{T})\tC\w+\t.*\tCOMPLEX_ACK\tread_property\t(?P<value>\d+)\t", (
            "Which invoke id did the Complex-ACK logged at {t} answer?",
            "The read_property reply at {t} - for which invoke id?")),
        Lookup("ip", r"^(?P<t>{T})\tC\w+" + BAC_IAM.replace("(?P<ip>", "(?P<value>"), (
            "Which device sent the I-Am at {t}?",
            "Who answered with an I-Am at {t}?",
            "I-Am announcement at {t}: from which address?")),
        Lookup("time", r"^(?P<value>{T})\tC\w+" + BAC_IAM, (
            "When did {ip} announce itself with I-Am?",
            "At what time did device {ip} send its I-Am?")),
        Lookup("id", r"\t(?P<value>C\w+)" + BAC_POLL, (
            "Which Zeek uid tracks the polling of {ip}?",
            "What connection id are the read_property requests to {ip} logged under?")),
        Lookup("status", r"^(?P<t>{T})\tC\w+\t.*\t47808\t\w+_NPDU\t(?P<value>[A-Z_]+)\t", (
            "What PDU type was logged at {t}?",
            "The BACnet message at {t}: which PDU type?")),
        Lookup("status", r"^(?P<t>{T})\tC\w+\t.*\t47808\t(?P<value>\w+_NPDU)\tUNCONFIRMED_REQUEST\t(?P<svc>\w+)\t", (
            "Which BVLC function carried the {svc} at {t}?",
            "The {svc} message at {t} went out as which BVLC function?")),
        Lookup("port", rf"\t(?P<uid>C\w+)\t{IP}\t(?P<value>\d+)\t{IP}\t\d+\t", (
            "Which UDP source port did connection {uid} use?",
            "From what port was {uid} opened?")),
        Lookup("time", r"^(?P<value>{T})\tC\w+" + BAC_POLL + r"(?P<inv>\d+)\t", (
            "When did the client send read_property invoke {inv} to {ip}?",
            "At what time was request {inv} to {ip} sent?")),
        Lookup("node", r"^(?P<t>{T})\tC\w+\t.*\t47808\t\w+_NPDU\t[A-Z_]+\t(?P<value>[a-z_]+)\t", (
            "Which BACnet service is on the message logged at {t}?",
            "What service did the packet at {t} carry?")),
    ), (
        Tally(BAC_POLL, (
            "How many read_property requests went to {ip}?",
            "How often has {ip} been polled?",
            "Count the property reads sent to {ip}."), (
            "When was {ip} first polled?",), (
            "When was {ip} last polled?",)),
        Tally(r"\tUNCONFIRMED_REQUEST\ti_am\t", (
            "How many I-Am announcements have been logged?",
            "How many devices have answered with I-Am so far?"), (
            "When was the first I-Am?",), (
            "When was the latest I-Am logged?",)),
        Tally(r"\t(?P<uid>C\w+)\t.*\tCOMPLEX_ACK\t", (
            "How many Complex-ACKs were logged on {uid}?",
            "How many acknowledged reads came back on connection {uid}?"), (
            "When was the first Complex-ACK on {uid}?",), (
            "When was the last Complex-ACK on {uid}?",)),
        Tally(r"\tUNCONFIRMED_REQUEST\twho_is\t", (
            "How many Who-Is broadcasts so far?",), (
            "When was the first Who-Is sent?",), (
            "When was the last Who-Is?",)),
    ), (
        Values(BAC_POLL.replace("(?P<ip>", "(?P<value>"), (
            "Which device is polled most often?",), (
            "Which devices have been polled so far?",)),
        Values(r"\t47808\t\w+_NPDU\t(?P<value>[A-Z_]+)\t", (
            "Which PDU type is the most common?",), (
            "Which PDU types have appeared?",)),
        Values(r"\tUNCONFIRMED_REQUEST\t(?P<value>[a-z_]+)\t", (
            "Which unconfirmed service shows up most?",), (
            "Which unconfirmed services have been sent?",)),
    ), split="fresh7"),
)


def log_path(log: str) -> Path:
    """Where a question set's log lies: FRESH... in the checkout, any other under ../shared/data."""
    return ROOT / log if log.startswith(FRESH) else DATA / log


def _clock(timestamp: str) -> str:
    """'2024-05-01 01:32:20.000000000' -> '01:32:20': the clock a TEP row shows in the stream."""
    return timestamp.strip().split(" ")[-1].split(".")[0]


def lines_of(path: str | Path, fmt: str) -> list[str]:
    """Each line's text as the stream shows it; line n is element n - 1. Plain: the file's non-blank lines, stripped.
    CSV: 'HH:MM:SS TAG TYPE DESCRIPTION' per data row."""
    text = Path(path).read_bytes().decode("utf-8", errors="replace")
    if fmt == "plain":
        return [line.strip() for line in text.splitlines() if line.strip()]
    rows = csv.DictReader(io.StringIO(text))
    return [f"{_clock(r['timestamp'])} {r['tag'].strip()} {r['type'].strip()} {r['description'].strip()}"
            for r in rows if any((v or "").strip() for v in r.values())]


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def _matches(lines: list[str], pattern: str, time_re: str) -> list[tuple[int, dict]]:
    """(line number, the pattern's groups) for each line it matches, over every line given."""
    rx = re.compile(pattern.replace("{T}", time_re))
    return [(n, m.groupdict()) for n, line in enumerate(lines, start=1) if (m := rx.search(line))]


def _time_of(line: str, time_re: str) -> str:
    return re.search(time_re, line).group(0)


def _grouped(found: list[tuple[int, dict]], without: str | None = None) -> dict[tuple, list[tuple[int, dict]]]:
    """The matches per subject: the tuple of their groups' (name, value), `without` one left out."""
    out: dict[tuple, list] = {}
    for n, groups in found:
        out.setdefault(tuple(sorted((k, v) for k, v in groups.items() if k != without)), []).append((n, groups))
    return out


def _stable_through(numbers: list[int], ask_after: int) -> int:
    """The last n (at most ask_after + SLACK) such that no line among `numbers` lies in (ask_after, n]."""
    return min([n - 1 for n in numbers if n > ask_after] + [ask_after + SLACK])


def _ask_points(first: int, rng: random.Random, tries: int = 6) -> list[int]:
    lo = max(MIN_ASK, first)
    return [rng.randint(lo, MAX_ASK) for _ in range(tries)] if lo <= MAX_ASK else []


def lookup_candidates(lines: list[str], spec: LogSpec, rule: Lookup, rng: random.Random) -> list[dict]:
    """Questions answered by one value on one kind of line: every line with the question's identifiers up to
    ask_after agrees on the value, and none comes within SLACK lines after."""
    out = []
    for subject, occ in _grouped(_matches(lines, rule.pattern, spec.time), without="value").items():
        for ask_after in _ask_points(occ[0][0], rng):
            inside = [(n, g["value"]) for n, g in occ if n <= ask_after]
            stable = _stable_through([n for n, _ in occ], ask_after)
            if stable >= ask_after + MIN_SLACK and len({v for _, v in inside}) == 1:
                out.append({"ask_after": ask_after, "subject": dict(subject), "route": "lookup", "kind": rule.kind,
                            "gold": inside[0][1], "gold_lines": [n for n, _ in inside], "stable_through": stable,
                            "templates": rule.templates})
                break
    return out


def tally_candidates(lines: list[str], spec: LogSpec, rule: Tally, rng: random.Random) -> dict[str, list[dict]]:
    """count / first / last questions about one event per subject."""
    out: dict[str, list[dict]] = {"count": [], "first": [], "last": []}
    for subject, occ in _grouped(_matches(lines, rule.pattern, spec.time)).items():
        numbers = [n for n, _ in occ]
        points = _ask_points(numbers[0], rng)
        quiet = [(a, s) for a in points if (s := _stable_through(numbers, a)) >= a + MIN_SLACK]
        base = {"subject": dict(subject), "route": "aggregate"}
        if quiet:
            (ask_after, stable), inside = quiet[0], [n for n in numbers if n <= quiet[0][0]]
            out["count"].append({**base, "ask_after": ask_after, "kind": "count", "gold": str(len(inside)),
                                 "gold_lines": inside, "stable_through": stable, "templates": rule.count})
            out["last"].append({**base, "ask_after": ask_after, "kind": "last",
                                "gold": _time_of(lines[inside[-1] - 1], spec.time), "gold_lines": [inside[-1]],
                                "stable_through": stable, "templates": rule.last})
        if points:
            out["first"].append({**base, "ask_after": points[-1], "kind": "first",
                                 "gold": _time_of(lines[numbers[0] - 1], spec.time), "gold_lines": [numbers[0]],
                                 "stable_through": points[-1] + SLACK, "templates": rule.first})
    return out


def values_candidates(lines: list[str], spec: LogSpec, rule: Values, rng: random.Random) -> dict[str, list[dict]]:
    """most_frequent / which questions at a few ask points where the answer holds through SLACK."""
    found = [(n, g["value"]) for n, g in _matches(lines, rule.pattern, spec.time)]
    out: dict[str, list[dict]] = {"most_frequent": [], "which": []}
    if not found:
        return out
    for ask_after in _ask_points(found[0][0], rng, tries=30):
        inside = [(n, v) for n, v in found if n <= ask_after]
        counts = Counter(v for _, v in inside).most_common()
        top = counts[0][0] if len(counts) == 1 or counts[0][1] > counts[1][1] else None
        distinct = list(dict.fromkeys(v for _, v in inside))
        base = {"ask_after": ask_after, "subject": {}, "route": "aggregate"}
        # which: any later line of the kind may add a value or a gold line; most_frequent: a line of the top value
        # adds a gold line, and another value may draw level (then the top is no longer one value)
        stable = _stable_through([n for n, _ in found], ask_after)
        if top is not None:
            level = [n for n in range(ask_after + 1, ask_after + SLACK + 1)
                     if (c := Counter(v for m, v in found if m <= n)).most_common(2)[-1][1] >= c[top] and len(c) > 1]
            top_stable = _stable_through([n for n, v in found if v == top] + level[:1], ask_after)
        if top is not None and top_stable >= ask_after + MIN_SLACK and not out["most_frequent"]:
            out["most_frequent"].append({**base, "kind": "most_frequent", "gold": top, "templates": rule.most,
                                         "gold_lines": [n for n, v in inside if v == top],
                                         "stable_through": top_stable})
        if 2 <= len(distinct) <= WHICH_MAX and stable >= ask_after + MIN_SLACK and not out["which"]:
            out["which"].append({**base, "kind": "which", "gold": ", ".join(distinct), "templates": rule.which,
                                 "gold_lines": [n for n, _ in inside], "stable_through": stable})
    return out


def _absent_variant(value: str, text: str, rng: random.Random) -> str | None:
    """`value` with one digit changed so that it occurs nowhere in the log's text: a plausible identifier that is not
    there."""
    digits = [i for i, ch in enumerate(value) if ch.isdigit()]
    for _ in range(40):
        if not digits:
            return None
        i = rng.choice(digits)
        other = value[:i] + rng.choice([d for d in "0123456789" if d != value[i]]) + value[i + 1:]
        if other not in text:
            return other
    return None


def _identifier(name: str, value: str) -> bool:
    """A group worth changing into an absent identifier: it has digits and is no time (a changed digit in a time
    can make an impossible one, '28:14')."""
    return name not in TIME_GROUPS and any(ch.isdigit() for ch in value)


def not_found_candidates(lines: list[str], spec: LogSpec, rng: random.Random) -> list[dict]:
    """Lookup questions about an identifier that never occurs in the whole log (one digit changed from a real one)."""
    whole = "\n".join(lines)
    out = []
    for rule in spec.lookups:
        subjects = [s for s in _grouped(_matches(lines, rule.pattern, spec.time), without="value")
                    if any(_identifier(k, v) for k, v in s)]
        if not subjects:
            continue
        subject = dict(rng.choice(subjects))
        name = next(k for k, v in sorted(subject.items()) if _identifier(k, v))
        other = _absent_variant(subject[name], whole, rng)
        if other is not None:
            ask_after = rng.randint(MIN_ASK, min(MAX_ASK, len(lines) - MIN_SLACK))   # a short log: MIN_SLACK to come
            out.append({"ask_after": ask_after, "subject": {**subject, name: other}, "route": "not_found",
                        "kind": rule.kind, "gold": None, "gold_lines": [], "stable_through": len(lines),
                        "templates": rule.templates, "absent": other})
    return out


def split_of(log: str, ask_after: int, text: str) -> str:
    """dev or heldout, by a hash of the question alone (deterministic; adding a question moves no other)."""
    h = int(hashlib.sha256(f"{log}|{ask_after}|{text}".encode()).hexdigest()[:8], 16)
    return "heldout" if h % 100 < HELDOUT_PERCENT else "dev"


def _take(pools: list[list[dict]], n: int, rng: random.Random) -> list[dict]:
    """n candidates, round robin over the pools (each shuffled), so every rule gets its turn."""
    for pool in pools:
        rng.shuffle(pool)
    out = []
    while len(out) < n and any(pools):
        for pool in pools:
            if pool and len(out) < n:
                out.append(pool.pop())
    return out


def build_log(spec: LogSpec, seed: int = SEED) -> list[Question]:
    """The questions over one log, deterministic for a seed."""
    rng = random.Random(f"{seed}:{spec.path}")
    quota = QUOTA if spec.split is None else FRESH_QUOTA
    lines = lines_of(log_path(spec.path), spec.fmt)
    window = lines[:MAX_ASK + SLACK]           # later lines never bear on a gold
    picked = _take([lookup_candidates(window, spec, r, rng) for r in spec.lookups], quota["lookup"], rng)
    tallies = [tally_candidates(window, spec, r, rng) for r in spec.tallies]
    values = [values_candidates(window, spec, r, rng) for r in spec.values]
    for kind in ("count", "first", "last"):
        picked += _take([t[kind] for t in tallies], quota[kind], rng)
    for kind in ("most_frequent", "which"):
        picked += _take([v[kind] for v in values], quota[kind], rng)
    picked += _take([[c] for c in not_found_candidates(lines, spec, rng)], quota["not_found"], rng)
    out, seen = [], set()
    stem = Path(spec.path).stem
    for c in picked:
        templates = [t for t in c["templates"] if _fields(t) == set(c["subject"])]
        assert templates, f"{spec.path}: no template names exactly {sorted(c['subject'])}"
        text = rng.choice(templates).format(**c["subject"])
        if text in seen:
            continue
        seen.add(text)
        out.append(Question("", spec.path, spec.fmt, c["ask_after"], text, c["route"], c["kind"], c["gold"],
                            tuple(c["gold_lines"]), c["stable_through"],
                            spec.split or split_of(spec.path, c["ask_after"], text),
                            c.get("absent")))
    out.sort(key=lambda q: (q.ask_after, q.text))
    return [Question(f"{stem}-{i:02d}", *list(asdict(q).values())[1:]) for i, q in enumerate(out, start=1)]


def build(seed: int = SEED) -> dict[str, list[Question]]:
    return {Path(spec.path).stem: build_log(spec, seed) for spec in SPECS}


def dumps(stem: str, questions: list[Question]) -> str:
    """One log's set as JSON: a header, then one question per line."""
    head = {"about": "operators' questions over one log with gold answers computed from the raw log by "
                     "bench/answer_questions.py (python -m bench.answer_questions writes them)",
            "lines": "line n = the log's n-th line (a CSV: its n-th data row) = its archive seq when the stream "
                     "starts at line 1; a question's gold is computed over lines[:ask_after] and is the same over "
                     "lines[:n] for every n up to stable_through",
            "exact": EXACT, "seed": SEED}
    body = ",\n".join("    " + json.dumps({**asdict(q), "gold_lines": list(q.gold_lines)}) for q in questions)
    return json.dumps(head, indent=2)[:-2] + ',\n  "questions": [\n' + body + "\n  ]\n}\n"


def load(directory: str | Path = QUESTIONS_DIR) -> list[Question]:
    """Every committed question, by log then ask_after."""
    out = []
    for path in sorted(Path(directory).glob("*.json")):
        for q in json.loads(path.read_text())["questions"]:
            out.append(Question(**{**q, "gold_lines": tuple(q["gold_lines"])}))
    return out


def write(directory: str | Path = QUESTIONS_DIR, seed: int = SEED) -> dict[str, int]:
    Path(directory).mkdir(parents=True, exist_ok=True)
    sets = build(seed)
    for stem, questions in sets.items():
        (Path(directory) / f"{stem}.json").write_text(dumps(stem, questions))
    return {stem: len(qs) for stem, qs in sets.items()}


if __name__ == "__main__":
    counts = write()
    print(json.dumps(counts), file=sys.stderr)
