"""The pipeline's use of sandboxes: one per rollout attempt, the group's shared lower layer,
grading in a fresh sandbox, the RUN's guard on its sandbox.
"""
