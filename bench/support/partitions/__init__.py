"""Partition schedules over fault-injecting proxies, and the history checker."""
