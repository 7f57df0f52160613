"""Operators' questions over the shared logs, with gold answers computed from the raw log: `bench --task answers`' sets.

Owns the question sets in bench/questions/*.json and the script that writes them (`python -m bench.answer_questions`):
its own reading of each log (the 7 loghub logs line by line, TEP alarm CSVs row by row, rendered the way the stream
shows a row), its own regexes per log format, seeded choices, the development / held-out split. Never imports the
reader, the server or the project's parsers (a test only checks that its line numbers and texts are the stream's);
never runs a model.

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
QUESTIONS_DIR = Path(__file__).resolve().parent / "questions"
SEED = 47
SLACK = 80                 # stable_through is looked for up to ask_after + SLACK
MIN_SLACK = 20             # ... and must be at least ask_after + MIN_SLACK (5 s of stream at 4 lines/s)
MIN_ASK, MAX_ASK = 24, 200     # questions are asked after 24..200 lines: about 50 s of stream at 4 lines/s
HELDOUT_PERCENT = 60
QUOTA = {"lookup": 12, "count": 6, "first": 1, "last": 1, "most_frequent": 1, "which": 1, "not_found": 2}
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
    log: str                     # path under ../shared/data, e.g. "loghub/Linux_2k.log"
    format: str                  # plain | csv (what `serve --format` is given)
    ask_after: int               # asked once the stream has ingested this many lines; gold over lines[:ask_after]
    text: str
    route: str                   # lookup | aggregate | not_found
    kind: str                    # port ip size path id user status node time | count first last most_frequent which
    gold: str | None             # None: not in the log
    gold_lines: tuple[int, ...]  # lines holding the gold (a lookup: every agreeing line, newest last; count: all)
    stable_through: int          # the gold (and gold_lines) is the same over lines[:n], ask_after <= n <= this
    split: str                   # dev | heldout
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
    path: str                    # under DATA
    fmt: str
    time: str                    # the line's timestamp field (a regex, no groups)
    lookups: tuple[Lookup, ...]
    tallies: tuple[Tally, ...]
    values: tuple[Values, ...]


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
            ask_after = rng.randint(MIN_ASK, MAX_ASK)
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
    lines = lines_of(DATA / spec.path, spec.fmt)
    window = lines[:MAX_ASK + SLACK]           # later lines never bear on a gold
    picked = _take([lookup_candidates(window, spec, r, rng) for r in spec.lookups], QUOTA["lookup"], rng)
    tallies = [tally_candidates(window, spec, r, rng) for r in spec.tallies]
    values = [values_candidates(window, spec, r, rng) for r in spec.values]
    for kind in ("count", "first", "last"):
        picked += _take([t[kind] for t in tallies], QUOTA[kind], rng)
    for kind in ("most_frequent", "which"):
        picked += _take([v[kind] for v in values], QUOTA[kind], rng)
    picked += _take([[c] for c in not_found_candidates(lines, spec, rng)], QUOTA["not_found"], rng)
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
                            tuple(c["gold_lines"]), c["stable_through"], split_of(spec.path, c["ask_after"], text),
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
