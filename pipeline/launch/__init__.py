"""The launchers: the actors of a run as local processes or Ray actors, and their supervisor. Import the modules
themselves; in the order a reader follows from `run_replay`: verbs.py (the `replay` and `serve` verbs), plan.py (what
a run starts, with what), supervise.py (the run, restarted when an actor dies), signals.py (the operator's signals),
local.py and ray_actors.py (the two launchers), site.py (a served several-node run's one front), deaths.py (an actor's
death, and whether to restart after it).
"""
