"""The LLM server pool's database side: generation marks, stickiness, pool-wide pause and verified
weight pushes.
"""
