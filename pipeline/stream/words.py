"""The reader's vocabularies, each written once: log levels, outcome words, and the words that name no line.

Owns the word lists the severity mapping, value extraction, retrieval, question routing and the span ranker share:
`LEVEL_WORDS` (a level word in capitals -> the severity it states), `LEVEL_LETTERS` (V/D/I/W/E/F: Android's logcat,
glog), `OTHER_LEVELS` (PostgreSQL's LOG and DEBUG1-5, written before ":  "), `OUTCOME_WORDS` (what a line says
happened: failed, closed, ...), and the stop words: `FUNCTION_WORDS` (English's own), to which retrieval adds
`ALARM_LOG_WORDS` (`RETRIEVAL_STOP`: in an alarm log every line is an alarm that fires, so these separate nothing) and
question routing adds `ASKING_WORDS` (`QUESTION_STOP`: the words a question asks with: how many, list, lines).
Compiles no pattern: the modules that read lines and questions compile these into their own.
"""
from __future__ import annotations

SEVERITIES = ("low", "medium", "high", "critical")
LEVEL_WORDS = {**dict.fromkeys(("FATAL", "CRITICAL", "CRIT", "EMERG", "EMERGENCY", "ALERT", "PANIC"), "critical"),
               **dict.fromkeys(("ERROR", "ERR", "SEVERE"), "high"),
               **dict.fromkeys(("WARN", "WARNING"), "medium"),
               **dict.fromkeys(("INFO", "NOTICE", "DEBUG", "TRACE", "FINE"), "low")}
LEVEL_LETTERS = "VDIWEF"
OTHER_LEVELS = ("LOG", "DEBUG1", "DEBUG2", "DEBUG3", "DEBUG4", "DEBUG5")
OUTCOME_WORDS = tuple("""failure failed fail success succeeded successful OK done opened closed started stopped running
    killed terminated aborted timeout denied accepted rejected refused up down active inactive enabled disabled
    completed finished lost interrupted recovered""".split())

FUNCTION_WORDS = frozenset("""
    a an the and or but not no of to in on at by for from with about into than then there this that these those it its
    is are was were be been being do does did done has have had can could will would should shall may might must
    i me my we our you your he she they them what when where which who whom whose why how
    last latest recent recently most ever time times first go goes went gone going come came get got
    happen happens happened occur occurred show tell give
""".split())
ALARM_LOG_WORDS = frozenset("fire fires fired firing raise raises raised trip tripped return returns returned back "
                        "alarm alarms alm".split())
ASKING_WORDS = frozenset("""
    many much often count number earliest least frequent frequently common commonly
    list name line lines log logs entry entries message messages event events record records mention mentions
    mentioned appear appears appeared any all each every some same one apart besides except other so far
""".split())
RETRIEVAL_STOP = FUNCTION_WORDS | ALARM_LOG_WORDS      # words that rank no line (the archive's BM25, the span ranker)
QUESTION_STOP = FUNCTION_WORDS | ASKING_WORDS      # words that name nothing a question asks for (routing)


def is_level(text: str) -> bool:
    """A log level as written: a level word in capitals (WARN, ERROR), one of V/D/I/W/E/F, or PostgreSQL's."""
    return text in LEVEL_WORDS or len(text) == 1 and text in LEVEL_LETTERS or text in OTHER_LEVELS
