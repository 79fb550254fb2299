"""A process's long-lived parts: the steps that make them, and the one object that starts them in
a declared order and stops them in reverse (the lowest wing: every other wing may use it).
"""
