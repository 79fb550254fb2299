"""What brings work back after a fault: the reaper and its sweeps, reclaiming lost leases, resume,
drain at a turn boundary, heartbeats and node liveness, hand-back.
"""
