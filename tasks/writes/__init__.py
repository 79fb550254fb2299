"""Statements that write rollout, turn, group and job rows: leases and hand-offs, the terminal
write, the turn log's group commit, callbacks, cancels, and the retry that rides out a database
outage.
"""
