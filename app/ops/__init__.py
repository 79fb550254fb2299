"""Operator commands: the `raas` CLI, `raas up` (embedded), `raas node`, `raas slurm write`, `raas
doctor`, token and validation commands, the development server.
"""
